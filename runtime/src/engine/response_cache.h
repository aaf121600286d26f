// The response cache: requests that negotiated successfully before, by id, so that a step that
// repeats the previous one's names announces each as a 5-byte id instead of the full request.
// Replicated like the controller: every rank adds the same entries in the same order, so ids
// agree without being sent. Names made up for unnamed requests ("*.noname.*") are never
// cached (they do not repeat). When full, nothing more is added (no eviction: ids stay valid).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/src/engine/request.h"

namespace ringrun::runtime::engine {

class ResponseCache {
 public:
  explicit ResponseCache(size_t capacity) : capacity_(capacity) {}
  // The id under which a request identical to `req` is cached, or -1.
  int64_t Find(const Request& req) const;
  // The id of the entry named `name` (whatever its arguments), or -1.
  int64_t IdOf(const std::string& name) const;
  const Request* Get(uint32_t id) const { return id < entries_.size() ? &entries_[id] : nullptr; }
  // How many times the entry `id` was replaced (its arguments changed).
  uint32_t Version(uint32_t id) const { return versions_[id]; }
  size_t size() const { return entries_.size(); }
  // How many entries were added or replaced so far.
  uint64_t changes() const { return changes_; }
  // Caches (or re-caches, if its arguments changed) a request that ran on every rank alike.
  void Put(const Request& req);

 private:
  const size_t capacity_;
  std::vector<Request> entries_;
  std::vector<uint32_t> versions_;  // by id
  std::unordered_map<std::string, uint32_t> by_name_;
  uint64_t changes_ = 0;
};

}  // namespace ringrun::runtime::engine
