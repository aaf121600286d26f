// Negotiation at scale: tens of ranks as threads in one process over loopback, the engine's
// allgather of frames (Bruck's, ceil(log2 n) steps), and the connections it makes. The 64-rank
// cases take seconds (more under ThreadSanitizer) and are tagged [slow].
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/runtime/engine_helpers.h"
#include "thread_job.h"

namespace ringrun::runtime::testing {
namespace {

using engine::Entry;
using engine::HandleState;
using engine::Kind;

ThreadJobOptions ScaleOpts(int np, bool shm) {
  ThreadJobOptions o;
  o.np = np;
  o.transport.use_shm = shm;
  o.transport.spin = false;  // far more ranks than CPUs
  o.timeout_ms = 30000;
  return o;
}

int CeilLog2(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

Entry FloatAllreduce(const std::string& name, float* buf, size_t count) {
  Entry e;
  e.req.name = name, e.req.kind = Kind::kAllreduce, e.req.dtype = RINGRUN_FLOAT32;
  e.req.op = RINGRUN_SUM, e.req.count = count;
  e.send = buf, e.recv = buf;
  return e;
}

TEST_CASE("engine at 64 ranks: random submission orders agree over O(log n) connections",
          "[engine][scale][slow]") {
  const int np = 64, kTensors = 24;
  std::vector<std::unique_ptr<Runtime>> rts;
  REQUIRE(MakeThreadJob(ScaleOpts(np, false), &rts).empty());
  Failures failures;
  std::vector<std::thread> threads;
  for (int r = 0; r < np; ++r) {
    threads.emplace_back([&, r] {
      for (int step = 0; step < 3; ++step) {  // later steps from the response cache
        std::vector<std::vector<float>> bufs(kTensors);
        for (int t = 0; t < kTensors; ++t) bufs[t].assign(1 + t * 13, static_cast<float>(r + t));
        std::vector<int> order(kTensors);
        for (int t = 0; t < kTensors; ++t) order[t] = t;
        std::shuffle(order.begin(), order.end(), std::mt19937(r * 7919 + step));
        std::vector<std::shared_ptr<HandleState>> hs(kTensors);
        for (int t : order) {
          hs[t] = Submit(*rts[r],
                         FloatAllreduce("g." + std::to_string(t), bufs[t].data(), bufs[t].size()));
        }
        for (int t = 0; t < kTensors; ++t) {
          if (!hs[t]) return failures.Add(r, "g." + std::to_string(t) + " refused");
          std::string err = WaitOk(*hs[t]);
          if (!err.empty()) return failures.Add(r, err);
          const float want = static_cast<float>(np * t + np * (np - 1) / 2);
          if (bufs[t][0] != want || bufs[t].back() != want) {
            return failures.Add(r, "g." + std::to_string(t) + " = " + std::to_string(bufs[t][0]));
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  INFO(failures.Joined());
  CHECK(failures.list().empty());
  // Negotiation's partners are rank +- 2^k; the ring's neighbours are among them.
  for (int r = 0; r < np; ++r) {
    const transport::Counters c = rts[r]->engine().transport_counters();
    INFO("rank " << r << ": " << c.connections << " connections");
    CHECK(c.connections <= 2 * CeilLog2(np));
    CHECK(c.connections_made == c.connections);
  }
}

TEST_CASE("engine at 64 ranks: a round that one rank starts wakes every sleeping rank",
          "[engine][scale]") {
  // Rank 63 submits alone; the others sleep in WaitForInput. Each is woken by its partner's
  // first step, which that partner sends once woken itself: every rank must run the round.
  const int np = 64, starter = 63;
  std::vector<std::unique_ptr<Runtime>> rts;
  REQUIRE(MakeThreadJob(ScaleOpts(np, false), &rts).empty());
  auto rounds = [&](int r) { return rts[r]->engine().negotiation_counters().rounds; };
  auto all_past = [&](const std::vector<uint64_t>& base) {
    for (int r = 0; r < np; ++r) {
      if (rounds(r) <= base[r]) return false;
    }
    return true;
  };
  const auto until = [](int ms) {
    return std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  };
  std::vector<uint64_t> none(np, 0), before(np);
  for (auto t = until(20000); !all_past(none) && std::chrono::steady_clock::now() < t;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  REQUIRE(all_past(none));  // every hello done
  for (int r = 0; r < np; ++r) before[r] = rounds(r);
  std::vector<float> x(np, 1.0f);
  std::vector<std::shared_ptr<HandleState>> hs(np);
  hs[starter] = Submit(*rts[starter], FloatAllreduce("x", &x[starter], 1));
  for (auto t = until(10000); !all_past(before) && std::chrono::steady_clock::now() < t;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int r = 0; r < np; ++r) {
    INFO("rank " << r);
    CHECK(rounds(r) > before[r]);
  }
  for (int r = 0; r < np; ++r) {
    if (r != starter) hs[r] = Submit(*rts[r], FloatAllreduce("x", &x[r], 1));
  }
  for (int r = 0; r < np; ++r) {
    INFO("rank " << r);
    CHECK(WaitOk(*hs[r]).empty());
    CHECK(x[r] == np);
  }
}

TEST_CASE("engine at 16 ranks: a negotiation round is log2(n) head messages per rank",
          "[engine][scale]") {
  // Barriers are negotiation only: every rank's frame is the same full request, so every step
  // is one 1 KiB head, and the peers are rank +- 1, 2, 4, 8: 7 connections.
  const int np = 16, steps = CeilLog2(np), kBarriers = 20;
  std::vector<std::unique_ptr<Runtime>> rts;
  REQUIRE(MakeThreadJob(ScaleOpts(np, true), &rts).empty());
  Failures failures;
  std::vector<std::thread> threads;
  for (int r = 0; r < np; ++r) {
    threads.emplace_back([&, r] {
      for (int b = 0; b < kBarriers; ++b) {
        Status st = rts[r]->Barrier();
        if (!st.ok()) return failures.Add(r, st.ToString());
      }
    });
  }
  for (auto& t : threads) t.join();
  INFO(failures.Joined());
  REQUIRE(failures.list().empty());
  for (int r = 0; r < np; ++r) {
    const transport::Counters c = rts[r]->engine().transport_counters();
    INFO("rank " << r << ": " << c.connections << " connections, " << c.messages_sent
                 << " messages, " << c.bytes_sent << " bytes");
    CHECK(c.connections == 7);
    CHECK(c.connections <= 2 * steps);
    CHECK(c.connections_made == c.connections);
    // The hello round and at least one round per barrier, each `steps` heads and nothing else.
    CHECK(c.messages_sent % steps == 0);
    CHECK(c.messages_sent >= uint64_t(steps) * (1 + kBarriers));
    CHECK(c.bytes_sent == c.messages_sent * 1024);
  }
}

TEST_CASE("engine at 64 ranks: a mismatch fails on every rank naming the ranks that differ",
          "[engine][scale][slow]") {
  const int np = 64;
  std::string failures =
      RunThreadJob(ScaleOpts(np, false), [&](int rank, Runtime& rt, Failures& f) {
        float x = 1;
        int32_t i = 1;
        Entry e = FloatAllreduce("w", &x, 1);
        if (rank == 5 || rank == 40) e.req.dtype = RINGRUN_INT32, e.send = &i, e.recv = &i;
        auto h = Submit(rt, e);
        if (!h) return f.Add(rank, "refused");
        auto [st, msg] = WaitStatus(*h);
        if (st != Code::kMismatch || msg.find("ranks disagree on the dtype") == std::string::npos ||
            msg.find("ranks 5, 40 sent int32") == std::string::npos) {
          f.Add(rank, std::string(CodeName(st)) + ": " + msg);
        }
        // The job goes on.
        float y = 1;
        auto h2 = Submit(rt, FloatAllreduce("after", &y, 1));
        std::string err = h2 ? WaitOk(*h2) : "refused";
        if (!err.empty() || y != np) f.Add(rank, "after: " + err + " " + std::to_string(y));
      });
  INFO(failures);
  CHECK(failures.empty());
}

TEST_CASE("engine at 64 ranks: the stall inspector names the missing rank, then shuts down",
          "[engine][scale][stall][slow]") {
  const int np = 64, missing = 37;
  Logs logs;
  EngineSettings s;
  s.stall.warning_us = 300'000;
  s.stall.shutdown_us = 900'000;
  s.log = logs.Sink();
  const auto t0 = std::chrono::steady_clock::now();
  std::string failures = RunThreadJob(
      ScaleOpts(np, false),
      [&](int rank, Runtime& rt, Failures& f) {
        float x = 1;
        if (rank == missing) {  // submits nothing, but its engine takes part in every round
          std::this_thread::sleep_for(std::chrono::milliseconds(2000));
          return;
        }
        auto h = Submit(rt, FloatAllreduce("late", &x, 1));
        if (!h) return f.Add(rank, "refused");
        auto [st, msg] = WaitStatus(*h);
        if (st != Code::kAborted || msg.find("stall shutdown") == std::string::npos ||
            msg.find("rank 37 has not submitted 1 tensor: late") == std::string::npos) {
          f.Add(rank, std::string(CodeName(st)) + ": " + msg);
        }
      },
      s);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(15));
  INFO(failures);
  CHECK(failures.empty());
  const std::vector<std::string> lines = logs.Lines();
  REQUIRE(!lines.empty());  // rank 0 warns before the shutdown
  INFO(lines[0]);
  CHECK(lines[0].find("rank 37 has not submitted 1 tensor: late") != std::string::npos);
}

TEST_CASE("engine at 32 ranks: a peer that dies fails every rank, not at the timeout",
          "[engine][scale][dead-peer]") {
  // Only the dead rank's partners see its connections close; they break, closing theirs, and so
  // on: every rank fails within a few hops. A rank names the peer whose connection closed on it,
  // which is the dead rank for its partners and may be a partner for the others.
  const int np = 32, dead = 13;
  ThreadJobOptions o = ScaleOpts(np, true);
  o.timeout_ms = 20000;
  std::vector<std::unique_ptr<Runtime>> rts;
  REQUIRE(MakeThreadJob(o, &rts).empty());
  std::vector<float> bufs(np, 1.0f);
  std::vector<std::shared_ptr<HandleState>> hs(np);
  for (int r = 0; r < np; ++r) {
    if (r != dead) hs[r] = Submit(*rts[r], FloatAllreduce("t", &bufs[r], 1));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto t0 = std::chrono::steady_clock::now();
  rts[dead].reset();
  int named_dead = 0;
  for (int r = 0; r < np; ++r) {
    if (r == dead) continue;
    auto [st, msg] = WaitStatus(*hs[r]);
    INFO("rank " << r << ": " << CodeName(st) << ": " << msg);
    CHECK(st != Code::kOk);
    CHECK(st != Code::kTimeout);
    CHECK(msg.find("peer rank") != std::string::npos);
    named_dead += msg.find("peer rank 13 ") != std::string::npos;
  }
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  CHECK(named_dead >= 1);
  // Later calls fail at once.
  float x = 1;
  CHECK_FALSE(rts[0]->Allreduce(&x, &x, 1, RINGRUN_FLOAT32, RINGRUN_SUM).ok());
}

}  // namespace
}  // namespace ringrun::runtime::testing
