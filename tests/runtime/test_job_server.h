// A minimal job service for the runtime's tests: the launcher's JobService with Join only,
// checked against the secret and forwarded to a real launcher::service::Rendezvous, on a server
// built by the launcher's own StartJobServer. Port 0.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "launcher/service/job_service.h"
#include "launcher/service/rendezvous.h"
#include "ringrun/job.grpc.pb.h"

namespace ringrun::runtime::testing {

class TestJobServer {
 public:
  // Listens on 127.0.0.1:<any port>; nullptr when the server could not start.
  static std::unique_ptr<TestJobServer> Start(int size, const std::string& secret,
                                              const std::string& job_id = "test-job");
  ~TestJobServer();

  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }
  launcher::service::Rendezvous& rendezvous() { return *rendezvous_; }
  // The contract variables ("NAME=VALUE") rank `rank` needs to join this server, as ringrun
  // would set them for a job of `size` ranks on one host.
  std::vector<std::string> RankEnvironment(int rank) const;

 private:
  TestJobServer() = default;
  int size_ = 0;
  std::string secret_, job_id_;
  std::unique_ptr<launcher::service::Rendezvous> rendezvous_;
  std::unique_ptr<launcher::service::JobService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace ringrun::runtime::testing
