// The C API: a thin shell over one Runtime. The only process-wide state is the pointer to that
// runtime (what ringrun_init builds and ringrun_shutdown withdraws; see Process), and each
// thread's last error.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "ringrun/common/env_contract.h"
#include "ringrun/common/gpu_info.h"
#include "ringrun/common/thread_annotations.h"
#include "ringrun/ringrun.h"
#include "runtime/src/engine/buffers.h"
#include "runtime/src/engine/engine.h"
#include "runtime/src/job_client.h"
#include "runtime/src/reduce.h"
#include "runtime/src/rendezvous/callback_store.h"
#include "runtime/src/rendezvous/pmix_store.h"
#include "runtime/src/rendezvous/store_job_client.h"
#include "runtime/src/runtime.h"

using ringrun::runtime::engine::HandleState;
using ringrun::runtime::engine::Kind;
using ringrun::runtime::engine::TensorArgs;

namespace {

using ringrun::Code;
using ringrun::Status;
using ringrun::runtime::Runtime;
namespace rdzv = ringrun::runtime::rendezvous;

// The edge: the C API's status of a Status code (the runtime and the engine speak Code).
ringrun_status ToC(Code code) {
  switch (code) {
    case Code::kOk:
      return RINGRUN_OK;
    case Code::kInvalidArgument:
      return RINGRUN_ERR_INVALID_ARGUMENT;
    case Code::kNotFound:
      return RINGRUN_ERR_NOT_FOUND;
    case Code::kTimeout:
      return RINGRUN_ERR_TIMEOUT;
    case Code::kUnavailable:
      return RINGRUN_ERR_UNAVAILABLE;
    case Code::kPermissionDenied:
      return RINGRUN_ERR_PERMISSION_DENIED;
    case Code::kAborted:
      return RINGRUN_ERR_ABORTED;
    case Code::kInternal:
      return RINGRUN_ERR_INTERNAL;
    case Code::kMismatch:
      return RINGRUN_ERR_MISMATCH;
    case Code::kDuplicate:
      return RINGRUN_ERR_DUPLICATE_NAME;
    case Code::kJoined:
      return RINGRUN_ERR_JOINED;
  }
  return RINGRUN_ERR_INTERNAL;
}

struct Process {
  ringrun::Mutex init_mu;  // serializes ringrun_init and ringrun_shutdown (held through a join)
  // The runtime that ringrun_init published (null after ringrun_shutdown). A C call reads it
  // with one load, without a count or a lock (a submission is made hundreds of times a step,
  // and counting each call cost two atomic read-modify-writes, about a tenth of a small
  // submission). So a runtime is never destroyed: ringrun_shutdown stops its engine, which
  // releases everything it holds (its thread, connections, shared memory, buffers, the GPU
  // communicator, the timeline file), and a call still in it on another thread then fails
  // ("shutting down"). What is left of each (the objects and the controller's cache of names:
  // kilobytes) is kept here, one per ringrun_init, until the process exits; its doorbell's
  // eventfd goes back to the engine's pool for the next runtime (engine/doorbell.h).
  std::atomic<Runtime*> current{nullptr};
  std::vector<std::unique_ptr<Runtime>> runtimes GUARDED_BY(init_mu);  // every one initialized
  uint32_t joins GUARDED_BY(init_mu) = 0;  // rendezvous rounds joined so far
  // Elastic jobs: the last generation joined (the next init asks for the one after it), and
  // the membership epoch of the last runtime, as it was at its shutdown (with the current
  // runtime's, ringrun_membership_epoch; read without the lock).
  uint32_t elastic_generation GUARDED_BY(init_mu) = 0;
  std::atomic<uint64_t> membership_epoch{0};
  // Under a PMIx launcher: the process's PMIx client, connected at the first ringrun_init and
  // kept until the process exits (rendezvous/pmix_store.h); later rounds join through it too.
  std::unique_ptr<rdzv::PmixStore> pmix GUARDED_BY(init_mu);
};
inline Process& TheProcess() {
  static Process* p = new Process;  // never destroyed: usable from atexit handlers
  return *p;
}

// Initial-exec (as the engine's handle cache): every C call clears it, and this makes that one
// %fs-relative access instead of a call to __tls_get_addr.
__attribute__((tls_model("initial-exec"))) thread_local std::string t_error;

// The shapes that ringrun_next_shapes gave for this thread's next submission: t_shapes_n
// tensors (0: none; a plain load, so that a submission without shapes pays one instruction),
// tensor i's t_shapes.ndims[i] dimensions following those before it in t_shapes.dims.
struct PendingShapes {
  std::vector<uint32_t> ndims;
  std::vector<int64_t> dims;
};
__attribute__((tls_model("initial-exec"))) thread_local size_t t_shapes_n = 0;
__attribute__((tls_model("initial-exec"))) thread_local PendingShapes t_shapes;
// The process set that ringrun_next_process_set gave for this thread's next submission (0:
// the whole job, the engine that Runtime::engine() is).
__attribute__((tls_model("initial-exec"))) thread_local int t_process_set = 0;

// The current runtime, or null (see Process).
Runtime* Current() { return TheProcess().current.load(std::memory_order_acquire); }

ringrun_status Fail(const Status& st) {
  t_error = st.message().empty() ? ringrun::CodeName(st.code()) : st.message();
  return st.ok() ? RINGRUN_ERR_INTERNAL : ToC(st.code());
}
ringrun_status Fail(ringrun_status code, const std::string& message) {
  t_error = message;
  return code;
}
// A submit call that fails before submitting: it still takes this thread's pending shapes.
ringrun_status Refuse(ringrun_status code, const std::string& message) {
  t_shapes_n = 0, t_process_set = 0;
  return Fail(code, message);
}

// Runs f(runtime) -> ringrun_status, turning "not initialized" and any exception into errors
// (nothing may unwind through the C API; a failed submission has communicated nothing).
template <typename F>
ringrun_status Call(F&& f) {
  t_error.clear();
  Runtime* rt = Current();
  if (!rt) {
    t_shapes_n = 0, t_process_set = 0;  // a submit call takes them, whatever it returns
    return Fail(RINGRUN_ERR_NOT_INITIALIZED,
                "ringrun is not initialized (call ringrun_init first)");
  }
  try {
    return f(*rt);
  } catch (const std::bad_alloc&) {
    return Fail(RINGRUN_ERR_INTERNAL, "out of memory");
  } catch (const std::exception& e) {
    return Fail(RINGRUN_ERR_INTERNAL, std::string("unexpected exception: ") + e.what());
  } catch (...) {
    return Fail(RINGRUN_ERR_INTERNAL, "unexpected exception");
  }
}

// A ringrun_handle is the engine's HandleState of the submission: the caller's reference,
// which ringrun_release drops (ReleaseHandle).
HandleState* State(ringrun_handle h) { return reinterpret_cast<HandleState*>(h); }

ringrun_status FromStatus(const Status& st) { return st.ok() ? RINGRUN_OK : Fail(st); }

// Gives tensors[0, n) the pending shapes of this thread (ringrun_next_shapes), taking them.
Status TakeShapes(TensorArgs* tensors, size_t n) {
  const size_t given = t_shapes_n;
  t_shapes_n = 0;
  const Kind kind = tensors[0].kind;
  if (kind == Kind::kBarrier || kind == Kind::kJoin) return Status::Ok();  // nothing to shape
  if (given != n) {
    return ringrun::InvalidArgument("ringrun_next_shapes gave " + std::to_string(given) +
                                    " shapes for a submission of " + std::to_string(n) +
                                    " tensors");
  }
  const int64_t* dims = t_shapes.dims.data();
  for (size_t i = 0; i < n; ++i) {
    tensors[i].shape = dims, tensors[i].ndims = t_shapes.ndims[i];
    dims += t_shapes.ndims[i];
  }
  return Status::Ok();
}

// The engine of this thread's pending process set (ringrun_next_process_set), taking it; a
// refusal takes the pending shapes too. Horovod names the collective in its refusals.
ringrun::Result<ringrun::runtime::engine::Engine*> TakeSetEngine(Runtime& rt, Kind kind) {
  const int id = t_process_set;
  t_process_set = 0;
  // Indexed by Kind (request.h), in Horovod's words.
  static constexpr const char* kWhat[] = {"Allreduce",     "Broadcast", "Allgather", "Alltoall",
                                          "Reducescatter", "Barrier",   "Join"};
  const auto k = static_cast<size_t>(kind);
  const char* what = k < std::size(kWhat) ? kWhat[k] : "Collective";
  ringrun::Result<ringrun::runtime::engine::Engine*> e = rt.SetEngine(id, what);
  if (!e.ok()) t_shapes_n = 0;
  return e;
}

// A process set's engine runs host memory only (ringrun.h, "Process sets"): refused here, at
// submission, on each rank that passes device memory.
Status HostOnly(const ringrun::runtime::engine::Engine& engine, const TensorArgs* tensors,
                size_t n) {
  const auto& is_device = engine.options().is_device;
  for (size_t i = 0; i < n; ++i) {
    for (const void* p : {tensors[i].send, static_cast<const void*>(tensors[i].recv)}) {
      if (p && (is_device ? is_device(p) : ringrun::runtime::engine::IsDeviceMemory(p))) {
        return ringrun::InvalidArgument(
            "device memory on a process set other than the global one is not supported (use "
            "host tensors on it, or the global set)");
      }
    }
  }
  return Status::Ok();
}

// Submits n tensors named `name` (NULL: unnamed; a group's base name) and wraps the result in
// a new handle; they take this thread's pending shapes and process set (`engine`, when
// given, is a set's, already taken; never the job's). Inlined into each submit function: a warm
// allreduce's submission pays one call into the engine, not two.
__attribute__((always_inline)) inline ringrun_status SubmitTensors(
    Runtime& rt, TensorArgs* tensors, size_t n, const char* name, ringrun_handle* handle,
    bool group = false, ringrun::runtime::engine::Engine* engine = nullptr) {
  if (__builtin_expect(t_process_set != 0, 0)) {
    ringrun::Result<ringrun::runtime::engine::Engine*> e = TakeSetEngine(rt, tensors[0].kind);
    if (!e.ok()) return Fail(e.status());
    engine = *e;
  }
  if (__builtin_expect(engine != nullptr, 0) && engine != &rt.engine()) {
    const Status st = HostOnly(*engine, tensors, n);
    if (!st.ok()) {
      t_shapes_n = 0;
      return Fail(st);
    }
  }
  if (__builtin_expect(t_shapes_n != 0, 0)) {
    const Status st = TakeShapes(tensors, n);
    if (!st.ok()) return Fail(st);
  }
  HandleState* h = nullptr;
  const Status st =
      (engine ? *engine : rt.engine())
          .Submit(name ? std::string_view(name) : std::string_view(), tensors, n, group, &h);
  if (!st.ok()) return Fail(st);
  *handle = reinterpret_cast<ringrun_handle>(h);
  return RINGRUN_OK;
}

// Blocking: submit one unnamed tensor and wait.
ringrun_status Blocking(const TensorArgs& t) {
  return Call([&](Runtime& rt) { return FromStatus(rt.SubmitAndWait({}, t)); });
}

TensorArgs MakeArgs(Kind kind, const void* send, void* recv, size_t count, ringrun_dtype dtype) {
  TensorArgs t;
  t.kind = kind;
  t.dtype = dtype, t.count = count;
  t.send = send, t.recv = recv;
  return t;
}

template <typename F>
int Shape(F&& f) {
  Runtime* rt = Current();
  return rt ? f(rt->shape()) : -1;
}

// The end both inits share, with init_mu held: makes the job client (which may fill in env,
// e.g. the secret), joins, and keeps the runtime. A round of the rendezvous that was used up
// counts, even if a later step failed: the next init joins the next round, as the other ranks'
// will. `where` prefixes the messages of unexpected exceptions.
template <typename MakeClient>
ringrun_status JoinAndKeep(Process& p, ringrun::runtime::JobEnv& env, const std::string& where,
                           MakeClient make_client) REQUIRES(p.init_mu) {
  bool joined = false;
  Status st;
  try {
    ringrun::Result<std::unique_ptr<ringrun::runtime::JobClient>> client = make_client(env);
    if (client.ok()) {
      ringrun::Result<std::unique_ptr<Runtime>> rt =
          Runtime::Join(env, client.value().get(), &joined);
      if (rt.ok()) {
        p.runtimes.push_back(std::move(rt.value()));  // kept (see Process)
        p.current.store(p.runtimes.back().get(), std::memory_order_release);
      }
      st = rt.status();
    } else {
      st = client.status();
    }
  } catch (const std::bad_alloc&) {
    st = ringrun::Internal(where + "out of memory");
  } catch (const std::exception& e) {
    st = ringrun::Internal(where + "unexpected exception: " + e.what());
  }
  if (joined) ++p.joins;
  return st.ok() ? RINGRUN_OK : Fail(st);
}

// The job client of a rendezvous through `store` for e.rank of e.size, rank 0's secret shared
// through the store into e.secret first.
ringrun::Result<std::unique_ptr<ringrun::runtime::JobClient>> StoreClient(
    rdzv::Store& store, ringrun::runtime::JobEnv& e, int timeout_ms) {
  if (e.size > 1) {
    ringrun::Result<std::string> secret =
        rdzv::ShareSecret(store, e.rank, e.generation, timeout_ms);
    if (!secret.ok()) return secret.status().Annotate("rank " + std::to_string(e.rank));
    e.secret = std::move(secret.value());
  }
  return rdzv::MakeStoreJobClient(store);
}

int JoinTimeoutMs(const ringrun::runtime::JobEnv& e) {
  return e.join_timeout_ms > 0 ? e.join_timeout_ms : ringrun::kJoinTimeoutMs;
}

// ringrun_init under a PMIx launcher (env.pmix_launcher): the rank and size from PMIx, the
// secret and the peers through the PMIx store. A PMIx server that cannot be joined fails the
// init; where the environment shows a job of several processes, with the refusal that names it.
ringrun_status JoinPmix(Process& p, ringrun::runtime::JobEnv& env) REQUIRES(p.init_mu) {
  const std::string where = "ringrun_init: ";
  // What a failure says: the refusal of the job the environment shows, else this.
  auto refuse = [&](const Status& why) {
    if (env.foreign) return Fail(rdzv::RefuseForeignJob(*env.foreign, why.message()));
    return Fail(
        Status(why.code(), where + "this process was started by " + env.pmix_launcher +
                               " (PMIX_RANK=" + std::getenv("PMIX_RANK") +
                               " PMIX_NAMESPACE=" + std::getenv("PMIX_NAMESPACE") +
                               "), but its PMIx server could not be joined: " + why.message()));
  };
  if (!p.pmix) {
    ringrun::Result<std::unique_ptr<rdzv::PmixStore>> store = rdzv::ConnectPmix(rdzv::SetterOf);
    if (!store.ok()) return refuse(store.status());
    p.pmix = std::move(store.value());
  }
  rdzv::PmixStore* store = p.pmix.get();
  const rdzv::PmixJob& job = store->job();
  if (env.foreign && env.foreign->size > 1 && env.foreign->size != job.size) {
    return refuse(ringrun::InvalidArgument(
        "PMIx says that namespace " + job.nspace + " has " + std::to_string(job.size) +
        " processes, the environment " + std::to_string(env.foreign->size)));
  }
  env.in_job = true;
  env.foreign.reset();
  env.rank = job.rank, env.size = job.size;
  env.local_rank = env.local_size = env.cross_rank = env.cross_size = -1;  // from the peers
  env.job_service.clear();
  env.job_id = job.nspace;
  env.source = "PMIx (" + env.pmix_launcher + ", namespace " + job.nspace + ")";
  if (const char* given = std::getenv(ringrun::env::kHostAddr); given && *given) {
    env.host_addr = given;
  } else {
    ringrun::Result<std::string> addr = rdzv::PmixHostAddress(job);
    if (!addr.ok()) {
      return Fail(addr.status().Annotate(where + "rank " + std::to_string(job.rank) +
                                         ": this host's data-plane address"));
    }
    env.host_addr = *addr;
  }
  const int timeout_ms = JoinTimeoutMs(env);
  return JoinAndKeep(p, env, where, [&](ringrun::runtime::JobEnv& e) {
    return StoreClient(*store, e, timeout_ms);
  });
}

// ringrun_init with `spin` (-1, 0 or 1; see ringrun_init_with_spin).
ringrun_status Init(int spin) {
  t_error.clear();
  if (spin < -1 || spin > 1) {
    return Fail(RINGRUN_ERR_INVALID_ARGUMENT,
                "ringrun_init_with_spin: spin " + std::to_string(spin) + " is not -1, 0 or 1");
  }
  Process& p = TheProcess();
  ringrun::MutexLock init_lock(&p.init_mu);
  if (Current()) return RINGRUN_OK;
  ringrun::Result<ringrun::runtime::JobEnv> env =
      ringrun::runtime::ReadJobEnv([](const char* n) { return std::getenv(n); });
  if (!env.ok()) return Fail(env.status());
  if (env->spin < 0) env->spin = spin;
  env->generation = env->elastic ? p.elastic_generation + 1 : p.joins;
  if (!env->in_job && !env->pmix_launcher.empty()) return JoinPmix(p, *env);
  const ringrun_status st = JoinAndKeep(p, *env, "ringrun_init: ", [](ringrun::runtime::JobEnv& e) {
    std::unique_ptr<ringrun::runtime::JobClient> client;
    if (e.in_job && (e.size > 1 || e.elastic))  // an elastic rank joins even alone
      client = ringrun::runtime::MakeGrpcJobClient(e.job_service, e.secret);
    return ringrun::Result<std::unique_ptr<ringrun::runtime::JobClient>>(std::move(client));
  });
  if (st == RINGRUN_OK && env->elastic && Current() != nullptr) {
    p.elastic_generation = std::max(p.elastic_generation, Current()->generation());
    p.membership_epoch.store(Current()->membership_epoch(), std::memory_order_relaxed);
  }
  return st;
}

// ringrun_init_with_store (ringrun.h): the environment's settings, the rank and size from
// `o`, the secret and the peers from the store.
ringrun_status InitWithStore(const ringrun_store* store, const ringrun_store_options* o) {
  t_error.clear();
  const std::string where = "ringrun_init_with_store: ";
  if (store == nullptr || o == nullptr || !rdzv::CallbackStore::Valid(*store)) {
    return Fail(RINGRUN_ERR_INVALID_ARGUMENT,
                where + "a store with set, get, wait and add, and options, are required");
  }
  if (o->size < 1 || o->rank < 0 || o->rank >= o->size) {
    return Fail(RINGRUN_ERR_INVALID_ARGUMENT, where + "rank " + std::to_string(o->rank) +
                                                  " is not in a job of size " +
                                                  std::to_string(o->size));
  }
  if (o->address == nullptr || *o->address == '\0') {
    return Fail(RINGRUN_ERR_INVALID_ARGUMENT, where + "options.address is required");
  }
  if (o->spin < -1 || o->spin > 1) {
    return Fail(RINGRUN_ERR_INVALID_ARGUMENT,
                where + "spin " + std::to_string(o->spin) + " is not -1, 0 or 1");
  }
  Process& p = TheProcess();
  ringrun::MutexLock init_lock(&p.init_mu);
  if (Current()) return RINGRUN_OK;
  ringrun::Result<ringrun::runtime::JobEnv> env =
      ringrun::runtime::ReadJobEnv([](const char* n) { return std::getenv(n); });
  if (!env.ok()) return Fail(env.status());
  env->in_job = true;
  env->foreign.reset();
  env->rank = o->rank, env->size = o->size;
  env->local_rank = env->local_size = env->cross_rank = env->cross_size = -1;  // from the peers
  env->job_service.clear();
  env->host_addr = o->address;
  env->job_id = o->job_id ? o->job_id : "";
  env->source = o->source ? std::string(o->source) + "'s store" : std::string("a store");
  if (env->spin < 0) env->spin = o->spin;
  env->generation = p.joins;
  const int timeout_ms = JoinTimeoutMs(*env);
  // The store outlives the join (Runtime::Join uses the client, which holds a reference).
  rdzv::CallbackStore callbacks(*store);
  return JoinAndKeep(p, *env, where, [&](ringrun::runtime::JobEnv& e) {
    return StoreClient(callbacks, e, timeout_ms);
  });
}

}  // namespace

extern "C" {

ringrun_status ringrun_init(void) { return Init(-1); }
ringrun_status ringrun_init_with_spin(int spin) { return Init(spin); }
ringrun_status ringrun_init_with_store(const ringrun_store* store,
                                       const ringrun_store_options* options) {
  return InitWithStore(store, options);
}

ringrun_status ringrun_membership_epoch(uint64_t* epoch) {
  t_error.clear();
  if (epoch == nullptr) {
    return Fail(RINGRUN_ERR_INVALID_ARGUMENT, "ringrun_membership_epoch: epoch is NULL");
  }
  // The current runtime's, raised by the job service's notices since its join; between a
  // shutdown and the next init, the last one's.
  Runtime* rt = Current();
  *epoch = std::max(TheProcess().membership_epoch.load(std::memory_order_relaxed),
                    rt ? rt->membership_epoch() : 0);
  return RINGRUN_OK;
}

void ringrun_shutdown(void) {
  Process& p = TheProcess();
  ringrun::MutexLock init_lock(&p.init_mu);
  Runtime* rt = p.current.exchange(nullptr);
  // Stops the engine now (pending handles fail) and releases what it holds, even while another
  // thread is still in a call on it (that call fails).
  if (rt) rt->Shutdown();
  if (rt && rt->membership_epoch() > p.membership_epoch.load(std::memory_order_relaxed)) {
    p.membership_epoch.store(rt->membership_epoch(), std::memory_order_relaxed);
  }
}

int ringrun_rank(void) {
  return Shape([](const auto& s) { return s.rank; });
}
int ringrun_size(void) {
  return Shape([](const auto& s) { return s.size; });
}
int ringrun_local_rank(void) {
  return Shape([](const auto& s) { return s.local_rank; });
}
int ringrun_local_size(void) {
  return Shape([](const auto& s) { return s.local_size; });
}
int ringrun_cross_rank(void) {
  return Shape([](const auto& s) { return s.cross_rank; });
}
int ringrun_cross_size(void) {
  return Shape([](const auto& s) { return s.cross_size; });
}

ringrun_status ringrun_allreduce(const void* sendbuf, void* recvbuf, size_t count,
                                 ringrun_dtype dtype, ringrun_op op) {
  TensorArgs e = MakeArgs(Kind::kAllreduce, sendbuf, recvbuf, count, dtype);
  e.op = op;
  return Blocking(e);
}
ringrun_status ringrun_broadcast(void* buf, size_t count, ringrun_dtype dtype, int root) {
  TensorArgs e = MakeArgs(Kind::kBroadcast, buf, buf, count, dtype);
  e.root = root;
  return Blocking(e);
}
ringrun_status ringrun_allgather(const void* sendbuf, void* recvbuf, size_t count,
                                 ringrun_dtype dtype) {
  return Call(
      [&](Runtime& rt) { return FromStatus(rt.Allgather(sendbuf, recvbuf, count, dtype)); });
}
ringrun_status ringrun_reducescatter(const void* sendbuf, void* recvbuf, size_t recvcount,
                                     ringrun_dtype dtype, ringrun_op op) {
  TensorArgs e = MakeArgs(Kind::kReduceScatter, sendbuf, recvbuf, recvcount, dtype);
  e.op = op;
  return Blocking(e);
}
ringrun_status ringrun_alltoall(const void* sendbuf, void* recvbuf, size_t count_per_rank,
                                ringrun_dtype dtype) {
  return Call([&](Runtime& rt) {
    return FromStatus(rt.Alltoall(sendbuf, recvbuf, count_per_rank, dtype));
  });
}
ringrun_status ringrun_barrier(void) {
  return Blocking(MakeArgs(Kind::kBarrier, nullptr, nullptr, 0, RINGRUN_UINT8));
}
ringrun_status ringrun_join(int* last_joined_rank) {
  return Call([&](Runtime& rt) {
    std::shared_ptr<HandleState> h;
    const Status st =
        rt.SubmitAndWait(ringrun::runtime::engine::kJoinName,
                         MakeArgs(Kind::kJoin, nullptr, nullptr, 0, RINGRUN_UINT8), &h);
    if (!st.ok()) return Fail(st);
    if (last_joined_rank) *last_joined_rank = h->last_joined;
    return RINGRUN_OK;
  });
}

ringrun_status ringrun_start_timeline(const char* path, int mark_cycles) {
  return Call([&](Runtime& rt) {
    if (!path) return Fail(RINGRUN_ERR_INVALID_ARGUMENT, "ringrun_start_timeline: path is NULL");
    return FromStatus(rt.StartTimeline(path, mark_cycles != 0));
  });
}
ringrun_status ringrun_stop_timeline(void) {
  return Call([&](Runtime& rt) { return FromStatus(rt.StopTimeline()); });
}

namespace {
ringrun_status OnStream(TensorArgs e, void* cuda_stream, const char* what) {
  if (!cuda_stream) {
    t_error.clear();
    return Fail(RINGRUN_ERR_INVALID_ARGUMENT, std::string(what) + ": cuda_stream is NULL");
  }
  e.stream = cuda_stream;
  return Blocking(e);
}
}  // namespace

ringrun_status ringrun_allreduce_on_stream(const void* sendbuf, void* recvbuf, size_t count,
                                           ringrun_dtype dtype, ringrun_op op, void* cuda_stream) {
  TensorArgs e = MakeArgs(Kind::kAllreduce, sendbuf, recvbuf, count, dtype);
  e.op = op;
  return OnStream(e, cuda_stream, "ringrun_allreduce_on_stream");
}
ringrun_status ringrun_broadcast_on_stream(void* buf, size_t count, ringrun_dtype dtype, int root,
                                           void* cuda_stream) {
  TensorArgs e = MakeArgs(Kind::kBroadcast, buf, buf, count, dtype);
  e.root = root;
  return OnStream(e, cuda_stream, "ringrun_broadcast_on_stream");
}
ringrun_status ringrun_allgather_on_stream(const void* sendbuf, void* recvbuf, size_t count,
                                           ringrun_dtype dtype, void* cuda_stream) {
  TensorArgs e = MakeArgs(Kind::kAllgather, sendbuf, recvbuf, count, dtype);
  e.fixed = true;
  return OnStream(e, cuda_stream, "ringrun_allgather_on_stream");
}

/* ---- handles ---- */

ringrun_status ringrun_test(ringrun_handle h) {
  if (!h) return Fail(RINGRUN_ERR_INVALID_ARGUMENT, "handle is NULL");
  return State(h)->done() ? ToC(State(h)->code) : RINGRUN_IN_PROGRESS;
}
ringrun_status ringrun_wait_for(ringrun_handle h, int timeout_ms) {
  if (!h) return Fail(RINGRUN_ERR_INVALID_ARGUMENT, "handle is NULL");
  // 0 (or less) is ringrun_test: RINGRUN_IN_PROGRESS, without counting as a waiter (which
  // would end the engine's gathering of a burst of submissions).
  if (timeout_ms <= 0) return State(h)->done() ? ToC(State(h)->code) : RINGRUN_IN_PROGRESS;
  return ToC(ringrun::runtime::engine::WaitHandle(*State(h), timeout_ms));
}
ringrun_status ringrun_wait(ringrun_handle h) {
  if (!h) return Fail(RINGRUN_ERR_INVALID_ARGUMENT, "handle is NULL");
  HandleState& s = *State(h);
  if (s.done()) return ToC(s.code);  // the usual case when collecting a step's handles
  return ToC(ringrun::runtime::engine::WaitHandle(s, s.wait_ms));
}
const char* ringrun_handle_message(ringrun_handle h) {
  if (!h) return "";
  return State(h)->done() ? State(h)->message.c_str() : "";  // written once, before done
}
const char* ringrun_handle_name(ringrun_handle h) { return h ? State(h)->name().c_str() : ""; }
ringrun_status ringrun_handle_output(ringrun_handle h, const void** data, size_t* count) {
  if (!h || !data || !count) return Fail(RINGRUN_ERR_INVALID_ARGUMENT, "NULL argument");
  HandleState& s = *State(h);
  ringrun::MutexLock lock(&s.mu);
  if (s.kind != Kind::kAllgather && s.kind != Kind::kAlltoall) {
    return Fail(RINGRUN_ERR_INVALID_ARGUMENT,
                s.name() + ": only allgather and alltoall have an output");
  }
  if (!s.done() || s.code != Code::kOk) {
    return Fail(RINGRUN_ERR_INVALID_ARGUMENT, s.name() + ": has not completed successfully");
  }
  if (s.device_output) {  // device memory: a device submission's result
    *data = s.device_output.get();
    *count = s.elem ? s.device_output_bytes / s.elem : 0;
    return RINGRUN_OK;
  }
  *data = s.output.data();
  *count = s.elem ? s.output.size() / s.elem : 0;
  return RINGRUN_OK;
}
ringrun_status ringrun_handle_rows(ringrun_handle h, size_t* rows, size_t n) {
  if (!h || (!rows && n)) return Fail(RINGRUN_ERR_INVALID_ARGUMENT, "NULL argument");
  HandleState& s = *State(h);
  ringrun::MutexLock lock(&s.mu);
  if (s.kind != Kind::kAllgather && s.kind != Kind::kAlltoall) {
    return Fail(RINGRUN_ERR_INVALID_ARGUMENT, s.name() + ": only allgather and alltoall have rows");
  }
  if (!s.done() || s.code != Code::kOk) {
    return Fail(RINGRUN_ERR_INVALID_ARGUMENT, s.name() + ": has not completed successfully");
  }
  if (n != s.rows.size()) {
    return Fail(RINGRUN_ERR_INVALID_ARGUMENT,
                "n must be the size of the submission's process set (" +
                    std::to_string(s.rows.size()) + ")");
  }
  for (size_t i = 0; i < n; ++i) rows[i] = s.rows[i];
  return RINGRUN_OK;
}
int ringrun_handle_last_joined_rank(ringrun_handle h) {
  if (!h) return -1;
  HandleState& s = *State(h);
  return s.done() && s.kind == Kind::kJoin ? s.last_joined : -1;
}
void ringrun_release(ringrun_handle h) {
  if (h) ringrun::runtime::engine::ReleaseHandle(State(h));
}

/* ---- submissions ---- */

ringrun_status ringrun_next_shapes(size_t n, const int* ndims, const int64_t* dims) {
  t_error.clear();
  t_shapes_n = 0;
  if (n == 0) return RINGRUN_OK;
  if (!ndims) return Fail(RINGRUN_ERR_INVALID_ARGUMENT, "ringrun_next_shapes: ndims is NULL");
  size_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    if (ndims[i] < 0 || ndims[i] > RINGRUN_MAX_DIMS) {
      return Fail(RINGRUN_ERR_INVALID_ARGUMENT, "ringrun_next_shapes: " + std::to_string(ndims[i]) +
                                                    " dimensions (at most " +
                                                    std::to_string(RINGRUN_MAX_DIMS) + ")");
    }
    total += static_cast<size_t>(ndims[i]);
  }
  if (total > 0 && !dims) {
    return Fail(RINGRUN_ERR_INVALID_ARGUMENT, "ringrun_next_shapes: dims is NULL");
  }
  for (size_t i = 0; i < total; ++i) {
    if (dims[i] < 0) {
      return Fail(RINGRUN_ERR_INVALID_ARGUMENT,
                  "ringrun_next_shapes: dimension " + std::to_string(dims[i]));
    }
  }
  try {
    t_shapes.ndims.assign(ndims, ndims + n);
    t_shapes.dims.assign(dims, dims + total);
  } catch (const std::bad_alloc&) {
    return Fail(RINGRUN_ERR_INTERNAL, "out of memory");
  }
  t_shapes_n = n;
  return RINGRUN_OK;
}

ringrun_status ringrun_allreduce_submit(const char* name, const void* sendbuf, void* recvbuf,
                                        size_t count, ringrun_dtype dtype, ringrun_op op,
                                        double prescale, double postscale, unsigned flags,
                                        ringrun_handle* handle) {
  if (!handle) return Refuse(RINGRUN_ERR_INVALID_ARGUMENT, "handle is NULL");
  *handle = nullptr;
  return Call([&](Runtime& rt) {
    TensorArgs e = MakeArgs(Kind::kAllreduce, sendbuf, recvbuf, count, dtype);
    e.op = op, e.prescale = prescale, e.postscale = postscale, e.flags = flags;
    return SubmitTensors(rt, &e, 1, name, handle);
  });
}
ringrun_status ringrun_grouped_allreduce_submit(const char* name, size_t n,
                                                const void* const* sendbufs, void* const* recvbufs,
                                                const size_t* counts, ringrun_dtype dtype,
                                                ringrun_op op, double prescale, double postscale,
                                                unsigned flags, ringrun_handle* handle) {
  if (!handle) return Refuse(RINGRUN_ERR_INVALID_ARGUMENT, "handle is NULL");
  *handle = nullptr;
  if (n == 0 || !sendbufs || !recvbufs || !counts) {
    return Refuse(RINGRUN_ERR_INVALID_ARGUMENT, "grouped allreduce: empty group or NULL array");
  }
  return Call([&](Runtime& rt) {
    std::vector<TensorArgs> v;
    for (size_t i = 0; i < n; ++i) {
      TensorArgs e = MakeArgs(Kind::kAllreduce, sendbufs[i], recvbufs[i], counts[i], dtype);
      e.op = op, e.prescale = prescale, e.postscale = postscale, e.flags = flags;
      v.push_back(e);
    }
    return SubmitTensors(rt, v.data(), v.size(), name, handle, /*group=*/true);
  });
}
ringrun_status ringrun_broadcast_submit(const char* name, void* buf, size_t count,
                                        ringrun_dtype dtype, int root, ringrun_handle* handle) {
  if (!handle) return Refuse(RINGRUN_ERR_INVALID_ARGUMENT, "handle is NULL");
  *handle = nullptr;
  return Call([&](Runtime& rt) {
    TensorArgs e = MakeArgs(Kind::kBroadcast, buf, buf, count, dtype);
    e.root = root;
    return SubmitTensors(rt, &e, 1, name, handle);
  });
}
ringrun_status ringrun_allgather_submit(const char* name, const void* sendbuf, size_t rows,
                                        size_t row_elems, ringrun_dtype dtype,
                                        ringrun_handle* handle) {
  if (!handle) return Refuse(RINGRUN_ERR_INVALID_ARGUMENT, "handle is NULL");
  *handle = nullptr;
  return Call([&](Runtime& rt) {
    TensorArgs e = MakeArgs(Kind::kAllgather, sendbuf, nullptr, rows, dtype);
    e.row_elems = row_elems;
    return SubmitTensors(rt, &e, 1, name, handle);
  });
}
ringrun_status ringrun_alltoall_submit(const char* name, const void* sendbuf,
                                       const size_t* send_rows, size_t row_elems,
                                       ringrun_dtype dtype, ringrun_handle* handle) {
  if (!handle) return Refuse(RINGRUN_ERR_INVALID_ARGUMENT, "handle is NULL");
  *handle = nullptr;
  if (!send_rows) return Refuse(RINGRUN_ERR_INVALID_ARGUMENT, "send_rows is NULL");
  return Call([&](Runtime& rt) {
    static_assert(sizeof(size_t) == sizeof(uint64_t));
    ringrun::runtime::engine::Engine* set = nullptr;
    if (t_process_set != 0) {  // send_rows has one entry per rank of the set
      ringrun::Result<ringrun::runtime::engine::Engine*> e = TakeSetEngine(rt, Kind::kAlltoall);
      if (!e.ok()) return Fail(e.status());
      set = *e;
    }
    TensorArgs e = MakeArgs(Kind::kAlltoall, sendbuf, nullptr, 0, dtype);
    e.row_elems = row_elems;
    e.send_rows = reinterpret_cast<const uint64_t*>(send_rows);
    const int size = set ? set->options().size : rt.shape().size;
    for (int r = 0; r < size; ++r) e.count += send_rows[r];
    return SubmitTensors(rt, &e, 1, name, handle, false, set);
  });
}
ringrun_status ringrun_reducescatter_submit(const char* name, const void* sendbuf, void* recvbuf,
                                            size_t recvcount, ringrun_dtype dtype, ringrun_op op,
                                            ringrun_handle* handle) {
  if (!handle) return Refuse(RINGRUN_ERR_INVALID_ARGUMENT, "handle is NULL");
  *handle = nullptr;
  return Call([&](Runtime& rt) {
    TensorArgs e = MakeArgs(Kind::kReduceScatter, sendbuf, recvbuf, recvcount, dtype);
    e.op = op;
    return SubmitTensors(rt, &e, 1, name, handle);
  });
}
ringrun_status ringrun_barrier_submit(ringrun_handle* handle) {
  if (!handle) return Refuse(RINGRUN_ERR_INVALID_ARGUMENT, "handle is NULL");
  *handle = nullptr;
  return Call([&](Runtime& rt) {
    TensorArgs e = MakeArgs(Kind::kBarrier, nullptr, nullptr, 0, RINGRUN_UINT8);
    return SubmitTensors(rt, &e, 1, nullptr, handle);
  });
}
ringrun_status ringrun_join_submit(ringrun_handle* handle) {
  if (!handle) return Refuse(RINGRUN_ERR_INVALID_ARGUMENT, "handle is NULL");
  *handle = nullptr;
  return Call([&](Runtime& rt) {
    TensorArgs e = MakeArgs(Kind::kJoin, nullptr, nullptr, 0, RINGRUN_UINT8);
    return SubmitTensors(rt, &e, 1, ringrun::runtime::engine::kJoinName.data(), handle);
  });
}

/* ---- process sets ---- */

ringrun_status ringrun_add_process_set(const int* ranks, size_t n, int* id) {
  if (!id || (!ranks && n)) {
    t_error.clear();
    return Fail(RINGRUN_ERR_INVALID_ARGUMENT, "ringrun_add_process_set: NULL argument");
  }
  *id = -1;
  return Call([&](Runtime& rt) {
    ringrun::Result<int> added = rt.AddProcessSet(std::vector<int>(ranks, ranks + n));
    if (!added.ok()) return Fail(added.status());
    *id = *added;
    return RINGRUN_OK;
  });
}
ringrun_status ringrun_remove_process_set(int id) {
  return Call([&](Runtime& rt) { return FromStatus(rt.RemoveProcessSet(id)); });
}
ringrun_status ringrun_next_process_set(int id) {
  t_error.clear();
  if (id < 0) {
    t_process_set = 0;
    return Fail(RINGRUN_ERR_INVALID_ARGUMENT,
                "ringrun_next_process_set: id " + std::to_string(id) + " is not a process set");
  }
  t_process_set = id;
  return RINGRUN_OK;
}
int ringrun_process_set_rank(int id) {
  Runtime* rt = Current();
  return rt ? rt->SetRank(id) : -1;
}
int ringrun_process_set_size(int id) {
  Runtime* rt = Current();
  return rt ? rt->SetSize(id) : -1;
}

const char* ringrun_error_message(void) { return t_error.c_str(); }
const char* ringrun_status_name(ringrun_status status) {
  switch (status) {
    case RINGRUN_OK:
      return "RINGRUN_OK";
    case RINGRUN_ERR_INVALID_ARGUMENT:
      return "RINGRUN_ERR_INVALID_ARGUMENT";
    case RINGRUN_ERR_NOT_FOUND:
      return "RINGRUN_ERR_NOT_FOUND";
    case RINGRUN_ERR_TIMEOUT:
      return "RINGRUN_ERR_TIMEOUT";
    case RINGRUN_ERR_UNAVAILABLE:
      return "RINGRUN_ERR_UNAVAILABLE";
    case RINGRUN_ERR_PERMISSION_DENIED:
      return "RINGRUN_ERR_PERMISSION_DENIED";
    case RINGRUN_ERR_ABORTED:
      return "RINGRUN_ERR_ABORTED";
    case RINGRUN_ERR_INTERNAL:
      return "RINGRUN_ERR_INTERNAL";
    case RINGRUN_ERR_MISMATCH:
      return "RINGRUN_ERR_MISMATCH";
    case RINGRUN_ERR_DUPLICATE_NAME:
      return "RINGRUN_ERR_DUPLICATE_NAME";
    case RINGRUN_ERR_NOT_INITIALIZED:
      return "RINGRUN_ERR_NOT_INITIALIZED";
    case RINGRUN_ERR_JOINED:
      return "RINGRUN_ERR_JOINED";
    case RINGRUN_IN_PROGRESS:
      return "RINGRUN_IN_PROGRESS";
    case RINGRUN_STATUS_MIN_ENUM_:
    case RINGRUN_STATUS_MAX_ENUM_:
      break;
  }
  return "RINGRUN_ERR_UNKNOWN";
}
size_t ringrun_dtype_size(ringrun_dtype dtype) { return ringrun::runtime::DtypeSize(dtype); }

int ringrun_nccl_version(void) {
  const ringrun::GpuBuildInfo info = ringrun::GetGpuBuildInfo();
  return info.have_nccl ? info.nccl_header_version : 0;
}

}  // extern "C"
