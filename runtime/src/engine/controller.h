// Negotiation: which named tensors run, in what order, and which fail.
//
// The controller is replicated: every rank holds one and feeds it the same input, every rank's
// frame of every round, so every rank computes the same responses in the same order without a
// coordinator. A frame lists the requests a rank announces in that round; a request whose name
// and arguments are in the response cache travels as a 5-byte cache id, else in full.
//
// A cached announcement (the steady state) is counted in an array slot by cache id, without
// touching the table of names; a name that some rank announces in full (its arguments changed,
// or it is new) negotiates in the table, and cached announcements of it join it there.
//
// A name is ready when every rank that has not joined has announced it. Names that become ready
// in one round run in the order of their first announcement (round, then rank, then position
// in that rank's frame). Ready requests that disagree on any field that must match fail on
// every rank with a message naming the tensor, the field and which ranks sent what.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/src/engine/request.h"
#include "runtime/src/engine/response_cache.h"

namespace ringrun::runtime::engine {

struct Response {
  enum Type { kRun, kError, kJoinDone };
  Type type = kRun;
  Request req;  // the agreed request (the first announcing rank's)
  // allgather, alltoall: every rank's request (rows differ); empty for other kinds. A joined
  // rank's slot holds nothing.
  std::vector<std::optional<Request>> by_rank;
  Code error_code = Code::kOk;
  std::string error;
  int contributors = 0;   // ranks that had not joined when it became ready
  int64_t cache_id = -1;  // the response cache's id of its name, if it has one
  // The cache entry (id, version) that `req` was last copied from by the fast path: a response
  // slot that serves the same cached name step after step copies it once.
  int64_t copied_from = -1;
  uint32_t copied_version = 0;
  int last_joined = -1;  // kJoinDone
  // When each rank's announcement reached this rank (local clock, microseconds; -1: joined).
  std::vector<int64_t> announced_us;
};

// A name some ranks have announced and others not (for the stall inspector).
struct PendingView {
  const std::string* name;
  int64_t first_us;             // when this rank first saw it announced
  std::vector<bool> announced;  // by rank
};

class Controller {
 public:
  Controller(int size, size_t cache_capacity);

  // Encodes this rank's frame for the requests it announces now. ids (optional): each one's
  // CachedId, when the caller has it.
  std::string EncodeFrame(const std::vector<const Request*>& announce,
                          const std::vector<int64_t>* ids = nullptr) const;
  // The cache id under which `req` travels (-1: in full). hint: the id it had last time, which
  // is checked first (a comparison instead of a hash).
  int64_t CachedId(const Request& req, int64_t hint = -1) const;
  // How many times the cache entry `id` (< the cache's size) was replaced.
  uint32_t CacheVersion(uint32_t id) const { return cache_.Version(id); }
  // Applies one round: frames[r] is rank r's frame. Returns the responses that are ready, in
  // the agreed order, or kInternal on a malformed frame.
  Result<std::vector<Response>> Apply(const std::vector<std::string>& frames, int64_t now_us);
  // The same for the engine, allocating nothing once warm. Returns k, the number of ready
  // responses, and points *ready at them: in *out for the general path, which writes
  // (*out)[0, k) (*out only grows: its elements beyond k are left as they were, so that a
  // cached response is copied into storage that an earlier round allocated), or in the
  // controller's own storage for the steady state's uniform rounds (uniform()). Valid until
  // the next Apply. equal: every rank's frame is frames[0], the only one given (an exchange
  // that found them equal; Engine::Exchange's uniform).
  Result<size_t> Apply(const std::vector<std::string>& frames, int64_t now_us,
                       std::vector<Response>* out, const Response** ready, bool equal = false);

  // Names announced by some ranks and not all (joined ranks count as announced), but for a
  // pending join: what the stall inspector and a timed-out call report.
  std::vector<PendingView> Pending() const;
  // When the oldest of those was first announced (-1: none), without building Pending().
  int64_t OldestPendingUs() const;
  // Whether responses carry announced_us (for the timeline; a copy per response otherwise).
  void set_record_announcements(bool on) { record_announcements_ = on; }
  bool has_pending() const { return !table_.empty() || fast_pending_ > 0; }
  int joined_count() const { return joined_count_; }
  uint64_t round() const { return round_; }
  // Whether the last Apply was a uniform round (see ApplyUniform), whose responses are in the
  // controller's own storage.
  bool uniform() const { return uniform_; }
  // Whether it was moreover the repeat of the previous uniform round: every rank announced
  // exactly that round's frame and the cache is unchanged, so that its responses are that
  // round's, unchanged and at the same addresses (a caller may reuse what it derived from
  // them, such as a fusion plan), but for announced_us.
  bool repeated() const { return repeated_; }

 private:
  struct Slot {
    std::vector<std::optional<Request>> by_rank;
    std::vector<int64_t> announced_us;
    int count = 0;
    uint64_t first_round = 0;
    int first_rank = 0;
    uint32_t first_index = 0;
    int64_t first_us = 0;
  };
  // The negotiation of a cached request, by cache id (count 0: nothing announced).
  struct FastSlot {
    int count = 0;  // its announcements, by rank, are at FastUs(id): -1 where none
    uint64_t first_round = 0;
    int first_rank = 0;
    uint32_t first_index = 0;
    int64_t first_us = 0;
    bool in_table = false;       // its name negotiates in table_ now
    uint64_t listed_round = 0;   // the round in which it was last found ready
    uint64_t uniform_round = 0;  // the round in which ApplyUniform last saw it
  };
  bool Ready(const Slot& s) const;
  bool Ready(uint32_t fast_id) const;
  static bool IsJoin(const Slot& s);
  Response Build(Slot& s);
  // Apply's shortcut for the steady state (see the definition); nullopt: take the general path.
  // Apply's path for every other round: counts each announcement, and reports what is
  // malformed.
  Result<size_t> ApplyGeneral(const std::vector<std::string>& frames, int64_t now_us,
                              std::vector<Response>* out);
  // It writes its responses to uniform_out_.
  // equal: the frames are known to be equal (only frames[0] is given).
  std::optional<size_t> ApplyUniform(const std::vector<std::string>& frames, int64_t now_us,
                                     bool equal);
  void BuildFast(uint32_t id, Response* resp);  // overwrites every field of *resp
  void FillFast(uint32_t id, Response* resp);   // the same but for announced_us and the slot
  // The error for a kind that cannot run while ranks have joined, or nullopt.
  std::optional<Response> JoinedError(const Request& req) const;
  FastSlot& Fast(uint32_t id);
  int64_t* FastUs(uint32_t id) { return &fast_us_[static_cast<size_t>(id) * size_]; }
  const int64_t* FastUs(uint32_t id) const { return &fast_us_[static_cast<size_t>(id) * size_]; }
  // Moves the cached announcements of `id` into a table slot for its name (a rank announced
  // the name in full, so they must be compared there).
  void MoveToTable(uint32_t id, std::vector<std::string>* touched);

  const int size_;
  ResponseCache cache_;
  std::unordered_map<std::string, Slot> table_;
  std::vector<FastSlot> fast_;    // by cache id
  std::vector<int64_t> fast_us_;  // size_ per cache id: when each rank announced it
  // Apply's, kept for their capacity.
  struct ReadyItem {
    uint64_t round;
    int rank;
    uint32_t index;
    const std::string* name;  // a table slot's, or nullptr for a cached one
    uint32_t id;              // the cache id of a cached one
  };
  std::vector<uint32_t> touched_fast_;
  std::vector<uint32_t> uniform_ids_;
  std::vector<ReadyItem> ready_;
  bool record_announcements_ = true;
  int fast_pending_ = 0;  // fast_ slots with a count
  std::vector<bool> joined_;
  int joined_count_ = 0;
  int last_joined_ = -1;
  uint64_t round_ = 0;
  // The last uniform round's responses, and what recognises its repeat (ApplyUniform).
  std::vector<Response> uniform_out_;
  struct Repeat {
    bool valid = false;
    size_t n = 0;
    uint64_t cache_changes = 0;
    std::string frame;
  } repeat_;
  bool uniform_ = false, repeated_ = false;
};

}  // namespace ringrun::runtime::engine
