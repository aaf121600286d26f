#include "runtime/src/rendezvous/store.h"

#include <chrono>
#include <cstdlib>

namespace ringrun::runtime::rendezvous {

Status MemoryStore::Set(const std::string& key, const std::string& value) {
  MutexLock lock(&mu_);
  values_[key] = value;
  changed_.SignalAll();
  return Status::Ok();
}

Status MemoryStore::Wait(const std::vector<std::string>& keys, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  MutexLock lock(&mu_);
  for (const std::string& key : keys) {
    while (values_.count(key) == 0) {
      if (!changed_.WaitUntil(&mu_, deadline) && values_.count(key) == 0) {
        return Timeout("memory store: key '" + key + "' was not set within " +
                       std::to_string(timeout_ms) + " ms");
      }
    }
  }
  return Status::Ok();
}

Result<std::string> MemoryStore::Get(const std::string& key, int timeout_ms) {
  RINGRUN_RETURN_IF_ERROR(Wait({key}, timeout_ms));
  MutexLock lock(&mu_);
  return values_[key];
}

Result<int64_t> MemoryStore::Add(const std::string& key, int64_t delta) {
  MutexLock lock(&mu_);
  std::string& v = values_[key];
  const int64_t sum = (v.empty() ? 0 : std::strtoll(v.c_str(), nullptr, 10)) + delta;
  v = std::to_string(sum);
  changed_.SignalAll();
  return sum;
}

}  // namespace ringrun::runtime::rendezvous
