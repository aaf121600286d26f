// The engine: named asynchronous collectives negotiated across ranks, ranks as threads over
// real loopback sockets and shared memory.
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "ringrun/common/clock.h"
#include "ringrun/common/fd.h"
#include "ringrun/names.h"
#include "runtime/src/engine/controller.h"
#include "runtime/src/engine/name_table.h"
#include "runtime/src/engine/stall_inspector.h"
#include "runtime/src/engine/timeline.h"
#include "runtime/src/gpu/device_backend.h"
#include "tests/runtime/engine_helpers.h"
#include "tests/runtime/values.h"
#include "thread_job.h"

namespace ringrun::runtime::testing {
namespace {

using namespace ringrun::runtime::transport;

using engine::Entry;
using engine::HandleState;
using engine::Kind;
using engine::KindName;

ThreadJobOptions Opts(int np, bool shm = true) {
  ThreadJobOptions o;
  o.np = np;
  o.transport.use_shm = shm;
  o.transport.spin = false;  // ranks are threads on a small machine
  o.timeout_ms = 20000;
  return o;
}

Entry Allreduce(const std::string& name, const float* send, float* recv, size_t count,
                ringrun_op op = RINGRUN_SUM) {
  Entry e;
  e.req.name = name, e.req.kind = Kind::kAllreduce, e.req.dtype = RINGRUN_FLOAT32;
  e.req.op = op, e.req.count = count;
  e.send = send, e.recv = recv;
  return e;
}

// Rank r's timeline file for a job whose RINGRUN_TIMELINE was DIR/t.json (rank 0's is the file
// named), and a file's bytes.
std::string TimelineOf(const char* dir, int r) {
  return std::string(dir) + (r == 0 ? "/t.json" : "/t." + std::to_string(r) + ".json");
}
// Waits for each handle, adding its failure to `f`.
void WaitAll(int rank, const std::vector<std::shared_ptr<HandleState>>& hs, Failures& f) {
  for (const auto& h : hs) {
    std::string err = WaitOk(*h);
    if (!err.empty()) f.Add(rank, err);
  }
}
std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Whether `path` is strict JSON, a list of events (python's parser, the strictest one at hand;
// true where there is no python).
bool StrictTrace(const std::string& path) {
  if (::access("/usr/bin/python3", X_OK) != 0) return true;
  const std::string cmd =
      "/usr/bin/python3 -c 'import json,sys; e=json.load(open(sys.argv[1]));"
      " assert all(\"ph\" in x for x in e)' " +
      path;
  return std::system(cmd.c_str()) == 0;
}

TEST_CASE("engine: the name table agrees with a map through growth and churn", "[engine]") {
  // Made-up names come and go (unnamed tensors), kept ones stay: erasing must shift probe runs
  // back so that every name that stays is still found, across wrap-around and growth.
  engine::NameTable<int> table;
  std::map<std::string, int> model;
  std::vector<std::unique_ptr<std::string>> keys;  // the table's keys view these
  std::vector<int> values(4096);
  std::mt19937 rng(7);
  for (int step = 0; step < 40000; ++step) {
    const int k = static_cast<int>(rng() % 3000);
    const std::string name = (k % 3 ? "layer" : "allreduce.noname.") + std::to_string(k);
    auto it = model.find(name);
    if (rng() % 2 == 0) {
      if (it == model.end()) {
        keys.push_back(std::make_unique<std::string>(name));
        REQUIRE(table.Insert(*keys.back(), &values[static_cast<size_t>(k)]));
        model[name] = k;
      } else {
        REQUIRE_FALSE(table.Insert(name, &values[0]));  // as emplace: the first value stays
      }
    } else {
      table.Erase(name);
      if (it != model.end()) model.erase(it);
    }
    if (step % 997 == 0 || step == 39999) {
      REQUIRE(table.size() == model.size());
      for (int j = 0; j < 3000; ++j) {
        const std::string q = (j % 3 ? "layer" : "allreduce.noname.") + std::to_string(j);
        const bool in = model.count(q) > 0;
        int* v = table.Find(q);
        REQUIRE((v != nullptr) == in);
        if (v) REQUIRE(v == &values[static_cast<size_t>(j)]);
      }
    }
  }
  for (const auto& [name, k] : std::map<std::string, int>(model)) table.Erase(name);
  REQUIRE(table.size() == 0);
  REQUIRE(table.Find("layer1") == nullptr);
}

TEST_CASE("engine: random submission orders and several threads per rank agree", "[engine]") {
  for (bool shm : {true, false}) {
    const int np = 3, kTensors = 60;
    std::string failures = RunThreadJob(Opts(np, shm), [&](int rank, Runtime& rt, Failures& f) {
      for (int step = 0; step < 3; ++step) {  // later steps run from the response cache
        std::vector<std::vector<float>> bufs(kTensors);
        for (int t = 0; t < kTensors; ++t) {
          bufs[t].assign(1 + t * 37, static_cast<float>(rank + t));
        }
        std::vector<int> order(kTensors);
        for (int t = 0; t < kTensors; ++t) order[t] = t;
        std::shuffle(order.begin(), order.end(), std::mt19937(rank * 7919 + step));
        std::vector<std::shared_ptr<HandleState>> hs(kTensors);
        std::vector<std::thread> threads;
        for (int th = 0; th < 3; ++th) {
          threads.emplace_back([&, th] {
            for (int i = th; i < kTensors; i += 3) {
              const int t = order[i];
              hs[t] = Submit(rt, Allreduce("grad." + std::to_string(t), bufs[t].data(),
                                           bufs[t].data(), bufs[t].size()));
            }
          });
        }
        for (auto& t : threads) t.join();
        for (int t = 0; t < kTensors; ++t) {
          if (!hs[t]) {
            f.Add(rank, "submission " + std::to_string(t) + " refused");
            return;
          }
          std::string err = WaitOk(*hs[t]);
          if (!err.empty()) f.Add(rank, err);
          const float want = static_cast<float>(np * t + (np * (np - 1)) / 2);
          for (float x : bufs[t]) {
            if (x != want) {
              f.Add(rank, "grad." + std::to_string(t) + " = " + std::to_string(x));
              break;
            }
          }
        }
      }
    });
    INFO((shm ? "shm: " : "tcp: ") + failures);
    CHECK(failures.empty());
  }
}

TEST_CASE("engine: blocking calls on one thread while another submits named tensors", "[engine]") {
  // One thread per rank makes blocking calls (made-up names, the same order on every rank)
  // while another submits named tensors in a random order: rounds carry both kinds, in
  // different mixes on each rank, and every result is right.
  for (bool shm : {true, false}) {
    const int np = 3, kSteps = 40, kTensors = 12;
    std::string failures = RunThreadJob(Opts(np, shm), [&](int rank, Runtime& rt, Failures& f) {
      std::thread async([&] {
        std::mt19937 rng(rank * 31 + 1);
        for (int step = 0; step < kSteps / 4; ++step) {
          std::vector<std::vector<float>> bufs(kTensors);
          std::vector<std::shared_ptr<HandleState>> hs(kTensors);
          std::vector<int> order(kTensors);
          for (int t = 0; t < kTensors; ++t) order[t] = t, bufs[t].assign(1 + t * 101, 1.0f);
          std::shuffle(order.begin(), order.end(), rng);
          for (int t : order) {
            hs[t] = Submit(rt, Allreduce("async." + std::to_string(t), bufs[t].data(),
                                         bufs[t].data(), bufs[t].size()));
          }
          for (int t = 0; t < kTensors; ++t) {
            if (!hs[t]) {
              f.Add(rank, "async." + std::to_string(t) + " refused");
              return;
            }
            std::string err = WaitOk(*hs[t]);
            if (!err.empty()) f.Add(rank, err);
            if (bufs[t][0] != np || bufs[t].back() != np) f.Add(rank, "async result wrong");
          }
        }
      });
      for (int step = 0; step < kSteps; ++step) {
        std::vector<float> x(1 + (step % 4) * 1000, static_cast<float>(rank + step));
        Status st = rt.Allreduce(x.data(), x.data(), x.size(), RINGRUN_FLOAT32, RINGRUN_SUM);
        if (!st.ok()) f.Add(rank, "blocking allreduce: " + st.ToString());
        const float want = static_cast<float>(np * step + np * (np - 1) / 2);
        if (x[0] != want || x.back() != want) {
          f.Add(rank, "blocking step " + std::to_string(step) + ": " + std::to_string(x[0]));
        }
        if (step % 10 == 9) {
          Status b = rt.Barrier();
          if (!b.ok()) f.Add(rank, "barrier: " + b.ToString());
        }
      }
      async.join();
    });
    INFO((shm ? "shm: " : "tcp: ") + failures);
    CHECK(failures.empty());
  }
}

TEST_CASE("engine: fused tensors of every small byte size are copied in and out whole",
          "[engine]") {
  // The fusion buffer copies tensors of up to 16 bytes without memcpy, in overlapping words:
  // every size from 1 to 40 bytes (int8 counts), packed back to back at odd offsets.
  const int np = 2, kTensors = 40;
  std::string failures = RunThreadJob(Opts(np), [&](int rank, Runtime& rt, Failures& f) {
    std::vector<std::vector<int8_t>> bufs(kTensors);
    for (int t = 0; t < kTensors; ++t) {
      bufs[t].resize(static_cast<size_t>(t + 1));
      for (int i = 0; i <= t; ++i)
        bufs[t][static_cast<size_t>(i)] = static_cast<int8_t>(rank + i % 7);
    }
    std::vector<Entry> entries;
    for (int t = 0; t < kTensors; ++t) {
      Entry e;
      e.req.name = "bytes." + std::to_string(t), e.req.kind = Kind::kAllreduce;
      e.req.dtype = RINGRUN_INT8, e.req.op = RINGRUN_SUM, e.req.count = bufs[t].size();
      e.send = bufs[t].data(), e.recv = bufs[t].data();
      entries.push_back(std::move(e));
    }
    Submitted r = SubmitGroup(rt, std::move(entries));
    if (!r.handle) {
      f.Add(rank, r.status.message());
      return;
    }
    std::string err = WaitOk(*r.handle);
    if (!err.empty()) f.Add(rank, err);
    for (int t = 0; t < kTensors; ++t) {
      for (int i = 0; i <= t; ++i) {
        const int want = 1 + 2 * (i % 7);  // rank 0's i % 7 plus rank 1's 1 + i % 7
        if (bufs[t][static_cast<size_t>(i)] != want) {
          f.Add(rank, "bytes." + std::to_string(t) + "[" + std::to_string(i) +
                          "] = " + std::to_string(bufs[t][static_cast<size_t>(i)]));
          return;
        }
      }
    }
  });
  INFO(failures);
  CHECK(failures.empty());
}

TEST_CASE("engine: AVERAGE and a postscale over the ring, at 2 and 3 ranks", "[engine]") {
  // Large enough for the ring, where the division and the postscale are applied to each block
  // as its last reduction writes it; the values must be exactly sum / n * postscale.
  for (int np : {2, 3}) {
    for (bool shm : {true, false}) {
      std::string failures = RunThreadJob(Opts(np, shm), [&](int rank, Runtime& rt, Failures& f) {
        const size_t count = (1 << 17) + 5;
        std::vector<float> a(count), want(count);
        for (size_t i = 0; i < count; ++i) {
          a[i] = static_cast<float>((i % 97) * (rank + 1)) * 0.37f;
          float sum = 0;
          for (int r = 0; r < np; ++r) sum += static_cast<float>((i % 97) * (r + 1)) * 0.37f;
          want[i] = sum / static_cast<float>(np) * 1.5f;
        }
        Entry e = Allreduce("avg.scaled", a.data(), a.data(), count, RINGRUN_AVERAGE);
        e.req.postscale = 1.5;
        auto h = Submit(rt, std::move(e));
        if (!h) return f.Add(rank, "submit failed");
        std::string err = WaitOk(*h);
        if (!err.empty()) return f.Add(rank, err);
        for (size_t i = 0; i < count; ++i) {
          // The sum's order differs from the reference loop's by rank; allow one rounding.
          if (std::fabs(a[i] - want[i]) > 1e-6f * std::fabs(want[i]) + 1e-6f) {
            return f.Add(rank, "element " + std::to_string(i) + ": " + std::to_string(a[i]) +
                                   ", want " + std::to_string(want[i]));
          }
        }
      });
      INFO("np=" << np << (shm ? " shm: " : " tcp: ") << failures);
      CHECK(failures.empty());
    }
  }
}

TEST_CASE("engine: between hosts, a batch of large and small allreduces runs as one ring",
          "[engine]") {
  // Ranks on two loopback "hosts": large allreduces of one round join the packed small ones in
  // one ring over all the buffers (AllreduceSegments); np=4 (two per host) takes the
  // hierarchical path, which reduces each buffer on its own. Values must be exact either way.
  for (int np : {2, 3, 4}) {
    ThreadJobOptions o = Opts(np);
    for (int r = 0; r < np; ++r) o.hosts.push_back(r < (np + 1) / 2 ? "127.0.0.1" : "127.0.0.2");
    std::string failures = RunThreadJob(o, [&](int rank, Runtime& rt, Failures& f) {
      const std::vector<size_t> counts = {70000, 3, 100000, 1, 65536 + 7, 20, 300000};
      std::vector<std::vector<float>> in(counts.size()), out(counts.size());
      std::vector<Entry> group;
      for (size_t t = 0; t < counts.size(); ++t) {
        in[t].resize(counts[t]), out[t].assign(counts[t], -1.0f);
        for (size_t i = 0; i < counts[t]; ++i) in[t][i] = static_cast<float>((i + t) % 13 + rank);
        const bool in_place = t % 2 == 0;
        group.push_back(Allreduce("seg", in[t].data(), in_place ? in[t].data() : out[t].data(),
                                  counts[t], RINGRUN_AVERAGE));
        group.back().req.postscale = 2.0;
      }
      Submitted h = SubmitGroup(rt, std::move(group));
      if (!h.handle) return f.Add(rank, "submit: " + h.status.message());
      std::string err = WaitOk(*h.handle);
      if (!err.empty()) return f.Add(rank, err);
      for (size_t t = 0; t < counts.size(); ++t) {
        const std::vector<float>& got = t % 2 == 0 ? in[t] : out[t];
        for (size_t i = 0; i < counts[t]; ++i) {
          float sum = 0;
          for (int r = 0; r < np; ++r) sum += static_cast<float>((i + t) % 13 + r);
          const float want = sum / static_cast<float>(np) * 2.0f;
          if (std::fabs(got[i] - want) > 1e-5f * want + 1e-6f) {
            return f.Add(rank, "tensor " + std::to_string(t) + "[" + std::to_string(i) + "] = " +
                                   std::to_string(got[i]) + ", want " + std::to_string(want));
          }
        }
      }
    });
    INFO("np=" << np << ": " << failures);
    CHECK(failures.empty());
  }
}

TEST_CASE("engine: every collective", "[engine]") {
  const int np = 3;
  std::string failures = RunThreadJob(Opts(np), [&](int rank, Runtime& rt, Failures& f) {
    // allreduce with prescale and postscale, AVERAGE
    std::vector<float> a(10, 2.0f), b(10, static_cast<float>(rank));
    Entry ea = Allreduce("scaled", a.data(), a.data(), a.size());
    ea.req.prescale = 0.5, ea.req.postscale = 3.0;
    auto ha = Submit(rt, std::move(ea));
    auto hb = Submit(rt, Allreduce("avg", b.data(), b.data(), b.size(), RINGRUN_AVERAGE));
    // grouped allreduce
    std::vector<std::vector<float>> g(4, std::vector<float>(5, 1.0f));
    std::vector<Entry> group;
    for (int i = 0; i < 4; ++i) group.push_back(Allreduce("grp", g[i].data(), g[i].data(), 5));
    Submitted hg = SubmitGroup(rt, std::move(group));
    // broadcast from rank 1
    std::vector<int32_t> bc(7, rank == 1 ? 42 : -1);
    Entry eb;
    eb.req.name = "bcast", eb.req.kind = Kind::kBroadcast, eb.req.dtype = RINGRUN_INT32;
    eb.req.count = bc.size(), eb.req.root = 1, eb.send = bc.data(), eb.recv = bc.data();
    auto hbc = Submit(rt, std::move(eb));
    // ragged allgather: rank r sends r+1 rows of 2
    std::vector<int32_t> rows(2 * (rank + 1), rank);
    Entry eg;
    eg.req.name = "gather", eg.req.kind = Kind::kAllgather, eg.req.dtype = RINGRUN_INT32;
    eg.req.count = rank + 1, eg.req.row_elems = 2, eg.send = rows.data();
    auto hga = Submit(rt, std::move(eg));
    // alltoall: rank r sends j+1 rows of 1 to rank j, values 100*r + j
    std::vector<int32_t> sa;
    Entry et;
    et.req.name = "a2a", et.req.kind = Kind::kAlltoall, et.req.dtype = RINGRUN_INT32;
    et.req.row_elems = 1;
    for (int j = 0; j < np; ++j) {
      et.req.send_rows.push_back(j + 1);
      for (int k = 0; k <= j; ++k) sa.push_back(100 * rank + j);
    }
    et.req.count = sa.size(), et.send = sa.data();
    auto hta = Submit(rt, std::move(et));
    // reducescatter
    std::vector<float> rs(np * 4, 1.0f), rr(4, 0);
    Entry er;
    er.req.name = "rs", er.req.kind = Kind::kReduceScatter, er.req.dtype = RINGRUN_FLOAT32;
    er.req.count = 4, er.send = rs.data(), er.recv = rr.data();
    auto hrs = Submit(rt, std::move(er));
    Entry ebar;
    ebar.req.kind = Kind::kBarrier;
    auto hbar = Submit(rt, std::move(ebar));
    for (auto* h : {ha.get(), hb.get(), hg.handle.get(), hbc.get(), hga.get(), hta.get(), hrs.get(),
                    hbar.get()}) {
      if (!h) {
        f.Add(rank, "a submission was refused");
        return;
      }
      std::string err = WaitOk(*h);
      if (!err.empty()) f.Add(rank, err);
    }
    if (a[0] != 0.5f * 2 * np * 3) f.Add(rank, "scaled = " + std::to_string(a[0]));
    if (b[0] != 1.0f) f.Add(rank, "avg = " + std::to_string(b[0]));
    if (g[3][4] != np) f.Add(rank, "group = " + std::to_string(g[3][4]));
    if (hg.handle->name() != "grp") f.Add(rank, "group handle named " + hg.handle->name());
    if (bc[6] != 42) f.Add(rank, "bcast = " + std::to_string(bc[6]));
    std::vector<int32_t> want_g;
    for (int r = 0; r < np; ++r) want_g.insert(want_g.end(), 2 * (r + 1), r);
    std::vector<int32_t> got_g(want_g.size());
    if (hga->output.size() == want_g.size() * 4) {
      std::memcpy(got_g.data(), hga->output.data(), hga->output.size());
    }
    if (got_g != want_g) f.Add(rank, "ragged allgather wrong");
    if (hga->rows != std::vector<size_t>{1, 2, 3}) f.Add(rank, "allgather rows wrong");
    std::vector<int32_t> want_t;
    for (int r = 0; r < np; ++r) want_t.insert(want_t.end(), rank + 1, 100 * r + rank);
    std::vector<int32_t> got_t(hta->output.size() / 4);
    std::memcpy(got_t.data(), hta->output.data(), hta->output.size());
    if (got_t != want_t) f.Add(rank, "alltoall wrong");
    if (rr[3] != np) f.Add(rank, "reducescatter = " + std::to_string(rr[3]));
  });
  INFO(failures);
  CHECK(failures.empty());
}

TEST_CASE("engine: allgather and alltoall of rows with no elements move the rows", "[engine]") {
  const int np = 3;
  std::string failures = RunThreadJob(Opts(np), [&](int rank, Runtime& rt, Failures& f) {
    // A tensor of shape (rank + 1, 0): no bytes, no buffer (torch's data_ptr() of it is 0).
    Entry eg;
    eg.req.name = "empty rows", eg.req.kind = Kind::kAllgather, eg.req.dtype = RINGRUN_FLOAT32;
    eg.req.count = rank + 1, eg.req.row_elems = 0, eg.send = nullptr;
    auto hg = Submit(rt, std::move(eg));
    Entry et;
    et.req.name = "empty a2a", et.req.kind = Kind::kAlltoall, et.req.dtype = RINGRUN_FLOAT32;
    et.req.row_elems = 0, et.send = nullptr;
    for (int j = 0; j < np; ++j) et.req.send_rows.push_back(rank + j);
    et.req.count = 0;
    for (size_t x : et.req.send_rows) et.req.count += x;
    auto ht = Submit(rt, std::move(et));
    if (!hg || !ht) return f.Add(rank, "a submission was refused");
    for (auto* h : {hg.get(), ht.get()}) {
      std::string err = WaitOk(*h);
      if (!err.empty()) return f.Add(rank, err);
    }
    if (!hg->output.empty()) f.Add(rank, "allgather output is not empty");
    if (hg->rows != std::vector<size_t>{1, 2, 3}) f.Add(rank, "allgather rows wrong");
    std::vector<size_t> want_t;
    for (int r = 0; r < np; ++r) want_t.push_back(r + rank);
    if (!ht->output.empty()) f.Add(rank, "alltoall output is not empty");
    if (ht->rows != want_t) f.Add(rank, "alltoall rows wrong");
  });
  INFO(failures);
  CHECK(failures.empty());
}

// Rank 1 submits `name` differently (through `change`); every rank's handle must fail naming
// the tensor, the field and the ranks.
void CheckMismatch(const std::string& field, const std::function<void(Entry&)>& change) {
  const int np = 3;
  std::string failures = RunThreadJob(Opts(np), [&](int rank, Runtime& rt, Failures& f) {
    std::vector<float> buf(8, 1.0f);
    Entry e = Allreduce("w", buf.data(), buf.data(), buf.size());
    if (rank == 1) change(e);
    auto h = Submit(rt, std::move(e));
    if (!h) return f.Add(rank, "refused");
    auto [st, msg] = WaitStatus(*h);
    if (st != Code::kMismatch) f.Add(rank, std::string(CodeName(st)) + ": " + msg);
    for (const std::string& part : {std::string("tensor 'w'"), "disagree on the " + field,
                                    std::string("ranks 0, 2 sent"), std::string("rank 1 sent")}) {
      if (msg.find(part) == std::string::npos) f.Add(rank, "'" + msg + "' lacks '" + part + "'");
    }
    // The runtime stays usable.
    std::vector<float> x(3, 1.0f);
    auto h2 = Submit(rt, Allreduce("after", x.data(), x.data(), 3));
    std::string err = h2 ? WaitOk(*h2) : "refused";
    if (!err.empty() || x[0] != np) f.Add(rank, "after a mismatch: " + err);
  });
  INFO(field + ": " + failures);
  CHECK(failures.empty());
}

TEST_CASE("engine: a cached name: staggered ranks, then a mismatch, then the cache again",
          "[engine]") {
  // After the first step "w" travels as a cache id. Ranks announce it in different rounds
  // (rank r waits r * 20 ms), which must still complete it; then rank 1 changes its count, so
  // it announces "w" in full while the others send the id, and all must get the mismatch; then
  // the cached form must work again.
  const int np = 3;
  std::string failures = RunThreadJob(Opts(np), [&](int rank, Runtime& rt, Failures& f) {
    std::vector<float> buf(8);
    auto step = [&](size_t count) {
      std::fill(buf.begin(), buf.end(), 1.0f);
      auto h = Submit(rt, Allreduce("w", buf.data(), buf.data(), count));
      return h ? WaitStatus(*h) : std::make_pair(Code::kInternal, std::string("refused"));
    };
    for (int s = 0; s < 4; ++s) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20 * rank * (s % 2)));
      auto [st, msg] = step(8);
      if (st != Code::kOk || buf[0] != np) return f.Add(rank, "step " + std::to_string(s) + msg);
    }
    auto [st, msg] = step(rank == 1 ? 4 : 8);
    if (st != Code::kMismatch || msg.find("disagree on the count") == std::string::npos) {
      return f.Add(rank, "mismatch: " + std::string(CodeName(st)) + ": " + msg);
    }
    for (int s = 0; s < 2; ++s) {
      auto [st2, msg2] = step(8);
      if (st2 != Code::kOk || buf[0] != np) return f.Add(rank, "after: " + msg2);
    }
  });
  INFO(failures);
  CHECK(failures.empty());
}

TEST_CASE("engine: mismatches fail on every rank naming tensor, field and ranks", "[engine]") {
  CheckMismatch("dtype", [](Entry& e) { e.req.dtype = RINGRUN_INT32; });
  CheckMismatch("count", [](Entry& e) { e.req.count = 4; });
  CheckMismatch("op", [](Entry& e) { e.req.op = RINGRUN_MAX; });
  CheckMismatch("scale factors", [](Entry& e) { e.req.prescale = 2; });
  CheckMismatch("collective", [](Entry& e) {
    e.req.kind = Kind::kBroadcast;
    e.recv = const_cast<void*>(e.send);
  });
  // root: a broadcast on every rank, rank 1 names another root
  const int np = 3;
  std::string failures = RunThreadJob(Opts(np), [&](int rank, Runtime& rt, Failures& f) {
    int32_t v = rank;
    Entry e;
    e.req.name = "b", e.req.kind = Kind::kBroadcast, e.req.dtype = RINGRUN_INT32;
    e.req.count = 1, e.req.root = rank == 1 ? 2 : 0, e.send = &v, e.recv = &v;
    auto h = Submit(rt, std::move(e));
    auto [st, msg] = WaitStatus(*h);
    if (st != Code::kMismatch || msg.find("root") == std::string::npos ||
        msg.find("rank 1 sent 2") == std::string::npos) {
      f.Add(rank, msg);
    }
  });
  INFO(failures);
  CHECK(failures.empty());
}

// Every rank submits `kind` of 6 floats named "s" (the rows of shape[0] for allgather; 3 to
// each rank for reducescatter), shaped shape_of(rank);
// every rank's handle must fail when `mismatch` (naming the shape of each rank), succeed
// otherwise, and the next collective must succeed either way.
void CheckShapes(Kind kind, const std::function<std::vector<int64_t>(int)>& shape_of, bool mismatch,
                 const std::string& detail) {
  const int np = 2;
  std::string failures = RunThreadJob(Opts(np), [&](int rank, Runtime& rt, Failures& f) {
    std::vector<float> buf(6, 1.0f), out(6);
    Entry e;
    e.req.name = "s", e.req.kind = kind, e.req.dtype = RINGRUN_FLOAT32, e.req.count = 6;
    e.send = buf.data(), e.recv = kind == Kind::kAllgather ? nullptr : out.data();
    e.req.shaped = true, e.req.shape = shape_of(rank);
    if (kind == Kind::kAllgather) {
      e.req.count = e.req.shape[0];
      e.req.row_elems = 6 / e.req.shape[0];
    }
    if (kind == Kind::kReduceScatter) e.req.count = 3;
    auto h = Submit(rt, e);
    if (!h) return f.Add(rank, "refused");
    auto [st, msg] = WaitStatus(*h);
    if (!mismatch && st != Code::kOk) f.Add(rank, std::string(CodeName(st)) + ": " + msg);
    if (mismatch && (st != Code::kMismatch || msg.find(detail) == std::string::npos)) {
      f.Add(rank, std::string(CodeName(st)) + ": '" + msg + "' lacks '" + detail + "'");
    }
    std::vector<float> x(3, 1.0f);
    auto h2 = Submit(rt, Allreduce("after", x.data(), x.data(), 3));
    std::string err = h2 ? WaitOk(*h2) : "refused";
    if (!err.empty() || x[0] != np) f.Add(rank, "after: " + err);
  });
  INFO(std::string(KindName(kind)) + ": " + failures);
  CHECK(failures.empty());
}

TEST_CASE("engine: shapes that differ with the same count are a mismatch, as in Horovod",
          "[engine]") {
  auto two = [](std::vector<int64_t> a, std::vector<int64_t> b) {
    return [=](int rank) { return rank == 0 ? a : b; };
  };
  for (Kind k : {Kind::kAllreduce, Kind::kBroadcast, Kind::kReduceScatter}) {
    CheckShapes(k, two({2, 3}, {3, 2}), true,
                "tensor 's': ranks disagree on the shape: rank 0 sent (2, 3); rank 1 sent (3, 2)");
    CheckShapes(k, two({6}, {6, 1}), true, "rank 0 sent (6,); rank 1 sent (6, 1)");
    CheckShapes(k, two({2, 3}, {2, 3}), false, "");
  }
  CheckShapes(Kind::kAllgather, two({2, 3}, {3, 2}), true,
              "ranks disagree on the shape: rank 0 sent (2, 3); rank 1 sent (3, 2)");
  CheckShapes(Kind::kAllgather, two({1, 6}, {6}), true, "rank 0 sent (1, 6); rank 1 sent (6,)");
  // The first dimension may differ (rows per rank); the rest may not.
  CheckShapes(Kind::kAllgather, two({1, 6}, {2, 3}), true, "disagree on the shape");
}

TEST_CASE("engine: a request's shape travels in its encoding, and only when given", "[engine]") {
  engine::Request r;
  r.name = "t", r.kind = Kind::kAllgather, r.count = 2, r.row_elems = 3;
  std::string plain;
  r.Encode(&plain);
  r.shaped = true, r.shape = {2, 3};
  std::string shaped;
  r.Encode(&shaped);
  CHECK(shaped.size() == plain.size() + 4 + 2 * 8);
  engine::Request back;
  size_t pos = 0;
  REQUIRE(back.Decode(shaped, &pos));
  CHECK(pos == shaped.size());
  CHECK(back.Identical(r));
  pos = 0;
  REQUIRE(back.Decode(plain, &pos));
  CHECK(!back.shaped);
  CHECK(back.shape.empty());
  pos = 0;
  CHECK(!back.Decode(shaped.substr(0, shaped.size() - 1), &pos));
}

TEST_CASE("engine: an allgather's first dimension may differ across ranks", "[engine]") {
  const int np = 2;
  std::string failures = RunThreadJob(Opts(np), [&](int rank, Runtime& rt, Failures& f) {
    std::vector<float> buf(4 * (rank + 1), 1.0f);
    Entry e;
    e.req.name = "g", e.req.kind = Kind::kAllgather, e.req.dtype = RINGRUN_FLOAT32;
    e.req.count = rank + 1, e.req.row_elems = 4, e.send = buf.data();
    e.req.shaped = true, e.req.shape = {rank + 1, 2, 2};
    auto h = Submit(rt, e);
    std::string err = h ? WaitOk(*h) : "refused";
    if (!err.empty()) f.Add(rank, err);
    if (h && h->rows != std::vector<size_t>{1, 2}) f.Add(rank, "rows wrong");
  });
  INFO(failures);
  CHECK(failures.empty());
}

TEST_CASE("engine: a kept name whose shape changes is announced again", "[engine]") {
  // Steps of "w" with shape (2, 3) on every rank go the warm way (QueueKept); then rank 1
  // submits (3, 2) with the same buffers and count, which must fail on both ranks; then
  // (2, 3) works again, and so does a submission without a shape.
  const int np = 2;
  std::string failures = RunThreadJob(Opts(np), [&](int rank, Runtime& rt, Failures& f) {
    std::vector<float> buf(6);
    auto step = [&](std::vector<int64_t> shape, bool shaped = true) {
      std::fill(buf.begin(), buf.end(), 1.0f);
      Entry e = Allreduce("w", buf.data(), buf.data(), 6);
      e.req.shaped = shaped, e.req.shape = shape;
      auto h = Submit(rt, e);
      return h ? WaitStatus(*h) : std::make_pair(Code::kInternal, std::string("refused"));
    };
    for (int s = 0; s < 3; ++s) {
      auto [st, msg] = step({2, 3});
      if (st != Code::kOk || buf[0] != np) return f.Add(rank, "step " + std::to_string(s) + msg);
    }
    auto [st, msg] = step(rank == 1 ? std::vector<int64_t>{3, 2} : std::vector<int64_t>{2, 3});
    if (st != Code::kMismatch || msg.find("rank 1 sent (3, 2)") == std::string::npos) {
      return f.Add(rank, "mismatch: " + std::string(CodeName(st)) + ": " + msg);
    }
    for (int s = 0; s < 2; ++s) {
      auto [st2, msg2] = step({2, 3});
      if (st2 != Code::kOk || buf[0] != np) return f.Add(rank, "after: " + msg2);
    }
    // Unknown on one rank: not compared.
    auto [st3, msg3] = step({2, 3}, rank == 0);
    if (st3 != Code::kOk || buf[0] != np) f.Add(rank, "one rank without a shape: " + msg3);
  });
  INFO(failures);
  CHECK(failures.empty());
}

TEST_CASE("engine: a blocking allgather and a submitted one under one name are a mismatch",
          "[engine]") {
  // Blocking calls and unnamed submissions share the default names ("allgather.noname.0"), so a
  // program that mixes them differently on two ranks pairs a blocking call (equal blocks, the
  // caller's buffer) with a submission (the result in the handle). Where a rank's result goes
  // would follow the other rank's request: an error on both, never a result in the wrong place.
  std::string failures = RunThreadJob(Opts(2), [&](int rank, Runtime& rt, Failures& f) {
    std::vector<float> send(4, static_cast<float>(rank)), recv(8, -1.0f);
    if (rank == 0) {
      Status st = rt.Allgather(send.data(), recv.data(), send.size(), RINGRUN_FLOAT32);
      if (st.ok() || st.message().find("disagree on the call") == std::string::npos ||
          st.message().find("rank 1 sent submitted") == std::string::npos) {
        f.Add(rank, "blocking: " + st.message());
      }
      if (recv[0] != -1.0f) f.Add(rank, "the receive buffer was written");
    } else {
      Entry e;
      e.req.kind = Kind::kAllgather, e.req.dtype = RINGRUN_FLOAT32;
      e.req.count = send.size(), e.req.row_elems = 1, e.send = send.data();
      auto h = Submit(rt, std::move(e));
      if (!h) return f.Add(rank, "refused");
      if (h->name() != "allgather.noname.0") f.Add(rank, "named " + h->name());
      auto [st, msg] = WaitStatus(*h);
      if (st != Code::kMismatch || msg.find("rank 0 sent blocking") == std::string::npos) {
        f.Add(rank, "submitted: " + msg);
      }
    }
  });
  INFO(failures);
  CHECK(failures.empty());
}

TEST_CASE("engine: a name still in flight is refused at submission", "[engine]") {
  std::string failures = RunThreadJob(Opts(2), [&](int rank, Runtime& rt, Failures& f) {
    std::vector<float> a(4, 1.0f), b(4, 1.0f);
    std::shared_ptr<HandleState> h1;
    if (rank == 0) {
      h1 = Submit(rt, Allreduce("dup", a.data(), a.data(), 4));
      std::string err;
      auto h2 = Submit(rt, Allreduce("dup", b.data(), b.data(), 4), &err);
      if (h2 || err.find("'dup' is still in flight") == std::string::npos) {
        f.Add(rank, "duplicate accepted: " + err);
      }
    }
    // Both ranks meet on a barrier, then rank 1 submits "dup" once.
    if (!rt.Barrier().ok()) f.Add(rank, "barrier");
    if (rank == 1) h1 = Submit(rt, Allreduce("dup", a.data(), a.data(), 4));
    std::string err = WaitOk(*h1);
    if (!err.empty() || a[0] != 2) f.Add(rank, "dup: " + err);
  });
  INFO(failures);
  CHECK(failures.empty());
}

TEST_CASE("engine: a user's name that equals a made-up one in flight is a duplicate", "[engine]") {
  std::string failures = RunThreadJob(Opts(2), [&](int rank, Runtime& rt, Failures& f) {
    std::vector<float> a(4, 1.0f), b(4, 1.0f);
    // Named like the first unnamed allreduce, and in flight on rank 0: rank 1 submits it only
    // after the barrier, which rank 0 reaches after its unnamed submission was refused.
    std::shared_ptr<HandleState> h1;
    if (rank == 0) {
      h1 = Submit(rt, Allreduce("allreduce.noname.0", a.data(), a.data(), 4));
      std::string err;
      auto h2 = Submit(rt, Allreduce("", b.data(), b.data(), 4), &err);
      if (h2 || err.find("'allreduce.noname.0' is still in flight") == std::string::npos) {
        f.Add(rank, "the unnamed submission was accepted: " + err);
      }
    }
    if (!rt.Barrier().ok()) f.Add(rank, "barrier");
    if (rank == 1) h1 = Submit(rt, Allreduce("allreduce.noname.0", a.data(), a.data(), 4));
    std::string err = WaitOk(*h1);
    if (!err.empty() || a[0] != 2) f.Add(rank, "allreduce.noname.0: " + err);
  });
  INFO(failures);
  CHECK(failures.empty());
}

TEST_CASE("engine: a cached name whose arguments change on every rank, and back", "[engine]") {
  // The count goes 8, 4, 4, 8 on every rank: the response cache replaces the entry twice, and
  // each step must run with that step's count (a reused response must not keep the old one).
  std::string failures = RunThreadJob(Opts(2), [&](int rank, Runtime& rt, Failures& f) {
    for (size_t count : {8, 4, 4, 8, 8}) {
      std::vector<float> g(8, 1.0f);
      auto h = Submit(rt, Allreduce("v", g.data(), g.data(), count));
      std::string err = h ? WaitOk(*h) : "refused";
      for (size_t i = 0; i < g.size() && err.empty(); ++i) {
        if (g[i] != (i < count ? 2.0f : 1.0f)) err = "element " + std::to_string(i) + " wrong";
      }
      if (!err.empty()) f.Add(rank, "count " + std::to_string(count) + ": " + err);
    }
  });
  INFO(failures);
  CHECK(failures.empty());
}

TEST_CASE("engine: join with uneven steps", "[engine][join]") {
  const int np = 3;
  for (bool by_contributors : {false, true}) {
    std::string failures = RunThreadJob(Opts(np), [&](int rank, Runtime& rt, Failures& f) {
      const int steps = 2 + rank;  // rank 2 runs longest
      for (int s = 0; s < steps; ++s) {
        std::vector<float> g(5, 6.0f);
        Entry e = Allreduce("g", g.data(), g.data(), 5, RINGRUN_AVERAGE);
        if (by_contributors) e.req.flags = RINGRUN_AVERAGE_BY_CONTRIBUTORS;
        auto h = Submit(rt, std::move(e));
        std::string err = WaitOk(*h);
        if (!err.empty()) return f.Add(rank, err);
        const int contributors = s < 2 ? 3 : s < 3 ? 2 : 1;
        const float want = by_contributors ? 6.0f : 6.0f * contributors / np;
        if (g[0] != want) {
          f.Add(rank, "step " + std::to_string(s) + ": " + std::to_string(g[0]) + " want " +
                          std::to_string(want));
        }
        if (s == 2 && rank == 2) {  // rank 0 has joined: broadcast cannot run
          int32_t v = 0;
          Entry b;
          b.req.name = "bc", b.req.kind = Kind::kBroadcast, b.req.dtype = RINGRUN_INT32;
          b.req.count = 1, b.send = &v, b.recv = &v;
          auto hb = Submit(rt, std::move(b));
          auto [st, msg] = WaitStatus(*hb);
          // Rank 0 has joined, rank 1 perhaps too.
          if (st != Code::kJoined || (msg.find("(rank 0)") == std::string::npos &&
                                      msg.find("(ranks 0, 1)") == std::string::npos)) {
            f.Add(rank, "broadcast while joined: " + msg);
          }
        }
      }
      Entry j;
      j.req.name = "join", j.req.kind = Kind::kJoin;
      auto hj = Submit(rt, std::move(j));
      std::string err = WaitOk(*hj);
      if (!err.empty()) f.Add(rank, err);
      if (hj->last_joined != 2) f.Add(rank, "last joined " + std::to_string(hj->last_joined));
      // After everyone joined, the job is whole again.
      float x = 1;
      if (!rt.Allreduce(&x, &x, 1, RINGRUN_FLOAT32, RINGRUN_SUM).ok() || x != np) {
        f.Add(rank, "allreduce after join");
      }
    });
    INFO(failures);
    CHECK(failures.empty());
  }
}

TEST_CASE("engine: a blocking join outlasts the collective timeout and the stall times",
          "[engine][join][stall]") {
  // Rank 0 runs out of data at once; rank 1 trains for 1.2 s more, past the collective timeout
  // (300 ms) and the stall warning and shutdown times (100 and 200 ms). That is what join is
  // for: no rank is stalled, and the blocking join must not give up.
  Logs logs;
  EngineSettings s;
  s.stall.warning_us = 100'000;
  s.stall.shutdown_us = 200'000;
  s.log = logs.Sink();
  ThreadJobOptions o = Opts(2);
  o.timeout_ms = 300;
  std::string failures = RunThreadJob(
      o,
      [&](int rank, Runtime& rt, Failures& f) {
        if (rank == 1) {
          const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(1200);
          for (int step = 0; std::chrono::steady_clock::now() < end; ++step) {
            float g = 2;
            if (!rt.Allreduce(&g, &g, 1, RINGRUN_FLOAT32, RINGRUN_SUM).ok() || g != 2) {
              return f.Add(rank, "step " + std::to_string(step) + " = " + std::to_string(g));
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
          }
        }
        Entry j;
        j.req.name = "join", j.req.kind = Kind::kJoin;
        std::shared_ptr<HandleState> h;
        Status st = rt.SubmitAndWait(j.req.name, ArgsOf(j), &h);
        if (!st.ok()) return f.Add(rank, "join: " + st.message());
        if (h->last_joined != 1) f.Add(rank, "last joined " + std::to_string(h->last_joined));
      },
      s);
  INFO(failures);
  CHECK(failures.empty());
  const std::vector<std::string> lines = logs.Lines();
  INFO(lines.size() << " lines, the first: " << (lines.empty() ? "" : lines[0]));
  CHECK(lines.empty());
}

TEST_CASE("engine: stall warning names the missing rank, stall shutdown fails the job",
          "[engine][stall]") {
  Logs logs;
  EngineSettings s;
  s.stall.warning_us = 200'000;
  s.log = logs.Sink();
  const auto started = std::chrono::steady_clock::now();
  std::string failures = RunThreadJob(
      Opts(3),
      [&](int rank, Runtime& rt, Failures& f) {
        std::vector<std::vector<float>> bufs(8, std::vector<float>(2, 1.0f));
        std::vector<std::shared_ptr<HandleState>> hs;
        // rank 2 submits t0..t1 only at first; ranks 0, 1 submit t0..t7.
        for (int t = 0; t < 8; ++t) {
          if (rank == 2 && t >= 2) break;
          hs.push_back(
              Submit(rt, Allreduce("t" + std::to_string(t), bufs[t].data(), bufs[t].data(), 2)));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(600));
        if (rank == 2) {
          for (int t = 2; t < 8; ++t) {
            hs.push_back(
                Submit(rt, Allreduce("t" + std::to_string(t), bufs[t].data(), bufs[t].data(), 2)));
          }
        }
        WaitAll(rank, hs, f);
      },
      s);
  INFO(failures);
  CHECK(failures.empty());
  // A warning at 200 ms, then one more every 200 ms while rank 2 sleeps (600 ms, longer on a
  // loaded machine): at least two, and no more than the job's time allows. Each names the same.
  const auto took_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::steady_clock::now() - started)
                           .count();
  const std::vector<std::string> lines = logs.Lines();
  INFO("job took " << took_ms << " ms");
  REQUIRE(lines.size() >= 2);
  CHECK(static_cast<int64_t>(lines.size()) <= took_ms / 200);
  for (const std::string& line : lines) {
    INFO(line);
    CHECK(line.find("rank 2 has not submitted 6 tensors: t2, t3, t4, t5, t6 and 1 more") !=
          std::string::npos);
    CHECK(line.find("rank 0") == std::string::npos);
  }

  // Shutdown: rank 1 never submits "late".
  s.stall.shutdown_us = 300'000;
  const auto t0 = std::chrono::steady_clock::now();
  failures = RunThreadJob(
      Opts(2),
      [&](int rank, Runtime& rt, Failures& f) {
        float x = 1;
        if (rank == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1500));
          return;
        }
        auto h = Submit(rt, Allreduce("late", &x, &x, 1));
        auto [st, msg] = WaitStatus(*h);
        if (st != Code::kAborted || msg.find("stall shutdown") == std::string::npos ||
            msg.find("rank 1 has not submitted 1 tensor: late") == std::string::npos) {
          f.Add(rank, msg);
        }
      },
      s);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  INFO(failures);
  CHECK(failures.empty());
}

TEST_CASE("engine: after blocking calls run on the calling thread, the engine answers a peer",
          "[engine][stall]") {
  // Blocking calls on an idle engine run their rounds on the calling thread (Engine::RunHere),
  // which quiets the peers' wake-ups of the sleeping engine thread and must re-arm them: rank 0
  // then idles while rank 1 announces "late", and only an engine thread woken by that frame
  // lets rank 0's stall inspector name rank 0.
  for (bool shm : {true, false}) {
    Logs logs;
    EngineSettings s;
    s.stall.warning_us = 100'000;
    s.log = logs.Sink();
    const auto started = std::chrono::steady_clock::now();
    std::string failures = RunThreadJob(
        Opts(2, shm),
        [&](int rank, Runtime& rt, Failures& f) {
          for (int i = 0; i < 20; ++i) {
            // Every engine thread asleep before the last one: both callers run its round.
            if (i == 19) std::this_thread::sleep_for(std::chrono::milliseconds(50));
            float x = 1;
            Status st = rt.Allreduce(&x, &x, 1, RINGRUN_FLOAT32, RINGRUN_SUM);
            if (!st.ok() || x != 2) f.Add(rank, "blocking allreduce: " + st.ToString());
          }
          float y = 1;
          if (rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(400));
          auto h = Submit(rt, Allreduce("late", &y, &y, 1));
          std::string err = WaitOk(*h);
          if (!err.empty()) f.Add(rank, err);
        },
        s);
    INFO((shm ? "shm: " : "tcp: ") + failures);
    CHECK(failures.empty());
    // A warning 100 ms after rank 1 announced "late", then one every 100 ms while rank 0
    // sleeps: no more than the job's time allows, each naming rank 0.
    const auto took_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::steady_clock::now() - started)
                             .count();
    const std::vector<std::string> lines = logs.Lines();
    INFO("job took " << took_ms << " ms");
    REQUIRE(!lines.empty());
    CHECK(static_cast<int64_t>(lines.size()) <= took_ms / 100);
    for (const std::string& line : lines) {
      INFO(line);
      CHECK(line.find("rank 0 has not submitted 1 tensor: late") != std::string::npos);
    }
  }
}

// A blocking call as Runtime::SubmitAndWait makes it (Submit's run_here), with t's arguments.
Status Blocking(Runtime& rt, const engine::TensorArgs& t) {
  HandleState* h = nullptr;
  Status st = rt.engine().Submit({}, &t, 1, /*group=*/false, &h, /*run_here=*/true);
  if (!st.ok()) return st;
  std::shared_ptr<HandleState> owned = engine::ShareHandle(h);
  auto [code, msg] = WaitStatus(*h);
  return code == Code::kOk ? Status::Ok() : Status(code, msg);
}

TEST_CASE("engine: a small blocking allreduce travels in its frame, every dtype and op",
          "[engine]") {
  // Blocking calls of every dtype and op, of 4 KiB and less, at 2 and 3 ranks: those whose
  // lone frames agree are done in one exchange (Engine::SubmitLone), the others in the general
  // round (a peer's engine thread answered); either way the result is exact, and with scale
  // factors it is the general path's (a named submission's) bit for bit.
  for (int np : {2, 3}) {
    for (bool shm : {true, false}) {
      std::atomic<uint64_t> lone{0}, calls{0};
      std::string failures = RunThreadJob(Opts(np, shm), [&](int rank, Runtime& rt, Failures& f) {
        for (ringrun_dtype d : AllDtypes()) {
          for (ringrun_op op : OpsFor(d)) {
            for (size_t count :
                 {size_t{0}, size_t{1}, size_t{7}, engine::kLoneBytes / DtypeSize(d)}) {
              const std::string what = std::string(NameOfDtype(d)) + " " + NameOfOp(op) + " " +
                                       std::to_string(count) + ": ";
              std::vector<char> in = Inputs(op, d, rank, count), out(in.size() + 8);
              engine::TensorArgs t;
              t.dtype = d, t.op = op, t.count = count, t.send = in.data(), t.recv = out.data();
              if (count == 7) t.send = t.recv = std::memcpy(out.data(), in.data(), in.size());
              Status st = Blocking(rt, t);
              if (rank == 0) ++calls;
              if (!st.ok()) {
                f.Add(rank, what + st.ToString());
                continue;
              }
              std::string bad = CheckReduced(op, d, np, out.data(), count);
              if (!bad.empty()) f.Add(rank, what + bad);
              if (!IsFloating(d) || count == 0) continue;
              t.send = in.data(), t.prescale = 0.5, t.postscale = 4;
              st = Blocking(rt, t);
              if (rank == 0) ++calls;
              std::vector<char> general(out.size());
              Entry e;
              e.req.name = "scaled", e.req.dtype = d, e.req.op = op, e.req.count = count;
              e.req.prescale = 0.5, e.req.postscale = 4;
              e.send = in.data(), e.recv = general.data();
              auto h = Submit(rt, e);
              std::string err = h ? WaitOk(*h) : "refused";
              if (!st.ok() || !err.empty()) {
                f.Add(rank, what + "scaled: " + st.ToString() + " " + err);
              } else if (std::memcmp(out.data(), general.data(), in.size()) != 0) {
                f.Add(rank,
                      what + "scaled: the lone frame's result differs from the general path's");
              }
            }
          }
        }
        if (rank == 0) lone += rt.engine().negotiation_counters().lone_rounds;
      });
      INFO("np " << np << (shm ? " shm: " : " tcp: ") << failures << lone << " of " << calls
                 << " calls done in one exchange");
      CHECK(failures.empty());
      CHECK(lone > 0);
    }
  }
}

TEST_CASE("engine: blocking calls whose lone frames differ fail as a mismatch, naming the ranks",
          "[engine]") {
  // Rank 1's third blocking allreduce has another count: every rank's call fails naming it,
  // the field and the ranks, as in the general round, and the next blocking call works.
  const int np = 3;
  std::string failures = RunThreadJob(Opts(np), [&](int rank, Runtime& rt, Failures& f) {
    for (int i = 0; i < 5; ++i) {
      std::vector<float> x(8, 1.0f);
      const size_t count = i == 2 && rank == 1 ? 4 : 8;
      Status st = rt.Allreduce(x.data(), x.data(), count, RINGRUN_FLOAT32, RINGRUN_SUM);
      if (i != 2) {
        if (!st.ok() || x[0] != np) f.Add(rank, "call " + std::to_string(i) + ": " + st.ToString());
        continue;
      }
      const std::string msg = st.message();
      if (st.code() != Code::kMismatch) f.Add(rank, "call 2: " + st.ToString());
      for (const std::string part : {"tensor 'allreduce.noname.2'", "disagree on the count",
                                     "ranks 0, 2 sent 8", "rank 1 sent 4"}) {
        if (msg.find(part) == std::string::npos) f.Add(rank, "'" + msg + "' lacks '" + part + "'");
      }
    }
  });
  INFO(failures);
  CHECK(failures.empty());
}

TEST_CASE("engine: stall inspector with an injected clock", "[engine][stall]") {
  std::vector<std::string> out;
  engine::StallOptions o;
  o.warning_us = 10, o.shutdown_us = 100, o.names_per_rank = 2;
  engine::StallInspector si(o, 0, [&](const std::string& m) { out.push_back(m); });
  std::string a = "a", b = "b", c = "c";
  std::vector<engine::PendingView> p = {
      {&a, 0, {true, false}}, {&b, 5, {true, false}}, {&c, 5, {false, true}}};
  CHECK(si.NextCheckUs(p) == 10);
  CHECK(si.Check(p, 9).ok());
  CHECK(out.empty());
  CHECK(si.Check(p, 20).ok());
  REQUIRE(out.size() == 1);
  CHECK(out[0].find("rank 1 has not submitted 2 tensors: a, b") != std::string::npos);
  CHECK(out[0].find("rank 0 has not submitted 1 tensor: c") != std::string::npos);
  // Then again every warning time while they stay pending, as Horovod's inspector does.
  CHECK(si.NextCheckUs(p) == 30);
  CHECK(si.Check(p, 25).ok());
  CHECK(out.size() == 1);
  CHECK(si.Check(p, 30).ok());
  REQUIRE(out.size() == 2);
  CHECK(out[1].find("rank 1 has not submitted 2 tensors: a, b") != std::string::npos);
  // A name that completes is forgotten: stalled again later, it is warned about a warning time
  // after its new announcement, not at once.
  std::string d = "d";
  std::vector<engine::PendingView> q = {{&d, 40, {true, false}}};
  CHECK(si.Check(q, 45).ok());
  CHECK(si.NextCheckUs(q) == 50);
  CHECK(si.Check(q, 49).ok());
  CHECK(out.size() == 2);
  CHECK(si.Check(q, 50).ok());
  REQUIRE(out.size() == 3);
  CHECK(out[2].find("rank 1 has not submitted 1 tensor: d") != std::string::npos);
  CHECK(out[2].find("tensors: a") == std::string::npos);
  Status st = si.Check(p, 100);
  CHECK(st.code() == Code::kAborted);
  CHECK(st.message().find("rank 1 has not submitted 1 tensor: a") != std::string::npos);
}

TEST_CASE("engine: the timeline is a Chrome trace with every phase", "[engine][timeline]") {
  char dir[] = "/tmp/ringrun-timeline-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  EngineSettings s;
  s.timeline = std::string(dir) + "/t.json";
  std::string failures = RunThreadJob(
      Opts(2),
      [&](int rank, Runtime& rt, Failures& f) {
        std::vector<std::vector<float>> bufs(4, std::vector<float>(100, 1.0f));
        std::vector<std::shared_ptr<HandleState>> hs;
        for (int t = 0; t < 4; ++t) {
          hs.push_back(Submit(rt, Allreduce("layer" + std::to_string(t) + "\"q", bufs[t].data(),
                                            bufs[t].data(), 100)));
        }
        WaitAll(rank, hs, f);
      },
      s);
  INFO(failures);
  CHECK(failures.empty());
  for (int r = 0; r < 2; ++r) {
    const std::string path = TimelineOf(dir, r);
    const std::string text = ReadAll(path);
    INFO(path << ":\n" << text.substr(0, 2000));
    CHECK(text.find("\"NEGOTIATE\"") != std::string::npos);
    CHECK(text.find("\"ALLREDUCE\"") != std::string::npos);
    CHECK(text.find("\"algorithm\": \"") != std::string::npos);
    CHECK(text.find("layer3\\\"q") != std::string::npos);
    CHECK(StrictTrace(path));  // strict JSON once closed
    std::remove(path.c_str());
  }
  ::rmdir(dir);
}

TEST_CASE("engine: the timeline into the launcher's pipe is one event a line and never blocks",
          "[engine][timeline]") {
  int fds[2];
  REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
  UniqueFd read_end(fds[0]), write_end(fds[1]);
  ::fcntl(write_end.get(), F_SETPIPE_SZ, 4096);  // full soon
  auto t = engine::Timeline::OpenPipe(write_end.get(), "t.json", 1, &SteadyClock());
  REQUIRE(t.ok());
  engine::Timeline& tl = *t.value();
  CHECK(tl.path() == "t.json");
  // Nobody reads: more than the pipe and the bounded buffer hold, without blocking.
  const auto start = std::chrono::steady_clock::now();
  const std::string name(200, 'x');
  size_t spans = 0;
  for (size_t bytes = 0; bytes < 2 * engine::kMaxTimelinePendingBytes; bytes += name.size()) {
    tl.Span(name + std::to_string(spans % 10), "ALLREDUCE", 0, 1, "\"bytes\": 4");
    if (++spans % 1000 == 0) tl.Flush();
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  const uint64_t dropped = tl.dropped();
  CHECK(dropped > 0);
  CHECK(dropped < spans);
  // The reader catches up while Close drains what waits: whole lines, each one event of rank 1.
  std::string text;
  std::thread reader([&] {
    char buf[65536];
    ssize_t n;
    while ((n = ::read(read_end.get(), buf, sizeof(buf))) > 0) text.append(buf, n);
  });
  tl.Close();
  write_end.Reset();  // the last writer: the reader sees the end
  reader.join();
  CHECK(tl.dropped() == dropped);  // Close drained the rest
  REQUIRE(!text.empty());
  CHECK(text.back() == '\n');
  CHECK(text.find('[') != 0);  // the launcher's file has the brackets
  size_t lines = 0, rank1 = 0;
  for (size_t at = 0; at < text.size();) {
    const size_t nl = text.find('\n', at);
    const std::string line = text.substr(at, nl - at);
    ++lines;
    if (line.rfind("{", 0) == 0 && line.size() > 2 && line.substr(line.size() - 2) == "},") ++rank1;
    CHECK(line.find("\"pid\": 1") != std::string::npos);
    at = nl + 1;
  }
  CHECK(lines == rank1);
  CHECK(lines + dropped == spans + 3 + 10);  // 3 metadata events, 10 rows named
}

TEST_CASE("engine: a dynamic timeline starts and stops while collectives are in flight",
          "[engine][timeline]") {
  char dir[] = "/tmp/ringrun-timeline-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string t = std::string(dir) + "/t.json", u = std::string(dir) + "/u.json";
  EngineSettings s;
  s.timeline_dynamic = true;  // HOROVOD_TIMELINE=DYNAMIC
  auto allreduce = [](Runtime& rt, const std::string& name, Failures& f, int rank) {
    float x = 1.0f;
    std::string err = WaitOk(*Submit(rt, Allreduce(name, &x, &x, 1)));
    if (!err.empty()) f.Add(rank, err);
  };
  std::atomic<bool> started0{false};
  std::string failures = RunThreadJob(
      Opts(2),
      [&](int rank, Runtime& rt, Failures& f) {
        allreduce(rt, "before", f, rank);
        if (::access(TimelineOf(dir, rank).c_str(), F_OK) == 0) f.Add(rank, "written before start");
        // Rank 0 starts while a collective is pending on it, which rank 1 submits only once
        // rank 0 has started: the change waits for no other rank and for no collective, and
        // the pending one is drawn from the file's start.
        float y = 2.0f;
        std::shared_ptr<HandleState> pending;
        if (rank == 0) pending = Submit(rt, Allreduce("pending", &y, &y, 1));
        while (rank == 1 && !started0.load()) std::this_thread::yield();
        Status st = rt.StartTimeline(t, /*mark_cycles=*/true);
        if (!st.ok()) f.Add(rank, "start: " + st.ToString());
        if (rank == 0) started0.store(true);
        if (rank == 1) pending = Submit(rt, Allreduce("pending", &y, &y, 1));
        std::string err = WaitOk(*pending);
        if (!err.empty()) f.Add(rank, err);
        for (int i = 0; i < 3; ++i) allreduce(rt, "during" + std::to_string(i), f, rank);
        // The same file again goes on writing it (not truncated).
        st = rt.StartTimeline(t, true);
        if (!st.ok()) f.Add(rank, "start again: " + st.ToString());
        allreduce(rt, "during3", f, rank);
        // Another file: the first is closed, the second gets what follows, without cycles.
        st = rt.StartTimeline(u, false);
        if (!st.ok()) f.Add(rank, "switch: " + st.ToString());
        allreduce(rt, "switched", f, rank);
        for (int i = 0; i < 2; ++i) {  // a second stop, with none open, succeeds and does nothing
          st = rt.StopTimeline();
          if (!st.ok()) f.Add(rank, "stop: " + st.ToString());
        }
        allreduce(rt, "after", f, rank);
        // A file that cannot be opened is the call's error; nothing changes.
        st = rt.StartTimeline(std::string(dir) + "/no/such/dir/t.json", false);
        if (st.code() != Code::kNotFound) f.Add(rank, "unopenable: " + st.ToString());
      },
      s);
  INFO(failures);
  CHECK(failures.empty());
  for (int r = 0; r < 2; ++r) {
    const std::string first = TimelineOf(dir, r);
    const std::string second = r == 0 ? u : std::string(dir) + "/u.1.json";
    const std::string a = ReadAll(first), b = ReadAll(second);
    INFO(first << ":\n" << a.substr(0, 3000) << "\n" << second << ":\n" << b.substr(0, 3000));
    CHECK(StrictTrace(first));
    CHECK(StrictTrace(second));
    CHECK(a.find("\"before\"") == std::string::npos);
    for (const char* name : {"\"pending\"", "\"during0\"", "\"during2\"", "\"during3\""}) {
      CHECK(a.find(name) != std::string::npos);
    }
    CHECK(a.find("\"ALLREDUCE\"") != std::string::npos);
    CHECK(a.find("\"NEGOTIATE\"") != std::string::npos);
    CHECK(a.find("\"CYCLE_START\"") != std::string::npos);
    CHECK(a.find("\"switched\"") == std::string::npos);
    CHECK(b.find("\"switched\"") != std::string::npos);
    CHECK(b.find("\"CYCLE_START\"") == std::string::npos);
    CHECK(b.find("\"after\"") == std::string::npos);
    // No event before the file's start: the pending tensor's negotiation is drawn from 0.
    CHECK(a.find("\"ts\": -") == std::string::npos);
    std::remove(first.c_str()), std::remove(second.c_str());
  }
  ::rmdir(dir);
}

TEST_CASE("engine: the timeline cannot start unless enabled, and toggling it races no collective",
          "[engine][timeline]") {
  char dir[] = "/tmp/ringrun-timeline-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string t = std::string(dir) + "/t.json";
  // Neither a file nor DYNAMIC: start is refused (Horovod's -2), stop does nothing.
  std::string failures = RunThreadJob(Opts(2), [&](int rank, Runtime& rt, Failures& f) {
    Status st = rt.StartTimeline(t, false);
    if (st.code() != Code::kInvalidArgument ||
        st.message().find("HOROVOD_TIMELINE=DYNAMIC") == std::string::npos) {
      f.Add(rank, "start without DYNAMIC: " + st.ToString());
    }
    st = rt.StopTimeline();
    if (!st.ok()) f.Add(rank, "stop: " + st.ToString());
  });
  INFO(failures);
  CHECK(failures.empty());
  CHECK(::access(TimelineOf(dir, 0).c_str(), F_OK) != 0);
  // HOROVOD_TIMELINE=FILE with mark cycles: on from the start; another thread stops and
  // starts it again and again while this one runs collectives.
  EngineSettings s;
  s.timeline = t;
  s.timeline_mark_cycles = true;
  failures = RunThreadJob(
      Opts(2),
      [&](int rank, Runtime& rt, Failures& f) {
        std::atomic<bool> done{false};
        std::thread toggler([&] {
          for (int i = 0; !done.load(); ++i) {
            Status st = i % 2 ? rt.StartTimeline(t, true) : rt.StopTimeline();
            if (!st.ok()) f.Add(rank, "toggle: " + st.ToString());
          }
          Status st = rt.StartTimeline(t, true);  // the last one open
          if (!st.ok()) f.Add(rank, "start: " + st.ToString());
        });
        std::vector<float> bufs(200, 1.0f);
        for (int i = 0; i < 200; ++i) {
          std::string err =
              WaitOk(*Submit(rt, Allreduce("x" + std::to_string(i % 7), &bufs[i], &bufs[i], 1)));
          if (!err.empty()) f.Add(rank, err);
          if (bufs[i] != 2.0f) f.Add(rank, "wrong sum " + std::to_string(bufs[i]));
        }
        done.store(true);
        toggler.join();
        float x = 1.0f;
        std::string err = WaitOk(*Submit(rt, Allreduce("last", &x, &x, 1)));
        if (!err.empty()) f.Add(rank, err);
      },
      s);
  INFO(failures);
  CHECK(failures.empty());
  for (int r = 0; r < 2; ++r) {
    const std::string path = TimelineOf(dir, r), text = ReadAll(path);
    INFO(path << ":\n" << text.substr(0, 2000));
    CHECK(StrictTrace(path));  // closed at shutdown
    CHECK(text.find("\"last\"") != std::string::npos);
    CHECK(text.find("\"CYCLE_START\"") != std::string::npos);
    std::remove(path.c_str());
  }
  ::rmdir(dir);
}

TEST_CASE("engine: a burst of submissions is one round, and a waiter starts it at once",
          "[engine]") {
  char dir[] = "/tmp/ringrun-burst-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  // A quiet window far longer than the pause below: the engine that the first submission woke
  // gathers the other 29 as well, and the first wait (once both ranks submitted all 30) starts
  // the round. Without the window that would be a round of 1, then one of 29.
  EngineSettings s;
  s.timeline = std::string(dir) + "/t.json";
  s.burst_quiet_ns = 2'000'000'000;  // 250 ms before the first growth
  std::atomic<int> submitted{0};
  std::string failures = RunThreadJob(
      Opts(2),
      [&](int rank, Runtime& rt, Failures& f) {
        std::vector<float> bufs(30, 1.0f);
        std::vector<std::shared_ptr<HandleState>> hs;
        for (int t = 0; t < 30; ++t) {
          hs.push_back(Submit(rt, Allreduce("burst" + std::to_string(t), &bufs[t], &bufs[t], 1)));
          if (t == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        submitted.fetch_add(1);
        while (submitted.load() < 2) std::this_thread::yield();
        WaitAll(rank, hs, f);
        if (bufs[29] != 2.0f) f.Add(rank, "wrong sum: " + std::to_string(bufs[29]));
      },
      s);
  INFO(failures);
  CHECK(failures.empty());
  // One round of all 30 on each rank (unless this process may use one CPU only: then the
  // engine gathers no bursts, since it would share that CPU with the submitting thread).
  const std::string rank0 = ReadAll(TimelineOf(dir, 0)), rank1 = ReadAll(TimelineOf(dir, 1));
  std::remove(TimelineOf(dir, 0).c_str()), std::remove(TimelineOf(dir, 1).c_str());
  ::rmdir(dir);
  cpu_set_t cpus;
  if (::sched_getaffinity(0, sizeof(cpus), &cpus) == 0 && CPU_COUNT(&cpus) > 1) {
    CHECK_THAT(rank0, Catch::Contains("\"announced\": 30, \"ready\": 30"));
    CHECK_THAT(rank1, Catch::Contains("\"announced\": 30, \"ready\": 30"));
  }

  // A window of 100 s: a lone blocking call must not sit it out (its wait ends the gathering).
  EngineSettings slow;
  slow.burst_quiet_ns = 100'000'000'000;
  const auto t0 = std::chrono::steady_clock::now();
  failures = RunThreadJob(
      Opts(2),
      [&](int rank, Runtime& rt, Failures& f) {
        float x = 1.0f;
        std::string err = WaitOk(*Submit(rt, Allreduce("lone", &x, &x, 1)));
        if (!err.empty()) f.Add(rank, err);
      },
      slow);
  INFO(failures);
  CHECK(failures.empty());
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30));
}

TEST_CASE("engine: a peer that leaves mid-step fails every pending handle, naming it",
          "[engine][dead-peer]") {
  for (bool shm : {true, false}) {
    ThreadJobOptions o = Opts(3, shm);
    o.timeout_ms = 20000;
    std::vector<std::unique_ptr<Runtime>> rts;
    REQUIRE(MakeThreadJob(o, &rts).empty());
    std::vector<std::vector<float>> bufs(3 * 20, std::vector<float>(1000, 1.0f));
    std::vector<std::shared_ptr<HandleState>> hs[3];
    for (int r = 0; r < 2; ++r) {
      for (int t = 0; t < 20; ++t) {
        hs[r].push_back(Submit(*rts[r], Allreduce("t" + std::to_string(t), bufs[r * 20 + t].data(),
                                                  bufs[r * 20 + t].data(), 1000)));
      }
    }
    // Rank 2 submits half, then its process "dies" (the runtime and its connections go).
    for (int t = 0; t < 10; ++t) {
      hs[2].push_back(Submit(*rts[2], Allreduce("t" + std::to_string(t), bufs[40 + t].data(),
                                                bufs[40 + t].data(), 1000)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto t0 = std::chrono::steady_clock::now();
    rts[2].reset();
    int failed = 0;
    for (int r = 0; r < 2; ++r) {
      for (int t = 10; t < 20; ++t) {
        auto [st, msg] = WaitStatus(*hs[r][t]);
        INFO(msg);
        CHECK(st != Code::kOk);
        CHECK(st != Code::kTimeout);
        CHECK(msg.find("rank 2") != std::string::npos);
        failed += st != Code::kOk;
      }
    }
    CHECK(failed == 20);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
    // Later submissions fail fast with the same error.
    float x = 1;
    Status st = rts[0]->Allreduce(&x, &x, 1, RINGRUN_FLOAT32, RINGRUN_SUM);
    CHECK_FALSE(st.ok());
  }
}

TEST_CASE("engine: shutdown fails pending handles, released handles are harmless", "[engine]") {
  std::vector<std::unique_ptr<Runtime>> rts;
  REQUIRE(MakeThreadJob(Opts(2), &rts).empty());
  float x = 1, y = 1;
  auto h = Submit(*rts[0], Allreduce("only-rank-0", &x, &x, 1));
  // A handle dropped without a wait: the engine keeps its state until it completes.
  Submit(*rts[0], Allreduce("dropped", &y, &y, 1)).reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  rts[0]->engine().Shutdown();
  auto [st, msg] = WaitStatus(*h);
  CHECK(st == Code::kAborted);
  CHECK(msg.find("ringrun_shutdown") != std::string::npos);
  std::string err;
  CHECK_FALSE(Submit(*rts[0], Allreduce("after", &x, &x, 1), &err));
  CHECK(err.find("shutting down") != std::string::npos);
}

// The ids of the eventfds this process has open (/proc/self/fdinfo's eventfd-id; empty on a
// kernel that does not show it).
std::set<std::string> EventfdIds() {
  std::set<std::string> ids;
  DIR* d = ::opendir("/proc/self/fdinfo");
  if (!d) return ids;
  while (dirent* e = ::readdir(d)) {
    std::ifstream info(std::string("/proc/self/fdinfo/") + e->d_name);
    for (std::string line; std::getline(info, line);) {
      if (line.rfind("eventfd-id:", 0) == 0) ids.insert(line);
    }
  }
  ::closedir(d);
  return ids;
}

TEST_CASE("engine: after fork(), a child's engine makes its own doorbell", "[engine]") {
  // A stopped engine's doorbell waits in a process-wide pool for the next engine. A child
  // inherits the pool: taking the parent's eventfd from it, one process's drain could swallow
  // the other's wake-up.
  engine::EngineOptions o;
  engine::Engine(nullptr, o).Shutdown();  // its doorbell goes to the pool
  const std::set<std::string> parent = EventfdIds();
  if (parent.empty()) {
    WARN("this kernel does not show eventfd-id in /proc/self/fdinfo; not checked");
    return;
  }
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    engine::Engine mine(nullptr, o);
    bool fresh = false;
    for (const std::string& id : EventfdIds()) fresh |= parent.count(id) == 0;
    mine.Shutdown();
    ::_exit(fresh ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  // The parent's pool still serves the parent.
  engine::Engine again(nullptr, o);
  CHECK(EventfdIds() == parent);
}

double CpuSeconds() {
  rusage u;
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

TEST_CASE("engine: an idle engine uses no CPU", "[engine][idle]") {
  // Shared memory, with ranks that yield while they wait as well (more ranks than CPUs); TCP.
  for (int way = 0; way < 3; ++way) {
    const bool shm = way < 2;
    ThreadJobOptions o = Opts(3, shm);
    o.transport.yield = way == 1;
    std::vector<std::unique_ptr<Runtime>> rts;
    REQUIRE(MakeThreadJob(o, &rts).empty());
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r) {
      threads.emplace_back([&, r] {
        float x = 1;
        (void)rts[r]->Allreduce(&x, &x, 1, RINGRUN_FLOAT32, RINGRUN_SUM);
      });
    }
    for (auto& t : threads) t.join();
    const double c0 = CpuSeconds();
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    const double used = CpuSeconds() - c0;
    INFO((way == 0   ? "shm"
          : way == 1 ? "shm, yielding"
                     : "tcp")
         << ": " << used << " s of CPU over 1 s idle");
    CHECK(used < 0.02);
  }
}

// A device backend that records what reaches it (the engine's GPU seam). Events are
// numbered host objects; nothing is computed.
class FakeDevice : public gpu::DeviceBackend {
 public:
  explicit FakeDevice(std::vector<std::string>* log) : log_(log) {}
  Status WaitFor(const gpu::DeviceEvent& ready) override {
    log_->push_back("wait " + (ready ? *static_cast<std::string*>(ready.get()) : "none"));
    return Status::Ok();
  }
  Result<void*> FusionBuffer(size_t bytes) override {
    if (fusion_.size() < bytes) fusion_.resize(bytes);
    return static_cast<void*>(fusion_.data());
  }
  Result<gpu::DeviceMemory> Allocate(size_t bytes) override {
    return gpu::DeviceMemory(::operator new(bytes + 1), [](void* p) { ::operator delete(p); });
  }
  Status Copy(void*, const void*, size_t bytes) override {
    log_->push_back("copy " + std::to_string(bytes));
    return Status::Ok();
  }
  Status Allreduce(const void*, void*, size_t count, ringrun_dtype, ringrun_op op,
                   double scale) override {
    std::ostringstream o;
    o << "allreduce " << count << " " << ringrun_op_name(op) << " x" << scale;
    log_->push_back(o.str());
    return Status::Ok();
  }
  Status Broadcast(void*, size_t count, ringrun_dtype, int root) override {
    log_->push_back("broadcast " + std::to_string(count) + " from " + std::to_string(root));
    return Status::Ok();
  }
  Status Allgatherv(const void*, void*, const std::vector<size_t>& counts, ringrun_dtype) override {
    std::string c;
    for (size_t x : counts) c += " " + std::to_string(x);
    log_->push_back("allgatherv" + c);
    return Status::Ok();
  }
  Status ReduceScatter(const void*, void*, size_t count, ringrun_dtype, ringrun_op) override {
    log_->push_back("reducescatter " + std::to_string(count));
    return Status::Ok();
  }
  Status Alltoallv(const void*, const std::vector<size_t>& send, void*,
                   const std::vector<size_t>& recv, ringrun_dtype) override {
    std::string c;
    for (size_t i = 0; i < send.size(); ++i)
      c += " " + std::to_string(send[i]) + "/" + std::to_string(recv[i]);
    log_->push_back("alltoallv" + c);
    return Status::Ok();
  }
  Status Finish(const std::vector<void*>& streams, bool wait) override {
    log_->push_back("finish streams=" + std::to_string(streams.size()) + (wait ? " wait" : ""));
    return Status::Ok();
  }
  void Abort(const std::string&) override {}

 private:
  std::vector<std::string>* log_;
  std::vector<char> fusion_;
};

// A ready event for FakeDevice: its text says which stream it was recorded on.
Result<std::shared_ptr<void>> FakeReadyEvent(const void*, void* stream) {
  return std::shared_ptr<void>(std::make_shared<std::string>(stream ? "caller-stream" : "default"));
}

TEST_CASE(
    "engine: device tensors go through the same negotiation, the NCCL id is made at the "
    "first device collective and broadcast over the CPU transport",
    "[engine][gpu]") {
  constexpr int np = 3;
  static float device_mem[np][64];  // "device memory" for the fake seam
  std::mutex mu;
  std::vector<std::string> ids(np), logs[np];
  std::atomic<int> id_calls{0}, backends{0};
  std::vector<std::unique_ptr<Runtime>> rts;
  std::vector<std::unique_ptr<Transport>> ts;
  REQUIRE(MakeThreadTransports(Opts(np), &ts).empty());
  for (int r = 0; r < np; ++r) {
    EngineSettings s;
    s.is_device = [](const void* p) {
      const char* c = static_cast<const char*>(p);
      const char* base = reinterpret_cast<const char*>(device_mem);
      return c >= base && c < base + sizeof(device_mem);
    };
    s.make_nccl_id = [&] {
      ++id_calls;
      return std::string("fake-nccl-id\0with-zero", 22);
    };
    s.make_device = [&, r](const std::string& id) -> Result<std::unique_ptr<gpu::DeviceBackend>> {
      std::lock_guard<std::mutex> lock(mu);
      ids[r] = id;
      ++backends;
      return std::unique_ptr<gpu::DeviceBackend>(new FakeDevice(&logs[r]));
    };
    s.record_event = FakeReadyEvent;
    Shape shape;
    shape.rank = r, shape.size = np, shape.local_rank = -1, shape.cross_rank = -1;
    rts.push_back(std::make_unique<Runtime>(std::move(ts[r]), shape, 20000, s));
  }
  Failures f;
  std::vector<std::thread> threads;
  for (int r = 0; r < np; ++r) {
    threads.emplace_back([&, r] {
      Runtime& rt = *rts[r];
      // Host work first: no device backend, no NCCL id.
      float x = 1;
      if (!rt.Allreduce(&x, &x, 1, RINGRUN_FLOAT32, RINGRUN_SUM).ok()) f.Add(r, "host");
      if (id_calls != 0) f.Add(r, "an NCCL id was made for a host collective");
      // Device tensors, in a different order per rank.
      std::vector<std::shared_ptr<HandleState>> hs;
      for (int k = 0; k < 2; ++k) {
        const int t = (k + r) % 2;
        float* p = device_mem[r] + 32 * t;
        hs.push_back(Submit(rt, Allreduce("dev." + std::to_string(t), p, p, 8 + t)));
      }
      for (auto& h : hs) {
        std::string err = h ? WaitOk(*h) : "refused";
        if (!err.empty()) f.Add(r, err);
      }
      // Host on one rank, device on the others: a mismatch on the device field.
      float host = 1;
      float* dev = device_mem[r] + 16;
      auto h = Submit(rt, Allreduce("mixed", r == 1 ? &host : dev, r == 1 ? &host : dev, 1));
      auto [st, msg] = WaitStatus(*h);
      if (st != Code::kMismatch || msg.find("device") == std::string::npos ||
          msg.find("rank 1 sent CPU") == std::string::npos) {
        f.Add(r, "mixed: " + msg);
      }
    });
  }
  for (auto& t : threads) t.join();
  INFO(f.Joined());
  CHECK(f.list().empty());
  CHECK(id_calls == 1);  // rank 0, once
  CHECK(backends == np);
  for (int r = 0; r < np; ++r) {
    CHECK(ids[r] == std::string("fake-nccl-id\0with-zero", 22));
    // Every rank ran the device allreduces in the same agreed order, each on its own (two
    // tensors ready in different rounds), after its ready event.
    CHECK(logs[r] == logs[0]);
    // 8 + 9 elements in one or two allreduces (fused when ready in the same round).
    int reduced = 0;
    for (const std::string& l : logs[r]) {
      if (l.rfind("allreduce ", 0) == 0) reduced += std::atoi(l.c_str() + 10);
    }
    CHECK(reduced == 17);
  }
}

// Ranks as threads whose device backends are FakeDevices writing to logs[rank]; device memory
// is dev_mem (is_device says so for any address inside it).
struct FakeDeviceJob {
  static constexpr int np = 2;
  static float dev_mem[np][4][80000];
  std::vector<std::string> logs[np];
  std::vector<std::unique_ptr<Runtime>> rts;

  std::string Start(size_t fusion_threshold = engine::kDefaultFusionThreshold) {
    std::vector<std::unique_ptr<Transport>> ts;
    std::string err = MakeThreadTransports(Opts(np), &ts);
    if (!err.empty()) return err;
    for (int r = 0; r < np; ++r) {
      EngineSettings s;
      s.fusion_threshold = fusion_threshold;
      s.is_device = [](const void* p) {
        const char* c = static_cast<const char*>(p);
        const char* base = reinterpret_cast<const char*>(dev_mem);
        return c >= base && c < base + sizeof(dev_mem);
      };
      s.make_nccl_id = [] { return std::string("id"); };
      s.make_device = [this, r](const std::string&) -> Result<std::unique_ptr<gpu::DeviceBackend>> {
        return std::unique_ptr<gpu::DeviceBackend>(new FakeDevice(&logs[r]));
      };
      s.record_event = FakeReadyEvent;
      Shape shape;
      shape.rank = r, shape.size = np, shape.local_rank = -1, shape.cross_rank = -1;
      rts.push_back(std::make_unique<Runtime>(std::move(ts[r]), shape, 20000, s));
    }
    return "";
  }
  std::string Run(const std::function<void(int, Runtime&, Failures&)>& body) {
    Failures f;
    std::vector<std::thread> threads;
    for (int r = 0; r < np; ++r) threads.emplace_back([&, r] { body(r, *rts[r], f); });
    for (auto& t : threads) t.join();
    return f.Joined();
  }
};
float FakeDeviceJob::dev_mem[FakeDeviceJob::np][4][80000];

TEST_CASE(
    "engine: device allreduces fuse into one collective after their ready events, with "
    "the scale factors folded into one PreMulSum scale",
    "[engine][gpu]") {
  FakeDeviceJob job;
  REQUIRE(job.Start() == "");
  std::string failures = job.Run([&](int r, Runtime& rt, Failures& f) {
    // A grouped allreduce: its four tensors become ready in one round and fuse.
    std::vector<Entry> group;
    for (int i = 0; i < 4; ++i) {
      float* p = FakeDeviceJob::dev_mem[r][i];
      Entry e = Allreduce("g", p, p, 10 + i, RINGRUN_AVERAGE);
      e.req.prescale = 0.5, e.req.postscale = 4.0;
      group.push_back(std::move(e));
    }
    Submitted g = SubmitGroup(rt, std::move(group));
    if (!g.handle) return f.Add(r, "group refused: " + g.status.message());
    std::string err = WaitOk(*g.handle);
    if (!err.empty()) f.Add(r, err);
    // 256 KiB and more: straight from the caller's buffers, no copies.
    float* big = FakeDeviceJob::dev_mem[r][0];
    auto hb = Submit(rt, Allreduce("big", big, big, 70000));
    if (!hb || !WaitOk(*hb).empty()) f.Add(r, "big");
    // Scale factors with MIN: refused at submission, naming the op.
    Entry bad = Allreduce("bad", big, big, 4, RINGRUN_MIN);
    bad.req.prescale = 2.0;
    std::string msg;
    if (Submit(rt, std::move(bad), &msg) || msg.find("not min") == std::string::npos) {
      f.Add(r, "MIN with a scale factor: " + msg);
    }
    // An _on_stream call: its stream waits for the result; the engine does not wait.
    if (!rt.Allreduce(big, big, 3, RINGRUN_FLOAT32, RINGRUN_SUM, reinterpret_cast<void*>(0x5))
             .ok()) {
      f.Add(r, "on stream");
    }
  });
  INFO(failures);
  CHECK(failures.empty());
  for (int r = 0; r < FakeDeviceJob::np; ++r) {
    const std::vector<std::string>& log = job.logs[r];
    INFO("rank " << r);
    const std::vector<std::string> want = {
        "wait default",
        "wait default",
        "wait default",
        "wait default",  // ready events
        "copy 40",
        "copy 44",
        "copy 48",
        "copy 52",              // into the buffer
        "allreduce 46 sum x1",  // 0.5 * 4 / 2 ranks: AVERAGE becomes SUM x1
        "copy 40",
        "copy 44",
        "copy 48",
        "copy 52",  // out of it
        "finish streams=0 wait",
        "wait default",
        "allreduce 70000 sum x1",
        "finish streams=0 wait",
        "wait caller-stream",
        "allreduce 3 sum x1",
        "finish streams=1"};
    CHECK(log == want);
  }
}

TEST_CASE("engine: every collective reaches the device backend", "[engine][gpu]") {
  FakeDeviceJob job;
  REQUIRE(job.Start() == "");
  std::string failures = job.Run([&](int r, Runtime& rt, Failures& f) {
    float* a = FakeDeviceJob::dev_mem[r][0];
    float* b = FakeDeviceJob::dev_mem[r][1];
    // reducescatter
    Entry rs;
    rs.req.name = "rs", rs.req.kind = Kind::kReduceScatter, rs.req.dtype = RINGRUN_FLOAT32;
    rs.req.count = 3, rs.req.op = RINGRUN_AVERAGE, rs.send = a, rs.recv = b;
    auto h1 = Submit(rt, std::move(rs));
    // ragged allgather: rank r sends r + 1 rows of 2
    Entry ag;
    ag.req.name = "ag", ag.req.kind = Kind::kAllgather, ag.req.dtype = RINGRUN_FLOAT32;
    ag.req.count = r + 1, ag.req.row_elems = 2, ag.send = a;
    auto h2 = Submit(rt, std::move(ag));
    // alltoall with splits: rank r sends j + 1 + r rows to rank j
    Entry at;
    at.req.name = "at", at.req.kind = Kind::kAlltoall, at.req.dtype = RINGRUN_FLOAT32;
    at.req.row_elems = 1, at.send = a;
    for (int j = 0; j < FakeDeviceJob::np; ++j) at.req.send_rows.push_back(j + 1 + r);
    at.req.count = at.req.send_rows[0] + at.req.send_rows[1];
    auto h3 = Submit(rt, std::move(at));
    for (auto* h : {h1.get(), h2.get(), h3.get()}) {
      std::string err = h ? WaitOk(*h) : "refused";
      if (!err.empty()) f.Add(r, err);
    }
    if (h2 && (h2->device_output == nullptr || h2->device_output_bytes != 3 * 2 * 4 ||
               h2->rows != std::vector<size_t>{1, 2})) {
      f.Add(r, "ragged allgather output");
    }
    if (h3 &&
        (h3->device_output_bytes != static_cast<size_t>(r + 1 + r + 2) * 4 ||
         h3->rows != std::vector<size_t>{static_cast<size_t>(r + 1), static_cast<size_t>(r + 2)})) {
      f.Add(r, "alltoall output");
    }
  });
  INFO(failures);
  CHECK(failures.empty());
  std::vector<std::string> want0 = {"wait default", "reducescatter 3",   "finish streams=0 wait",
                                    "wait default", "allgatherv 2 4",    "finish streams=0 wait",
                                    "wait default", "alltoallv 1/1 2/2", "finish streams=0 wait"};
  std::vector<std::string> want1 = want0;
  want1[7] = "alltoallv 2/2 3/3";
  CHECK(job.logs[0] == want0);
  CHECK(job.logs[1] == want1);
}

TEST_CASE("engine: the controller orders ready names by first announcement", "[engine]") {
  engine::Controller c0(2, 16), c1(2, 16);
  auto req = [](const std::string& n) {
    engine::Request r;
    r.name = n, r.count = 1;
    return r;
  };
  engine::Request a = req("a"), b = req("b"), z = req("z");
  // Round 1: rank 0 announces z, a; rank 1 announces b, a.
  std::vector<std::string> f = {c0.EncodeFrame({&z, &a}), c1.EncodeFrame({&b, &a})};
  auto r0 = c0.Apply(f, 0);
  auto r1 = c1.Apply(f, 0);
  REQUIRE(r0.ok());
  REQUIRE(r0->size() == 1);
  CHECK((*r0)[0].req.name == "a");
  // Round 2: rank 0 announces b, rank 1 announces z: both ready, z first (announced earlier).
  f = {c0.EncodeFrame({&b}), c1.EncodeFrame({&z})};
  r0 = c0.Apply(f, 0);
  r1 = c1.Apply(f, 0);
  REQUIRE(r0->size() == 2);
  CHECK((*r0)[0].req.name == "z");
  CHECK((*r0)[1].req.name == "b");
  CHECK((*r1)[0].req.name == "z");
  // Round 3: "a" again is cached: its frame entry is 5 bytes.
  CHECK(c0.EncodeFrame({&a}).size() == 4 + 5);
}

TEST_CASE("engine: the controller's steady state matches the general path", "[engine]") {
  // Identical frames of cached ids with nothing pending take a shortcut (ApplyUniform); what
  // it returns, and what follows it, must be what counting every announcement gives.
  engine::Controller c0(2, 16), c1(2, 16);
  auto req = [](const std::string& n, uint64_t count) {
    engine::Request r;
    r.name = n, r.count = count;
    return r;
  };
  engine::Request a = req("a", 1), b = req("b", 2), c = req("c", 3);
  auto apply = [&](std::vector<std::string> f, int64_t now) {
    auto r0 = c0.Apply(f, now);
    auto r1 = c1.Apply(f, now);
    REQUIRE(r0.ok() == r1.ok());
    std::vector<std::string> names;
    if (!r0.ok()) return names;
    REQUIRE(r0->size() == r1->size());
    for (size_t i = 0; i < r0->size(); ++i) {
      const engine::Response& x = (*r0)[i];
      CHECK(x.req.name == (*r1)[i].req.name);
      CHECK(x.type == engine::Response::kRun);
      CHECK(x.contributors == 2);
      CHECK(x.announced_us == std::vector<int64_t>{now, now});
      names.push_back(x.req.name + "/" + std::to_string(x.req.count) +
                      (x.cache_id >= 0 ? "" : "/full"));
    }
    return names;
  };
  using V = std::vector<std::string>;
  // In full first (no cache id yet): cached after.
  CHECK(apply({c0.EncodeFrame({&a, &b, &c}), c1.EncodeFrame({&a, &b, &c})}, 1) ==
        V{"a/1/full", "b/2/full", "c/3/full"});
  // The same cached ids in the same order on both ranks: the shortcut, in frame order.
  CHECK(c0.EncodeFrame({&c, &b, &a}).size() == 4 + 3 * 5);
  CHECK(apply({c0.EncodeFrame({&c, &b, &a}), c1.EncodeFrame({&c, &b, &a})}, 2) ==
        V{"c/3", "b/2", "a/1"});
  // Different orders: the general path, in rank 0's order.
  CHECK(apply({c0.EncodeFrame({&a, &b}), c1.EncodeFrame({&b, &a})}, 3) == V{"a/1", "b/2"});
  // Something pending (rank 1 has not sent c): identical frames after it take the general
  // path, and c runs once rank 1 sends it.
  CHECK(apply({c0.EncodeFrame({&c}), c1.EncodeFrame({})}, 4).empty());
  CHECK(c0.has_pending());
  CHECK(apply({c0.EncodeFrame({&a}), c1.EncodeFrame({&a})}, 5) == V{"a/1"});
  auto r0 = c0.Apply({c0.EncodeFrame({}), c1.EncodeFrame({&c})}, 6);
  auto r1 = c1.Apply({c0.EncodeFrame({}), c1.EncodeFrame({&c})}, 6);
  REQUIRE(r0.ok());
  REQUIRE(r0->size() == 1);
  CHECK((*r0)[0].req.name == "c");
  CHECK((*r0)[0].announced_us == std::vector<int64_t>{4, 6});
  CHECK(!c0.has_pending());
  // A changed argument travels in full on both ranks: not the shortcut; then cached again.
  engine::Request b5 = req("b", 5);
  CHECK(apply({c0.EncodeFrame({&b5}), c1.EncodeFrame({&b5})}, 7) == V{"b/5"});
  CHECK(apply({c0.EncodeFrame({&b5, &a}), c1.EncodeFrame({&b5, &a})}, 8) == V{"b/5", "a/1"});
  // A repeated id in identical frames is malformed, as in the general path.
  const std::string twice = c0.EncodeFrame({&a, &a});
  CHECK(!c0.Apply({twice, twice}, 9).ok());
}

TEST_CASE("engine: a repeated uniform round reuses its responses only while nothing changed",
          "[engine]") {
  // The steady state of training repeats one step's frame: the controller then hands back the
  // previous uniform round's responses (Controller::repeated), across general rounds in between
  // (a barrier, a blocking call), but not once the cache changed or the frame differs.
  engine::Controller c0(2, 16), c1(2, 16);
  auto req = [](const std::string& n, uint64_t count) {
    engine::Request r;
    r.name = n, r.count = count;
    return r;
  };
  engine::Request a = req("a", 1), b = req("b", 2), c = req("c", 3);
  std::vector<engine::Response> out0, out1;
  struct Round {
    std::vector<std::string> names;
    bool uniform, repeated;
  };
  auto apply = [&](const std::vector<const engine::Request*>& x, int64_t now) {
    const std::vector<std::string> f{c0.EncodeFrame(x), c1.EncodeFrame(x)};
    const engine::Response *p0 = nullptr, *p1 = nullptr;
    Result<size_t> n0 = c0.Apply(f, now, &out0, &p0);
    Result<size_t> n1 = c1.Apply(f, now, &out1, &p1);
    REQUIRE(n0.ok());
    REQUIRE(n1.ok());
    REQUIRE(*n0 == *n1);
    CHECK(c0.repeated() == c1.repeated());
    Round r{{}, c0.uniform(), c0.repeated()};
    for (size_t i = 0; i < *n0; ++i) {
      CHECK(p0[i].req.name == p1[i].req.name);
      CHECK(p0[i].type == engine::Response::kRun);
      CHECK(p0[i].contributors == 2);
      CHECK(p0[i].announced_us == std::vector<int64_t>{now, now});
      CHECK(p0[i].cache_id >= 0);
      r.names.push_back(p0[i].req.name + "/" + std::to_string(p0[i].req.count));
    }
    return r;
  };
  using V = std::vector<std::string>;
  const std::vector<std::string> full{c0.EncodeFrame({&a, &b, &c}), c1.EncodeFrame({&a, &b, &c})};
  REQUIRE(c0.Apply(full, 1).ok());  // in full: cached after
  REQUIRE(c1.Apply(full, 1).ok());
  Round r = apply({&c, &b, &a}, 2);
  CHECK((r.uniform && !r.repeated));
  CHECK(r.names == V{"c/3", "b/2", "a/1"});
  r = apply({&c, &b, &a}, 3);
  CHECK((r.uniform && r.repeated));
  CHECK(r.names == V{"c/3", "b/2", "a/1"});
  // A round of the general path in between (a name in full) leaves the repeat possible.
  engine::Request barrier = req("barrier.noname.0", 0);
  barrier.kind = engine::Kind::kBarrier;
  const std::vector<std::string> fb{c0.EncodeFrame({&barrier}), c1.EncodeFrame({&barrier})};
  const engine::Response* p = nullptr;
  REQUIRE(c0.Apply(fb, 4, &out0, &p).ok());
  REQUIRE(c1.Apply(fb, 4, &out1, &p).ok());
  CHECK_FALSE(c0.uniform());
  r = apply({&c, &b, &a}, 5);
  CHECK((r.uniform && r.repeated));
  CHECK(r.names == V{"c/3", "b/2", "a/1"});
  // Another frame: a uniform round of its own, not a repeat.
  r = apply({&a, &b}, 6);
  CHECK((r.uniform && !r.repeated));
  CHECK(r.names == V{"a/1", "b/2"});
  r = apply({&a, &b}, 7);
  CHECK((r.uniform && r.repeated));
  // b's arguments change (in full, then cached again): the same ids, but the cache changed,
  // so the next identical frame is built afresh and carries the new count.
  engine::Request b5 = req("b", 5);
  CHECK(apply({&b5}, 8).names == V{"b/5"});
  r = apply({&a, &b5}, 9);
  CHECK((r.uniform && !r.repeated));
  CHECK(r.names == V{"a/1", "b/5"});
  r = apply({&a, &b5}, 10);
  CHECK((r.uniform && r.repeated));
  CHECK(r.names == V{"a/1", "b/5"});
}

}  // namespace
}  // namespace ringrun::runtime::testing
