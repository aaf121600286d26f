#include "tests/runtime/test_job_server.h"

#include "launcher/service/job_server.h"
#include "ringrun/common/env_contract.h"

namespace ringrun::runtime::testing {

std::unique_ptr<TestJobServer> TestJobServer::Start(int size, const std::string& secret,
                                                    const std::string& job_id) {
  std::unique_ptr<TestJobServer> s(new TestJobServer);
  s->size_ = size;
  s->secret_ = secret;
  s->job_id_ = job_id;
  s->rendezvous_ = std::make_unique<launcher::service::Rendezvous>(size, job_id);
  s->service_ = std::make_unique<launcher::service::JobService>(secret, nullptr,
                                                                s->rendezvous_.get(), 1000, 10000);
  auto server = launcher::service::StartJobServer("127.0.0.1:0", *s->service_);
  if (!server.ok()) return nullptr;
  s->server_ = std::move(server->server);
  s->port_ = server->port;
  return s;
}

std::vector<std::string> TestJobServer::RankEnvironment(int rank) const {
  auto var = [](const char* name, const std::string& value) {
    return std::string(name) + "=" + value;
  };
  return {var(env::kRank, std::to_string(rank)),
          var(env::kSize, std::to_string(size_)),
          var(env::kLocalRank, std::to_string(rank)),
          var(env::kLocalSize, std::to_string(size_)),
          var(env::kCrossRank, "0"),
          var(env::kCrossSize, "1"),
          var(env::kJobService, target()),
          var(env::kSecret, secret_),
          var(env::kHostAddr, "127.0.0.1"),
          var(env::kJobId, job_id_)};
}

TestJobServer::~TestJobServer() {
  if (rendezvous_) rendezvous_->Abort("test server stopping");
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

}  // namespace ringrun::runtime::testing
