// What one rank asks for under one name (Request: the part every rank must agree on, which
// travels in negotiation), and the local side of it (Entry: buffers and the handle).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ringrun/common/status.h"
#include "ringrun/ringrun.h"
#include "runtime/src/reduce.h"

namespace ringrun::runtime::engine {

enum class Kind : uint8_t {
  kAllreduce = 0,
  kBroadcast = 1,
  kAllgather = 2,
  kAlltoall = 3,
  kReduceScatter = 4,
  kBarrier = 5,
  kJoin = 6,
};
const char* KindName(Kind k);

// The negotiated description of one tensor on one rank. Every field but `rows` and
// `send_rows` (allgather and alltoall, which may differ per rank) must be equal on every rank;
// `shape` is compared as Horovod does (see ShapesAgree).
// A new field must be added to TensorArgs and Engine::UpdateArgs too (a submission's arguments
// are copied field by field), and to Encode, Decode, Identical and Differs.
struct Request {
  std::string name;
  Kind kind = Kind::kAllreduce;
  ringrun_dtype dtype = RINGRUN_FLOAT32;
  ringrun_op op = RINGRUN_SUM;
  bool device = false;  // CUDA memory
  int32_t root = 0;     // broadcast
  uint64_t count = 0;   // elements: allreduce, broadcast, reducescatter (per rank); allgather rows
  uint64_t row_elems = 1;  // allgather, alltoall
  double prescale = 1.0, postscale = 1.0;
  uint32_t flags = 0;               // RINGRUN_AVERAGE_BY_CONTRIBUTORS
  bool fixed = false;               // blocking allgather/alltoall: equal blocks, caller's buffer
  std::vector<uint64_t> send_rows;  // alltoall: rows to each rank
  // The caller's tensor shape (its dimensions), or none given (`shaped` false: C callers that
  // do not call ringrun_next_shapes, and the blocking calls). Only compared; the engine moves
  // `count` elements whatever it says.
  bool shaped = false;
  std::vector<int64_t> shape;

  // The first field that must match and differs from o's ("collective", "dtype", "count",
  // ...), or "" when they match.
  std::string Differs(const Request& o) const;
  // Whether the shapes agree: unknown on either side, or equal for allreduce, broadcast and
  // reducescatter, or of as many dimensions with the same ones after the first for allgather
  // and alltoall (rows may differ per rank). Other kinds have no shape to agree on.
  bool ShapesAgree(const Request& o) const;
  // Differs(o).empty(), cheaply.
  bool Matches(const Request& o) const;
  // This request's value of such a field, for messages ("float32", "(1, 0.5)", "(2, 3)"...).
  std::string FieldValue(const std::string& field) const;
  // Every field equal, bit for bit (the scale factors too): what the response cache compares.
  bool Identical(const Request& o) const;
  // The same but for the name.
  bool SameArguments(const Request& o) const;
  // Allreduces fuse when these are equal.
  bool Fusable(const Request& o) const {
    return kind == Kind::kAllreduce && o.kind == Kind::kAllreduce && dtype == o.dtype &&
           op == o.op && device == o.device && prescale == o.prescale && postscale == o.postscale &&
           flags == o.flags;
  }
  size_t ElemBytes() const { return DtypeSize(dtype); }
  void Encode(std::string* out) const;
  // Reads one request at *pos; false on malformed input.
  bool Decode(const std::string& in, size_t* pos);
};

// The state a caller holds: one per submission (a grouped allreduce has one for n entries).
struct HandleState;

// One tensor of a submission as its caller gives it to Engine::Submit: the arguments and the
// buffers, viewed. It owns nothing (no string, vector or shared pointer), so that submitting
// costs no construction and no destruction; Submit copies what it keeps into the tensor's
// Entry. The defaults are those of a plain allreduce. `device` is not an argument: Submit
// finds it from the buffers.
struct TensorArgs {
  Kind kind = Kind::kAllreduce;
  ringrun_dtype dtype = RINGRUN_FLOAT32;
  ringrun_op op = RINGRUN_SUM;
  int32_t root = 0;
  uint64_t count = 0;
  uint64_t row_elems = 1;
  double prescale = 1.0, postscale = 1.0;
  uint32_t flags = 0;
  bool fixed = false;
  const uint64_t* send_rows = nullptr;  // alltoall: one per rank of the job (read at Submit)
  const int64_t* shape = nullptr;       // ndims dimensions (read at Submit), or null: unknown
  uint32_t ndims = 0;
  const void* send = nullptr;
  void* recv = nullptr;
  void* stream = nullptr;
};

// The engine's record of one tensor on this rank while in flight (see Engine::Slot).
struct Entry {
  Request req;
  const void* send = nullptr;
  void* recv = nullptr;
  void* stream = nullptr;  // _on_stream: enqueue on this cudaStream_t and return
  // Device memory: a CUDA event recorded on the caller's stream (`stream`, or the legacy
  // default stream) at submission; the engine's stream waits for it before reading.
  std::shared_ptr<void> ready;
  HandleState* handle = nullptr;  // the engine's part of it (see HandleState::flags)
  int64_t submit_us = 0;
};

}  // namespace ringrun::runtime::engine
