// The engine's device path end to end without a GPU: ranks as threads, each with its engine,
// the real NCCL backend and a FakeNcclApi joined in one FakeGpuWorld, which moves and reduces
// the bytes. Checks values, how many NCCL calls a fused batch costs, the ordering with the
// callers' streams, and that no pending device work outlives a deadline or a shutdown.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "runtime/src/gpu/nccl_backend.h"
#include "tests/gpu/fake_nccl_api.h"
#include "tests/runtime/engine_helpers.h"
#include "tests/runtime/thread_job.h"

namespace ringrun::runtime::testing {
namespace {

using namespace ringrun::runtime::transport;

using engine::Entry;
using engine::HandleState;
using engine::Kind;
using gpu::testing::FakeGpuWorld;
using gpu::testing::FakeNcclApi;

constexpr int kMaxRanks = 3;
constexpr size_t kDeviceFloats = 4096;
// "Device memory": is_device says so for any address inside it.
float g_device[kMaxRanks][8][kDeviceFloats];

bool InDevice(const void* p) {
  const char* c = static_cast<const char*>(p);
  const char* base = reinterpret_cast<const char*>(g_device);
  return c >= base && c < base + sizeof(g_device);
}

// np runtimes over loopback, each with an NCCL backend on its own FakeNcclApi of one world.
struct DeviceJob {
  int np;
  std::shared_ptr<FakeGpuWorld> world;
  std::vector<std::shared_ptr<FakeNcclApi>> apis;
  std::vector<std::unique_ptr<Runtime>> rts;

  // timeline: a path for RINGRUN_TIMELINE ("" for none); rank 0 writes it, rank r > 0
  // <stem>.<r>.json.
  // failing_malloc_on_0: rank 0's n-th device allocation fails (0: none does).
  explicit DeviceJob(int n, int backend_timeout_ms = 10000, const std::string& timeline = "",
                     int failing_malloc_on_0 = 0)
      : np(n) {
    world = std::make_shared<FakeGpuWorld>(np);
    FakeNcclApi::Script script;
    script.device_count = 1;
    for (int r = 0; r < np; ++r) {
      script.failing_malloc = r == 0 ? failing_malloc_on_0 : 0;
      apis.push_back(std::make_shared<FakeNcclApi>(script, world, r));
    }
    ThreadJobOptions o;
    o.np = np;
    o.transport.use_shm = false;
    o.timeout_ms = 20000;
    std::vector<std::unique_ptr<Transport>> ts;
    REQUIRE(MakeThreadTransports(o, &ts).empty());
    for (int r = 0; r < np; ++r) {
      EngineSettings s;
      s.is_device = InDevice;
      s.timeline = timeline;
      s.make_nccl_id = [] {
        FakeNcclApi id_maker;
        ncclUniqueId id;
        id_maker.GetUniqueId(&id);
        return std::string(id.internal, sizeof(id.internal));
      };
      std::shared_ptr<gpu::NcclApi> api = apis[r];
      s.make_device = [api, r, n = np, backend_timeout_ms](const std::string& id) {
        gpu::NcclBackendOptions b;
        b.rank = r, b.size = n, b.local_rank = 0, b.nccl_id = id;
        b.timeout_ms = backend_timeout_ms;
        b.poll_interval_us = 50;
        return gpu::MakeNcclBackend(api, b);
      };
      s.record_event = [api](const void* buffer, void* stream) {
        return gpu::RecordNcclEvent(api, buffer, stream);
      };
      Shape shape;
      shape.rank = r, shape.size = np, shape.local_rank = -1, shape.cross_rank = -1;
      rts.push_back(std::make_unique<Runtime>(std::move(ts[r]), shape, 20000, s));
    }
  }

  std::string Run(const std::function<void(int, Runtime&, FakeNcclApi&, Failures&)>& body) {
    Failures f;
    std::vector<std::thread> threads;
    for (int r = 0; r < np; ++r) {
      threads.emplace_back([&, r] { body(r, *rts[r], *apis[r], f); });
    }
    for (auto& t : threads) t.join();
    return f.Joined();
  }

  // The NCCL calls of one kind that rank r's backend made ("allreduce", "premulsum", ...).
  int Calls(int r, const std::string& kind) {
    int n = 0;
    for (const std::string& c : apis[r]->record().collectives) n += c.rfind(kind + " ", 0) == 0;
    return n;
  }
};

Entry DeviceAllreduce(const std::string& name, float* buf, size_t count, ringrun_op op,
                      double pre = 1.0, double post = 1.0) {
  Entry e;
  e.req.name = name, e.req.kind = Kind::kAllreduce, e.req.dtype = RINGRUN_FLOAT32;
  e.req.op = op, e.req.count = count, e.req.prescale = pre, e.req.postscale = post;
  e.send = buf, e.recv = buf;
  return e;
}

TEST_CASE(
    "device engine: fused named allreduces with scale factors are one NCCL allreduce "
    "with the right values",
    "[engine_device]") {
  const int np = 3, kTensors = 6;
  char dir[] = "/tmp/ringrun-device-timeline.XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string timeline = std::string(dir) + "/t.json";
  auto job = std::make_unique<DeviceJob>(np, 10000, timeline);
  DeviceJob& j = *job;
  std::string failures = j.Run([&](int r, Runtime& rt, FakeNcclApi&, Failures& f) {
    for (int step = 0; step < 2; ++step) {  // the second step reuses the fusion buffer
      std::vector<Entry> group;
      for (int t = 0; t < kTensors; ++t) {
        float* p = g_device[r][t];
        for (int i = 0; i < 10 + t; ++i) p[i] = static_cast<float>(r + t + i);
        group.push_back(DeviceAllreduce("grad", p, 10 + t, RINGRUN_AVERAGE, 3.0, 0.5));
      }
      Submitted g = SubmitGroup(rt, std::move(group));
      if (!g.handle) return f.Add(r, "refused: " + g.status.message());
      std::string err = WaitOk(*g.handle);
      if (!err.empty()) return f.Add(r, err);
      // 0.5 * 3 * average over ranks of (r + t + i) = 1.5 * (t + i + 1)
      for (int t = 0; t < kTensors; ++t) {
        for (int i = 0; i < 10 + t; ++i) {
          const float want = 1.5f * static_cast<float>(t + i + 1);
          if (g_device[r][t][i] != want) {
            return f.Add(r, "tensor " + std::to_string(t) + "[" + std::to_string(i) +
                                "] = " + std::to_string(g_device[r][t][i]) + ", want " +
                                std::to_string(want));
          }
        }
      }
    }
  });
  INFO(failures);
  CHECK(failures.empty());
  for (int r = 0; r < np; ++r) {
    // One NCCL allreduce per step for six tensors; the scale is one PreMulSum of 3 * 0.5 / 3.
    CHECK(j.Calls(r, "allreduce") == 2);
    CHECK(j.Calls(r, "premulsum") == 2);
    CHECK(j.apis[r]->record().collectives[0].find("scalar=0.5") != std::string::npos);
    // The fusion buffer: allocated once, reused by the second step.
    CHECK(j.apis[r]->record().mallocs == 1);
    CHECK(j.apis[r]->record().copies == 2 * 2 * kTensors);
  }
  job.reset();  // flushes and closes the timelines
  for (int r = 0; r < np; ++r) {
    // Each tensor's row has its NCCL span, with the batch's size.
    const std::string path =
        std::string(dir) + (r == 0 ? "/t.json" : "/t." + std::to_string(r) + ".json");
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    CHECK_THAT(text.str(), Catch::Contains("\"NCCL_ALLREDUCE\"") &&
                               Catch::Contains("\"tensors\": 6") && Catch::Contains("grad.5of6"));
    std::remove(path.c_str());
  }
  rmdir(dir);
}

TEST_CASE("device engine: every collective of the API on device memory", "[engine_device]") {
  const int np = 3;
  DeviceJob job(np);
  std::string failures = job.Run([&](int r, Runtime& rt, FakeNcclApi&, Failures& f) {
    auto check = [&](bool ok, const std::string& what) {
      if (!ok) f.Add(r, what);
    };
    // allreduce SUM and MAX, unfused (different ops), and broadcast from rank 2.
    float* a = g_device[r][0];
    float* m = g_device[r][1];
    float* b = g_device[r][2];
    for (int i = 0; i < 5; ++i) a[i] = static_cast<float>(r * 10 + i), m[i] = static_cast<float>(r);
    for (int i = 0; i < 4; ++i) b[i] = r == 2 ? 7.0f + i : -1.0f;
    auto ha = Submit(rt, DeviceAllreduce("sum", a, 5, RINGRUN_SUM));
    auto hm = Submit(rt, DeviceAllreduce("max", m, 5, RINGRUN_MAX));
    Entry eb;
    eb.req.name = "bcast", eb.req.kind = Kind::kBroadcast, eb.req.dtype = RINGRUN_FLOAT32;
    eb.req.count = 4, eb.req.root = 2, eb.send = b, eb.recv = b;
    auto hb = Submit(rt, std::move(eb));
    // reducescatter AVERAGE: rank r gets block r of the average.
    float* rs_in = g_device[r][3];
    float* rs_out = g_device[r][4];
    for (int i = 0; i < 2 * np; ++i) rs_in[i] = static_cast<float>(i + 3 * r);
    Entry er;
    er.req.name = "rs", er.req.kind = Kind::kReduceScatter, er.req.dtype = RINGRUN_FLOAT32;
    er.req.op = RINGRUN_AVERAGE, er.req.count = 2, er.send = rs_in, er.recv = rs_out;
    auto hr = Submit(rt, std::move(er));
    // ragged allgather: rank r sends r + 1 rows of 2 (values 100 r + i).
    float* ag = g_device[r][5];
    for (int i = 0; i < 2 * (r + 1); ++i) ag[i] = static_cast<float>(100 * r + i);
    Entry eg;
    eg.req.name = "gather", eg.req.kind = Kind::kAllgather, eg.req.dtype = RINGRUN_FLOAT32;
    eg.req.count = r + 1, eg.req.row_elems = 2, eg.send = ag;
    auto hg = Submit(rt, std::move(eg));
    // alltoall with splits: rank r sends j + 1 rows of 1 to rank j (values 100 r + j).
    float* at = g_device[r][6];
    Entry et;
    et.req.name = "a2a", et.req.kind = Kind::kAlltoall, et.req.dtype = RINGRUN_FLOAT32;
    et.req.row_elems = 1;
    size_t k = 0;
    for (int j = 0; j < np; ++j) {
      et.req.send_rows.push_back(j + 1);
      for (int x = 0; x <= j; ++x) at[k++] = static_cast<float>(100 * r + j);
    }
    et.req.count = k, et.send = at;
    auto ht = Submit(rt, std::move(et));
    for (auto* h : {ha.get(), hm.get(), hb.get(), hr.get(), hg.get(), ht.get()}) {
      std::string err = h ? WaitOk(*h) : "refused";
      if (!err.empty()) return f.Add(r, err);
    }
    check(a[4] == static_cast<float>(10 * (0 + 1 + 2) + 3 * 4), "sum");
    check(m[0] == np - 1, "max");
    check(b[3] == 10.0f, "broadcast");
    // average over k of (r * 2 + i + 3 k) for i < 2
    for (int i = 0; i < 2; ++i) {
      check(rs_out[i] == static_cast<float>(2 * r + i + 3),
            "reducescatter[" + std::to_string(i) + "]");
    }
    std::vector<float> want_g;
    for (int q = 0; q < np; ++q) {
      for (int i = 0; i < 2 * (q + 1); ++i) want_g.push_back(static_cast<float>(100 * q + i));
    }
    check(hg->device_output_bytes == want_g.size() * 4 &&
              std::memcmp(hg->device_output.get(), want_g.data(), want_g.size() * 4) == 0,
          "ragged allgather values");
    check(hg->rows == std::vector<size_t>{1, 2, 3}, "ragged allgather rows");
    std::vector<float> want_t;
    for (int q = 0; q < np; ++q)
      want_t.insert(want_t.end(), r + 1, static_cast<float>(100 * q + r));
    check(ht->device_output_bytes == want_t.size() * 4 &&
              std::memcmp(ht->device_output.get(), want_t.data(), want_t.size() * 4) == 0,
          "alltoall values");
    // The blocking forms (equal blocks, the caller's buffers), alltoall in place.
    float* fa = g_device[r][7];
    for (int j = 0; j < np; ++j) fa[j] = static_cast<float>(10 * r + j);
    check(rt.Alltoall(fa, fa, 1, RINGRUN_FLOAT32).ok(), "blocking alltoall");
    for (int j = 0; j < np; ++j)
      check(fa[j] == static_cast<float>(10 * j + r), "alltoall in place");
    float* gin = g_device[r][3];
    float* gout = g_device[r][4];
    gin[0] = static_cast<float>(r);
    check(rt.Allgather(gin, gout, 1, RINGRUN_FLOAT32).ok(), "blocking allgather");
    for (int j = 0; j < np; ++j) check(gout[j] == static_cast<float>(j), "allgather");
    // NCCL's in place reducescatter: recv = send + rank * recvcount.
    float* rsp = g_device[r][5];
    for (int i = 0; i < np; ++i) rsp[i] = 1.0f;
    check(rt.ReduceScatter(rsp, rsp + r, 1, RINGRUN_FLOAT32, RINGRUN_SUM).ok(), "rs in place");
    check(rsp[r] == np, "reducescatter in place");
  });
  INFO(failures);
  CHECK(failures.empty());
  // The handle owns the device outputs: released with it (the runtime is still up).
  for (int r = 0; r < np; ++r) {
    CHECK(job.Calls(r, "reducescatter") == 2);
    CHECK(job.Calls(r, "send") > 0);
  }
}

TEST_CASE(
    "device engine: the engine's stream waits for the caller's stream, and the caller's "
    "stream waits for the result",
    "[engine_device]") {
  const int np = 2;
  DeviceJob job(np);
  std::vector<float> seen[np];
  std::string failures = job.Run([&](int r, Runtime& rt, FakeNcclApi& api, Failures& f) {
    float* x = g_device[r][0];
    for (int i = 0; i < 4; ++i) x[i] = -100.0f;  // stale: must never be reduced
    cudaStream_t caller;
    api.StreamCreateNonBlocking(&caller);
    // The caller's "kernel" that produces the input runs only when the gate opens.
    const int gate = api.EnqueueGate(caller);
    api.EnqueueHostFn(caller, [x, r] {
      for (int i = 0; i < 4; ++i) x[i] = static_cast<float>(r + i);
    });
    // Returns once enqueued: the input is not even produced yet.
    Status st = rt.Allreduce(x, x, 4, RINGRUN_FLOAT32, RINGRUN_SUM, caller);
    if (!st.ok()) return f.Add(r, "allreduce on stream: " + st.message());
    if (x[0] != -100.0f) f.Add(r, "the engine read or wrote before the caller's stream got there");
    // The caller's next "kernel" reads the result.
    api.EnqueueHostFn(caller, [x, r, &seen] { seen[r].assign(x, x + 4); });
    api.OpenGate(gate);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (api.StreamQuery(caller) != cudaSuccess && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const std::vector<float> want = {1, 3, 5, 7};
    if (seen[r] != want) f.Add(r, "the caller's stream did not see the result");
    // Which streams waited on which events: the engine's (neither the caller's nor the default
    // one) on the ready event (e1, recorded at submission), then the caller's on the result
    // event (e2, made with the backend at the first device collective).
    const std::vector<std::string> waits = api.record().stream_waits;
    const std::string mine = api.Name(caller);
    const bool engine_first = waits.size() == 2 && waits[0].rfind(mine + "->", 0) != 0 &&
                              waits[0].rfind("default->", 0) != 0 &&
                              waits[0].substr(waits[0].find("->")) == "->e1";
    if (!engine_first || waits[1] != mine + "->e2") {
      std::string got;
      for (const auto& w : waits) got += w + " ";
      f.Add(r, "stream waits: " + got);
    }
  });
  INFO(failures);
  CHECK(failures.empty());
}

// A grouped device allreduce (three tensors, fused) that cannot complete: rank 1's producer
// never runs (a closed gate on its default stream), so its engine's stream never reaches the
// allreduce, and every other rank's never completes either.
testing::Submitted SubmitStuckGroup(int r, Runtime& rt, FakeNcclApi& api) {
  if (r == 1) api.EnqueueGate(nullptr);
  std::vector<Entry> group;
  for (int t = 0; t < 3; ++t) group.push_back(DeviceAllreduce("w", g_device[r][t], 8, RINGRUN_SUM));
  return SubmitGroup(rt, std::move(group));
}

TEST_CASE("device engine: fused work that cannot complete ends at the deadline on every rank",
          "[engine_device]") {
  const int np = 2;
  DeviceJob job(np, /*backend_timeout_ms=*/300);
  std::string failures = job.Run([&](int r, Runtime& rt, FakeNcclApi& api, Failures& f) {
    Submitted g = SubmitStuckGroup(r, rt, api);
    if (!g.handle) return f.Add(r, "refused");
    const auto start = std::chrono::steady_clock::now();
    Code st = engine::WaitHandle(*g.handle, 20000);
    const auto took = std::chrono::steady_clock::now() - start;
    const std::string msg = g.handle->done() ? g.handle->message : "(not done)";
    if (st != Code::kTimeout || msg.find("did not complete within 300 ms") == std::string::npos) {
      f.Add(r, std::string(CodeName(st)) + ": " + msg);
    }
    if (took > std::chrono::seconds(10)) f.Add(r, "took too long");
    // The communicator is aborted: later device work fails fast with the same reason.
    float* p = g_device[r][4];
    std::string again;
    auto h = Submit(rt, DeviceAllreduce("after", p, 2, RINGRUN_SUM), &again);
    if (!h || engine::WaitHandle(*h, 20000) == Code::kOk) f.Add(r, "later device work ran");
    if (api.record().aborts != 1) f.Add(r, "aborts: " + std::to_string(api.record().aborts));
  });
  INFO(failures);
  CHECK(failures.empty());
}

TEST_CASE(
    "device engine: a device failure on one rank never pairs its NCCL calls with "
    "another step's",
    "[engine_device]") {
  // Rank 0 cannot allocate the fusion buffer in step 0, so it enqueues nothing for it while
  // rank 1 enqueues step 0's allreduce. Were rank 0's communicator kept, its step 1 allreduce
  // would be the partner of rank 1's step 0 one (NCCL pairs the k-th calls), and rank 1 would
  // get step 1's data as step 0's sum. Every handle must end with the right sum or an error.
  const int np = 2;
  DeviceJob job(np, /*backend_timeout_ms=*/1000, "", /*failing_malloc_on_0=*/1);
  std::string failures = job.Run([&](int r, Runtime& rt, FakeNcclApi&, Failures& f) {
    int failed = 0;
    for (int step = 0; step < 2; ++step) {
      std::vector<Entry> group;
      for (int t = 0; t < 2; ++t) {
        float* p = g_device[r][t];
        for (int i = 0; i < 4; ++i) p[i] = static_cast<float>(10 * step + r);
        group.push_back(DeviceAllreduce("s", p, 4, RINGRUN_SUM));
      }
      Submitted g = SubmitGroup(rt, std::move(group));
      if (!g.handle) {  // refused: the runtime has failed (that is allowed)
        ++failed;
        continue;
      }
      Code st = engine::WaitHandle(*g.handle, 20000);
      if (st != Code::kOk) {
        ++failed;
        if (r == 0 && step == 0 && g.handle->message.find("cudaMalloc") == std::string::npos) {
          f.Add(r, "step 0 failed without naming the allocation: " + g.handle->message);
        }
        continue;
      }
      const float want = static_cast<float>(2 * 10 * step + 1);
      for (int t = 0; t < 2; ++t) {
        if (g_device[r][t][0] != want) {
          f.Add(r, "step " + std::to_string(step) + ": " + std::to_string(g_device[r][t][0]) +
                       " reported OK, the sum is " + std::to_string(want));
        }
      }
    }
    if (r == 0 && failed == 0) f.Add(r, "the failed allocation failed nothing");
  });
  INFO(failures);
  CHECK(failures.empty());
}

TEST_CASE("device engine: shutdown aborts fused work in flight, nothing waits for the timeout",
          "[engine_device]") {
  const int np = 2;
  DeviceJob job(np, /*backend_timeout_ms=*/60000);
  std::vector<std::shared_ptr<HandleState>> handles(np);
  std::string failures = job.Run([&](int r, Runtime& rt, FakeNcclApi& api, Failures& f) {
    Submitted g = SubmitStuckGroup(r, rt, api);
    if (!g.handle) return f.Add(r, "refused");
    handles[r] = g.handle;
    // Wait until the device batch is in flight (the backend exists and has enqueued).
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (api.record().collectives.empty() && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  REQUIRE(failures.empty());
  const auto start = std::chrono::steady_clock::now();
  for (auto& rt : job.rts) rt->engine().Shutdown();
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  for (int r = 0; r < np; ++r) {
    INFO("rank " << r);
    REQUIRE(handles[r]);
    Code st = engine::WaitHandle(*handles[r], 0);
    CHECK(st == Code::kAborted);
    CHECK(job.apis[r]->record().aborts == 1);
  }
}

TEST_CASE("device engine: submission errors", "[engine_device]") {
  DeviceJob job(1);
  Runtime& rt = *job.rts[0];
  float* p = g_device[0][0];
  std::string msg;
  Entry e = DeviceAllreduce("p", p, 4, RINGRUN_PRODUCT, 2.0);
  CHECK_FALSE(Submit(rt, std::move(e), &msg));
  CHECK_THAT(msg, Catch::Contains("scale factors on device memory need SUM or AVERAGE") &&
                      Catch::Contains("not product"));
  // A host buffer with a device one.
  float host[4];
  Entry mixed = DeviceAllreduce("m", p, 4, RINGRUN_SUM);
  mixed.recv = host;
  CHECK_FALSE(Submit(rt, std::move(mixed), &msg));
  CHECK_THAT(msg, Catch::Contains("one buffer is device memory"));
  // int16 reductions: NCCL has no 16-bit integer type, so they are refused here, by name.
  for (Kind kind : {Kind::kAllreduce, Kind::kReduceScatter}) {
    Entry r = DeviceAllreduce("i16", p, 2, RINGRUN_SUM);
    r.req.kind = kind, r.req.dtype = RINGRUN_INT16;
    CHECK_FALSE(Submit(rt, std::move(r), &msg));
    CHECK_THAT(msg, Catch::Contains("int16 reductions need host memory") &&
                        Catch::Contains("NCCL has no 16-bit integer type"));
  }
  // Nothing reached NCCL, and no backend was made for refused work.
  CHECK(job.apis[0]->record().init_rank == -1);
}

TEST_CASE("device engine: int16 broadcast and allgather copy the values", "[engine_device]") {
  const int np = 2;
  DeviceJob job(np);
  const int16_t values[3] = {-32768, -2, 32767};
  std::string failures = job.Run([&](int r, Runtime& rt, FakeNcclApi&, Failures& f) {
    auto* b = reinterpret_cast<int16_t*>(g_device[r][0]);
    for (int i = 0; i < 3; ++i) b[i] = r == 1 ? values[i] : 0;
    if (Status st = rt.Broadcast(b, 3, RINGRUN_INT16, 1); !st.ok()) return f.Add(r, st.ToString());
    if (std::memcmp(b, values, sizeof(values)) != 0) f.Add(r, "broadcast values");
    auto* in = reinterpret_cast<int16_t*>(g_device[r][1]);
    auto* out = reinterpret_cast<int16_t*>(g_device[r][2]);
    in[0] = static_cast<int16_t>(-1 - r), in[1] = static_cast<int16_t>(30000 + r);
    if (Status st = rt.Allgather(in, out, 2, RINGRUN_INT16); !st.ok()) {
      return f.Add(r, st.ToString());
    }
    const int16_t want[4] = {-1, 30000, -2, 30001};
    if (std::memcmp(out, want, sizeof(want)) != 0) f.Add(r, "allgather values");
  });
  INFO(failures);
  CHECK(failures.empty());
}

}  // namespace
}  // namespace ringrun::runtime::testing
