#include "runtime/src/collectives.h"

#include <algorithm>
#include <cstring>

namespace ringrun::runtime {
namespace {

char* At(void* p, size_t off) { return static_cast<char*>(p) + off; }
const char* At(const void* p, size_t off) { return static_cast<const char*>(p) + off; }

bool Overlap(const void* a, size_t an, const void* b, size_t bn) {
  const char* x = static_cast<const char*>(a);
  const char* y = static_cast<const char*>(b);
  return an > 0 && bn > 0 && x < y + bn && y < x + an;
}

// Appends ops, skipping empty ones (both sides skip the same ones: sizes agree).
void AddSend(std::vector<transport::Op>& ops, int peer, const void* p, size_t n) {
  if (n > 0) ops.push_back(transport::Op::Send(peer, p, n));
}
void AddRecv(std::vector<transport::Op>& ops, int peer, void* p, size_t n) {
  if (n > 0) ops.push_back(transport::Op::Recv(peer, p, n));
}

Status RunOps(const CollectiveContext& c, std::vector<transport::Op>& ops) {
  if (ops.empty()) return Status::Ok();
  return c.transport->Run(ops, c.deadline);
}

// finish (optional) is applied to this member's own block as its last reduction writes it.
Status RingReduceScatterTo(const CollectiveContext& c, const Group& g, const void* send, void* work,
                           void* final_out, size_t count, size_t elem, ReduceFn fn,
                           const Finish* finish = nullptr) {
  const int n = g.size(), me = g.me;
  std::vector<transport::Op> ops;
  for (int k = 0; k + 1 < n; ++k) {
    const int s = ((me - k - 1) % n + n) % n;
    const int r = ((me - k - 2) % n + 2 * n) % n;
    const BlockRange sb = Block(count, n, s), rb = Block(count, n, r);
    ops.clear();
    AddSend(ops, g.peer(me + 1), At(k == 0 ? send : work, sb.begin * elem), sb.count * elem);
    if (rb.count > 0) {
      void* dst = (r == me && final_out) ? final_out : At(work, rb.begin * elem);
      ops.push_back(transport::Op::RecvReduce(g.peer(me - 1), dst, At(send, rb.begin * elem),
                                              rb.count * elem, fn, elem));
      if (r == me && finish && finish->active()) ops.back().finish = finish;
    }
    RINGRUN_RETURN_IF_ERROR(RunOps(c, ops));
  }
  return Status::Ok();
}

Status RecursiveDoubling(const CollectiveContext& c, const Group& g, const void* send, void* recv,
                         size_t count, size_t elem, ReduceFn fn) {
  const int n = g.size(), me = g.me;
  const size_t bytes = count * elem;
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int rem = n - p;
  std::vector<transport::Op> ops;
  const void* cur = send;
  int vr;
  if (me < 2 * rem) {
    if (me % 2 == 0) {  // folds into its odd neighbour, then receives the result
      ops = {transport::Op::Send(g.peer(me + 1), send, bytes)};
      RINGRUN_RETURN_IF_ERROR(RunOps(c, ops));
      ops = {transport::Op::Recv(g.peer(me + 1), recv, bytes)};
      return RunOps(c, ops);
    }
    ops = {transport::Op::RecvReduce(g.peer(me - 1), recv, send, bytes, fn, elem)};
    RINGRUN_RETURN_IF_ERROR(RunOps(c, ops));
    cur = recv;
    vr = me / 2;
  } else {
    vr = me - rem;
  }
  char* tmp = c.scratch->Get(0, bytes);
  for (int mask = 1; mask < p; mask <<= 1) {
    const int pv = vr ^ mask;
    const int partner = pv < rem ? 2 * pv + 1 : pv + rem;
    void* dst = cur == recv ? static_cast<void*>(tmp) : recv;
    // Both partners compute reduce(lower rank's value, higher rank's value): the same bits.
    ops = {transport::Op::Send(g.peer(partner), cur, bytes),
           transport::Op::RecvReduce(g.peer(partner), dst, cur, bytes, fn, elem, partner < me)};
    RINGRUN_RETURN_IF_ERROR(RunOps(c, ops));
    cur = dst;
  }
  if (cur != recv) std::memcpy(recv, cur, bytes);
  if (me < 2 * rem) {
    ops = {transport::Op::Send(g.peer(me - 1), recv, bytes)};
    RINGRUN_RETURN_IF_ERROR(RunOps(c, ops));
  }
  return Status::Ok();
}

// Same number of ranks on every host, more than one host and more than one rank per host:
// returns the local group (my host's members) and the cross group (my local index on each
// host).
bool HierarchicalGroups(const transport::Transport& t, const Group& g, Group* local, Group* cross) {
  const transport::PeerTable& peers = t.peers();
  std::vector<uint32_t> hosts;            // host (address index) of each host slot, in order
  std::vector<std::vector<int>> members;  // group indices per host slot
  for (int i = 0; i < g.size(); ++i) {
    const uint32_t h = peers.address_of_rank[g.ranks[i]];
    auto it = std::find(hosts.begin(), hosts.end(), h);
    if (it == hosts.end()) {
      if (hosts.size() > 64) return false;  // keep this cheap; large jobs use the flat ring
      hosts.push_back(h), members.emplace_back();
      it = hosts.end() - 1;
    }
    members[it - hosts.begin()].push_back(i);
  }
  if (hosts.size() < 2 || members[0].size() < 2) return false;
  for (const auto& m : members) {
    if (m.size() != members[0].size()) return false;
  }
  const uint32_t my_host = peers.address_of_rank[g.ranks[g.me]];
  const size_t my_slot = std::find(hosts.begin(), hosts.end(), my_host) - hosts.begin();
  const auto& mine = members[my_slot];
  const size_t my_local = std::find(mine.begin(), mine.end(), g.me) - mine.begin();
  local->ranks.clear(), cross->ranks.clear();
  for (int i : mine) local->ranks.push_back(g.ranks[i]);
  local->me = static_cast<int>(my_local);
  for (const auto& m : members) cross->ranks.push_back(g.ranks[m[my_local]]);
  cross->me = static_cast<int>(my_slot);
  return true;
}

}  // namespace

BlockRange Block(size_t count, int blocks, int index) {
  const size_t n = static_cast<size_t>(blocks), i = static_cast<size_t>(index);
  const size_t base = count / n, extra = count % n;
  return BlockRange{i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

Status RingReduceScatter(const CollectiveContext& c, const Group& g, const void* send, void* recv,
                         size_t count, size_t elem, ReduceFn fn) {
  return RingReduceScatterTo(c, g, send, recv, nullptr, count, elem, fn);
}

Status RingAllgather(const CollectiveContext& c, const Group& g, void* buf, size_t count,
                     size_t elem) {
  const int n = g.size(), me = g.me;
  std::vector<transport::Op> ops;
  for (int k = 0; k + 1 < n; ++k) {
    const BlockRange sb = Block(count, n, ((me - k) % n + n) % n);
    const BlockRange rb = Block(count, n, ((me - k - 1) % n + n) % n);
    ops.clear();
    AddSend(ops, g.peer(me + 1), At(buf, sb.begin * elem), sb.count * elem);
    AddRecv(ops, g.peer(me - 1), At(buf, rb.begin * elem), rb.count * elem);
    RINGRUN_RETURN_IF_ERROR(RunOps(c, ops));
  }
  return Status::Ok();
}

Status Allreduce(const CollectiveContext& c, const Group& g, const void* send, void* recv,
                 size_t count, ringrun_dtype dtype, ReduceFn fn, const Finish* finish) {
  const size_t elem = DtypeSize(dtype), bytes = count * elem;
  const bool finishing = finish && finish->active() && count > 0;
  if (g.size() == 1 || count == 0) {
    if (send != recv && bytes > 0) std::memcpy(recv, send, bytes);
    if (finishing) finish->Apply(recv, count);
    return Status::Ok();
  }
  if (bytes <= kSmallAllreduceBytes || count < static_cast<size_t>(g.size())) {
    RINGRUN_RETURN_IF_ERROR(RecursiveDoubling(c, g, send, recv, count, elem, fn));
    if (finishing) finish->Apply(recv, count);
    return Status::Ok();
  }
  Group local, cross;
  if (c.hierarchical && HierarchicalGroups(*c.transport, g, &local, &cross)) {
    RINGRUN_RETURN_IF_ERROR(RingReduceScatter(c, local, send, recv, count, elem, fn));
    const BlockRange mine = Block(count, local.size(), local.me);
    char* block = At(recv, mine.begin * elem);
    RINGRUN_RETURN_IF_ERROR(Allreduce(c, cross, block, block, mine.count, dtype, fn, finish));
    return RingAllgather(c, local, recv, count, elem);
  }
  // Each member finishes its own block as the ring's last step reduces it; the allgather then
  // passes finished blocks around.
  RINGRUN_RETURN_IF_ERROR(RingReduceScatterTo(c, g, send, recv, nullptr, count, elem, fn, finish));
  return RingAllgather(c, g, recv, count, elem);
}

namespace {

// Calls fn(segment index, element offset in it, elements) for each piece of the virtual range
// [begin, begin + count) of the segments' concatenation (offsets: each segment's first element).
template <typename Fn>
void ForPieces(const std::vector<Segment>& segs, const std::vector<size_t>& offsets, size_t begin,
               size_t count, Fn fn) {
  size_t i = std::upper_bound(offsets.begin(), offsets.end(), begin) - offsets.begin() - 1;
  while (count > 0) {
    const size_t at = begin - offsets[i];
    const size_t n = std::min(count, segs[i].count - at);
    if (n > 0) fn(i, at, n);
    begin += n, count -= n, ++i;
  }
}

}  // namespace

Status AllreduceSegments(const CollectiveContext& c, const Group& g,
                         const std::vector<Segment>& segs, ringrun_dtype dtype, ReduceFn fn,
                         const Finish* finish) {
  const size_t elem = DtypeSize(dtype);
  const int n = g.size(), me = g.me;
  std::vector<Segment> live;
  std::vector<size_t> offsets;
  size_t total = 0;
  for (const Segment& s : segs) {
    if (s.count == 0) continue;
    live.push_back(s), offsets.push_back(total), total += s.count;
  }
  Group local, cross;
  if (live.size() <= 1 || n == 1 || total * elem <= kSmallAllreduceBytes ||
      total < static_cast<size_t>(n) ||
      (c.hierarchical && HierarchicalGroups(*c.transport, g, &local, &cross))) {
    for (const Segment& s : live) {
      RINGRUN_RETURN_IF_ERROR(Allreduce(c, g, s.send, s.recv, s.count, dtype, fn, finish));
    }
    return Status::Ok();
  }
  const bool finishing = finish && finish->active();
  std::vector<transport::Op> ops;
  // Reduce-scatter (as RingReduceScatterTo, with recv as the work buffer).
  for (int k = 0; k + 1 < n; ++k) {
    const int sblock = ((me - k - 1) % n + n) % n;
    const int rblock = ((me - k - 2) % n + 2 * n) % n;
    const BlockRange sb = Block(total, n, sblock), rb = Block(total, n, rblock);
    ops.clear();
    ForPieces(live, offsets, sb.begin, sb.count, [&](size_t i, size_t at, size_t cnt) {
      const void* from = k == 0 ? live[i].send : static_cast<const void*>(live[i].recv);
      AddSend(ops, g.peer(me + 1), At(from, at * elem), cnt * elem);
    });
    ForPieces(live, offsets, rb.begin, rb.count, [&](size_t i, size_t at, size_t cnt) {
      ops.push_back(transport::Op::RecvReduce(g.peer(me - 1), At(live[i].recv, at * elem),
                                              At(live[i].send, at * elem), cnt * elem, fn, elem));
      if (rblock == me && finishing) ops.back().finish = finish;
    });
    RINGRUN_RETURN_IF_ERROR(RunOps(c, ops));
  }
  // Allgather of the finished blocks.
  for (int k = 0; k + 1 < n; ++k) {
    const BlockRange sb = Block(total, n, ((me - k) % n + n) % n);
    const BlockRange rb = Block(total, n, ((me - k - 1) % n + n) % n);
    ops.clear();
    ForPieces(live, offsets, sb.begin, sb.count, [&](size_t i, size_t at, size_t cnt) {
      AddSend(ops, g.peer(me + 1), At(live[i].recv, at * elem), cnt * elem);
    });
    ForPieces(live, offsets, rb.begin, rb.count, [&](size_t i, size_t at, size_t cnt) {
      AddRecv(ops, g.peer(me - 1), At(live[i].recv, at * elem), cnt * elem);
    });
    RINGRUN_RETURN_IF_ERROR(RunOps(c, ops));
  }
  return Status::Ok();
}

Status Broadcast(const CollectiveContext& c, const Group& g, void* buf, size_t bytes, int root) {
  const int n = g.size();
  if (n == 1 || bytes == 0) return Status::Ok();
  const int vr = (g.me - root + n) % n;
  auto real = [&](int v) { return g.peer(v + root); };
  std::vector<transport::Op> ops;
  if (bytes <= kSmallBroadcastBytes || n == 2) {  // binomial tree
    int mask = 1;
    while (mask < n) {
      if (vr & mask) {
        ops = {transport::Op::Recv(real(vr - mask), buf, bytes)};
        RINGRUN_RETURN_IF_ERROR(RunOps(c, ops));
        break;
      }
      mask <<= 1;
    }
    ops.clear();
    for (mask >>= 1; mask > 0; mask >>= 1) {
      if (vr + mask < n) ops.push_back(transport::Op::Send(real(vr + mask), buf, bytes));
    }
    return RunOps(c, ops);
  }
  // A pipelined chain root -> root+1 -> ...: chunk i arrives while chunk i-1 moves on.
  const size_t chunk = std::clamp<size_t>(bytes / 16, 64 << 10, 4 << 20);
  const size_t chunks = (bytes + chunk - 1) / chunk;
  auto range = [&](size_t i) { return std::min(chunk, bytes - i * chunk); };
  for (size_t i = 0; i <= chunks; ++i) {
    ops.clear();
    if (vr == 0) {
      if (i < chunks) ops.push_back(transport::Op::Send(real(1), At(buf, i * chunk), range(i)));
    } else {
      if (i < chunks)
        ops.push_back(transport::Op::Recv(real(vr - 1), At(buf, i * chunk), range(i)));
      if (i >= 1 && vr + 1 < n) {
        ops.push_back(transport::Op::Send(real(vr + 1), At(buf, (i - 1) * chunk), range(i - 1)));
      }
    }
    RINGRUN_RETURN_IF_ERROR(RunOps(c, ops));
  }
  return Status::Ok();
}

Status Allgather(const CollectiveContext& c, const Group& g, const void* send, void* recv,
                 size_t bytes) {
  const int n = g.size();
  char* mine = At(recv, static_cast<size_t>(g.me) * bytes);
  if (send != mine && bytes > 0) std::memmove(mine, send, bytes);
  if (n == 1 || bytes == 0) return Status::Ok();
  return RingAllgather(c, g, recv, static_cast<size_t>(n) * bytes, 1);
}

Status ReduceScatter(const CollectiveContext& c, const Group& g, const void* send, void* recv,
                     size_t recvcount, ringrun_dtype dtype, ReduceFn fn) {
  const int n = g.size();
  const size_t elem = DtypeSize(dtype), block = recvcount * elem, total = block * n;
  if (recvcount == 0) return Status::Ok();
  if (n == 1) {
    if (send != recv) std::memmove(recv, send, block);
    return Status::Ok();
  }
  if (Overlap(send, total, recv, block) &&
      At(send, static_cast<size_t>(g.me) * block) != static_cast<const char*>(recv)) {
    char* copy = c.scratch->Get(1, total);
    std::memcpy(copy, send, total);
    send = copy;
  }
  char* work = c.scratch->Get(0, total);
  return RingReduceScatterTo(c, g, send, work, recv, recvcount * n, elem, fn);
}

Status Alltoall(const CollectiveContext& c, const Group& g, const void* send, void* recv,
                size_t b) {
  const int n = g.size();
  const size_t total = b * n;
  if (b == 0) return Status::Ok();
  if (Overlap(send, total, recv, total)) {
    char* copy = c.scratch->Get(1, total);
    std::memcpy(copy, send, total);
    send = copy;
  }
  return Alltoallv(c, g, send, std::vector<size_t>(n, b), recv, std::vector<size_t>(n, b));
}

Status Barrier(const CollectiveContext& c, const Group& g) {
  const int n = g.size();
  char out = 1;
  char* in = c.scratch->Get(0, 1);
  std::vector<transport::Op> ops;
  for (int d = 1; d < n; d <<= 1) {  // dissemination
    ops = {transport::Op::Send(g.peer(g.me + d), &out, 1),
           transport::Op::Recv(g.peer(g.me - d), in, 1)};
    RINGRUN_RETURN_IF_ERROR(RunOps(c, ops));
  }
  return Status::Ok();
}

}  // namespace ringrun::runtime

namespace ringrun::runtime {

const char* AllreduceAlgorithm(const transport::Transport& t, const Group& g, size_t count,
                               size_t elem, bool hierarchical) {
  if (g.size() == 1 || count == 0) return "local";
  if (count * elem <= kSmallAllreduceBytes || count < static_cast<size_t>(g.size())) {
    return "recursive_doubling";
  }
  Group local, cross;
  return hierarchical && HierarchicalGroups(t, g, &local, &cross) ? "hierarchical" : "ring";
}

Status Allgatherv(const CollectiveContext& c, const Group& g, const void* send, void* recv,
                  const std::vector<size_t>& bytes) {
  const int n = g.size(), me = g.me;
  std::vector<size_t> off(n + 1, 0);
  for (int i = 0; i < n; ++i) off[i + 1] = off[i] + bytes[i];
  if (bytes[me] > 0 && At(recv, off[me]) != send) std::memmove(At(recv, off[me]), send, bytes[me]);
  std::vector<transport::Op> ops;
  for (int k = 0; k + 1 < n; ++k) {  // ring: pass on the block received in the step before
    const int s = ((me - k) % n + n) % n, r = ((me - k - 1) % n + n) % n;
    ops.clear();
    AddSend(ops, g.peer(me + 1), At(recv, off[s]), bytes[s]);
    AddRecv(ops, g.peer(me - 1), At(recv, off[r]), bytes[r]);
    RINGRUN_RETURN_IF_ERROR(RunOps(c, ops));
  }
  return Status::Ok();
}

Status Alltoallv(const CollectiveContext& c, const Group& g, const void* send,
                 const std::vector<size_t>& send_bytes, void* recv,
                 const std::vector<size_t>& recv_bytes) {
  const int n = g.size(), me = g.me;
  std::vector<size_t> soff(n + 1, 0), roff(n + 1, 0);
  for (int i = 0; i < n; ++i) {
    soff[i + 1] = soff[i] + send_bytes[i];
    roff[i + 1] = roff[i] + recv_bytes[i];
  }
  if (send_bytes[me] > 0) std::memcpy(At(recv, roff[me]), At(send, soff[me]), send_bytes[me]);
  constexpr int kWindow = 8;
  std::vector<transport::Op> ops;
  for (int k0 = 1; k0 < n; k0 += kWindow) {
    ops.clear();
    for (int k = k0; k < std::min(n, k0 + kWindow); ++k) {
      const int to = (me + k) % n, from = (me - k + n) % n;
      AddSend(ops, g.peer(to), At(send, soff[to]), send_bytes[to]);
      AddRecv(ops, g.peer(from), At(recv, roff[from]), recv_bytes[from]);
    }
    RINGRUN_RETURN_IF_ERROR(RunOps(c, ops));
  }
  return Status::Ok();
}

}  // namespace ringrun::runtime
