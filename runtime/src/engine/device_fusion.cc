#include "runtime/src/engine/device_fusion.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "runtime/src/engine/handles.h"
#include "runtime/src/reduce.h"

namespace ringrun::runtime::engine {
namespace {

bool Overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const char* x = static_cast<const char*>(a);
  const char* y = static_cast<const char*>(b);
  return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

// `send` itself, or a copy of its `bytes` in the fusion buffer when it overlaps `out` in a way
// NCCL does not allow (anything but `in_place`, the position NCCL reads in place).
Result<const void*> Unaliased(gpu::DeviceBackend& dev, const void* send, size_t bytes,
                              const void* out, size_t out_bytes, const void* in_place) {
  if (send == in_place || !Overlap(send, bytes, out, out_bytes)) return send;
  Result<void*> copy = dev.FusionBuffer(bytes);
  if (!copy.ok()) return copy.status();
  RINGRUN_RETURN_IF_ERROR(dev.Copy(*copy, send, bytes));
  return static_cast<const void*>(*copy);
}

const char* Phase(Kind k) {
  switch (k) {
    case Kind::kAllreduce:
      return "NCCL_ALLREDUCE";
    case Kind::kBroadcast:
      return "NCCL_BROADCAST";
    case Kind::kAllgather:
      return "NCCL_ALLGATHER";
    case Kind::kAlltoall:
      return "NCCL_ALLTOALL";
    case Kind::kReduceScatter:
      return "NCCL_REDUCESCATTER";
    default:
      return "NCCL";
  }
}

Status RunFusedAllreduce(gpu::DeviceBackend& dev, int size, const std::vector<DeviceItem>& batch,
                         size_t* moved) {
  const Request& key = batch[0].response->req;
  const size_t elem = key.ElemBytes();
  size_t total = 0;
  for (const DeviceItem& it : batch) total += it.response->req.count * elem;
  *moved = total;
  if (total == 0) return Status::Ok();
  Result<void*> buf = dev.FusionBuffer(total);
  if (!buf.ok()) return buf.status();
  char* base = static_cast<char*>(*buf);
  size_t off = 0;
  for (const DeviceItem& it : batch) {
    const size_t bytes = it.response->req.count * elem;
    RINGRUN_RETURN_IF_ERROR(dev.Copy(base + off, it.entry->send, bytes));
    off += bytes;
  }
  double scale;
  ringrun_op op;
  DeviceScaleAndOp(key, size, &scale, &op);
  RINGRUN_RETURN_IF_ERROR(dev.Allreduce(base, base, total / elem, key.dtype, op, scale));
  off = 0;
  for (const DeviceItem& it : batch) {
    const size_t bytes = it.response->req.count * elem;
    RINGRUN_RETURN_IF_ERROR(dev.Copy(it.entry->recv, base + off, bytes));
    off += bytes;
  }
  return Status::Ok();
}

// A result that the handle owns (ragged allgather, alltoall through a handle).
Result<void*> HandleOutput(gpu::DeviceBackend& dev, HandleState& h, size_t bytes) {
  h.device_output.reset();
  h.device_output_bytes = bytes;
  if (bytes == 0) return static_cast<void*>(nullptr);
  Result<gpu::DeviceMemory> mem = dev.Allocate(bytes);
  if (!mem.ok()) return mem.status();
  h.device_output = std::move(mem.value());
  return h.device_output.get();
}

Status RunOne(gpu::DeviceBackend& dev, int rank, int size, const DeviceItem& item, size_t* moved) {
  const Response& r = *item.response;
  const Request& q = r.req;
  Entry& e = *item.entry;
  const int n = size, me = rank;
  const size_t elem = q.ElemBytes();
  switch (q.kind) {
    case Kind::kAllreduce: {
      *moved = q.count * elem;
      double scale;
      ringrun_op op;
      DeviceScaleAndOp(q, size, &scale, &op);
      return dev.Allreduce(e.send, e.recv, q.count, q.dtype, op, scale);
    }
    case Kind::kBroadcast:
      *moved = q.count * elem;
      return dev.Broadcast(e.recv, q.count, q.dtype, q.root);
    case Kind::kAllgather: {
      std::vector<size_t> counts(n);
      size_t total = 0, before_me = 0;
      for (int k = 0; k < n; ++k) {
        counts[k] = r.by_rank[k]->count * r.by_rank[k]->row_elems;
        if (k < me) before_me += counts[k];
        total += counts[k];
      }
      *moved = total * elem;
      void* out;
      if (q.fixed) {
        out = e.recv;
      } else {
        Result<void*> o = HandleOutput(dev, *e.handle, total * elem);
        if (!o.ok()) return o.status();
        out = *o;
        e.handle->rows.assign(n, 0);
        for (int k = 0; k < n; ++k) e.handle->rows[k] = r.by_rank[k]->count;
      }
      if (total == 0) return Status::Ok();
      Result<const void*> send = Unaliased(dev, e.send, counts[me] * elem, out, total * elem,
                                           static_cast<const char*>(out) + before_me * elem);
      if (!send.ok()) return send.status();
      return dev.Allgatherv(*send, out, counts, q.dtype);
    }
    case Kind::kAlltoall: {
      const Request& mine = *r.by_rank[me];
      std::vector<size_t> send_counts(n), recv_counts(n);
      size_t send_total = 0, recv_total = 0;
      for (int k = 0; k < n; ++k) {
        send_counts[k] = mine.send_rows[k] * mine.row_elems;
        recv_counts[k] = r.by_rank[k]->send_rows[me] * r.by_rank[k]->row_elems;
        send_total += send_counts[k], recv_total += recv_counts[k];
      }
      *moved = recv_total * elem;
      void* out;
      if (q.fixed) {
        out = e.recv;
      } else {
        Result<void*> o = HandleOutput(dev, *e.handle, recv_total * elem);
        if (!o.ok()) return o.status();
        out = *o;
        e.handle->rows.assign(n, 0);
        for (int k = 0; k < n; ++k) e.handle->rows[k] = r.by_rank[k]->send_rows[me];
      }
      // Sends and receives run at once: any overlap (in place included) needs a copy.
      Result<const void*> send =
          Unaliased(dev, e.send, send_total * elem, out, recv_total * elem, nullptr);
      if (!send.ok()) return send.status();
      return dev.Alltoallv(*send, send_counts, out, recv_counts, q.dtype);
    }
    case Kind::kReduceScatter: {
      const size_t block = q.count * elem;
      *moved = block * n;
      if (q.count == 0) return Status::Ok();
      // NCCL's in place form: recv == send + me * block.
      const void* in_place =
          reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(e.recv) - me * block);
      Result<const void*> send = Unaliased(dev, e.send, block * n, e.recv, block, in_place);
      if (!send.ok()) return send.status();
      return dev.ReduceScatter(*send, e.recv, q.count, q.dtype, q.op);
    }
    case Kind::kBarrier:
    case Kind::kJoin:
      break;
  }
  return InvalidArgument(std::string(KindName(q.kind)) + " on device memory");
}

}  // namespace

Status ValidateDeviceRequest(const Request& r) {
  if ((r.kind == Kind::kAllreduce || r.kind == Kind::kReduceScatter) && r.dtype == RINGRUN_INT16) {
    return InvalidArgument(
        "int16 reductions need host memory: NCCL has no 16-bit integer type (reduce the tensor "
        "as int32, or from host memory)");
  }
  if (r.kind == Kind::kAllreduce && (r.prescale != 1.0 || r.postscale != 1.0) &&
      r.op != RINGRUN_SUM && r.op != RINGRUN_AVERAGE) {
    return InvalidArgument(
        std::string("scale factors on device memory need SUM or AVERAGE (NCCL's PreMulSum), not ") +
        NameOfOp(r.op));
  }
  return Status::Ok();
}

void DeviceScaleAndOp(const Request& r, int size, double* scale, ringrun_op* op) {
  *scale = r.prescale * r.postscale;
  *op = r.op;
  if (*scale != 1.0 && *op == RINGRUN_AVERAGE) {
    *scale /= std::max(size, 1);
    *op = RINGRUN_SUM;
  }
}

Status RunDeviceBatch(const DeviceBatchContext& ctx, const std::vector<DeviceItem>& batch) {
  gpu::DeviceBackend& dev = *ctx.backend;
  const int64_t t0 = NowMicros(*ctx.clock);
  std::vector<void*> streams;
  bool wait = false;
  for (const DeviceItem& it : batch) {
    if (it.entry == nullptr) return InvalidArgument("device collective without a local entry");
    RINGRUN_RETURN_IF_ERROR(dev.WaitFor(it.entry->ready));
    if (it.entry->stream == nullptr) {
      wait = true;
    } else if (std::find(streams.begin(), streams.end(), it.entry->stream) == streams.end()) {
      streams.push_back(it.entry->stream);
    }
  }
  size_t moved = 0;
  RINGRUN_RETURN_IF_ERROR(batch.size() > 1 ? RunFusedAllreduce(dev, ctx.size, batch, &moved)
                                           : RunOne(dev, ctx.rank, ctx.size, batch[0], &moved));
  RINGRUN_RETURN_IF_ERROR(dev.Finish(streams, wait));
  if (ctx.timeline) {
    const int64_t t1 = NowMicros(*ctx.clock);
    const std::string args = "\"bytes\": " + std::to_string(moved) +
                             ", \"tensors\": " + std::to_string(batch.size()) +
                             ", \"waited\": " + (wait ? "true" : "false");
    for (const DeviceItem& it : batch) {
      ctx.timeline->Span(it.response->req.name, Phase(it.response->req.kind), t0, t1, args);
    }
  }
  return Status::Ok();
}

}  // namespace ringrun::runtime::engine
