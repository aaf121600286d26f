// The NCCL backend's logic driven by a fake NCCL: device choice, the non-blocking init and
// collectives, deadlines, asynchronous errors and Abort() from another thread.
#include "runtime/src/gpu/nccl_backend.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>
#include <vector>

#include "tests/gpu/fake_nccl_api.h"

using namespace ringrun;
using namespace ringrun::runtime;
using namespace ringrun::runtime::gpu;
using ringrun::runtime::gpu::testing::FakeNcclApi;

namespace {

gpu::NcclBackendOptions Opts(int rank, int size, int local_rank, int timeout_ms = 2000) {
  gpu::NcclBackendOptions o;
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
  auto backend = gpu::MakeNcclBackend(api, Opts(1, 4, 1));
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
    auto backend = gpu::MakeNcclBackend(api, Opts(3, 4, 3));
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
    auto backend = gpu::MakeNcclBackend(api, Opts(0, 2, 0));
    REQUIRE(backend.ok());
    for (int d : api->record().set_devices) CHECK(d == 1);
  }
}

TEST_CASE("no driver or no device fails with a message naming the cause", "[backend]") {
  FakeNcclApi::Script s;
  s.device_count_error = cudaErrorInsufficientDriver;
  s.driver_version = 0;
  auto r = gpu::MakeNcclBackend(std::make_shared<FakeNcclApi>(s), Opts(0, 2, 0));
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kUnavailable);
  CHECK_THAT(r.status().message(),
             Catch::Contains("rank 0/2") &&
                 Catch::Contains("no CUDA driver: CUDA driver version is insufficient"));

  FakeNcclApi::Script none;
  none.device_count = 0;
  auto r2 = gpu::MakeNcclBackend(std::make_shared<FakeNcclApi>(none), Opts(0, 2, 0));
  REQUIRE_FALSE(r2.ok());
  CHECK_THAT(r2.status().message(), Catch::Contains("no CUDA device"));
}

TEST_CASE("a missing or malformed unique id is refused before NCCL is asked", "[backend]") {
  auto api = std::make_shared<FakeNcclApi>();
  gpu::NcclBackendOptions o = Opts(1, 2, 1);
  o.nccl_id.clear();
  auto r = gpu::MakeNcclBackend(api, o);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("no NCCL unique id from rank 0"));
  o.nccl_id = "short";
  auto r2 = gpu::MakeNcclBackend(api, o);
  REQUIRE_FALSE(r2.ok());
  CHECK(r2.status().code() == Code::kInvalidArgument);
  CHECK(api->record().init_rank == -1);

  // A job of size 1 may make its own id.
  gpu::NcclBackendOptions single = Opts(0, 1, 0);
  single.nccl_id.clear();
  CHECK(gpu::MakeNcclBackend(std::make_shared<FakeNcclApi>(), single).ok());
}

TEST_CASE("an init that never completes times out and is aborted", "[backend]") {
  FakeNcclApi::Script s;
  s.init_hangs = true;
  auto api = std::make_shared<FakeNcclApi>(s);
  const auto start = std::chrono::steady_clock::now();
  auto r = gpu::MakeNcclBackend(api, Opts(0, 2, 0, /*timeout_ms=*/100));
  const auto took = std::chrono::steady_clock::now() - start;
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kTimeout);
  CHECK_THAT(r.status().message(), Catch::Contains("NCCL init") && Catch::Contains("100 ms"));
  CHECK(api->record().aborts == 1);
  CHECK(api->record().calls_after_end == 0);
  CHECK(took < std::chrono::seconds(5));
}

TEST_CASE("collectives map their arguments, only Finish waits, for the result event", "[backend]") {
  auto api = std::make_shared<FakeNcclApi>();
  auto backend = gpu::MakeNcclBackend(api, Opts(0, 2, 0));
  REQUIRE(backend.ok());
  gpu::DeviceBackend& b = **backend;
  REQUIRE(b.Allreduce(g_buf, g_buf, 3, RINGRUN_BFLOAT16, RINGRUN_AVERAGE, 1.0).ok());
  REQUIRE(b.Broadcast(g_buf, 4, RINGRUN_INT64, 1).ok());
  REQUIRE(b.Allgatherv(g_buf, g_buf, {2, 2}, RINGRUN_FLOAT16).ok());
  REQUIRE(b.ReduceScatter(g_buf, g_buf, 2, RINGRUN_FLOAT32, RINGRUN_MAX).ok());
  auto rec = api->record();
  REQUIRE(rec.collectives.size() == 4);
  CHECK(rec.collectives[0] == "allreduce dtype=" + std::to_string(ncclBfloat16) +
                                  " op=" + std::to_string(ncclAvg) + " count=3");
  CHECK(rec.collectives[1] == "broadcast dtype=" + std::to_string(ncclInt64) + " root=1 count=4");
  CHECK(rec.collectives[2] == "allgather dtype=" + std::to_string(ncclHalf) + " count=2");
  CHECK(rec.collectives[3] == "reducescatter dtype=" + std::to_string(ncclFloat32) +
                                  " op=" + std::to_string(ncclMax) + " count=2");
  // Finish without waiting records the result event and makes the caller's stream wait.
  cudaStream_t caller;
  api->StreamCreateNonBlocking(&caller);
  REQUIRE(b.Finish({caller}, /*wait=*/false).ok());
  CHECK(api->StreamQuery(caller) == cudaErrorNotReady);
  rec = api->record();
  REQUIRE(rec.stream_waits.size() == 1);
  CHECK(rec.stream_waits[0] == api->Name(caller) + "->e1");
  // Finish with waiting returns once the event completed: the caller's stream is free then.
  REQUIRE(b.Finish({}, /*wait=*/true).ok());
  CHECK(api->StreamQuery(caller) == cudaSuccess);
}

TEST_CASE("ragged allgather and alltoall are grouped sends and receives", "[backend]") {
  auto api = std::make_shared<FakeNcclApi>();
  auto backend = gpu::MakeNcclBackend(api, Opts(1, 2, 1));
  REQUIRE(backend.ok());
  gpu::DeviceBackend& b = **backend;
  REQUIRE(b.Allgatherv(g_buf, g_buf, {1, 3}, RINGRUN_FLOAT32).ok());
  REQUIRE(b.Alltoallv(g_buf, {2, 0}, g_buf, {1, 1}, RINGRUN_INT32).ok());
  const std::string f = std::to_string(ncclFloat32), i = std::to_string(ncclInt32);
  const std::vector<std::string> want = {
      "group start",
      "send dtype=" + f + " peer=0 count=3",
      "recv dtype=" + f + " peer=0 count=1",
      "send dtype=" + f + " peer=1 count=3",
      "recv dtype=" + f + " peer=1 count=3",
      "group end",
      "group start",
      "send dtype=" + i + " peer=0 count=2",
      "recv dtype=" + i + " peer=0 count=1",
      "recv dtype=" + i + " peer=1 count=1",  // nothing to send to itself: no call
      "group end"};
  CHECK(api->record().collectives == want);
}

TEST_CASE("scale factors are one PreMulSum, created and destroyed per call, other ops refuse them",
          "[backend]") {
  auto api = std::make_shared<FakeNcclApi>();
  auto backend = gpu::MakeNcclBackend(api, Opts(0, 2, 0));
  REQUIRE(backend.ok());
  gpu::DeviceBackend& b = **backend;
  REQUIRE(b.Allreduce(g_buf, g_buf, 8, RINGRUN_FLOAT32, RINGRUN_SUM, 0.25).ok());
  const std::string f = std::to_string(ncclFloat32);
  CHECK(api->record().collectives ==
        std::vector<std::string>{"premulsum dtype=" + f + " scalar=0.25",
                                 "allreduce dtype=" + f + " op=premulsum count=8"});
  Status max = b.Allreduce(g_buf, g_buf, 8, RINGRUN_FLOAT32, RINGRUN_MAX, 0.25);
  CHECK(max.code() == Code::kInvalidArgument);
  CHECK_THAT(max.message(), Catch::Contains("needs SUM, not max"));
  Status integer = b.Allreduce(g_buf, g_buf, 8, RINGRUN_INT32, RINGRUN_SUM, 0.25);
  CHECK(integer.code() == Code::kInvalidArgument);
  CHECK(api->record().collectives.size() == 2);

  FakeNcclApi::Script old;
  old.nccl_version = 21003;
  auto api_old = std::make_shared<FakeNcclApi>(old);
  auto b_old = gpu::MakeNcclBackend(api_old, Opts(0, 2, 0));
  REQUIRE(b_old.ok());
  Status st = (*b_old)->Allreduce(g_buf, g_buf, 8, RINGRUN_FLOAT32, RINGRUN_SUM, 0.5);
  CHECK_THAT(st.message(), Catch::Contains("NCCL >= 2.11"));
}

TEST_CASE("with one rank, AVERAGE is a SUM and a PreMulSum is issued in pieces NCCL writes whole",
          "[backend]") {
  // NCCL's one-rank kernel (ncclAvg on floats, PreMulSum) leaves the last elements of some
  // counts unwritten (NcclOneRankPreMulSumSpan); a real H200 with NCCL 2.28.3 showed it.
  auto world = std::make_shared<ringrun::runtime::gpu::testing::FakeGpuWorld>(1);  // moves data
  auto api = std::make_shared<FakeNcclApi>(FakeNcclApi::Script{}, world, 0);
  auto backend = gpu::MakeNcclBackend(api, Opts(0, 1, 0));
  REQUIRE(backend.ok());
  gpu::DeviceBackend& b = **backend;
  constexpr size_t kCount = (size_t{1} << 20) + 3;
  std::vector<float> send(kCount, 2.0f), recv(kCount, 0.0f);
  REQUIRE(
      b.Allreduce(send.data(), recv.data(), kCount, RINGRUN_FLOAT32, RINGRUN_AVERAGE, 1.0).ok());
  REQUIRE(b.ReduceScatter(send.data(), recv.data(), 8, RINGRUN_FLOAT32, RINGRUN_AVERAGE).ok());
  REQUIRE(b.Allreduce(send.data(), recv.data(), kCount, RINGRUN_FLOAT32, RINGRUN_SUM, 0.5).ok());
  REQUIRE(b.Finish({}, /*wait=*/true).ok());
  const std::string f = std::to_string(ncclFloat32), sum = std::to_string(ncclSum);
  CHECK(api->record().collectives ==
        std::vector<std::string>{
            "allreduce dtype=" + f + " op=" + sum + " count=" + std::to_string(kCount),
            "reducescatter dtype=" + f + " op=" + sum + " count=8",
            "premulsum dtype=" + f + " scalar=0.5",
            "allreduce dtype=" + f + " op=premulsum count=" + std::to_string(size_t{1} << 20),
            "allreduce dtype=" + f + " op=premulsum count=3"});
  CHECK(recv.front() == 1.0f);
  CHECK(recv.back() == 1.0f);

  // With two ranks, AVERAGE stays ncclAvg (a PreMulSum stays one call: the test above).
  auto api2 = std::make_shared<FakeNcclApi>();
  auto two = gpu::MakeNcclBackend(api2, Opts(0, 2, 0));
  REQUIRE(two.ok());
  REQUIRE((*two)->Allreduce(g_buf, g_buf, 8, RINGRUN_FLOAT32, RINGRUN_AVERAGE, 1.0).ok());
  CHECK(api2->record().collectives ==
        std::vector<std::string>{"allreduce dtype=" + f + " op=" + std::to_string(ncclAvg) +
                                 " count=8"});
}

TEST_CASE("the fusion buffer is allocated once, grown when needed, freed with the backend",
          "[backend]") {
  auto api = std::make_shared<FakeNcclApi>();
  {
    auto backend = gpu::MakeNcclBackend(api, Opts(0, 2, 0));
    REQUIRE(backend.ok());
    gpu::DeviceBackend& b = **backend;
    Result<void*> a = b.FusionBuffer(100);
    Result<void*> a2 = b.FusionBuffer(1000);
    REQUIRE(a.ok());
    REQUIRE(a2.ok());
    CHECK(*a == *a2);  // 1 MiB steps
    CHECK(api->record().mallocs == 1);
    Result<void*> big = b.FusionBuffer((3 << 20) + 1);
    REQUIRE(big.ok());
    CHECK(api->record().mallocs == 2);
    CHECK(api->record().frees == 1);
    CHECK(api->IsAllocated(static_cast<char*>(*big) + (4 << 20) - 1));
    Result<gpu::DeviceMemory> out = b.Allocate(64);
    REQUIRE(out.ok());
    CHECK(api->live_allocations() == 2);
  }
  CHECK(api->live_allocations() == 0);
  auto rec = api->record();
  CHECK(rec.events_created == rec.events_destroyed);
}

TEST_CASE("rejected arguments communicate nothing and leave the backend usable", "[backend]") {
  auto api = std::make_shared<FakeNcclApi>();
  auto backend = gpu::MakeNcclBackend(api, Opts(0, 2, 0));
  REQUIRE(backend.ok());
  gpu::DeviceBackend& b = **backend;
  Status avg = b.Allreduce(g_buf, g_buf, 3, RINGRUN_INT32, RINGRUN_AVERAGE, 1.0);
  CHECK(avg.code() == Code::kInvalidArgument);
  CHECK_THAT(avg.message(), Catch::Contains("rank 0/2") && Catch::Contains("allreduce"));
  CHECK(b.Broadcast(g_buf, 3, RINGRUN_FLOAT32, 2).code() == Code::kInvalidArgument);
  CHECK(b.Allgatherv(g_buf, g_buf, {1}, RINGRUN_FLOAT32).code() == Code::kInvalidArgument);
  CHECK(api->record().collectives.empty());
  CHECK(b.Allreduce(g_buf, g_buf, 3, RINGRUN_INT32, RINGRUN_SUM, 1.0).ok());
}

TEST_CASE("an asynchronous NCCL error aborts the communicator, later calls fail fast",
          "[backend]") {
  FakeNcclApi::Script s;
  s.async_error = ncclRemoteError;
  auto api = std::make_shared<FakeNcclApi>(s);
  auto backend = gpu::MakeNcclBackend(api, Opts(1, 2, 1));
  REQUIRE(backend.ok());
  gpu::DeviceBackend& b = **backend;
  Status st = b.Allreduce(g_buf, g_buf, 8, RINGRUN_FLOAT32, RINGRUN_SUM, 1.0);
  CHECK(st.code() == Code::kUnavailable);
  CHECK_THAT(st.message(), Catch::Contains("rank 1/2") && Catch::Contains("remote process exited"));
  CHECK(api->record().aborts == 1);
  Status again = b.Allgatherv(g_buf, g_buf, {1, 1}, RINGRUN_FLOAT32);
  CHECK(again.message() == st.message());
  CHECK(b.Copy(g_buf, g_buf + 1, 4).message() == st.message());
  CHECK(b.Finish({}, true).message() == st.message());
  CHECK(api->record().collectives.size() == 1);
  CHECK(api->record().calls_after_end == 0);
}

TEST_CASE("work that never completes times out in Finish and aborts", "[backend]") {
  FakeNcclApi::Script s;
  s.collective_hangs = true;
  auto api = std::make_shared<FakeNcclApi>(s);
  auto backend = gpu::MakeNcclBackend(api, Opts(0, 2, 0, /*timeout_ms=*/100));
  REQUIRE(backend.ok());
  gpu::DeviceBackend& b = **backend;
  REQUIRE(b.Allreduce(g_buf, g_buf, 8, RINGRUN_FLOAT32, RINGRUN_SUM, 1.0).ok());
  // Not waiting: returns at once, the work still pending.
  REQUIRE(b.Finish({}, /*wait=*/false).ok());
  Status st = b.Finish({}, /*wait=*/true);
  CHECK(st.code() == Code::kTimeout);
  CHECK_THAT(st.message(), Catch::Contains("device collectives did not complete within 100 ms"));
  CHECK(api->record().aborts == 1);
}

TEST_CASE("Abort() from another thread ends a Finish in flight", "[backend]") {
  FakeNcclApi::Script s;
  s.collective_hangs = true;
  auto api = std::make_shared<FakeNcclApi>(s);
  auto backend = gpu::MakeNcclBackend(api, Opts(0, 2, 0, /*timeout_ms=*/60000));
  REQUIRE(backend.ok());
  gpu::DeviceBackend* b = backend->get();
  REQUIRE(b->Allreduce(g_buf, g_buf, 8, RINGRUN_FLOAT32, RINGRUN_SUM, 1.0).ok());
  std::thread aborter([b] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    b->Abort("rank 1 on node2 exited with code 137");
  });
  const auto start = std::chrono::steady_clock::now();
  Status st = b->Finish({}, /*wait=*/true);
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

TEST_CASE("an abort that hangs is left behind at its deadline, and NCCL is refused after it",
          "[backend]") {
  FakeNcclApi::Script s;
  s.collective_hangs = true;
  s.abort_hangs = true;
  auto api = std::make_shared<FakeNcclApi>(s);
  gpu::NcclBackendOptions o = Opts(0, 2, 0, /*timeout_ms=*/100);
  o.abort_timeout_ms = 200;
  auto backend = gpu::MakeNcclBackend(api, o);
  REQUIRE(backend.ok());
  gpu::DeviceBackend& b = **backend;
  REQUIRE(b.Allreduce(g_buf, g_buf, 8, RINGRUN_FLOAT32, RINGRUN_SUM, 1.0).ok());
  const auto start = std::chrono::steady_clock::now();
  Status st = b.Finish({}, /*wait=*/true);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  CHECK(st.code() == Code::kTimeout);
  CHECK_THAT(st.message(), Catch::Contains("device collectives did not complete within 100 ms") &&
                               Catch::Contains("ncclCommAbort did not return within 200 ms"));
  CHECK(api->hung_aborts() == 1);
  CHECK(api->record().aborts == 0);  // still inside it
  // Later calls fail at once, with the same message.
  CHECK(b.Finish({}, true).message() == st.message());
  // A new communicator on this GPU (the next generation's, in an elastic job) is refused.
  auto next = gpu::MakeNcclBackend(api, Opts(0, 2, 0));
  REQUIRE_FALSE(next.ok());
  CHECK(next.status().code() == Code::kUnavailable);
  CHECK_THAT(next.status().message(),
             Catch::Contains("rank 0/2: NCCL cannot be used again in this process") &&
                 Catch::Contains("could not be aborted"));
  // The backend goes without waiting again and frees nothing on the stuck device.
  const int frees = api->record().frees;
  const auto destroy = std::chrono::steady_clock::now();
  backend->reset();
  CHECK(std::chrono::steady_clock::now() - destroy < std::chrono::seconds(1));
  CHECK(api->record().frees == frees);
  // The abort's thread ends once NCCL lets it.
  api->ReleaseHungAborts();
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (api->record().aborts == 0 && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(api->record().aborts == 1);
  // Another process's NCCL (another api) is not marked.
  auto other = std::make_shared<FakeNcclApi>(FakeNcclApi::Script{});
  CHECK(gpu::MakeNcclBackend(other, Opts(0, 1, 0)).ok());
}

TEST_CASE("a ready event is recorded on the caller's stream, on the buffer's device", "[backend]") {
  FakeNcclApi::Script s;
  s.current_device = 1;
  auto api = std::make_shared<FakeNcclApi>(s);
  cudaStream_t caller;
  api->StreamCreateNonBlocking(&caller);
  const int gate = api->EnqueueGate(caller);
  Result<gpu::DeviceEvent> ev = gpu::RecordNcclEvent(api, g_buf, caller);
  REQUIRE(ev.ok());
  auto* e = static_cast<cudaEvent_t>(ev->get());
  CHECK(api->EventQuery(e) == cudaErrorNotReady);  // behind the caller's pending work
  api->OpenGate(gate);
  CHECK(api->EventQuery(e) == cudaSuccess);
  ev->reset();
  CHECK(api->record().events_destroyed == 1);
}

TEST_CASE("a healthy backend is finalized and destroyed, not aborted", "[backend]") {
  auto api = std::make_shared<FakeNcclApi>();
  {
    auto backend = gpu::MakeNcclBackend(api, Opts(0, 2, 0));
    REQUIRE(backend.ok());
  }
  auto rec = api->record();
  CHECK(rec.finalizes == 1);
  CHECK(rec.destroys == 1);
  CHECK(rec.aborts == 0);
  CHECK(rec.calls_after_end == 0);
}
