// The NCCL bootstrap through the job service, with a fake NCCL: rank 0's unique id goes up in
// its JoinRequest (runtime's gRPC job client), through the launcher's real JobService and
// Rendezvous, and must reach every rank's ncclCommInitRankConfig byte for byte.
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <thread>
#include <vector>

#include "launcher/service/job_service.h"
#include "launcher/service/rendezvous.h"
#include "runtime/src/gpu/nccl_backend.h"
#include "runtime/src/job_client.h"
#include "tests/gpu/fake_nccl_api.h"

using namespace ringrun;
using namespace ringrun::runtime;
using namespace ringrun::runtime::transport;
using namespace ringrun::runtime::gpu;
using ringrun::runtime::gpu::testing::FakeNcclApi;

namespace {

// Only Join is exercised: agents never register in this test.
class NoAgents : public launcher::service::JobEvents {
 public:
  grpc::Status OnRegister(const v1::RegisterRequest&, const std::string&,
                          v1::RegisterReply*) override {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no agents in this test");
  }
  void OnAgentEvent(int, const v1::AgentEvent&) override {}
  void OnSessionEnded(int, bool, const std::string&) override {}
};

struct Service {
  explicit Service(int size)
      : rendezvous(size, "jobid-nccl"), service(kSecret, &events, &rendezvous, 2000, 10000) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~Service() {
    rendezvous.Abort("test over");
    service.Close();
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
  std::string target() const { return "127.0.0.1:" + std::to_string(port); }

  static constexpr char kSecret[] =
      "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
  NoAgents events;
  launcher::service::Rendezvous rendezvous;
  launcher::service::JobService service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

struct RankOutcome {
  std::string joined_id;  // what the job service handed back
  Status backend = Internal("not run");
  std::shared_ptr<FakeNcclApi> api;
};

}  // namespace

TEST_CASE("rank 0's NCCL id reaches every rank unchanged through Join", "[bootstrap]") {
  constexpr int kSize = 4;
  Service svc(kSize);
  REQUIRE(svc.server != nullptr);
  REQUIRE(svc.port > 0);

  std::vector<RankOutcome> out(kSize);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kSize; ++r) {
    out[r].api = std::make_shared<FakeNcclApi>([] {
      FakeNcclApi::Script s;
      s.id_seed = 0xa5;  // the id contains zero bytes and bytes >= 0x80
      s.device_count = 2;
      return s;
    }());
    ranks.emplace_back([&, r] {
      JoinInfo info;
      info.rank = r;
      info.size = kSize;
      info.address = "127.0.0.1";
      info.port = static_cast<uint16_t>(20000 + r);
      if (r == 0) info.nccl_id = gpu::CreateNcclUniqueId(*out[r].api);
      auto client = MakeGrpcJobClient(svc.target(), Service::kSecret);
      Result<PeerTable> peers = client->Join(info, 10000);
      if (!peers.ok()) {
        out[r].backend = peers.status();
        return;
      }
      out[r].joined_id = peers->nccl_id;
      gpu::NcclBackendOptions o;
      o.rank = r;
      o.size = kSize;
      o.local_rank = r;
      o.nccl_id = peers->nccl_id;
      o.timeout_ms = 5000;
      o.poll_interval_us = 50;
      auto backend = gpu::MakeNcclBackend(out[r].api, o);
      out[r].backend = backend.ok() ? Status::Ok() : backend.status();
    });
  }
  for (auto& t : ranks) t.join();

  ncclUniqueId expected_id;
  FakeNcclApi::Script s;
  s.id_seed = 0xa5;
  FakeNcclApi(s).GetUniqueId(&expected_id);
  const std::string expected(expected_id.internal, sizeof(expected_id.internal));
  REQUIRE(expected.size() == NCCL_UNIQUE_ID_BYTES);
  REQUIRE(expected.find('\0') != std::string::npos);

  for (int r = 0; r < kSize; ++r) {
    INFO("rank " << r << ": " << out[r].backend.ToString());
    REQUIRE(out[r].backend.ok());
    CHECK(out[r].joined_id == expected);
    FakeNcclApi::Record rec = out[r].api->record();
    CHECK(rec.init_id == expected);
    CHECK(rec.init_rank == r);
    CHECK(rec.init_nranks == kSize);
    CHECK(rec.init_blocking == 0);
    // One device per local rank, round-robin over the two devices.
    REQUIRE_FALSE(rec.set_devices.empty());
    CHECK(rec.set_devices.front() == r % 2);
  }
}

TEST_CASE("rank 0 without a GPU sends no id, and the others are told why", "[bootstrap]") {
  constexpr int kSize = 2;
  Service svc(kSize);
  REQUIRE(svc.server != nullptr);
  FakeNcclApi::Script no_driver;
  no_driver.device_count_error = cudaErrorInsufficientDriver;
  no_driver.driver_version = 0;
  FakeNcclApi rank0_api(no_driver);

  std::vector<Status> status(kSize, Internal("not run"));
  std::vector<std::thread> ranks;
  for (int r = 0; r < kSize; ++r) {
    ranks.emplace_back([&, r] {
      JoinInfo info;
      info.rank = r;
      info.size = kSize;
      info.address = "127.0.0.1";
      info.port = static_cast<uint16_t>(21000 + r);
      if (r == 0) info.nccl_id = gpu::CreateNcclUniqueId(rank0_api);
      Result<PeerTable> peers =
          MakeGrpcJobClient(svc.target(), Service::kSecret)->Join(info, 10000);
      if (!peers.ok()) {
        status[r] = peers.status();
        return;
      }
      gpu::NcclBackendOptions o;
      o.rank = r;
      o.size = kSize;
      o.nccl_id = peers->nccl_id;
      auto backend = gpu::MakeNcclBackend(std::make_shared<FakeNcclApi>(), o);
      status[r] = backend.ok() ? Status::Ok() : backend.status();
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kSize; ++r) {
    INFO("rank " << r);
    CHECK(status[r].code() == Code::kUnavailable);
    CHECK_THAT(status[r].message(), Catch::Contains("no NCCL unique id from rank 0"));
  }
}
