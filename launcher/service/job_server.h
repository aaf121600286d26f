// The one place a gRPC server for the job service is built: the launcher's, and every server
// the tests and benchmarks run, so that all of them serve with the same settings (keepalive
// that matches the agents' and ranks' channels, message sizes).
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "launcher/service/job_service.h"
#include "ringrun/common/status.h"

namespace ringrun::launcher::service {

struct JobServer {
  std::unique_ptr<grpc::Server> server;  // Shutdown() it before `service` goes
  int port = 0;                          // the port it listens on
};

// Starts serving `service` on `address` ("127.0.0.1:0": loopback only; "0.0.0.0:0": every
// interface; port 0 picks a free port). `service` must outlive the server. Errors say why the
// server could not start. Turns off Abseil's mutex deadlock detection for the process (see the
// definition).
Result<JobServer> StartJobServer(const std::string& address, JobService& service);

}  // namespace ringrun::launcher::service
