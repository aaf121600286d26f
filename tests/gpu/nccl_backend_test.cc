// The NCCL backend's logic driven by a fake NCCL: device choice, the non-blocking init and
// collectives, deadlines, asynchronous errors and Abort() from another thread.
#include "runtime/src/gpu/nccl_backend.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "tests/gpu/fake_nccl_api.h"

using namespace ringrun;
using namespace ringrun::runtime;
using ringrun::runtime::testing::FakeNcclApi;

namespace {

NcclBackendOptions Opts(int rank, int size, int local_rank, int timeout_ms = 2000) {
  NcclBackendOptions o;
  o.rank = rank;
  o.size = size;
  o.local_rank = local_rank;
  FakeNcclApi id_maker;
  ncclUniqueId id;
  id_maker.GetUniqueId(&id);
  o.nccl_id.assign(id.internal, sizeof(id.internal));
  o.timeout_ms = timeout_ms;
  o.poll_interval_us = 50;
  return o;
}

// A device pointer is never dereferenced by the backend; any address will do for the fake.
float g_buf[8];

}  // namespace

TEST_CASE("the communicator is non-blocking and init is polled to completion", "[backend]") {
  auto api = std::make_shared<FakeNcclApi>();
  auto backend = MakeNcclBackend(api, Opts(1, 4, 1));
  REQUIRE(backend.ok());
  FakeNcclApi::Record rec = api->record();
  CHECK(rec.init_blocking == 0);
  CHECK(rec.init_rank == 1);
  CHECK(rec.init_nranks == 4);
  CHECK(rec.aborts == 0);
}

TEST_CASE("the device is the local rank's unless the program chose one", "[backend]") {
  SECTION("no context yet: local rank modulo the device count") {
    FakeNcclApi::Script s;
    s.device_count = 2;
    auto api = std::make_shared<FakeNcclApi>(s);
    auto backend = MakeNcclBackend(api, Opts(3, 4, 3));
    REQUIRE(backend.ok());
    REQUIRE_FALSE(api->record().set_devices.empty());
    CHECK(api->record().set_devices.front() == 1);
    // The thread's current device is given back afterwards.
    int current = -1;
    api->GetDevice(&current);
    CHECK(current == 0);
  }
  SECTION("the program made device 1 current: it is kept whatever the local rank") {
    FakeNcclApi::Script s;
    s.thread_has_context = true;
    s.current_device = 1;
    auto api = std::make_shared<FakeNcclApi>(s);
    auto backend = MakeNcclBackend(api, Opts(0, 2, 0));
    REQUIRE(backend.ok());
    for (int d : api->record().set_devices) CHECK(d == 1);
  }
}

TEST_CASE("no driver or no device fails with a message naming the cause", "[backend]") {
  FakeNcclApi::Script s;
  s.device_count_error = cudaErrorInsufficientDriver;
  s.driver_version = 0;
  auto r = MakeNcclBackend(std::make_shared<FakeNcclApi>(s), Opts(0, 2, 0));
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kUnavailable);
  CHECK_THAT(r.status().message(),
             Catch::Contains("rank 0/2") &&
                 Catch::Contains("no CUDA driver: CUDA driver version is insufficient"));

  FakeNcclApi::Script none;
  none.device_count = 0;
  auto r2 = MakeNcclBackend(std::make_shared<FakeNcclApi>(none), Opts(0, 2, 0));
  REQUIRE_FALSE(r2.ok());
  CHECK_THAT(r2.status().message(), Catch::Contains("no CUDA device"));
}

TEST_CASE("a missing or malformed unique id is refused before NCCL is asked", "[backend]") {
  auto api = std::make_shared<FakeNcclApi>();
  NcclBackendOptions o = Opts(1, 2, 1);
  o.nccl_id.clear();
  auto r = MakeNcclBackend(api, o);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("no NCCL unique id from rank 0"));
  o.nccl_id = "short";
  auto r2 = MakeNcclBackend(api, o);
  REQUIRE_FALSE(r2.ok());
  CHECK(r2.status().code() == Code::kInvalidArgument);
  CHECK(api->record().init_rank == -1);

  // A job of size 1 may make its own id.
  NcclBackendOptions single = Opts(0, 1, 0);
  single.nccl_id.clear();
  CHECK(MakeNcclBackend(std::make_shared<FakeNcclApi>(), single).ok());
}

TEST_CASE("an init that never completes times out and is aborted", "[backend]") {
  FakeNcclApi::Script s;
  s.init_hangs = true;
  auto api = std::make_shared<FakeNcclApi>(s);
  const auto start = std::chrono::steady_clock::now();
  auto r = MakeNcclBackend(api, Opts(0, 2, 0, /*timeout_ms=*/100));
  const auto took = std::chrono::steady_clock::now() - start;
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kTimeout);
  CHECK_THAT(r.status().message(), Catch::Contains("NCCL init") && Catch::Contains("100 ms"));
  CHECK(api->record().aborts == 1);
  CHECK(api->record().calls_after_end == 0);
  CHECK(took < std::chrono::seconds(5));
}

TEST_CASE("collectives map their arguments and wait for the stream when synchronous", "[backend]") {
  auto api = std::make_shared<FakeNcclApi>();
  auto backend = MakeNcclBackend(api, Opts(0, 2, 0));
  REQUIRE(backend.ok());
  DeviceBackend& b = **backend;
  REQUIRE(b.Allreduce(g_buf, g_buf, 3, RINGRUN_BFLOAT16, RINGRUN_AVERAGE, nullptr, true).ok());
  REQUIRE(b.Broadcast(g_buf, 4, RINGRUN_INT64, 1, nullptr, true).ok());
  REQUIRE(b.Allgather(g_buf, g_buf, 2, RINGRUN_FLOAT16, nullptr, false).ok());
  auto rec = api->record();
  REQUIRE(rec.collectives.size() == 3);
  CHECK(rec.collectives[0] == "allreduce dtype=" + std::to_string(ncclBfloat16) +
                                  " op=" + std::to_string(ncclAvg) + " count=3");
  CHECK(rec.collectives[1] == "broadcast dtype=" + std::to_string(ncclInt64) + " root=1 count=4");
  CHECK(rec.collectives[2] == "allgather dtype=" + std::to_string(ncclHalf) + " count=2");
  // Synchronous calls drained the stream; the asynchronous one left it pending.
  CHECK(api->StreamQuery(nullptr) == cudaErrorNotReady);
}

TEST_CASE("rejected arguments communicate nothing and leave the backend usable", "[backend]") {
  auto api = std::make_shared<FakeNcclApi>();
  auto backend = MakeNcclBackend(api, Opts(0, 2, 0));
  REQUIRE(backend.ok());
  DeviceBackend& b = **backend;
  Status avg = b.Allreduce(g_buf, g_buf, 3, RINGRUN_INT32, RINGRUN_AVERAGE, nullptr, true);
  CHECK(avg.code() == Code::kInvalidArgument);
  CHECK_THAT(avg.message(), Catch::Contains("rank 0/2") && Catch::Contains("allreduce"));
  CHECK(b.Broadcast(g_buf, 3, RINGRUN_FLOAT32, 2, nullptr, true).code() == Code::kInvalidArgument);
  CHECK(api->record().collectives.empty());
  CHECK(b.Allreduce(g_buf, g_buf, 3, RINGRUN_INT32, RINGRUN_SUM, nullptr, true).ok());
}

TEST_CASE("an asynchronous NCCL error aborts the communicator; later calls fail fast",
          "[backend]") {
  FakeNcclApi::Script s;
  s.async_error = ncclRemoteError;
  auto api = std::make_shared<FakeNcclApi>(s);
  auto backend = MakeNcclBackend(api, Opts(1, 2, 1));
  REQUIRE(backend.ok());
  DeviceBackend& b = **backend;
  Status st = b.Allreduce(g_buf, g_buf, 8, RINGRUN_FLOAT32, RINGRUN_SUM, nullptr, true);
  CHECK(st.code() == Code::kUnavailable);
  CHECK_THAT(st.message(), Catch::Contains("rank 1/2") && Catch::Contains("remote process exited"));
  CHECK(api->record().aborts == 1);
  Status again = b.Allgather(g_buf, g_buf, 1, RINGRUN_FLOAT32, nullptr, true);
  CHECK(again.message() == st.message());
  CHECK(api->record().collectives.size() == 1);
  CHECK(api->record().calls_after_end == 0);
}

TEST_CASE("a collective that never completes times out and aborts", "[backend]") {
  FakeNcclApi::Script s;
  s.collective_hangs = true;
  auto api = std::make_shared<FakeNcclApi>(s);
  auto backend = MakeNcclBackend(api, Opts(0, 2, 0, /*timeout_ms=*/100));
  REQUIRE(backend.ok());
  Status st = (*backend)->Allreduce(g_buf, g_buf, 8, RINGRUN_FLOAT32, RINGRUN_SUM, nullptr, true);
  CHECK(st.code() == Code::kTimeout);
  CHECK_THAT(st.message(), Catch::Contains("allreduce did not complete within 100 ms"));
  CHECK(api->record().aborts == 1);
}

TEST_CASE("Abort() from another thread ends an allreduce in flight", "[backend]") {
  FakeNcclApi::Script s;
  s.collective_hangs = true;
  auto api = std::make_shared<FakeNcclApi>(s);
  auto backend = MakeNcclBackend(api, Opts(0, 2, 0, /*timeout_ms=*/60000));
  REQUIRE(backend.ok());
  DeviceBackend* b = backend->get();
  std::thread aborter([b, api] {
    // In flight: the fake has the allreduce, whose stream never drains (5 s at most).
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (api->record().collectives.empty() && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    b->Abort("rank 1 on node2 exited with code 137");
  });
  const auto start = std::chrono::steady_clock::now();
  Status st = b->Allreduce(g_buf, g_buf, 8, RINGRUN_FLOAT32, RINGRUN_SUM, nullptr, true);
  const auto took = std::chrono::steady_clock::now() - start;
  aborter.join();
  CHECK(st.code() == Code::kAborted);
  CHECK_THAT(st.message(), Catch::Contains("rank 1 on node2 exited"));
  CHECK(took < std::chrono::seconds(10));
  CHECK(api->record().aborts == 1);
  b->Abort("again");  // idempotent
  CHECK(api->record().aborts == 1);
  CHECK(api->record().calls_after_end == 0);
}

TEST_CASE("a healthy backend is finalized and destroyed, not aborted", "[backend]") {
  auto api = std::make_shared<FakeNcclApi>();
  {
    auto backend = MakeNcclBackend(api, Opts(0, 2, 0));
    REQUIRE(backend.ok());
  }
  auto rec = api->record();
  CHECK(rec.finalizes == 1);
  CHECK(rec.destroys == 1);
  CHECK(rec.aborts == 0);
  CHECK(rec.calls_after_end == 0);
}
