#include "runtime/src/runtime.h"

#include <cstdlib>
#include <cstring>
#include <thread>

#include "ringrun/common/defaults.h"
#include "ringrun/common/env_contract.h"
#include "runtime/src/gpu/device_backend.h"
#include "runtime/src/reduce.h"

namespace ringrun::runtime {

namespace {

Result<int> ParseInt(const char* name, const char* v, int lo, int hi) {
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || x < lo || x > hi) {
    return InvalidArgument(std::string("environment variable ") + name + "='" + v +
                           "' is not an integer in [" + std::to_string(lo) + ", " +
                           std::to_string(hi) + "]");
  }
  return static_cast<int>(x);
}

Status CheckBuffers(const void* a, const void* b, size_t count) {
  if (count > 0 && (a == nullptr || b == nullptr)) return InvalidArgument("buffer is NULL");
  return Status::Ok();
}

Status CheckDtype(ringrun_dtype dtype) {
  if (!IsValidDtype(dtype)) return InvalidArgument("invalid dtype " + std::to_string(dtype));
  return Status::Ok();
}

Status CheckOp(ringrun_dtype dtype, ringrun_op op) {
  RINGRUN_RETURN_IF_ERROR(CheckDtype(dtype));
  if (!IsValidOp(op)) return InvalidArgument("invalid op " + std::to_string(op));
  if (op == RINGRUN_AVERAGE && !IsFloating(dtype)) {
    return InvalidArgument(std::string("AVERAGE needs a floating dtype, not ") +
                           NameOfDtype(dtype));
  }
  return Status::Ok();
}

Status CheckBytes(size_t count, size_t factor, ringrun_dtype dtype) {
  const size_t elem = DtypeSize(dtype);
  if (factor != 0 && count > SIZE_MAX / elem / factor) return InvalidArgument("count overflows");
  return Status::Ok();
}

bool PartialOverlap(const void* a, const void* b, size_t bytes) {
  const char* x = static_cast<const char*>(a);
  const char* y = static_cast<const char*>(b);
  return x != y && bytes > 0 && x < y + bytes && y < x + bytes;
}

}  // namespace

Result<JobEnv> ReadJobEnv(const std::function<const char*(const char*)>& getenv) {
  JobEnv e;
  const char* rank = getenv(env::kRank);
  const char* size = getenv(env::kSize);
  auto get_int = [&](const char* name, int lo, int hi, int* out) -> Status {
    const char* v = getenv(name);
    if (v == nullptr || *v == '\0') return Status::Ok();
    Result<int> r = ParseInt(name, v, lo, hi);
    if (!r.ok()) return r.status();
    *out = *r;
    return Status::Ok();
  };
  RINGRUN_RETURN_IF_ERROR(get_int("RINGRUN_TIMEOUT_MS", 1, 1 << 30, &e.timeout_ms));
  int disable_shm = 0;
  RINGRUN_RETURN_IF_ERROR(get_int("RINGRUN_DISABLE_SHM", 0, 1, &disable_shm));
  e.use_shm = disable_shm == 0;
  RINGRUN_RETURN_IF_ERROR(get_int("RINGRUN_SHM_RING_KIB", 4, 1 << 20, &e.shm_ring_kib));
  if (e.shm_ring_kib & (e.shm_ring_kib - 1)) {
    return InvalidArgument("RINGRUN_SHM_RING_KIB must be a power of two");
  }
  if (rank == nullptr && size == nullptr) return e;  // not under ringrun
  if (rank == nullptr || size == nullptr) {
    return InvalidArgument(std::string("only one of ") + env::kRank + " and " + env::kSize +
                           " is set");
  }
  e.in_job = true;
  RINGRUN_RETURN_IF_ERROR(get_int(env::kSize, 1, 1 << 24, &e.size));
  RINGRUN_RETURN_IF_ERROR(get_int(env::kRank, 0, e.size - 1, &e.rank));
  RINGRUN_RETURN_IF_ERROR(get_int(env::kLocalRank, 0, e.size - 1, &e.local_rank));
  RINGRUN_RETURN_IF_ERROR(get_int(env::kLocalSize, 1, e.size, &e.local_size));
  RINGRUN_RETURN_IF_ERROR(get_int(env::kCrossRank, 0, e.size - 1, &e.cross_rank));
  RINGRUN_RETURN_IF_ERROR(get_int(env::kCrossSize, 1, e.size, &e.cross_size));
  auto get_str = [&](const char* name, std::string* out) {
    const char* v = getenv(name);
    if (v != nullptr && *v != '\0') *out = v;
  };
  get_str(env::kJobService, &e.job_service);
  get_str(env::kSecret, &e.secret);
  get_str(env::kHostAddr, &e.host_addr);
  get_str(env::kJobId, &e.job_id);
  if (e.size > 1 && e.job_service.empty()) {
    return InvalidArgument(std::string(env::kJobService) + " is not set (job of size " +
                           std::to_string(e.size) + ")");
  }
  return e;
}

Shape DeriveShape(const PeerTable& peers, int rank) {
  Shape s;
  s.rank = rank;
  s.size = peers.size();
  std::vector<int> host_slot(peers.addresses.size(), -1);
  int hosts = 0;
  s.local_rank = 0, s.local_size = 0;
  for (int r = 0; r < peers.size(); ++r) {
    int& slot = host_slot[peers.address_of_rank[r]];
    if (slot < 0) slot = hosts++;
    if (peers.SameHost(r, rank)) {
      if (r < rank) ++s.local_rank;
      ++s.local_size;
    }
  }
  s.cross_rank = host_slot[peers.address_of_rank[rank]];
  s.cross_size = hosts;
  return s;
}

Result<std::unique_ptr<Runtime>> Runtime::Join(const JobEnv& env, JobClient* client, bool* joined) {
  if (joined) *joined = false;
  Shape shape;
  if (!env.in_job || env.size == 1) {
    shape.rank = 0, shape.size = 1;
    return std::make_unique<Runtime>(nullptr, shape, env.timeout_ms);
  }
  Result<Listener> listener = Listen(env.host_addr);
  if (!listener.ok()) {
    return listener.status().Annotate("rank " + std::to_string(env.rank) + ": data-plane listener");
  }
  JoinInfo info;
  info.rank = env.rank;
  info.size = env.size;
  info.address = env.host_addr;
  info.port = listener->port;
  info.generation = env.generation;
  if (env.rank == 0) info.nccl_id = MaybeCreateNcclUniqueId();
  Result<PeerTable> peers =
      client->Join(info, env.join_timeout_ms > 0 ? env.join_timeout_ms : kJoinTimeoutMs);
  if (!peers.ok()) return peers.status().Annotate("rank " + std::to_string(env.rank));
  if (joined) *joined = true;
  if (peers->job_id.empty()) peers->job_id = env.job_id;
  TransportOptions topts;
  topts.use_shm = env.use_shm;
  if (env.shm_ring_kib > 0) topts.shm_ring_bytes = size_t(env.shm_ring_kib) << 10;
  Shape derived = DeriveShape(*peers, env.rank);
  topts.spin = derived.local_size <= static_cast<int>(std::thread::hardware_concurrency());
  shape = derived;
  // The launcher's numbering wins where it gave one.
  if (env.local_rank >= 0) shape.local_rank = env.local_rank;
  if (env.local_size >= 0) shape.local_size = env.local_size;
  if (env.cross_rank >= 0) shape.cross_rank = env.cross_rank;
  if (env.cross_size >= 0) shape.cross_size = env.cross_size;
  std::string nccl_id = peers->nccl_id;
  Result<std::unique_ptr<Transport>> t =
      MakeSocketTransport(env.rank, std::move(peers.value()), std::move(listener.value()), topts);
  if (!t.ok()) return t.status();
  return std::make_unique<Runtime>(std::move(t.value()), shape, env.timeout_ms, nccl_id);
}

Runtime::Runtime(std::unique_ptr<Transport> transport, Shape shape, int timeout_ms,
                 std::string nccl_id)
    : shape_([&] {
        if (transport && (shape.local_rank < 0 || shape.cross_rank < 0)) {
          return DeriveShape(transport->peers(), transport->rank());
        }
        return shape;
      }()),
      timeout_ms_(timeout_ms),
      nccl_id_(std::move(nccl_id)),
      world_([&] {
        Group g;
        for (int r = 0; r < shape_.size; ++r) g.ranks.push_back(r);
        g.me = shape_.rank;
        return g;
      }()),
      transport_(std::move(transport)) {}

Runtime::~Runtime() = default;

Status Runtime::HostStatus() const { return transport_ ? transport_->status() : Status::Ok(); }

Status Runtime::Break(Status st) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!transport_) return st;  // a job of one: no peers to leave mid-collective
  transport_->Break(st);
  return transport_->status();
}

CollectiveContext Runtime::Context() {
  return CollectiveContext{transport_.get(), DeadlineAfter(timeout_ms_), &scratch_};
}

Result<bool> Runtime::RouteToDevice(const void* a, const void* b, DeviceBackend** backend) {
  const bool da = a != nullptr && IsDevicePointer(a);
  const bool db = b != nullptr && IsDevicePointer(b);
  if (!da && !db) return false;
  if (da != db) return InvalidArgument("one buffer is device memory and the other host memory");
  if (!device_ && device_error_.ok()) {
    Result<std::unique_ptr<DeviceBackend>> made =
        MakeDeviceBackend(shape_.rank, shape_.size, shape_.local_rank, nccl_id_, timeout_ms_);
    if (made.ok()) {
      device_ = std::move(made.value());
    } else {
      device_error_ = made.status().Annotate("GPU backend");
    }
  }
  if (!device_) return device_error_;
  *backend = device_.get();
  return true;
}

#define RINGRUN_ROUTE_DEVICE(a, b, call)                 \
  do {                                                   \
    DeviceBackend* dev = nullptr;                        \
    Result<bool> routed = RouteToDevice((a), (b), &dev); \
    if (!routed.ok()) return routed.status();            \
    if (*routed) return dev->call;                       \
  } while (0)

namespace {
Status HostBufferOnStream() {
  return InvalidArgument(
      "the _async variants take CUDA device memory; these buffers are host memory");
}
}  // namespace

Status Runtime::Allreduce(const void* send, void* recv, size_t count, ringrun_dtype dtype,
                          ringrun_op op, void* stream) {
  RINGRUN_RETURN_IF_ERROR(CheckOp(dtype, op));
  RINGRUN_RETURN_IF_ERROR(CheckBytes(count, 1, dtype));
  RINGRUN_RETURN_IF_ERROR(CheckBuffers(send, recv, count));
  if (PartialOverlap(send, recv, count * DtypeSize(dtype))) {
    return InvalidArgument("sendbuf and recvbuf overlap without being equal");
  }
  std::lock_guard<std::mutex> lock(mu_);
  RINGRUN_ROUTE_DEVICE(send, recv, Allreduce(send, recv, count, dtype, op, stream, !stream));
  if (stream) return HostBufferOnStream();
  RINGRUN_RETURN_IF_ERROR(HostStatus());
  const bool average = op == RINGRUN_AVERAGE && shape_.size > 1;
  if (average && dtype == RINGRUN_FLOAT16 && count > 0) {  // see ScaleHalf
    ScaleHalf(static_cast<uint16_t*>(recv), static_cast<const uint16_t*>(send), count,
              1.0f / static_cast<float>(shape_.size));
    return runtime::Allreduce(Context(), world_, recv, recv, count, dtype,
                              GetReduceFn(dtype, RINGRUN_SUM));
  }
  RINGRUN_RETURN_IF_ERROR(
      runtime::Allreduce(Context(), world_, send, recv, count, dtype, GetReduceFn(dtype, op)));
  if (average) DivideInPlace(recv, count, dtype, shape_.size);
  return Status::Ok();
}

Status Runtime::Broadcast(void* buf, size_t count, ringrun_dtype dtype, int root, void* stream) {
  RINGRUN_RETURN_IF_ERROR(CheckDtype(dtype));
  RINGRUN_RETURN_IF_ERROR(CheckBytes(count, 1, dtype));
  RINGRUN_RETURN_IF_ERROR(CheckBuffers(buf, buf, count));
  if (root < 0 || root >= shape_.size) {
    return InvalidArgument("root " + std::to_string(root) + " is not a rank of a job of size " +
                           std::to_string(shape_.size));
  }
  std::lock_guard<std::mutex> lock(mu_);
  RINGRUN_ROUTE_DEVICE(buf, buf, Broadcast(buf, count, dtype, root, stream, !stream));
  if (stream) return HostBufferOnStream();
  RINGRUN_RETURN_IF_ERROR(HostStatus());
  return runtime::Broadcast(Context(), world_, buf, count * DtypeSize(dtype), root);
}

Status Runtime::Allgather(const void* send, void* recv, size_t count, ringrun_dtype dtype,
                          void* stream) {
  RINGRUN_RETURN_IF_ERROR(CheckDtype(dtype));
  RINGRUN_RETURN_IF_ERROR(CheckBytes(count, shape_.size, dtype));
  RINGRUN_RETURN_IF_ERROR(CheckBuffers(send, recv, count));
  std::lock_guard<std::mutex> lock(mu_);
  RINGRUN_ROUTE_DEVICE(send, recv, Allgather(send, recv, count, dtype, stream, !stream));
  if (stream) return HostBufferOnStream();
  RINGRUN_RETURN_IF_ERROR(HostStatus());
  const size_t bytes = count * DtypeSize(dtype);
  const char* mine = static_cast<char*>(recv) + static_cast<size_t>(shape_.rank) * bytes;
  if (PartialOverlap(send, recv, bytes * shape_.size) && send != mine) {
    char* copy = scratch_.Get(2, bytes);
    std::memcpy(copy, send, bytes);
    send = copy;
  }
  return runtime::Allgather(Context(), world_, send, recv, bytes);
}

Status Runtime::ReduceScatter(const void* send, void* recv, size_t recvcount, ringrun_dtype dtype,
                              ringrun_op op) {
  RINGRUN_RETURN_IF_ERROR(CheckOp(dtype, op));
  RINGRUN_RETURN_IF_ERROR(CheckBytes(recvcount, shape_.size, dtype));
  RINGRUN_RETURN_IF_ERROR(CheckBuffers(send, recv, recvcount));
  std::lock_guard<std::mutex> lock(mu_);
  {
    DeviceBackend* dev = nullptr;
    Result<bool> routed = RouteToDevice(send, recv, &dev);
    if (!routed.ok()) return routed.status();
    if (*routed) return InvalidArgument("reducescatter on device memory is not supported yet");
  }
  RINGRUN_RETURN_IF_ERROR(HostStatus());
  const bool average = op == RINGRUN_AVERAGE && shape_.size > 1;
  if (average && dtype == RINGRUN_FLOAT16 && recvcount > 0) {  // see ScaleHalf
    const size_t total = recvcount * static_cast<size_t>(shape_.size);
    uint16_t* scaled = reinterpret_cast<uint16_t*>(scratch_.Get(3, total * sizeof(uint16_t)));
    ScaleHalf(scaled, static_cast<const uint16_t*>(send), total,
              1.0f / static_cast<float>(shape_.size));
    return runtime::ReduceScatter(Context(), world_, scaled, recv, recvcount, dtype,
                                  GetReduceFn(dtype, RINGRUN_SUM));
  }
  RINGRUN_RETURN_IF_ERROR(runtime::ReduceScatter(Context(), world_, send, recv, recvcount, dtype,
                                                 GetReduceFn(dtype, op)));
  if (average) DivideInPlace(recv, recvcount, dtype, shape_.size);
  return Status::Ok();
}

Status Runtime::Alltoall(const void* send, void* recv, size_t count_per_rank, ringrun_dtype dtype) {
  RINGRUN_RETURN_IF_ERROR(CheckDtype(dtype));
  RINGRUN_RETURN_IF_ERROR(CheckBytes(count_per_rank, shape_.size, dtype));
  RINGRUN_RETURN_IF_ERROR(CheckBuffers(send, recv, count_per_rank));
  std::lock_guard<std::mutex> lock(mu_);
  {
    DeviceBackend* dev = nullptr;
    Result<bool> routed = RouteToDevice(send, recv, &dev);
    if (!routed.ok()) return routed.status();
    if (*routed) return InvalidArgument("alltoall on device memory is not supported yet");
  }
  RINGRUN_RETURN_IF_ERROR(HostStatus());
  return runtime::Alltoall(Context(), world_, send, recv, count_per_rank * DtypeSize(dtype));
}

Status Runtime::Barrier() {
  std::lock_guard<std::mutex> lock(mu_);
  RINGRUN_RETURN_IF_ERROR(HostStatus());
  if (shape_.size == 1) return Status::Ok();
  return runtime::Barrier(Context(), world_);
}

}  // namespace ringrun::runtime
