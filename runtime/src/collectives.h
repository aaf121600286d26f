// The collective algorithms, written only against Transport.
//
// A Group is an ordered subset of the job's ranks (the whole job, the ranks of one host, or one
// rank per host); algorithms index peers by position in the group. Every function is called by
// every member with matching arguments, and fails (naming the peer) when the transport does.
// Buffers are host memory, already validated by the caller (runtime.cc); send and recv are
// either equal or disjoint unless a function says otherwise.
#pragma once

#include <vector>

#include "runtime/src/transport/transport.h"

namespace ringrun::runtime {

struct Group {
  std::vector<int> ranks;  // global ranks, in group order
  int me = 0;              // my index in ranks
  int size() const { return static_cast<int>(ranks.size()); }
  int peer(int index) const { return ranks[((index % size()) + size()) % size()]; }
};

// Reusable scratch memory, owned by the caller (one per runtime).
class Scratch {
 public:
  char* Get(size_t which, size_t bytes) {
    if (bufs_.size() <= which) bufs_.resize(which + 1);
    if (bufs_[which].size() < bytes) bufs_[which].resize(bytes);
    return bufs_[which].data();
  }

 private:
  std::vector<std::vector<char>> bufs_;
};

struct CollectiveContext {
  transport::Transport* transport;
  Deadline deadline;
  Scratch* scratch;
  // Allreduce may go hierarchical where the group's layout allows (see Allreduce); false: the
  // flat algorithms only (HOROVOD_HIERARCHICAL_ALLREDUCE=0). Every member must pass the same.
  bool hierarchical = true;
};

// Algorithm choice thresholds (bytes of the whole buffer).
inline constexpr size_t kSmallAllreduceBytes = 64 << 10;   // recursive doubling below
inline constexpr size_t kSmallBroadcastBytes = 256 << 10;  // binomial tree below, chain above

// recv = op(send) over the group; op AVERAGE is reduced as SUM, and `finish` (optional: the
// division of AVERAGE, a postscale) is applied to the result, fused into the ring's last
// reduction of each block where the ring runs.
// Small messages: recursive doubling; large: ring reduce-scatter + allgather; when the group
// spans hosts with the same number of ranks on each (and more than one), hierarchical:
// reduce-scatter on each host, allreduce across hosts, allgather on each host.
Status Allreduce(const CollectiveContext& c, const Group& g, const void* send, void* recv,
                 size_t count, ringrun_dtype dtype, ReduceFn fn, const Finish* finish = nullptr);
// One buffer of AllreduceSegments: count elements from send, reduced into recv (may be send).
struct Segment {
  const void* send;
  void* recv;
  size_t count;
};
// Allreduce of several buffers at the cost of one: the ring runs over their concatenation
// without copying them together. A ring block that spans buffers moves as one message per piece
// (every member cuts the same pieces, so each Send meets its RecvReduce), and `finish` applies as
// in Allreduce. Where the ring would not run (a small total, fewer elements than members, a
// hierarchical group), each buffer is reduced on its own.
Status AllreduceSegments(const CollectiveContext& c, const Group& g,
                         const std::vector<Segment>& segments, ringrun_dtype dtype, ReduceFn fn,
                         const Finish* finish = nullptr);
Status Broadcast(const CollectiveContext& c, const Group& g, void* buf, size_t bytes, int root);
// recv block i (bytes each) = member i's send. send may be recv + me * bytes (in place).
Status Allgather(const CollectiveContext& c, const Group& g, const void* send, void* recv,
                 size_t bytes);
// recv = block `me` (recvcount elements) of op(send). send and recv may overlap in any way.
Status ReduceScatter(const CollectiveContext& c, const Group& g, const void* send, void* recv,
                     size_t recvcount, ringrun_dtype dtype, ReduceFn fn);
// Block j of send goes to member j; recv block i comes from member i. May be in place.
Status Alltoall(const CollectiveContext& c, const Group& g, const void* send, void* recv,
                size_t bytes_per_rank);
Status Barrier(const CollectiveContext& c, const Group& g);
// Ragged forms. Allgatherv: recv holds every member's block (bytes[i] bytes) in member order;
// send may be this member's block of recv. Alltoallv: send holds send_bytes[j] bytes for member
// j in order, recv gets recv_bytes[i] bytes from member i in order; send and recv disjoint.
Status Allgatherv(const CollectiveContext& c, const Group& g, const void* send, void* recv,
                  const std::vector<size_t>& bytes);
Status Alltoallv(const CollectiveContext& c, const Group& g, const void* send,
                 const std::vector<size_t>& send_bytes, void* recv,
                 const std::vector<size_t>& recv_bytes);
// The algorithm Allreduce picks for `count` elements of `elem` bytes (for the timeline).
const char* AllreduceAlgorithm(const transport::Transport& t, const Group& g, size_t count,
                               size_t elem, bool hierarchical = true);

// The ring phases, exposed for the hierarchical path and tests. `count` elements are split in
// size() blocks as BlockRange says; after RingReduceScatter member `me` holds block me of the
// reduction in recv (other blocks hold partial sums); RingAllgather then completes recv.
struct BlockRange {
  size_t begin, count;
};
BlockRange Block(size_t count, int blocks, int index);
Status RingReduceScatter(const CollectiveContext& c, const Group& g, const void* send, void* recv,
                         size_t count, size_t elem, ReduceFn fn);
Status RingAllgather(const CollectiveContext& c, const Group& g, void* buf, size_t count,
                     size_t elem);

}  // namespace ringrun::runtime
