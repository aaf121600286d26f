#include "runtime/src/engine/controller.h"

#include <algorithm>
#include <unordered_set>

#include "runtime/src/engine/wire.h"

namespace ringrun::runtime::engine {
namespace {

constexpr uint8_t kTagCached = 0;
constexpr uint8_t kTagFull = 1;

bool NeedsAllRanks(Kind k) {
  return k == Kind::kBroadcast || k == Kind::kAllgather || k == Kind::kAlltoall ||
         k == Kind::kReduceScatter;
}

// "ranks 0, 2" / "rank 1"
std::string RankList(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

}  // namespace

Controller::Controller(int size, size_t cache_capacity)
    : size_(size), cache_(cache_capacity), joined_(size, false) {}

std::string Controller::EncodeFrame(const std::vector<const Request*>& announce) const {
  std::string out;
  Put<uint32_t>(&out, static_cast<uint32_t>(announce.size()));
  std::string enc;
  for (const Request* r : announce) {
    enc.clear();
    r->Encode(&enc);
    int64_t id = cache_.Find(r->name, enc);
    if (id >= 0) {
      Put<uint8_t>(&out, kTagCached);
      Put<uint32_t>(&out, static_cast<uint32_t>(id));
    } else {
      Put<uint8_t>(&out, kTagFull);
      out += enc;
    }
  }
  return out;
}

bool Controller::Ready(const Slot& s) const {
  for (int r = 0; r < size_; ++r) {
    if (!s.by_rank[r] && !joined_[r]) return false;
  }
  return true;
}

Result<std::vector<Response>> Controller::Apply(const std::vector<std::string>& frames,
                                                int64_t now_us) {
  ++round_;
  bool joins_changed = false;
  std::vector<std::string> touched;
  for (int r = 0; r < size_; ++r) {
    const std::string& f = frames[r];
    size_t pos = 0;
    uint32_t n = 0;
    if (!Get(f, &pos, &n))
      return Internal("malformed negotiation frame from rank " + std::to_string(r));
    for (uint32_t i = 0; i < n; ++i) {
      uint8_t tag;
      Request req;
      if (!Get(f, &pos, &tag))
        return Internal("malformed negotiation frame from rank " + std::to_string(r));
      if (tag == kTagCached) {
        uint32_t id;
        const Request* c = Get(f, &pos, &id) ? cache_.Get(id) : nullptr;
        if (!c) return Internal("rank " + std::to_string(r) + " sent an unknown cache id");
        req = *c;
      } else if (tag != kTagFull || !req.Decode(f, &pos)) {
        return Internal("malformed request from rank " + std::to_string(r));
      }
      auto [it, fresh] = table_.try_emplace(req.name);
      Slot& s = it->second;
      if (fresh) {
        s.by_rank.resize(size_);
        s.announced_us.assign(size_, -1);
        s.first_round = round_, s.first_rank = r, s.first_index = i, s.first_us = now_us;
        touched.push_back(req.name);
      }
      if (s.by_rank[r]) {  // the submitting rank refuses duplicates; a bug if it happens
        return Internal("rank " + std::to_string(r) + " announced '" + req.name + "' twice");
      }
      if (req.kind == Kind::kJoin && !joined_[r]) {
        joined_[r] = true, ++joined_count_, last_joined_ = r, joins_changed = true;
      }
      s.by_rank[r] = std::move(req);
      s.announced_us[r] = now_us;
      ++s.count;
      if (!fresh) touched.push_back(it->first);  // duplicates are dropped below
    }
  }
  // Which names are ready now, in their agreed order.
  std::vector<std::pair<const std::string*, Slot*>> ready;
  std::unordered_set<const Slot*> seen;
  auto consider = [&](const std::string& name, Slot& s) {
    if (Ready(s) && seen.insert(&s).second) ready.emplace_back(&name, &s);
  };
  if (joins_changed) {
    for (auto& [name, s] : table_) consider(name, s);
  } else {
    for (const std::string& name : touched) {
      auto it = table_.find(name);
      if (it != table_.end()) consider(it->first, it->second);
    }
  }
  std::sort(ready.begin(), ready.end(), [](const auto& a, const auto& b) {
    const Slot& x = *a.second;
    const Slot& y = *b.second;
    if (x.first_round != y.first_round) return x.first_round < y.first_round;
    if (x.first_rank != y.first_rank) return x.first_rank < y.first_rank;
    return x.first_index < y.first_index;
  });
  std::vector<std::string> ready_names;
  ready_names.reserve(ready.size());
  for (const auto& [name, slot] : ready) ready_names.push_back(*name);
  std::vector<Response> out;
  std::optional<Response> join_done;
  for (const std::string& name : ready_names) {
    auto it = table_.find(name);
    Response resp = Build(it->second);
    table_.erase(it);
    if (resp.type == Response::kJoinDone) {
      join_done = std::move(resp);
    } else {
      if (resp.type == Response::kRun && resp.req.kind != Kind::kBarrier && !resp.req.fixed &&
          resp.by_rank.empty()) {
        cache_.Put(resp.req);
      }
      out.push_back(std::move(resp));
    }
  }
  if (join_done) {
    out.push_back(std::move(*join_done));
    joined_.assign(size_, false);
    joined_count_ = 0;
  }
  return out;
}

Response Controller::Build(Slot& s) {
  Response resp;
  resp.announced_us = s.announced_us;
  resp.contributors = size_ - joined_count_;
  int first = -1;
  for (int r = 0; r < size_; ++r) {
    if (s.by_rank[r]) {
      first = r;
      break;
    }
  }
  resp.req = *s.by_rank[first];
  const std::string& name = resp.req.name;
  // Every announced request must match the first one on the fields that must match.
  std::string field;
  for (int r = first + 1; r < size_ && field.empty(); ++r) {
    if (s.by_rank[r]) field = resp.req.Differs(*s.by_rank[r]);
  }
  if (!field.empty()) {
    // Group the ranks by the value they sent for that field, in order of first appearance.
    std::vector<std::pair<std::string, std::vector<int>>> groups;
    for (int r = 0; r < size_; ++r) {
      if (!s.by_rank[r]) continue;
      std::string v = s.by_rank[r]->FieldValue(field);
      auto g =
          std::find_if(groups.begin(), groups.end(), [&](const auto& x) { return x.first == v; });
      if (g == groups.end())
        groups.push_back({v, {r}});
      else
        g->second.push_back(r);
    }
    std::string detail;
    for (const auto& [v, ranks] : groups)
      detail += (detail.empty() ? "" : "; ") + RankList(ranks) + " sent " + v;
    resp.type = Response::kError;
    resp.error_code = RINGRUN_ERR_MISMATCH;
    resp.error = "tensor '" + name + "': ranks disagree on the " + field + ": " + detail;
    return resp;
  }
  if (resp.req.kind == Kind::kJoin) {
    resp.type = Response::kJoinDone;
    resp.last_joined = last_joined_;
    return resp;
  }
  if (joined_count_ > 0 && (NeedsAllRanks(resp.req.kind) || resp.req.device)) {
    std::vector<int> joined;
    for (int r = 0; r < size_; ++r) {
      if (joined_[r]) joined.push_back(r);
    }
    resp.type = Response::kError;
    resp.error_code = RINGRUN_ERR_JOINED;
    resp.error = "tensor '" + name + "': " + KindName(resp.req.kind) +
                 (resp.req.device ? " of device memory" : "") +
                 " is not possible while ranks have joined (" + RankList(joined) +
                 "); only host allreduce and barrier run until every rank has joined";
    return resp;
  }
  if (resp.req.kind == Kind::kAllgather || resp.req.kind == Kind::kAlltoall) {
    resp.by_rank = s.by_rank;
    if (resp.req.kind == Kind::kAlltoall) {
      for (int r = 0; r < size_; ++r) {
        if (s.by_rank[r]->send_rows.size() != static_cast<size_t>(size_)) {
          resp.type = Response::kError;
          resp.error_code = RINGRUN_ERR_MISMATCH;
          resp.error = "tensor '" + name + "': rank " + std::to_string(r) + " sent " +
                       std::to_string(s.by_rank[r]->send_rows.size()) + " splits for " +
                       std::to_string(size_) + " ranks";
          return resp;
        }
      }
    }
  }
  return resp;
}

std::vector<PendingView> Controller::Pending() const {
  std::vector<PendingView> out;
  for (const auto& [name, s] : table_) {
    PendingView v{&name, s.first_us, std::vector<bool>(size_)};
    for (int r = 0; r < size_; ++r) v.announced[r] = s.by_rank[r].has_value() || joined_[r];
    out.push_back(std::move(v));
  }
  return out;
}

}  // namespace ringrun::runtime::engine
