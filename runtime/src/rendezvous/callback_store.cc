#include "runtime/src/rendezvous/callback_store.h"

namespace ringrun::runtime::rendezvous {

bool CallbackStore::Valid(const ringrun_store& c) {
  return c.set != nullptr && c.get != nullptr && c.wait != nullptr && c.add != nullptr;
}

Status CallbackStore::Check(ringrun_status st, const std::string& what) const {
  if (st == RINGRUN_OK) return Status::Ok();
  const bool known = st > RINGRUN_OK && st <= RINGRUN_ERR_INTERNAL;
  std::string m = "store " + what + " failed";
  if (c_.last_error != nullptr) {
    if (const char* why = c_.last_error(c_.context); why != nullptr && *why != '\0') {
      m += ": " + std::string(why);
    }
  }
  if (!known) m += " (status " + std::to_string(static_cast<int>(st)) + ")";
  return Status(known ? static_cast<Code>(st) : Code::kInternal, m);
}

Status CallbackStore::Set(const std::string& key, const std::string& value) {
  return Check(c_.set(c_.context, key.c_str(), value.data(), value.size()), "set '" + key + "'");
}

Result<std::string> CallbackStore::Get(const std::string& key, int timeout_ms) {
  std::string value(256, '\0');
  for (int tries = 0; tries < 2; ++tries) {
    size_t size = 0;
    RINGRUN_RETURN_IF_ERROR(
        Check(c_.get(c_.context, key.c_str(), timeout_ms, value.data(), value.size(), &size),
              "get '" + key + "'"));
    if (size <= value.size()) {
      value.resize(size);
      return value;
    }
    value.assign(size, '\0');  // the value is set now: the second call copies it at once
  }
  return Internal("store get '" + key + "': the value's size changed between two calls");
}

Status CallbackStore::Wait(const std::vector<std::string>& keys, int timeout_ms) {
  std::vector<const char*> raw;
  raw.reserve(keys.size());
  for (const std::string& k : keys) raw.push_back(k.c_str());
  return Check(c_.wait(c_.context, raw.data(), raw.size(), timeout_ms),
               "wait for '" + (keys.empty() ? std::string() : keys[0]) + "'" +
                   (keys.size() > 1 ? " and " + std::to_string(keys.size() - 1) + " more" : ""));
}

Result<int64_t> CallbackStore::Add(const std::string& key, int64_t delta) {
  int64_t sum = 0;
  RINGRUN_RETURN_IF_ERROR(
      Check(c_.add(c_.context, key.c_str(), delta, &sum), "add to '" + key + "'"));
  return sum;
}

}  // namespace ringrun::runtime::rendezvous
