#include "test_job_server.h"

#include "launcher/job_service.h"

namespace ringrun::runtime::testing {


std::unique_ptr<TestJobServer> TestJobServer::Start(int size, const std::string& secret,
                                                    const std::string& job_id) {
  std::unique_ptr<TestJobServer> s(new TestJobServer);
  s->rendezvous_ = std::make_unique<launcher::Rendezvous>(size, job_id);
  s->service_ = std::make_unique<launcher::JobService>(secret, nullptr, s->rendezvous_.get(),
                                                        1000, 10000);
  grpc::ServerBuilder b;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &s->port_);
  b.RegisterService(s->service_.get());
  s->server_ = b.BuildAndStart();
  if (!s->server_ || s->port_ == 0) return nullptr;
  return s;
}

TestJobServer::~TestJobServer() {
  if (rendezvous_) rendezvous_->Abort("test server stopping");
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

}  // namespace ringrun::runtime::testing
