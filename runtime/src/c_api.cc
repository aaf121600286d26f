// The C API: a thin shell over one Runtime. The only process-wide state is the pointer to that
// runtime (what ringrun_init builds and ringrun_shutdown drops), and each thread's last error.
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <string>

#include "ringrun/ringrun.h"
#include "runtime/src/job_client.h"
#include "runtime/src/reduce.h"
#include "runtime/src/runtime.h"

namespace {

using ringrun::Status;
using ringrun::runtime::Runtime;

struct Process {
  std::mutex mu;
  std::shared_ptr<Runtime> runtime;  // guarded by mu
  uint32_t joins = 0;                // rendezvous rounds joined so far; guarded by mu
};
Process& TheProcess() {
  static Process* p = new Process;  // never destroyed: usable from atexit handlers
  return *p;
}

thread_local std::string t_error;

std::shared_ptr<Runtime> Current() {
  std::lock_guard<std::mutex> lock(TheProcess().mu);
  return TheProcess().runtime;
}

int Fail(const Status& st) {
  t_error = st.message().empty() ? ringrun::CodeName(st.code()) : st.message();
  return static_cast<int>(st.code()) == 0 ? -1 : static_cast<int>(st.code());
}

template <typename F>
int Call(F&& f) {
  t_error.clear();
  std::shared_ptr<Runtime> rt = Current();
  if (!rt)
    return Fail(ringrun::Status(ringrun::Code::kInvalidArgument,
                                "ringrun is not initialized (call ringrun_init first)"));
  try {
    Status st = f(*rt);
    return st.ok() ? 0 : Fail(st);
  } catch (const std::bad_alloc&) {
    // Nothing may unwind through the C API. Peers may be mid-collective with this rank, so
    // the runtime is broken from here on (they fail at their timeout at the latest).
    return Fail(rt->Break(ringrun::Status(
        ringrun::Code::kInternal, "out of memory (a scratch buffer could not be allocated)")));
  }
}

template <typename F>
int Shape(F&& f) {
  std::shared_ptr<Runtime> rt = Current();
  return rt ? f(rt->shape()) : -1;
}

}  // namespace

extern "C" {

int ringrun_init(void) {
  t_error.clear();
  Process& p = TheProcess();
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.runtime) return 0;
  ringrun::Result<ringrun::runtime::JobEnv> env =
      ringrun::runtime::ReadJobEnv([](const char* n) { return std::getenv(n); });
  if (!env.ok()) return Fail(env.status());
  env->generation = p.joins;
  std::unique_ptr<ringrun::runtime::JobClient> client;
  if (env->in_job && env->size > 1) {
    client = ringrun::runtime::MakeGrpcJobClient(env->job_service, env->secret);
  }
  // A round of the rendezvous that was used up counts, even if a later step failed: the next
  // ringrun_init joins the next round, as the other ranks' will.
  bool joined = false;
  Status st;
  try {
    ringrun::Result<std::unique_ptr<Runtime>> rt = Runtime::Join(*env, client.get(), &joined);
    if (rt.ok())
      p.runtime = std::move(rt.value());
    else
      st = rt.status();
  } catch (const std::bad_alloc&) {
    st = ringrun::Status(ringrun::Code::kInternal, "ringrun_init: out of memory");
  }
  if (joined) ++p.joins;
  return st.ok() ? 0 : Fail(st);
}

void ringrun_shutdown(void) {
  std::shared_ptr<Runtime> rt;
  {
    std::lock_guard<std::mutex> lock(TheProcess().mu);
    rt = std::move(TheProcess().runtime);
  }
  // The last in-flight call (if any) destroys it.
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

int ringrun_allreduce(const void* sendbuf, void* recvbuf, size_t count, ringrun_dtype dtype,
                      ringrun_op op) {
  return Call([&](Runtime& rt) { return rt.Allreduce(sendbuf, recvbuf, count, dtype, op); });
}
int ringrun_broadcast(void* buf, size_t count, ringrun_dtype dtype, int root) {
  return Call([&](Runtime& rt) { return rt.Broadcast(buf, count, dtype, root); });
}
int ringrun_allgather(const void* sendbuf, void* recvbuf, size_t count, ringrun_dtype dtype) {
  return Call([&](Runtime& rt) { return rt.Allgather(sendbuf, recvbuf, count, dtype); });
}
int ringrun_allreduce_async(const void* sendbuf, void* recvbuf, size_t count, ringrun_dtype dtype,
                            ringrun_op op, void* cuda_stream) {
  return Call([&](Runtime& rt) {
    return cuda_stream ? rt.Allreduce(sendbuf, recvbuf, count, dtype, op, cuda_stream)
                       : ringrun::InvalidArgument("ringrun_allreduce_async: cuda_stream is NULL");
  });
}
int ringrun_broadcast_async(void* buf, size_t count, ringrun_dtype dtype, int root,
                            void* cuda_stream) {
  return Call([&](Runtime& rt) {
    return cuda_stream ? rt.Broadcast(buf, count, dtype, root, cuda_stream)
                       : ringrun::InvalidArgument("ringrun_broadcast_async: cuda_stream is NULL");
  });
}
int ringrun_allgather_async(const void* sendbuf, void* recvbuf, size_t count, ringrun_dtype dtype,
                            void* cuda_stream) {
  return Call([&](Runtime& rt) {
    return cuda_stream ? rt.Allgather(sendbuf, recvbuf, count, dtype, cuda_stream)
                       : ringrun::InvalidArgument("ringrun_allgather_async: cuda_stream is NULL");
  });
}
int ringrun_reducescatter(const void* sendbuf, void* recvbuf, size_t recvcount, ringrun_dtype dtype,
                          ringrun_op op) {
  return Call(
      [&](Runtime& rt) { return rt.ReduceScatter(sendbuf, recvbuf, recvcount, dtype, op); });
}
int ringrun_alltoall(const void* sendbuf, void* recvbuf, size_t count_per_rank,
                     ringrun_dtype dtype) {
  return Call([&](Runtime& rt) { return rt.Alltoall(sendbuf, recvbuf, count_per_rank, dtype); });
}
int ringrun_barrier(void) {
  return Call([](Runtime& rt) { return rt.Barrier(); });
}
const char* ringrun_error_message(void) { return t_error.c_str(); }
size_t ringrun_dtype_size(ringrun_dtype dtype) { return ringrun::runtime::DtypeSize(dtype); }

}  // extern "C"
