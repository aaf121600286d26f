// The collectives over real loopback sockets and real shared memory, ranks as threads.
#include <sys/eventfd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <numeric>
#include <thread>

#include "tests/runtime/thread_job.h"
#include "tests/runtime/values.h"

namespace ringrun::runtime::testing {
namespace {

using namespace ringrun::runtime::transport;

const size_t kCounts[] = {0, 1, 7, 1023, 65537, (1u << 20) + 3};

// kShmFallback: shared memory on, but rank 2 has no local listener, so its pairs are TCP.
// kShmYield: shared memory, waiting as ranks past the core count do (TransportOptions::yield).
enum class Mode { kTcp, kShm, kTwoHosts, kShmFallback, kShmYield };

ThreadJobOptions Options(int np, Mode mode) {
  ThreadJobOptions o;
  o.np = np;
  o.transport.use_shm = mode != Mode::kTcp;
  o.transport.spin = false;               // ranks are threads on a small machine
  o.transport.shm_ring_bytes = 64 << 10;  // small, so that messages wrap many times
  if (mode == Mode::kShmFallback) o.without_local_listener = {2};
  o.transport.yield = mode == Mode::kShmYield;
  if (mode == Mode::kTwoHosts) {
    for (int r = 0; r < np; ++r) o.hosts.push_back(r < (np + 1) / 2 ? "127.0.0.1" : "127.0.0.2");
  }
  return o;
}

// Every dtype x op x count, in place and out of place. `big` includes 2^20+3.
void AllreduceMatrix(int np, Mode mode, bool big) {
  std::string failures = RunThreadJob(Options(np, mode), [&](int rank, Runtime& rt, Failures& f) {
    for (size_t count : kCounts) {
      if (!big && count > 65537) continue;
      for (ringrun_dtype d : AllDtypes()) {
        for (ringrun_op op : OpsFor(d)) {
          const size_t e = DtypeSize(d);
          std::vector<char> in = Inputs(op, d, rank, count);
          // Out of place; recv starts as garbage, send must be left alone.
          std::vector<char> out(count * e + 1, '\x5a');
          Status st = rt.Allreduce(in.data(), out.data(), count, d, op);
          if (!st.ok()) return f.Add(rank, st.ToString());
          std::string bad = CheckReduced(op, d, np, out.data(), count);
          if (!bad.empty()) return f.Add(rank, "out of place: " + bad);
          if (out[count * e] != '\x5a') return f.Add(rank, "wrote past recvbuf");
          if (in != Inputs(op, d, rank, count)) return f.Add(rank, "sendbuf modified");
          // In place.
          st = rt.Allreduce(in.data(), in.data(), count, d, op);
          if (!st.ok()) return f.Add(rank, st.ToString());
          bad = CheckReduced(op, d, np, in.data(), count);
          if (!bad.empty()) return f.Add(rank, "in place: " + bad);
        }
      }
    }
  });
  INFO(failures);
  CHECK(failures.empty());
}

}  // namespace

TEST_CASE("allreduce: every dtype, op and count over TCP", "[allreduce][slow]") {
  for (int np : {1, 2, 3, 5}) {
    DYNAMIC_SECTION("np=" << np) { AllreduceMatrix(np, Mode::kTcp, true); }
  }
}

TEST_CASE("allreduce: every dtype, op and count over shared memory", "[allreduce][shm][slow]") {
  for (int np : {2, 3, 5}) {
    DYNAMIC_SECTION("np=" << np) { AllreduceMatrix(np, Mode::kShm, np != 5); }
  }
}

TEST_CASE("allreduce: a rank without a local listener is reached over TCP", "[allreduce][shm]") {
  AllreduceMatrix(3, Mode::kShmFallback, false);
}

TEST_CASE("allreduce: ranks that yield while they wait, as past the core count",
          "[allreduce][shm]") {
  AllreduceMatrix(5, Mode::kShmYield, false);
}

TEST_CASE("allreduce: hierarchical and mixed, over two loopback hosts", "[allreduce][shm][slow]") {
  // np=4: two hosts of two (hierarchical); np=3 and 5: uneven hosts (flat ring, mixed pairs).
  for (int np : {3, 4, 5}) {
    DYNAMIC_SECTION("np=" << np) { AllreduceMatrix(np, Mode::kTwoHosts, np == 4); }
  }
}

TEST_CASE("min/max/sum: every rank gets the same bits, NaN propagates, -0 < +0", "[allreduce]") {
  // Element i: NaN on rank i % 7 (when that rank exists; the payload names the rank, and
  // i % 14 < 7 puts a NaN on every rank), +0 / -0 (even / odd ranks) where i % 5 == 0, else a
  // small integer. Small counts take recursive doubling, where each pair combines its two
  // values on both sides, large ones the ring.
  for (Mode mode : {Mode::kTcp, Mode::kShm}) {
    for (int np : {2, 3, 4}) {
      DYNAMIC_SECTION("np=" << np << " shm=" << (mode == Mode::kShm)) {
        for (size_t count : {size_t{5}, size_t{29}, size_t{100003}}) {
          for (ringrun_op op : {RINGRUN_MIN, RINGRUN_MAX, RINGRUN_SUM}) {
            std::vector<std::vector<float>> out(np);
            std::string failures =
                RunThreadJob(Options(np, mode), [&](int rank, Runtime& rt, Failures& f) {
                  std::vector<float> in(count);
                  const uint32_t nan_bits = 0x7fc00000u | static_cast<uint32_t>(rank + 1);
                  for (size_t i = 0; i < count; ++i) {
                    const bool nan = static_cast<int>(i % 7) == rank || i % 14 < 7;
                    if (nan)
                      std::memcpy(&in[i], &nan_bits, 4);
                    else
                      in[i] = i % 5 == 0 ? (rank % 2 ? -0.0f : 0.0f)
                                         : static_cast<float>((i * 3 + rank) % 11);
                  }
                  out[rank].resize(count);
                  Status st = rt.Allreduce(in.data(), out[rank].data(), count, RINGRUN_FLOAT32, op);
                  if (!st.ok()) f.Add(rank, st.ToString());
                });
            INFO(failures << "count " << count << " " << NameOfOp(op));
            REQUIRE(failures.empty());
            for (int r = 1; r < np; ++r) {
              CHECK(std::memcmp(out[r].data(), out[0].data(), count * sizeof(float)) == 0);
            }
            size_t bad = 0;
            for (size_t i = 0; i < count; ++i) {
              const float v = out[0][i];
              if (static_cast<int>(i % 7) < np || i % 14 < 7)
                bad += !std::isnan(v);
              else if (i % 5 == 0 && op != RINGRUN_SUM)
                bad += v != 0 || std::signbit(v) != (op == RINGRUN_MIN);
            }
            CHECK(bad == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("broadcast from every root, small and large", "[broadcast]") {
  for (Mode mode : {Mode::kTcp, Mode::kShm}) {
    for (int np : {1, 2, 3, 5}) {
      DYNAMIC_SECTION("np=" << np << " shm=" << (mode == Mode::kShm)) {
        std::string failures = RunThreadJob(Options(np, mode), [&](int rank, Runtime& rt,
                                                                   Failures& f) {
          for (size_t count : {size_t{0}, size_t{1}, size_t{1023}, size_t{300001}}) {
            for (int root = 0; root < np; ++root) {
              std::vector<int32_t> buf(count);
              for (size_t i = 0; i < count; ++i) {
                buf[i] = rank == root ? static_cast<int32_t>(i * 31 + root) : -1;
              }
              Status st = rt.Broadcast(buf.data(), count, RINGRUN_INT32, root);
              if (!st.ok()) return f.Add(rank, st.ToString());
              for (size_t i = 0; i < count; ++i) {
                if (buf[i] != static_cast<int32_t>(i * 31 + root)) {
                  return f.Add(rank, "broadcast root " + std::to_string(root) + " count " +
                                         std::to_string(count) + " wrong at " + std::to_string(i));
                }
              }
            }
          }
        });
        INFO(failures);
        CHECK(failures.empty());
      }
    }
  }
}

TEST_CASE("allgather, reduce-scatter and all-to-all", "[allgather][reducescatter][alltoall]") {
  for (Mode mode : {Mode::kTcp, Mode::kShm}) {
    for (int np : {1, 2, 3, 5}) {
      DYNAMIC_SECTION("np=" << np << " shm=" << (mode == Mode::kShm)) {
        std::string failures = RunThreadJob(Options(np, mode), [&](int rank, Runtime& rt,
                                                                   Failures& f) {
          for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{70001}}) {
            // Allgather, out of place and in place (sendbuf = recvbuf + rank * count).
            std::vector<int64_t> mine(count), all(count * np, -7);
            for (size_t i = 0; i < count; ++i) mine[i] = rank * 1000000 + i;
            Status st = rt.Allgather(mine.data(), all.data(), count, RINGRUN_INT64);
            if (!st.ok()) return f.Add(rank, st.ToString());
            for (int r = 0; r < np; ++r) {
              for (size_t i = 0; i < count; ++i) {
                if (all[r * count + i] != static_cast<int64_t>(r * 1000000 + i)) {
                  return f.Add(rank, "allgather wrong at rank block " + std::to_string(r));
                }
              }
            }
            std::vector<int64_t> inplace(count * np, -7);
            std::copy(mine.begin(), mine.end(), inplace.begin() + rank * count);
            st = rt.Allgather(inplace.data() + rank * count, inplace.data(), count, RINGRUN_INT64);
            if (!st.ok()) return f.Add(rank, st.ToString());
            if (inplace != all) return f.Add(rank, "in-place allgather differs");

            // Reduce-scatter (float sum, then average), out of place and sendbuf == recvbuf.
            std::vector<float> send(count * np), recv(count, -1);
            for (size_t i = 0; i < send.size(); ++i) send[i] = float((i + rank) % 13);
            st = rt.ReduceScatter(send.data(), recv.data(), count, RINGRUN_FLOAT32, RINGRUN_SUM);
            if (!st.ok()) return f.Add(rank, st.ToString());
            for (size_t i = 0; i < count; ++i) {
              float want = 0;
              for (int r = 0; r < np; ++r) want += float((rank * count + i + r) % 13);
              if (recv[i] != want) return f.Add(rank, "reducescatter wrong");
            }
            std::vector<float> same = send;
            st =
                rt.ReduceScatter(same.data(), same.data(), count, RINGRUN_FLOAT32, RINGRUN_AVERAGE);
            if (!st.ok()) return f.Add(rank, st.ToString());
            for (size_t i = 0; i < count; ++i) {
              if (same[i] != recv[i] / float(np)) return f.Add(rank, "in-place average wrong");
            }

            // All-to-all, out of place and in place.
            std::vector<int32_t> a2a(count * np), got(count * np, -1);
            for (int to = 0; to < np; ++to) {
              for (size_t i = 0; i < count; ++i) a2a[to * count + i] = rank * 100 + to + i;
            }
            st = rt.Alltoall(a2a.data(), got.data(), count, RINGRUN_INT32);
            if (!st.ok()) return f.Add(rank, st.ToString());
            for (int from = 0; from < np; ++from) {
              for (size_t i = 0; i < count; ++i) {
                if (got[from * count + i] != static_cast<int32_t>(from * 100 + rank + i)) {
                  return f.Add(rank, "alltoall wrong");
                }
              }
            }
            st = rt.Alltoall(a2a.data(), a2a.data(), count, RINGRUN_INT32);
            if (!st.ok()) return f.Add(rank, st.ToString());
            if (a2a != got) return f.Add(rank, "in-place alltoall differs");
          }
          for (int i = 0; i < 3; ++i) {
            Status st = rt.Barrier();
            if (!st.ok()) return f.Add(rank, st.ToString());
          }
        });
        INFO(failures);
        CHECK(failures.empty());
      }
    }
  }
}

TEST_CASE("bad arguments are rejected before communicating and leave the runtime usable",
          "[args]") {
  std::string failures =
      RunThreadJob(Options(3, Mode::kShm), [&](int rank, Runtime& rt, Failures& f) {
        float x[4] = {1, 2, 3, 4};
        int32_t n[4] = {1, 2, 3, 4};
        int16_t h[4] = {1, 2, 3, 4};
        auto expect_invalid = [&](const Status& st, const char* what) {
          if (st.code() != Code::kInvalidArgument)
            f.Add(rank, std::string(what) + ": " + st.ToString());
        };
        expect_invalid(rt.Allreduce(x, x, 4, static_cast<ringrun_dtype>(99), RINGRUN_SUM), "dtype");
        expect_invalid(rt.Allreduce(x, x, 4, RINGRUN_FLOAT32, static_cast<ringrun_op>(-1)), "op");
        expect_invalid(rt.Allreduce(n, n, 4, RINGRUN_INT32, RINGRUN_AVERAGE), "average int");
        expect_invalid(rt.Allreduce(h, h, 4, RINGRUN_INT16, RINGRUN_AVERAGE), "average int16");
        expect_invalid(rt.Allreduce(nullptr, x, 4, RINGRUN_FLOAT32, RINGRUN_SUM), "null");
        expect_invalid(rt.Allreduce(x, x + 1, 3, RINGRUN_FLOAT32, RINGRUN_SUM), "overlap");
        expect_invalid(rt.Allreduce(x, x, SIZE_MAX / 2, RINGRUN_FLOAT32, RINGRUN_SUM), "overflow");
        expect_invalid(rt.Allreduce(x, x, SIZE_MAX / 4 + 1, RINGRUN_FLOAT32, RINGRUN_SUM),
                       "overflow by one");
        expect_invalid(rt.ReduceScatter(x, x, SIZE_MAX / 12 + 1, RINGRUN_FLOAT32, RINGRUN_SUM),
                       "rs overflow (3 ranks)");
        expect_invalid(rt.Broadcast(x, 4, RINGRUN_FLOAT32, 3), "root");
        expect_invalid(rt.Broadcast(x, 4, RINGRUN_FLOAT32, -1), "negative root");
        expect_invalid(rt.Allgather(x, nullptr, 1, RINGRUN_FLOAT32), "allgather null");
        expect_invalid(rt.ReduceScatter(n, n, 1, RINGRUN_INT32, RINGRUN_AVERAGE), "rs average");
        // Still usable, and nothing above was sent: the next collective matches up.
        Status st = rt.Allreduce(x, x, 4, RINGRUN_FLOAT32, RINGRUN_SUM);
        if (!st.ok()) return f.Add(rank, st.ToString());
        if (x[0] != 3 || x[3] != 12) f.Add(rank, "allreduce after rejected calls is wrong");
      });
  INFO(failures);
  CHECK(failures.empty());
}

TEST_CASE("a missing peer times out with an error that names it", "[timeout]") {
  ThreadJobOptions o = Options(3, Mode::kTcp);
  o.timeout_ms = 300;
  std::vector<std::unique_ptr<Runtime>> rts;
  REQUIRE(MakeThreadJob(o, &rts).empty());
  // Rank 2 never calls: ranks 0 and 1 must fail within the timeout, naming a peer.
  Failures f;
  std::vector<Status> errors(2);
  std::vector<std::thread> threads;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      std::vector<float> buf(1 << 18, 1.0f);
      errors[r] =
          rts[r]->Allreduce(buf.data(), buf.data(), buf.size(), RINGRUN_FLOAT32, RINGRUN_SUM);
    });
  }
  for (auto& t : threads) t.join();
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  CHECK(ms < 5000);
  // The first to time out closes its connections, so the other may see that instead. Rank 2's
  // engine is alive, so the error says it never submitted the collective.
  int timeouts = 0;
  for (int r = 0; r < 2; ++r) {
    INFO(errors[r].ToString());
    CHECK((errors[r].code() == Code::kTimeout || errors[r].code() == Code::kUnavailable));
    CHECK((errors[r].message().find("rank 2 has not submitted") != std::string::npos ||
           errors[r].message().find("peer rank") != std::string::npos));
    timeouts += errors[r].code() == Code::kTimeout;
  }
  CHECK(timeouts >= 1);
  // The failure is sticky.
  float x = 1;
  CHECK_FALSE(rts[0]->Allreduce(&x, &x, 1, RINGRUN_FLOAT32, RINGRUN_SUM).ok());
}

TEST_CASE("a peer that closes mid-collective fails the others at once", "[dead-peer]") {
  for (Mode mode : {Mode::kTcp, Mode::kShm}) {
    DYNAMIC_SECTION("shm=" << (mode == Mode::kShm)) {
      ThreadJobOptions o = Options(3, mode);
      o.timeout_ms = 30000;
      std::vector<std::unique_ptr<Runtime>> rts;
      REQUIRE(MakeThreadJob(o, &rts).empty());
      // Every rank loops over large allreduces; rank 1 stops after two and its runtime is
      // dropped (its sockets close). By then ranks 0 and 2 are in, or entering, an allreduce
      // that needs rank 1: its return is the readiness signal, no sleep guesses it.
      std::vector<Status> errors(3);
      std::vector<std::thread> threads;
      for (int r = 0; r < 3; ++r) {
        threads.emplace_back([&, r] {
          std::vector<float> buf(1 << 20, 1.0f);
          for (int i = 0; r != 1 || i < 2; ++i) {
            errors[r] =
                rts[r]->Allreduce(buf.data(), buf.data(), buf.size(), RINGRUN_FLOAT32, RINGRUN_SUM);
            if (!errors[r].ok()) return;
          }
        });
      }
      threads[1].join();
      CHECK(errors[1].ok());
      const auto t0 = std::chrono::steady_clock::now();
      rts[1].reset();
      threads[0].join();
      threads[2].join();
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now() - t0)
                          .count();
      CHECK(ms < 10000);  // well inside the 30 s timeout: EOF is seen at once
      for (int r : {0, 2}) {
        INFO(errors[r].ToString());
        CHECK(errors[r].code() == Code::kUnavailable);
        CHECK(errors[r].message().find("peer rank") != std::string::npos);
        // The runtime is broken now: every later collective fails with the same message,
        // empty ones too (they would not touch the transport).
        float x = 1;
        for (size_t count : {size_t{0}, size_t{1}}) {
          Status again = rts[r]->Allreduce(&x, &x, count, RINGRUN_FLOAT32, RINGRUN_SUM);
          CHECK(again.message() == errors[r].message());
          again = rts[r]->Broadcast(&x, count, RINGRUN_FLOAT32, 0);
          CHECK(again.message() == errors[r].message());
          again = rts[r]->ReduceScatter(&x, &x, count, RINGRUN_FLOAT32, RINGRUN_SUM);
          CHECK(again.message() == errors[r].message());
        }
        CHECK(rts[r]->Barrier().message() == errors[r].message());
        // A bad argument is still an argument error, not the broken transport's.
        CHECK(rts[r]->Broadcast(&x, 1, RINGRUN_FLOAT32, 7).code() == Code::kInvalidArgument);
      }
    }
  }
}

TEST_CASE("a peer that wrote its last bytes and left is drained, not reported gone",
          "[dead-peer][shm]") {
  // Rank 0's broadcast fits in the pair's ring, so it completes and rank 0 leaves before rank 1
  // reads a byte; rank 1 must still read all of it (the mapping outlives the peer). (The racier
  // case, a rank asleep in Wait while its peer writes its last bytes and exits, is the
  // multiprocess "late" test's: it failed in about 2 of 10 runs before Wait drained fully.)
  // (On the transports: through the engine a broadcast completes on no rank before every rank
  // has submitted it.)
  ThreadJobOptions o = Options(2, Mode::kShm);
  o.transport.shm_ring_bytes = 1 << 20;
  std::vector<std::unique_ptr<Transport>> ts;
  REQUIRE(MakeThreadTransports(o, &ts).empty());
  Scratch scratch[2];
  auto ctx = [&](int r) {
    return CollectiveContext{ts[r].get(), DeadlineAfter(5000), &scratch[r]};
  };
  auto group = [](int r) {
    Group g;
    g.ranks = {0, 1}, g.me = r;
    return g;
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] { (void)ringrun::runtime::Barrier(ctx(r), group(r)); });
  }
  for (auto& t : threads) t.join();
  const size_t n = 900 << 8;  // 900 KiB of int32
  std::vector<int32_t> sent(n), got(n, -1);
  for (size_t i = 0; i < n; ++i) sent[i] = static_cast<int32_t>(i * 3);
  REQUIRE(ringrun::runtime::Broadcast(ctx(0), group(0), sent.data(), n * 4, 0).ok());
  ts[0].reset();
  Status st = ringrun::runtime::Broadcast(ctx(1), group(1), got.data(), n * 4, 0);
  INFO(st.ToString());
  CHECK(st.ok());
  CHECK(got == sent);
}

TEST_CASE("fp16 average: an average that fits never overflows on the way", "[allreduce]") {
  // 40000 on every rank: the fp16 sum (80000, 120000) is past 65504, the average is not.
  // Inputs are scaled by 1/np first, so allreduce and reduce-scatter give 40000 (for np=3:
  // 3 * fp16(40000/3) = 40008, which rounds to 40000 in fp16).
  for (int np : {2, 3}) {
    DYNAMIC_SECTION("np=" << np) {
      for (size_t count : {size_t{3}, size_t{50001}}) {
        std::string failures = RunThreadJob(Options(np, Mode::kShm), [&](int rank, Runtime& rt,
                                                                         Failures& f) {
          const uint16_t big = FloatToHalf(40000.0f);
          std::vector<uint16_t> buf(count * np, big), part(count);
          Status st =
              rt.ReduceScatter(buf.data(), part.data(), count, RINGRUN_FLOAT16, RINGRUN_AVERAGE);
          if (!st.ok()) return f.Add(rank, st.ToString());
          st = rt.Allreduce(buf.data(), buf.data(), buf.size(), RINGRUN_FLOAT16, RINGRUN_AVERAGE);
          if (!st.ok()) return f.Add(rank, st.ToString());
          for (size_t i = 0; i < buf.size(); ++i) {
            if (buf[i] != big || (i < count && part[i] != big)) {
              return f.Add(rank, "element " + std::to_string(i) + ": " +
                                     std::to_string(HalfToFloat(buf[i])) + " / " +
                                     std::to_string(HalfToFloat(part[i % count])));
            }
          }
        });
        INFO(failures);
        CHECK(failures.empty());
      }
    }
  }
}

TEST_CASE("one pair carries small and large messages, interleaved, in order", "[transport][shm]") {
  // Small messages (<= 8 KiB) and large ones take different rings of a shared-memory pair;
  // the receiver must still see them in the order they were sent, in both directions at once.
  const std::vector<size_t> sizes = {4096, 100000, 8, 65536, 16, 8192, 8200, 1, 300000, 7};
  for (bool shm : {false, true}) {
    DYNAMIC_SECTION("shm=" << shm) {
      TransportOptions topts;
      topts.use_shm = shm;
      topts.spin = false;
      topts.shm_ring_bytes = 64 << 10;
      topts.secret = kThreadJobSecret;
      PeerTable table;
      table.job_id = "interleave";
      table.addresses = {"127.0.0.1"};
      std::vector<Listener> listeners;
      for (int r = 0; r < 2; ++r) {
        Result<Listener> l = Listen("127.0.0.1");
        REQUIRE(l.ok());
        REQUIRE(l->local.valid());  // else shm=true would quietly test TCP
        table.address_of_rank.push_back(0);
        table.port_of_rank.push_back(l->port);
        listeners.push_back(std::move(l.value()));
      }
      std::vector<std::unique_ptr<Transport>> ts;
      for (int r = 0; r < 2; ++r) {
        Result<std::unique_ptr<Transport>> t =
            MakeSocketTransport(r, table, std::move(listeners[r]), topts);
        REQUIRE(t.ok());
        ts.push_back(std::move(t.value()));
      }
      auto fill = [](int from, size_t i, size_t n) {
        std::vector<char> v(n);
        for (size_t k = 0; k < n; ++k) v[k] = static_cast<char>(from * 31 + i * 7 + k % 251);
        return v;
      };
      Failures failures;
      std::vector<std::thread> threads;
      for (int r = 0; r < 2; ++r) {
        threads.emplace_back([&, r] {
          std::vector<std::vector<char>> out, in;
          std::vector<Op> ops;
          for (size_t i = 0; i < sizes.size(); ++i) {
            out.push_back(fill(r, i, sizes[i]));
            in.emplace_back(sizes[i]);
          }
          for (size_t i = 0; i < sizes.size(); ++i) {
            ops.push_back(Op::Send(1 - r, out[i].data(), sizes[i]));
            ops.push_back(Op::Recv(1 - r, in[i].data(), sizes[i]));
          }
          Status st = ts[r]->Run(ops, DeadlineAfter(20000));
          if (!st.ok()) return failures.Add(r, st.ToString());
          for (size_t i = 0; i < sizes.size(); ++i) {
            if (in[i] != fill(1 - r, i, sizes[i])) {
              return failures.Add(r, "message " + std::to_string(i) + " corrupted or reordered");
            }
          }
        });
      }
      for (auto& t : threads) t.join();
      INFO(failures.Joined());
      CHECK(failures.list().empty());
    }
  }
}

TEST_CASE("transport: a rank asleep between rounds joins a round whose relay is silent",
          "[transport][shm][dead-peer]") {
  // At n = 3 a negotiation exchange that rank 2 starts reaches rank 0 only through rank 1
  // (rank 2 sends to rank 1 first, and to rank 0 once it has heard from rank 0). With rank 1
  // stopped, rank 0 would sleep until its own timeout and blame rank 2; asked to join
  // (Op::round), it wakes, and its wait in the exchange names rank 1.
  std::vector<std::unique_ptr<Transport>> ts;
  REQUIRE(MakeThreadTransports(Options(3, Mode::kShm), &ts).empty());
  // An exchange of rank r in a ring (it sends to r - 1 and receives from r + 1). Every rank's
  // exchange 1 connects every pair.
  auto exchange = [&](int r, uint64_t round) {
    char out[8] = {}, in[8] = {};
    std::vector<Op> ops{Op::Send((r + 2) % 3, out, sizeof(out)),
                        Op::Recv((r + 1) % 3, in, sizeof(in))};
    ops.back().round = round;
    return ts[r]->Run(ops, DeadlineAfter(20000));
  };
  Failures failures;
  auto first_exchange = [&] {
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r) {
      threads.emplace_back([&, r] {
        if (Status st = exchange(r, 1); !st.ok()) failures.Add(r, st.ToString());
      });
    }
    for (auto& t : threads) t.join();
  };
  first_exchange();
  REQUIRE(failures.list().empty());
  UniqueFd doorbell(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  REQUIRE(doorbell.valid());
  // A request for an exchange that rank 0 has run already is stale: it does not wake it.
  std::thread stale([&] {
    char head[8] = {};
    std::vector<Op> ops{Op::Recv(0, head, sizeof(head))};
    ops[0].round = 1;
    Status st = ts[2]->Run(ops, DeadlineAfter(600));  // times out, and breaks rank 2's
    if (st.code() != Code::kTimeout) failures.Add(2, "stale request: " + st.ToString());
  });
  bool input = true;
  CHECK(ts[0]->WaitForInput(doorbell.get(), DeadlineAfter(300), &input).ok());
  CHECK_FALSE(input);
  stale.join();
  REQUIRE(failures.list().empty());
  // Exchange 2, on fresh transports: rank 2 starts it (its send to rank 1 completes; rank 1,
  // "stopped", reads nothing) and waits for rank 0, which sleeps.
  ts.clear();
  REQUIRE(MakeThreadTransports(Options(3, Mode::kShm), &ts).empty());
  first_exchange();
  REQUIRE(failures.list().empty());
  std::thread starter([&] {
    if (Status st = exchange(2, 2); !st.ok()) failures.Add(2, st.ToString());
  });
  input = false;
  // Without the request it would sleep until this deadline (before rank 2's, whose failure
  // would close its connections), with no input.
  CHECK(ts[0]->WaitForInput(doorbell.get(), DeadlineAfter(10000), &input).ok());
  CHECK(input);
  // Rank 0 joins: its part reaches rank 2, and it waits for rank 1 in turn.
  std::thread joiner([&] {
    if (Status st = exchange(0, 2); !st.ok()) failures.Add(0, st.ToString());
  });
  Status st = exchange(1, 2);  // rank 1 resumes
  joiner.join();
  starter.join();
  INFO(failures.Joined());
  CHECK(st.ok());
  CHECK(failures.list().empty());
}

}  // namespace ringrun::runtime::testing
