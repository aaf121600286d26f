// Host execution: one function per collective kind over the CPU transport (a job of one
// runs them locally), the fused allreduce through the fusion buffer, and their timeline spans.
#include <algorithm>
#include <cstring>

#include "runtime/src/engine/buffers.h"
#include "runtime/src/engine/engine.h"
#include "runtime/src/reduce.h"

namespace ringrun::runtime::engine {

Status Engine::HostAllreduce(std::vector<Segment> segments, const Request& req, int contributors,
                             const char* span) {
  const int n = options_.size;
  const ringrun_dtype dtype = req.dtype;
  const size_t elem = DtypeSize(dtype);
  size_t total = 0;
  for (const Segment& sg : segments) total += sg.count;
  if (total == 0) return Status::Ok();
  const int divisor = (req.flags & RINGRUN_AVERAGE_BY_CONTRIBUTORS) ? std::max(contributors, 1) : n;
  const bool average = req.op == RINGRUN_AVERAGE && divisor > 1;
  const ReduceFn fn = GetReduceFn(dtype, req.op);
  double pre = req.prescale;
  if (average && dtype == RINGRUN_FLOAT16) pre /= divisor;  // see ScaleHalf
  if (pre != 1.0) {
    for (Segment& sg : segments) {
      if (sg.send != sg.recv) std::memcpy(sg.recv, sg.send, sg.count * elem);
      if (dtype == RINGRUN_FLOAT16) {
        ScaleHalf(static_cast<uint16_t*>(sg.recv), static_cast<const uint16_t*>(sg.recv), sg.count,
                  static_cast<float>(pre));
      } else {
        ScaleInPlace(sg.recv, sg.count, dtype, pre);
      }
      sg.send = sg.recv;
    }
  }
  Finish finish;
  finish.dtype = dtype;
  if (average && dtype != RINGRUN_FLOAT16) finish.divisor = divisor;
  finish.factor = req.postscale;
  const int64_t t0 = Now();
  if (transport_) {
    RINGRUN_RETURN_IF_ERROR(
        runtime::AllreduceSegments(Context(), world_, segments, dtype, fn, &finish));
  } else {
    for (const Segment& sg : segments) {
      if (sg.send != sg.recv) std::memcpy(sg.recv, sg.send, sg.count * elem);
      finish.Apply(sg.recv, sg.count);
    }
  }
  if (timeline_ && span) {
    const char* algo =
        transport_ ? AllreduceAlgorithm(*transport_, world_, total, elem, hierarchical_) : "local";
    timeline_->Span(span, "ALLREDUCE", t0, Now(),
                    "\"bytes\": " + std::to_string(total * elem) + ", \"buffers\": " +
                        std::to_string(segments.size()) + ", \"algorithm\": \"" + algo + "\"");
  }
  return Status::Ok();
}

Status Engine::RunAllreduce(const Response& r, Entry* e) {
  const size_t bytes = r.req.count * r.req.ElemBytes();
  if (e) {
    return HostAllreduce({Segment{e->send, e->recv, r.req.count}}, r.req, r.contributors,
                         r.req.name.c_str());
  }
  // Joined: contribute zeros.
  if (zeros_.size() < bytes) zeros_.resize(bytes);
  std::memset(zeros_.data(), 0, bytes);
  return HostAllreduce({Segment{zeros_.data(), zeros_.data(), r.req.count}}, r.req, r.contributors,
                       r.req.name.c_str());
}

Status Engine::RunFused(Batch& b) {
  const Request& key = b.responses[0]->req;
  const size_t elem = key.ElemBytes();
  const size_t threshold = fusion_.threshold();
  // Packed() for this batch's dtype (every response in it has key's).
  auto packed = [&](const Request& q) {
    const size_t bytes = q.count * elem;
    return bytes <= threshold && bytes < kDirectAllreduceBytes;
  };
  // The small ones are packed into the fusion buffer (one segment); the large ones are segments
  // of their own, reduced where they are. A joined rank contributes zeros for each.
  // (Only while ranks have joined: this rank has an entry for every response otherwise.)
  size_t zero_bytes = 0;
  if (b.responses[0]->contributors != options_.size) {
    for (size_t i = 0; i < b.responses.size(); ++i) {
      if (!b.locals[i] && !packed(b.responses[i]->req)) {
        zero_bytes += b.responses[i]->req.count * elem;
      }
    }
  }
  if (zero_bytes > 0) {
    if (zeros_.size() < zero_bytes) zeros_.resize(zero_bytes);
    std::memset(zeros_.data(), 0, zero_bytes);
  }
  char* buf = b.bytes > 0 ? fusion_.data() : nullptr;
  std::vector<Segment> segments;
  if (buf) segments.push_back(Segment{buf, buf, b.bytes / elem});
  size_t off = 0, zero_off = 0;
  const int64_t t0 = Now();
  for (size_t i = 0; i < b.responses.size(); ++i) {
    const Request& q = b.responses[i]->req;
    const size_t bytes = q.count * elem;
    if (!packed(q)) {
      if (b.locals[i]) {
        segments.push_back(Segment{b.locals[i]->send, b.locals[i]->recv, q.count});
      } else {
        segments.push_back(Segment{zeros_.data() + zero_off, zeros_.data() + zero_off, q.count});
        zero_off += bytes;
      }
    } else if (bytes > 0) {
      if (b.locals[i]) {
        CopyBytes(buf + off, b.locals[i]->send, bytes);
      } else {
        std::memset(buf + off, 0, bytes);
      }
      off += bytes;
    }
  }
  const int64_t t1 = Now();
  RINGRUN_RETURN_IF_ERROR(
      HostAllreduce(std::move(segments), key, b.responses[0]->contributors, nullptr));
  const int64_t t2 = Now();
  off = 0;
  size_t total = 0;
  for (size_t i = 0; i < b.responses.size(); ++i) {
    const Request& q = b.responses[i]->req;
    const size_t bytes = q.count * elem;
    total += bytes;
    if (!packed(q)) continue;
    if (b.locals[i] && bytes > 0) CopyBytes(b.locals[i]->recv, buf + off, bytes);
    off += bytes;
  }
  if (timeline_) {
    const int64_t t3 = Now();
    const char* algo =
        transport_ ? AllreduceAlgorithm(*transport_, world_, total / elem, elem, hierarchical_)
                   : "local";
    const std::string args = "\"fused_bytes\": " + std::to_string(total) +
                             ", \"fused_tensors\": " + std::to_string(b.responses.size()) +
                             ", \"packed_bytes\": " + std::to_string(b.bytes) +
                             ", \"algorithm\": \"" + algo + "\"";
    for (const Response* r : b.responses) {
      if (Packed(r->req, threshold))
        timeline_->Span(r->req.name, "MEMCPY_IN_FUSION_BUFFER", t0, t1);
      timeline_->Span(r->req.name, "ALLREDUCE", t1, t2, args);
      if (Packed(r->req, threshold))
        timeline_->Span(r->req.name, "MEMCPY_OUT_FUSION_BUFFER", t2, t3);
    }
  }
  return Status::Ok();
}

void Engine::SpanMoved(const Request& q, const char* phase, int64_t t0, size_t bytes) {
  timeline_->Span(q.name, phase, t0, Now(), "\"bytes\": " + std::to_string(bytes));
}

Status Engine::RunBroadcast(const Response& r, Entry* e) {
  const Request& q = r.req;
  const int64_t t0 = Now();
  const size_t bytes = q.count * q.ElemBytes();
  Status st;
  if (transport_) st = runtime::Broadcast(Context(), world_, e->recv, bytes, q.root);
  if (timeline_) SpanMoved(q, "BROADCAST", t0, bytes);
  return st;
}

namespace {

// The result of an allgather or alltoall submitted through a handle: `bytes` that the handle
// holds, and the rows that each rank sent this one.
template <typename RowsFrom>
void* OutputInHandle(HandleState& h, size_t bytes, int n, RowsFrom rows_from) {
  h.output.resize(bytes);
  h.rows.resize(n);
  for (int k = 0; k < n; ++k) h.rows[k] = rows_from(k);
  return h.output.data();
}

}  // namespace

Status Engine::RunAllgather(const Response& r, Entry* e) {
  const int64_t t0 = Now();
  const int n = options_.size, me = options_.rank;
  const size_t elem = r.req.ElemBytes();
  std::vector<size_t> bytes(n);
  size_t total = 0;
  for (int k = 0; k < n; ++k) {
    bytes[k] = r.by_rank[k]->count * r.by_rank[k]->row_elems * elem;
    total += bytes[k];
  }
  void* out = e->recv;
  if (!r.req.fixed) {
    out = OutputInHandle(*e->handle, total, n, [&](int k) { return r.by_rank[k]->count; });
  } else if (const char* mine = static_cast<char*>(out) + me * bytes[me];
             bytes[me] > 0 && PartialOverlap(e->send, out, total) && e->send != mine) {
    char* copy = scratch_.Get(2, bytes[me]);
    std::memcpy(copy, e->send, bytes[me]);
    e->send = copy;
  }
  Status st;
  if (transport_) {
    st = Allgatherv(Context(), world_, e->send, out, bytes);
  } else if (bytes[me] > 0 && out != e->send) {
    std::memmove(out, e->send, bytes[me]);
  }
  if (timeline_) SpanMoved(r.req, "ALLGATHER", t0, total);
  return st;
}

Status Engine::RunAlltoall(const Response& r, Entry* e) {
  const int64_t t0 = Now();
  const int n = options_.size, me = options_.rank;
  const Request& mine = *r.by_rank[me];
  const size_t elem = mine.ElemBytes();
  std::vector<size_t> send_bytes(n), recv_bytes(n);
  size_t total = 0, send_total = 0;
  for (int k = 0; k < n; ++k) {
    send_bytes[k] = mine.send_rows[k] * mine.row_elems * elem;
    recv_bytes[k] = r.by_rank[k]->send_rows[me] * r.by_rank[k]->row_elems * elem;
    total += recv_bytes[k];
    send_total += send_bytes[k];
  }
  void* out = e->recv;
  const void* send = e->send;
  if (!r.req.fixed) {
    out = OutputInHandle(*e->handle, total, n, [&](int k) { return r.by_rank[k]->send_rows[me]; });
  } else if (send_total > 0 && (PartialOverlap(send, out, total) || send == out)) {
    // Nothing to copy when this rank sends nothing (the buffers may then be null, and
    // scratch_ hands out none: memcpy of a null pointer is undefined even for 0 bytes).
    char* copy = scratch_.Get(1, send_total);
    std::memcpy(copy, send, send_total);
    send = copy;
  }
  Status st;
  if (transport_) {
    st = Alltoallv(Context(), world_, send, send_bytes, out, recv_bytes);
  } else if (total > 0) {
    std::memmove(out, send, total);
  }
  if (timeline_) SpanMoved(r.req, "ALLTOALL", t0, total);
  return st;
}

Status Engine::RunReduceScatter(const Response& r, Entry* e) {
  const Request& q = r.req;
  const int n = options_.size;
  const size_t elem = q.ElemBytes();
  const int64_t t0 = Now();
  const size_t recvcount = q.count;
  Status st;
  if (recvcount > 0) {
    const bool average = q.op == RINGRUN_AVERAGE && n > 1;
    const void* send = e->send;
    ringrun_op op = q.op;
    if (average && q.dtype == RINGRUN_FLOAT16) {  // see ScaleHalf
      const size_t total = recvcount * static_cast<size_t>(n);
      uint16_t* scaled = reinterpret_cast<uint16_t*>(scratch_.Get(3, total * sizeof(uint16_t)));
      ScaleHalf(scaled, static_cast<const uint16_t*>(send), total, 1.0f / static_cast<float>(n));
      send = scaled, op = RINGRUN_SUM;
    }
    if (transport_) {
      st = runtime::ReduceScatter(Context(), world_, send, e->recv, recvcount, q.dtype,
                                  GetReduceFn(q.dtype, op));
    } else if (send != e->recv) {
      std::memmove(e->recv, send, recvcount * elem);
    }
    if (st.ok() && average && q.dtype != RINGRUN_FLOAT16) {
      DivideInPlace(e->recv, recvcount, q.dtype, n);
    }
  }
  if (timeline_) SpanMoved(q, "REDUCESCATTER", t0, recvcount * elem * n);
  return st;
}

}  // namespace ringrun::runtime::engine
