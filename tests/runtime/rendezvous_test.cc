// The Rendezvous behind a real gRPC server, driven by the real job-service client.
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "ringrun/common/auth.h"
#include "runtime/src/job_client.h"
#include "tests/runtime/test_job_server.h"

namespace ringrun::runtime::testing {
namespace {

using namespace ringrun::runtime::transport;

// Polls `done` until it holds, for at most `timeout_ms`; whether it held.
template <typename Pred>
bool WaitUntil(Pred done, int timeout_ms = 5000) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace

TEST_CASE("rendezvous: every rank gets the whole columnar table", "[rendezvous]") {
  constexpr int kSize = 6;
  auto server = TestJobServer::Start(kSize, "secret", "job-7");
  REQUIRE(server);
  std::vector<Result<PeerTable>> results(kSize, Result<PeerTable>(Internal("not run")));
  std::vector<std::thread> threads;
  for (int r = 0; r < kSize; ++r) {
    threads.emplace_back([&, r] {
      auto client = MakeGrpcJobClient(server->target(), "secret");
      JoinInfo info;
      info.rank = r, info.size = kSize, info.port = static_cast<uint16_t>(1000 + r);
      info.address = r < 3 ? "10.0.0.1" : "10.0.0.2";
      if (r == 0) info.nccl_id = "nccl-bytes";
      results[r] = client->Join(info, 10000);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kSize; ++r) {
    INFO(results[r].status().ToString());
    REQUIRE(results[r].ok());
    const PeerTable& t = *results[r];
    CHECK(t.size() == kSize);
    CHECK(t.addresses.size() == 2);
    CHECK(t.job_id == "job-7");
    CHECK(t.nccl_id == "nccl-bytes");
    for (int p = 0; p < kSize; ++p) {
      CHECK(t.port_of_rank[p] == static_cast<uint32_t>(1000 + p));
      CHECK(t.address(p) == (p < 3 ? "10.0.0.1" : "10.0.0.2"));
    }
  }
}

TEST_CASE("rendezvous: bad joins are refused", "[rendezvous]") {
  auto server = TestJobServer::Start(2, "secret");
  REQUIRE(server);
  JoinInfo info;
  info.rank = 0, info.size = 3, info.address = "127.0.0.1", info.port = 5;
  CHECK(MakeGrpcJobClient(server->target(), "secret")->Join(info, 5000).status().code() ==
        Code::kInvalidArgument);
  info.size = 2;
  CHECK(MakeGrpcJobClient(server->target(), "wrong")->Join(info, 5000).status().code() ==
        Code::kPermissionDenied);
  // A rank that gives up (deadline) may join again; a second copy of a held rank is refused.
  CHECK(MakeGrpcJobClient(server->target(), "secret")->Join(info, 200).status().code() ==
        Code::kTimeout);
  // The server learns of the give-up asynchronously.
  REQUIRE(WaitUntil([&] { return server->rendezvous().joined() == 0; }));
  std::thread holder(
      [&] { (void)MakeGrpcJobClient(server->target(), "secret")->Join(info, 3000); });
  CHECK(WaitUntil([&] { return server->rendezvous().joined() != 0; }));  // the holder is in
  CHECK(MakeGrpcJobClient(server->target(), "secret")->Join(info, 2000).status().code() ==
        Code::kInvalidArgument);  // ALREADY_EXISTS
  server->rendezvous().Abort("test over");
  holder.join();
  CHECK(MakeGrpcJobClient(server->target(), "secret")->Join(info, 2000).status().code() ==
        Code::kAborted);
}

TEST_CASE("rendezvous: ranks that leave and join again meet in a new round", "[rendezvous]") {
  constexpr int kSize = 3;
  auto server = TestJobServer::Start(kSize, "secret");
  REQUIRE(server);
  auto join = [&](int rank, uint32_t gen, int port, int timeout_ms) {
    JoinInfo info;
    info.rank = rank, info.size = kSize, info.address = "127.0.0.1";
    info.port = static_cast<uint16_t>(port), info.generation = gen;
    return MakeGrpcJobClient(server->target(), "secret")->Join(info, timeout_ms);
  };
  // Joins `ranks` of round `gen` concurrently (rank r on port_base + r); each must get the
  // whole table of that round.
  auto round = [&](uint32_t gen, int port_base, std::vector<int> ranks) {
    std::vector<Result<PeerTable>> results(kSize, Result<PeerTable>(Internal("not run")));
    std::vector<std::thread> threads;
    for (int r : ranks) {
      threads.emplace_back([&, r] { results[r] = join(r, gen, port_base + r, 10000); });
    }
    for (auto& t : threads) t.join();
    for (int r : ranks) {
      INFO("round " << gen << " rank " << r << ": " << results[r].status().ToString());
      REQUIRE(results[r].ok());
      for (int p = 0; p < kSize; ++p) CHECK(results[r]->port_of_rank[p] == uint32_t(port_base + p));
    }
  };
  round(0, 2000, {0, 1, 2});
  // Round 0 is over: joining it again is refused, and so is skipping a round.
  Status st = join(1, 0, 9, 2000).status();
  CHECK(st.code() == Code::kInvalidArgument);
  CHECK(st.message().find("already joined") != std::string::npos);
  st = join(1, 2, 9, 2000).status();
  CHECK(st.message().find("joined in order") != std::string::npos);
  // Round 1: a rank that gives up (deadline) may join it again; while it collects, a join for
  // round 2 is refused; then everyone meets, with the new endpoints.
  CHECK(join(0, 1, 9, 200).status().code() == Code::kTimeout);
  REQUIRE(WaitUntil([&] { return server->rendezvous().joined() == 0; }));
  Result<PeerTable> held(Internal("not run"));
  std::thread holder([&] { held = join(2, 1, 3002, 10000); });
  CHECK(WaitUntil([&] { return server->rendezvous().joined() != 0; }));  // the holder is in
  st = join(1, 2, 9, 2000).status();
  CHECK(st.message().find("still waits") != std::string::npos);
  round(1, 3000, {0, 1});
  holder.join();
  REQUIRE(held.ok());
  CHECK(held->port_of_rank[0] == 3000u);
  round(2, 4000, {0, 1, 2});
}

}  // namespace ringrun::runtime::testing
