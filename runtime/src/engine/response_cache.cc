#include "runtime/src/engine/response_cache.h"

namespace ringrun::runtime::engine {

int64_t ResponseCache::Find(const Request& req) const {
  const int64_t id = IdOf(req.name);
  return id >= 0 && entries_[id].Identical(req) ? id : -1;
}

int64_t ResponseCache::IdOf(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : static_cast<int64_t>(it->second);
}

void ResponseCache::Put(const Request& req) {
  if (req.name.find(".noname.") != std::string::npos) return;
  auto it = by_name_.find(req.name);
  if (it != by_name_.end()) {
    // Arguments changed: replace in place; every rank does the same, so the id stays valid.
    Request& cached = entries_[it->second];
    if (!cached.Identical(req)) cached = req, ++versions_[it->second], ++changes_;
    return;
  }
  if (entries_.size() >= capacity_) return;
  by_name_.emplace(req.name, static_cast<uint32_t>(entries_.size()));
  entries_.push_back(req);
  versions_.push_back(0);
  ++changes_;
}

}  // namespace ringrun::runtime::engine
