#include "runtime/src/engine/controller.h"

#include <algorithm>
#include <cstring>
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

int64_t Controller::CachedId(const Request& req, int64_t hint) const {
  if (hint >= 0) {
    // The hint is the id this name had: an id keeps its name (a changed request is replaced in
    // place), so only the arguments need comparing.
    const Request* c = cache_.Get(static_cast<uint32_t>(hint));
    if (c && c->SameArguments(req)) return hint;
  }
  return cache_.Find(req);
}

std::string Controller::EncodeFrame(const std::vector<const Request*>& announce,
                                    const std::vector<int64_t>* ids) const {
  // Room for every entry as a cached id (5 bytes: the steady state), written in place; a
  // request in full is appended at `at` and the room for the rest made again after it.
  const size_t n = announce.size();
  std::string out(4 + n * 5, '\0');
  const uint32_t n32 = static_cast<uint32_t>(n);
  std::memcpy(out.data(), &n32, sizeof(n32));
  size_t at = 4;
  for (size_t i = 0; i < n; ++i) {
    const Request* r = announce[i];
    const int64_t id = ids ? (*ids)[i] : cache_.Find(*r);
    if (id >= 0) {
      char* p = out.data() + at;
      p[0] = static_cast<char>(kTagCached);
      const uint32_t id32 = static_cast<uint32_t>(id);
      std::memcpy(p + 1, &id32, sizeof(id32));
      at += 5;
    } else {
      out.resize(at);
      Put<uint8_t>(&out, kTagFull);
      r->Encode(&out);
      at = out.size();
      out.resize(at + (n - i - 1) * 5);
    }
  }
  out.resize(at);
  return out;
}

Controller::FastSlot& Controller::Fast(uint32_t id) {
  if (fast_.size() <= id) {
    fast_.resize(cache_.size());
    fast_us_.resize(fast_.size() * static_cast<size_t>(size_), -1);
  }
  return fast_[id];
}

bool Controller::Ready(uint32_t id) const {
  const FastSlot& s = fast_[id];
  if (s.count == 0) return false;
  if (joined_count_ == 0) return s.count == size_;
  const int64_t* us = FastUs(id);
  for (int r = 0; r < size_; ++r) {
    if (us[r] < 0 && !joined_[r]) return false;
  }
  return true;
}

void Controller::MoveToTable(uint32_t id, std::vector<std::string>* touched) {
  FastSlot& f = Fast(id);
  f.in_table = true;
  if (f.count == 0) return;
  const Request& cached = *cache_.Get(id);
  auto [it, fresh] = table_.try_emplace(cached.name);
  Slot& s = it->second;  // fresh: in_table was false, so no slot had this name
  s.by_rank.resize(size_);
  int64_t* us = FastUs(id);
  s.announced_us.assign(us, us + size_);
  s.first_round = f.first_round, s.first_rank = f.first_rank, s.first_index = f.first_index;
  s.first_us = f.first_us;
  for (int r = 0; r < size_; ++r) {
    if (us[r] >= 0) s.by_rank[r] = cached, ++s.count;
  }
  if (fresh) touched->push_back(cached.name);
  f.count = 0;
  --fast_pending_;
  std::fill(us, us + size_, -1);
}

bool Controller::Ready(const Slot& s) const {
  if (joined_count_ == 0) return s.count == size_;  // O(1): Apply asks once per announcement
  for (int r = 0; r < size_; ++r) {
    if (!s.by_rank[r] && !joined_[r]) return false;
  }
  return true;
}

Result<std::vector<Response>> Controller::Apply(const std::vector<std::string>& frames,
                                                int64_t now_us) {
  std::vector<Response> out;
  const Response* ready = nullptr;
  Result<size_t> n = Apply(frames, now_us, &out, &ready);
  if (!n.ok()) return n.status();
  if (ready != out.data()) return std::vector<Response>(ready, ready + *n);
  out.resize(*n);
  return out;
}

Result<size_t> Controller::Apply(const std::vector<std::string>& frames, int64_t now_us,
                                 std::vector<Response>* out_vec, const Response** ready,
                                 bool equal) {
  ++round_;
  repeated_ = false;
  if (std::optional<size_t> n = ApplyUniform(frames, now_us, equal)) {
    uniform_ = true;
    *ready = uniform_out_.data();
    return *n;
  }
  uniform_ = false;
  if (equal && size_ > 1) {
    // The general path reads every rank's frame: the one given, n times.
    std::vector<std::string> all(static_cast<size_t>(size_), frames[0]);
    Result<size_t> k = ApplyGeneral(all, now_us, out_vec);
    *ready = out_vec->data();
    return k;
  }
  Result<size_t> k = ApplyGeneral(frames, now_us, out_vec);
  *ready = out_vec->data();
  return k;
}

Result<size_t> Controller::ApplyGeneral(const std::vector<std::string>& frames, int64_t now_us,
                                        std::vector<Response>* out_vec) {
  bool joins_changed = false;
  std::vector<std::string> touched;
  std::vector<uint32_t>& touched_fast = touched_fast_;
  touched_fast.clear();
  for (int r = 0; r < size_; ++r) {
    const std::string& f = frames[r];
    size_t pos = 0;
    uint32_t n = 0;
    if (!Get(f, &pos, &n))
      return Internal("malformed negotiation frame from rank " + std::to_string(r));
    for (uint32_t i = 0; i < n; ++i) {
      uint8_t tag;
      if (!Get(f, &pos, &tag))
        return Internal("malformed negotiation frame from rank " + std::to_string(r));
      const Request* c = nullptr;  // a cached announcement's request
      if (tag == kTagCached) {
        uint32_t id;
        c = Get(f, &pos, &id) ? cache_.Get(id) : nullptr;
        if (!c) return Internal("rank " + std::to_string(r) + " sent an unknown cache id");
        FastSlot& fs = Fast(id);
        if (!fs.in_table) {  // the steady state: count it in the array
          int64_t* us = FastUs(id);
          if (us[r] >= 0) {
            return Internal("rank " + std::to_string(r) + " announced '" + c->name + "' twice");
          }
          if (fs.count == 0) {
            fs.first_round = round_, fs.first_rank = r, fs.first_index = i, fs.first_us = now_us;
            ++fast_pending_;
          }
          touched_fast.push_back(id);
          us[r] = now_us;
          ++fs.count;
          continue;
        }
      }
      Request req;
      if (c) {
        req = *c;  // its name negotiates in the table now
      } else if (tag != kTagFull || !req.Decode(f, &pos)) {
        return Internal("malformed request from rank " + std::to_string(r));
      } else if (const int64_t id = cache_.IdOf(req.name); id >= 0) {
        MoveToTable(static_cast<uint32_t>(id), &touched);
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
  // Which names are ready now, in their agreed order (table slots and cached ones alike).
  std::vector<ReadyItem>& ready = ready_;
  ready.clear();
  std::unordered_set<const Slot*> seen;
  auto consider = [&](const std::string& name, Slot& s) {
    if (Ready(s) && seen.insert(&s).second) {
      ready.push_back({s.first_round, s.first_rank, s.first_index, &name, 0});
    }
  };
  auto consider_fast = [&](uint32_t id) {
    FastSlot& fs = fast_[id];
    if (fs.listed_round != round_ && Ready(id)) {
      ready.push_back({fs.first_round, fs.first_rank, fs.first_index, nullptr, id});
      fs.listed_round = round_;  // once
    }
  };
  if (joins_changed) {
    for (auto& [name, s] : table_) consider(name, s);
    for (uint32_t id = 0; id < fast_.size(); ++id) consider_fast(id);
  } else {
    for (const std::string& name : touched) {
      auto it = table_.find(name);
      if (it != table_.end()) consider(it->first, it->second);
    }
    for (uint32_t id : touched_fast) consider_fast(id);
  }
  auto earlier = [](const ReadyItem& x, const ReadyItem& y) {
    if (x.round != y.round) return x.round < y.round;
    if (x.rank != y.rank) return x.rank < y.rank;
    return x.index < y.index;
  };
  // Usually in order already (both ranks announced a step's names in one round).
  if (!std::is_sorted(ready.begin(), ready.end(), earlier)) {
    std::sort(ready.begin(), ready.end(), earlier);
  }
  std::vector<std::string> ready_names;
  for (const ReadyItem& x : ready) {
    if (x.name) ready_names.push_back(*x.name);
  }
  std::vector<Response>& out = *out_vec;
  size_t k = 0;
  auto next = [&]() -> Response& {
    if (out.size() <= k) out.emplace_back();
    return out[k++];
  };
  std::optional<Response> join_done;
  size_t next_name = 0;
  for (const ReadyItem& x : ready) {
    if (!x.name) {
      BuildFast(x.id, &next());
      continue;
    }
    auto it = table_.find(ready_names[next_name++]);
    Response resp = Build(it->second);
    table_.erase(it);
    if (const int64_t id = cache_.IdOf(resp.req.name); id >= 0) {
      Fast(static_cast<uint32_t>(id)).in_table = false;
      resp.cache_id = id;
    }
    if (resp.type == Response::kJoinDone) {
      join_done = std::move(resp);
    } else {
      if (resp.type == Response::kRun && resp.req.kind != Kind::kBarrier && !resp.req.fixed &&
          resp.by_rank.empty()) {
        cache_.Put(resp.req);
      }
      next() = std::move(resp);
    }
  }
  if (join_done) {
    next() = std::move(*join_done);
    joined_.assign(size_, false);
    joined_count_ = 0;
  }
  return k;
}

std::optional<size_t> Controller::ApplyUniform(const std::vector<std::string>& frames,
                                               int64_t now_us, bool equal) {
  // The steady state of training: nothing pending, no rank joined, and every rank announces
  // the same cached names in the same order. Then each is ready now, in frame order, which is
  // what the general path below would find after counting every rank's announcement of each.
  // Anything else (a name in full, a frame that differs, an unknown or repeated id) takes the
  // general path, which also reports what is malformed; nothing that it reads is changed
  // before that (uniform_round is this shortcut's own).
  if (fast_pending_ != 0 || !table_.empty() || joined_count_ != 0) return std::nullopt;
  const std::string& f = frames[0];
  for (int r = 1; !equal && r < size_; ++r) {
    if (frames[r] != f) return std::nullopt;
  }
  // The same frame as the last uniform round's, and no cache entry changed since: the
  // responses that round left in uniform_out_ are this round's too (every field of them
  // follows from the ids, the cache and the joins, and nothing has joined). Only the
  // announcement times are new. Rounds of the general path in between (a barrier, a blocking
  // call) write elsewhere.
  if (repeat_.valid && repeat_.cache_changes == cache_.changes() && repeat_.frame == f) {
    const size_t n = repeat_.n;
    if (record_announcements_) {
      for (size_t i = 0; i < n; ++i) {
        uniform_out_[i].announced_us.assign(static_cast<size_t>(size_), now_us);
      }
    }
    repeated_ = true;
    return n;
  }
  size_t pos = 0;
  uint32_t n = 0;
  if (!Get(f, &pos, &n) || f.size() - pos != size_t{n} * 5) return std::nullopt;
  uniform_ids_.clear();
  for (uint32_t i = 0; i < n; ++i, pos += 5) {
    uint32_t id;
    std::memcpy(&id, f.data() + pos + 1, sizeof(id));
    if (f[pos] != static_cast<char>(kTagCached) || !cache_.Get(id)) return std::nullopt;
    FastSlot& fs = Fast(id);
    if (fs.in_table || fs.uniform_round == round_) return std::nullopt;  // repeated
    fs.uniform_round = round_;
    uniform_ids_.push_back(id);
  }
  std::vector<Response>* out = &uniform_out_;  // the last uniform round's are replaced now
  for (uint32_t i = 0; i < n; ++i) {
    if (out->size() <= i) out->emplace_back();
    Response& resp = (*out)[i];
    FillFast(uniform_ids_[i], &resp);
    if (record_announcements_) {
      resp.announced_us.assign(static_cast<size_t>(size_), now_us);
    } else {
      resp.announced_us.clear();
    }
  }
  repeat_.valid = true, repeat_.n = n, repeat_.frame = f;
  repeat_.cache_changes = cache_.changes();
  return n;
}

void Controller::FillFast(uint32_t id, Response* out) {
  Response& resp = *out;
  resp.type = Response::kRun;
  const uint32_t version = cache_.Version(id);
  if (resp.copied_from != id || resp.copied_version != version) {
    resp.req = *cache_.Get(id);  // into the capacity of an earlier round's response
    resp.copied_from = id, resp.copied_version = version;
  }
  resp.by_rank.clear();
  resp.error_code = Code::kOk;
  resp.error.clear();
  resp.contributors = size_ - joined_count_;
  resp.last_joined = -1;
  resp.cache_id = id;
}

void Controller::BuildFast(uint32_t id, Response* out) {
  FastSlot& fs = fast_[id];
  Response& resp = *out;
  FillFast(id, &resp);
  int64_t* us = FastUs(id);
  if (record_announcements_) {
    resp.announced_us.assign(us, us + size_);
  } else {
    resp.announced_us.clear();
  }
  fs.count = 0;
  --fast_pending_;
  std::fill(us, us + size_, -1);
  if (std::optional<Response> e = JoinedError(resp.req)) {
    e->cache_id = id;
    e->announced_us = std::move(resp.announced_us);
    resp = std::move(*e);
  }
}

std::optional<Response> Controller::JoinedError(const Request& req) const {
  if (joined_count_ == 0 || !(NeedsAllRanks(req.kind) || req.device)) return std::nullopt;
  std::vector<int> joined;
  for (int r = 0; r < size_; ++r) {
    if (joined_[r]) joined.push_back(r);
  }
  Response resp;
  resp.req = req;
  resp.contributors = size_ - joined_count_;
  resp.type = Response::kError;
  resp.error_code = Code::kJoined;
  resp.error = "tensor '" + req.name + "': " + KindName(req.kind) +
               (req.device ? " of device memory" : "") +
               " is not possible while ranks have joined (" + RankList(joined) +
               "); only host allreduce and barrier run until every rank has joined";
  return resp;
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
    resp.error_code = Code::kMismatch;
    resp.error = "tensor '" + name + "': ranks disagree on the " + field + ": " + detail;
    return resp;
  }
  if (resp.req.kind == Kind::kJoin) {
    resp.type = Response::kJoinDone;
    resp.last_joined = last_joined_;
    return resp;
  }
  if (std::optional<Response> e = JoinedError(resp.req)) {
    e->announced_us = std::move(resp.announced_us);
    return std::move(*e);
  }
  if (resp.req.kind == Kind::kAllgather || resp.req.kind == Kind::kAlltoall) {
    resp.by_rank = s.by_rank;
    if (resp.req.kind == Kind::kAlltoall) {
      for (int r = 0; r < size_; ++r) {
        if (s.by_rank[r]->send_rows.size() != static_cast<size_t>(size_)) {
          resp.type = Response::kError;
          resp.error_code = Code::kMismatch;
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

// A join is not a stall: the ranks that have not joined are the ones that still have data, and
// may train for long after (Horovod's stall inspector does not see joins either).
bool Controller::IsJoin(const Slot& s) {
  const std::optional<Request>& first = s.by_rank[s.first_rank];
  return first && first->kind == Kind::kJoin;
}

int64_t Controller::OldestPendingUs() const {
  int64_t oldest = -1;
  auto consider = [&](int64_t t) { oldest = oldest < 0 ? t : std::min(oldest, t); };
  for (const auto& [name, s] : table_) {
    if (!IsJoin(s)) consider(s.first_us);
  }
  int left = fast_pending_;
  for (uint32_t id = 0; left > 0 && id < fast_.size(); ++id) {
    if (fast_[id].count > 0) consider(fast_[id].first_us), --left;
  }
  return oldest;
}

std::vector<PendingView> Controller::Pending() const {
  std::vector<PendingView> out;
  for (const auto& [name, s] : table_) {
    if (IsJoin(s)) continue;
    PendingView v{&name, s.first_us, std::vector<bool>(size_)};
    for (int r = 0; r < size_; ++r) v.announced[r] = s.by_rank[r].has_value() || joined_[r];
    out.push_back(std::move(v));
  }
  for (uint32_t id = 0; fast_pending_ > 0 && id < fast_.size(); ++id) {
    const FastSlot& fs = fast_[id];
    if (fs.count == 0) continue;
    PendingView v{&cache_.Get(id)->name, fs.first_us, std::vector<bool>(size_)};
    const int64_t* us = FastUs(id);
    for (int r = 0; r < size_; ++r) v.announced[r] = us[r] >= 0 || joined_[r];
    out.push_back(std::move(v));
  }
  return out;
}

}  // namespace ringrun::runtime::engine
