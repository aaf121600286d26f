#include "launcher/service/job_server.h"

#include "ringrun/common/defaults.h"

namespace ringrun::launcher::service {

Result<JobServer> StartJobServer(const std::string& address, JobService& service) {
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
