#include "test_job_server.h"

#include "ringrun/common/auth.h"

namespace ringrun::runtime::testing {

class TestJobServer::Service final
    : public v1::JobService::WithCallbackMethod_Join<v1::JobService::Service> {
 public:
  Service(std::string secret, launcher::Rendezvous* r) : secret_(std::move(secret)), r_(r) {}
  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const v1::JoinRequest* req,
                                 v1::JoinReply* reply) override {
    grpc::Status auth = CheckSecret(*ctx, secret_);
    if (!auth.ok()) {
      auto* reactor = ctx->DefaultReactor();
      reactor->Finish(auth);
      return reactor;
    }
    return r_->Join(ctx, req, reply);
  }

 private:
  const std::string secret_;
  launcher::Rendezvous* const r_;
};

std::unique_ptr<TestJobServer> TestJobServer::Start(int size, const std::string& secret,
                                                    const std::string& job_id) {
  std::unique_ptr<TestJobServer> s(new TestJobServer);
  s->rendezvous_ = std::make_unique<launcher::Rendezvous>(size, job_id);
  s->service_ = std::make_unique<Service>(secret, s->rendezvous_.get());
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
