#include "launcher/service/job_server.h"

#include <absl/synchronization/mutex.h>

#include "ringrun/common/defaults.h"

namespace ringrun::launcher::service {

Result<JobServer> StartJobServer(const std::string& address, JobService& service) {
  // Debian's Abseil is built without NDEBUG, which leaves absl::Mutex's lock-order graph on:
  // with 1,000 agents it was a third of the launcher's CPU (docs/scale.md). It checks gRPC's
  // own locks, not ours; gRPC's release builds run without it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  JobServer out;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &out.port);
  builder.RegisterService(&service);
  ConfigureJobServer(&builder);  // limits and keepalive: the secret and size caps
  out.server = builder.BuildAndStart();
  if (!out.server || out.port == 0) {
    return Unavailable("could not listen on " + address + " for the job service");
  }
  return out;
}

}  // namespace ringrun::launcher::service
