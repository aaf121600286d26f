#include "runtime/src/engine/response_cache.h"

namespace ringrun::runtime::engine {

int64_t ResponseCache::Find(const std::string& name, const std::string& encoded) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end() || entries_[it->second].encoded != encoded) return -1;
  return it->second;
}

void ResponseCache::Put(const Request& req) {
  if (req.name.find(".noname.") != std::string::npos) return;
  std::string enc;
  req.Encode(&enc);
  auto it = by_name_.find(req.name);
  if (it != by_name_.end()) {
    // Arguments changed: replace in place; every rank does the same, so the id stays valid.
    Item& item = entries_[it->second];
    if (item.encoded != enc) item = Item{req, std::move(enc)};
    return;
  }
  if (entries_.size() >= capacity_) return;
  by_name_.emplace(req.name, static_cast<uint32_t>(entries_.size()));
  entries_.push_back(Item{req, std::move(enc)});
}

}  // namespace ringrun::runtime::engine
