#include "runtime/src/rendezvous/pmix_store.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "ringrun/common/interfaces.h"
#include "ringrun/rendezvous/config.h"

#if RINGRUN_HAVE_PMIX
#include <pmix.h>
#endif

namespace ringrun::runtime::rendezvous {

Result<std::string> PmixHostAddress(const PmixJob& job) {
  if (job.local_size >= job.size) return std::string("127.0.0.1");
  if (!job.rank0_host.empty()) {
    Result<std::string> route = RouteSourceAddress(job.rank0_host);
    if (route.ok() && !IsLoopback(*route)) return route;
  }
  Result<std::vector<NetInterface>> interfaces = ListInterfaces();
  if (!interfaces.ok()) return interfaces.status();
  for (const NetInterface& i : *interfaces) {
    if (!i.address.empty() && !IsLoopback(i.address)) {
      return i.address;
    }
  }
  return NotFound(
      "no address of this host but loopback, in a job on several nodes; set "
      "RINGRUN_HOST_ADDR");
}

#if RINGRUN_HAVE_PMIX
namespace {

using Clock = std::chrono::steady_clock;

std::string Why(pmix_status_t rc) { return PMIx_Error_string(rc); }

// A pmix_value_t that PMIx_Get allocated, released on scope exit.
struct ValueDeleter {
  void operator()(pmix_value_t* v) const { PMIX_VALUE_RELEASE(v); }
};
using Value = std::unique_ptr<pmix_value_t, ValueDeleter>;

// An unsigned job-level number (PMIx gives sizes as uint32, ranks as uint16).
bool Number(const pmix_value_t& v, int* out) {
  switch (v.type) {
    case PMIX_UINT32:
      *out = static_cast<int>(v.data.uint32);
      return true;
    case PMIX_UINT16:
      *out = v.data.uint16;
      return true;
    case PMIX_INT:
      *out = v.data.integer;
      return true;
    case PMIX_UINT:
      *out = static_cast<int>(v.data.uint);
      return true;
    default:
      return false;
  }
}

class PmixClientStore final : public PmixStore {
 public:
  PmixClientStore(const pmix_proc_t& me, PmixJob job,
                  std::function<int(const std::string&)> setter_of)
      : me_(me), job_(std::move(job)), setter_of_(std::move(setter_of)) {}

  const PmixJob& job() const override { return job_; }

  Status Set(const std::string& key, const std::string& value) override {
    pmix_value_t v;
    PMIX_VALUE_CONSTRUCT(&v);
    v.type = PMIX_BYTE_OBJECT;
    v.data.bo.bytes = const_cast<char*>(value.data());  // PMIx_Put copies
    v.data.bo.size = value.size();
    pmix_status_t rc = PMIx_Put(PMIX_GLOBAL, key.c_str(), &v);
    if (rc != PMIX_SUCCESS) return Unavailable("PMIx_Put('" + key + "'): " + Why(rc));
    rc = PMIx_Commit();
    if (rc != PMIX_SUCCESS) return Unavailable("PMIx_Commit ('" + key + "'): " + Why(rc));
    return Status::Ok();
  }

  Result<std::string> Get(const std::string& key, int timeout_ms) override {
    const auto deadline = Clock::now() + std::chrono::milliseconds(std::max(timeout_ms, 1));
    const int setter = setter_of_(key);
    pmix_proc_t proc;
    PMIX_LOAD_PROCID(&proc, me_.nspace, static_cast<pmix_rank_t>(setter));
    const std::string what = "'" + key + "' of rank " + std::to_string(setter);
    auto backoff = std::chrono::milliseconds(10);
    for (bool refresh = false;; refresh = true) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      int seconds = static_cast<int>(std::max<int64_t>((left + 999) / 1000, 1));  // PMIx's unit
      pmix_info_t info[2];
      PMIX_INFO_CONSTRUCT(&info[0]);
      PMIX_INFO_CONSTRUCT(&info[1]);
      PMIX_INFO_LOAD(&info[0], PMIX_TIMEOUT, &seconds, PMIX_INT);
      bool yes = true;
      PMIX_INFO_LOAD(&info[1], PMIX_GET_REFRESH_CACHE, &yes, PMIX_BOOL);
      pmix_value_t* raw = nullptr;
      const pmix_status_t rc = PMIx_Get(&proc, key.c_str(), info, refresh ? 2 : 1, &raw);
      PMIX_INFO_DESTRUCT(&info[0]);
      PMIX_INFO_DESTRUCT(&info[1]);
      Value value(raw);
      if (rc == PMIX_SUCCESS && value) {
        if (value->type == PMIX_BYTE_OBJECT) {
          return std::string(value->data.bo.bytes, value->data.bo.size);
        }
        if (value->type == PMIX_STRING && value->data.string != nullptr) {
          return std::string(value->data.string);
        }
        return Internal("PMIx: " + what + " is not bytes (PMIx type " +
                        std::to_string(value->type) + ")");
      }
      const bool timed_out = rc == PMIX_ERR_TIMEOUT || Clock::now() >= deadline;
      if (timed_out && (rc == PMIX_ERR_TIMEOUT || rc == PMIX_ERR_NOT_FOUND)) {
        return Timeout("PMIx: " + what + " was not set within " + std::to_string(timeout_ms) +
                       " ms");
      }
      if (rc != PMIX_ERR_NOT_FOUND) return Unavailable("PMIx_Get(" + what + "): " + Why(rc));
      std::this_thread::sleep_for(
          std::min(backoff, std::chrono::duration_cast<std::chrono::milliseconds>(
                                deadline - Clock::now() + std::chrono::milliseconds(1))));
      backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
    }
  }

  Status Wait(const std::vector<std::string>& keys, int timeout_ms) override {
    const auto deadline = Clock::now() + std::chrono::milliseconds(std::max(timeout_ms, 1));
    for (const std::string& key : keys) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      Result<std::string> got = Get(key, static_cast<int>(std::max<int64_t>(left, 1)));
      if (!got.ok()) return got.status();
    }
    return Status::Ok();
  }

  Result<int64_t> Add(const std::string& key, int64_t) override {
    return InvalidArgument("PMIx store: add to '" + key +
                           "': each PMIx key belongs to the process that put it; a counter "
                           "shared by several ranks cannot be kept");
  }

 private:
  const pmix_proc_t me_;
  const PmixJob job_;
  const std::function<int(const std::string&)> setter_of_;
};

// The value `key` of `rank` (PMIx's wildcard rank: the job's) that the server gave this client
// with the job's description, or null; never a request to another node, which could wait.
Value JobValue(const pmix_proc_t& me, const char* key, pmix_rank_t rank = PMIX_RANK_WILDCARD) {
  pmix_proc_t proc;
  PMIX_LOAD_PROCID(&proc, me.nspace, rank);
  pmix_info_t optional;
  PMIX_INFO_CONSTRUCT(&optional);
  bool yes = true;
  PMIX_INFO_LOAD(&optional, PMIX_OPTIONAL, &yes, PMIX_BOOL);
  pmix_value_t* raw = nullptr;
  const pmix_status_t rc = PMIx_Get(&proc, key, &optional, 1, &raw);
  PMIX_INFO_DESTRUCT(&optional);
  return rc == PMIX_SUCCESS ? Value(raw) : nullptr;
}

}  // namespace

Result<std::unique_ptr<PmixStore>> ConnectPmix(std::function<int(const std::string&)> setter_of) {
  pmix_proc_t me;
  PMIX_PROC_CONSTRUCT(&me);
  pmix_status_t rc = PMIx_Init(&me, nullptr, 0);
  if (rc != PMIX_SUCCESS) return Unavailable("PMIx_Init: " + Why(rc));
  PmixJob job;
  job.nspace = me.nspace;
  job.rank = static_cast<int>(me.rank);
  Value size = JobValue(me, PMIX_JOB_SIZE);
  if (!size || !Number(*size, &job.size) || job.size < 1 || job.rank >= job.size) {
    PMIx_Finalize(nullptr, 0);
    return Unavailable("PMIx: the job's size (" PMIX_JOB_SIZE ") is not known for rank " +
                       std::to_string(job.rank) + " of namespace " + job.nspace);
  }
  // A child forked later inherits the handler, not the connection: only this process finalizes.
  static pid_t connected = 0;
  if (connected == 0) {
    connected = ::getpid();
    std::atexit([] {
      if (::getpid() == connected) PMIx_Finalize(nullptr, 0);
    });
  }
  if (Value local = JobValue(me, PMIX_LOCAL_SIZE); local) Number(*local, &job.local_size);
  if (job.local_size < job.size) {
    Value host = JobValue(me, PMIX_HOSTNAME, 0);
    if (host && host->type == PMIX_STRING && host->data.string) job.rank0_host = host->data.string;
  }
  return std::unique_ptr<PmixStore>(
      std::make_unique<PmixClientStore>(me, std::move(job), std::move(setter_of)));
}

#else  // !RINGRUN_HAVE_PMIX

Result<std::unique_ptr<PmixStore>> ConnectPmix(std::function<int(const std::string&)>) {
  return Unavailable(
      "this libringrun was built without PMIx (RINGRUN_WITH_PMIX; Debian's libpmix-dev)");
}

#endif  // RINGRUN_HAVE_PMIX

}  // namespace ringrun::runtime::rendezvous
