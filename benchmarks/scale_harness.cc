// Negotiation at n ranks on one machine: n real engines as threads in one process.
//
//   scale_harness [--transport socket|memory] [--ranks 2,8,64,...] [--tensors K] [--steps S]
//                 [--count C] [--hosts H]
//
// socket: the real transport over loopback TCP (each rank a listener; pairs connected lazily, as
// in a job). memory: an in-process transport that moves the same bytes through per-pair queues
// and counts them the same way; the engines, their frames and every message are real, only the
// wire is not. Ranks are spread over H "hosts" (addresses 127.0.0.1 to 127.0.0.H, n/H ranks each,
// in rank order), which the hierarchical allreduce sees. Per n: every rank submits K named
// allreduces of C floats (default 1) in its own random order (a cold negotiation: every name
// new), then S warm steps of the same K names in order (every name cached). Printed per n, one
// line:
//   msgs/round, bytes/round   negotiation's messages and bytes per rank per warm round
//                             (Engine::negotiation_counters; the allreduces' own are apart)
//   rounds/step               warm rounds per step (1 when every rank's step is one round)
//   cold_rounds               rounds the cold negotiation took (the most over ranks)
//   conns max/mean            connections per rank at the end (data plane included)
//   setup_s, cold_ms, step_ms the engines' start (their hello), the cold negotiation, a warm step
// The time is that of n ranks sharing this machine's CPUs, not of n hosts.
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ringrun/common/fd.h"
#include "runtime/src/engine/engine.h"
#include "runtime/src/engine/handles.h"
#include "runtime/src/transport/transport.h"

namespace {

using namespace ringrun;
using namespace ringrun::runtime;

constexpr char kSecret[] = "scale-harness-secret-0123456789abcdef";

// The memory transport's shared state: one inbox per rank, a byte stream per sender.
struct Hub {
  struct Inbox {
    std::mutex mu;
    std::condition_variable cv;
    // By sender: the bytes not received yet, from .second on (a few senders per rank).
    std::map<int, std::pair<std::string, size_t>> from;
    UniqueFd bell;  // an eventfd rung on every arrival (WaitForInput)
  };
  explicit Hub(int n) {
    for (int r = 0; r < n; ++r) {
      inbox.push_back(std::make_unique<Inbox>());
      inbox.back()->bell.Reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    }
  }
  std::vector<std::unique_ptr<Inbox>> inbox;
};

// Sends complete at once (unbounded queues); receives wait for their bytes. Counts as the
// socket transport does; a "connection" is a peer this rank has exchanged a message with.
class MemTransport final : public transport::Transport {
 public:
  MemTransport(int rank, transport::PeerTable peers, std::shared_ptr<Hub> hub)
      : rank_(rank), peers_(std::move(peers)), hub_(std::move(hub)) {}
  int rank() const override { return rank_; }
  int size() const override { return peers_.size(); }
  const transport::PeerTable& peers() const override { return peers_; }
  using Transport::Run;
  Status Run(std::vector<transport::Op>& ops, Deadline deadline, int) override {
    if (!broken_.ok()) return broken_;
    uint64_t sends = 0, sent = 0;
    for (transport::Op& op : ops) {
      Touch(op.peer);
      if (op.kind != transport::Op::kSend) continue;
      ++sends, sent += op.bytes;
      Hub::Inbox& box = *hub_->inbox[op.peer];
      {
        std::lock_guard<std::mutex> lock(box.mu);
        box.from[rank_].first.append(static_cast<const char*>(op.buf), op.bytes);
      }
      box.cv.notify_all();
      const uint64_t one = 1;
      (void)!::write(box.bell.get(), &one, sizeof(one));
    }
    messages_.store(messages_.load() + sends), bytes_.store(bytes_.load() + sent);
    Hub::Inbox& mine = *hub_->inbox[rank_];
    for (transport::Op& op : ops) {
      if (op.kind == transport::Op::kSend) continue;
      std::unique_lock<std::mutex> lock(mine.mu);
      std::string& q = mine.from[op.peer].first;
      size_t& at = mine.from[op.peer].second;
      if (!mine.cv.wait_until(lock, deadline, [&] { return q.size() - at >= op.bytes; })) {
        broken_ = Timeout("rank " + std::to_string(rank_) + ": timed out receiving from rank " +
                          std::to_string(op.peer));
        return broken_;
      }
      const char* in = q.data() + at;
      if (op.kind == transport::Op::kRecv) {
        std::memcpy(op.buf, in, op.bytes);
      } else {
        const size_t count = op.bytes / op.elem_size;
        const char* own = static_cast<const char*>(op.src);
        op.reduce(op.buf, op.incoming_first ? in : own, op.incoming_first ? own : in, count);
        if (op.finish) op.finish->Apply(op.buf, count);
      }
      at += op.bytes;
      if (at == q.size()) q.clear(), at = 0;
    }
    return Status::Ok();
  }
  Status WaitForInput(int doorbell, Deadline deadline, bool* peer_input, Mutex* asleep) override {
    Hub::Inbox& mine = *hub_->inbox[rank_];
    uint64_t drained;
    (void)!::read(mine.bell.get(), &drained, sizeof(drained));
    *peer_input = HasInput();
    if (*peer_input) return Status::Ok();
    pollfd fds[2] = {{doorbell, POLLIN, 0}, {mine.bell.get(), POLLIN, 0}};
    int ms = -1;
    if (deadline != Deadline::max()) {
      ms = static_cast<int>(std::max<int64_t>(
          0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                   std::chrono::steady_clock::now())
                     .count() +
                 1));
    }
    if (asleep) asleep->Unlock();
    (void)::poll(fds, 2, ms);
    if (asleep) asleep->Lock();
    *peer_input = HasInput();
    return broken_;
  }
  Status status() const override { return broken_; }
  void Break(const Status& st) override {
    if (broken_.ok()) broken_ = st;
  }
  transport::Counters counters() const override {
    transport::Counters c;
    c.messages_sent = messages_.load(), c.bytes_sent = bytes_.load();
    c.connections = c.connections_made = connections_.load();
    return c;
  }

 private:
  bool HasInput() {
    Hub::Inbox& mine = *hub_->inbox[rank_];
    std::lock_guard<std::mutex> lock(mine.mu);
    for (const auto& [peer, q] : mine.from) {
      if (q.first.size() > q.second) return true;
    }
    return false;
  }
  void Touch(int peer) {
    if (touched_.insert(peer).second) connections_.store(static_cast<int>(touched_.size()));
  }
  const int rank_;
  const transport::PeerTable peers_;
  std::shared_ptr<Hub> hub_;
  Status broken_;
  std::set<int> touched_;
  std::atomic<uint64_t> messages_{0}, bytes_{0};
  std::atomic<int> connections_{0};
};

struct Row {
  int n = 0;
  double msgs = 0, bytes = 0, rounds_per_step = 0;
  uint64_t cold_rounds = 0;
  int conns_max = 0;
  double conns_mean = 0;
  double setup_s = 0, cold_ms = 0, step_ms = 0;
  std::string error;
};

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Row RunN(int n, bool memory, int tensors, int steps, size_t count, int hosts) {
  Row row;
  row.n = n;
  transport::PeerTable table;
  table.job_id = "scale-harness";
  hosts = std::max(1, std::min(hosts, n));
  for (int h = 0; h < hosts; ++h) table.addresses.push_back("127.0.0." + std::to_string(h + 1));
  auto host_of = [&](int r) { return static_cast<uint32_t>(r / ((n + hosts - 1) / hosts)); };
  std::vector<std::unique_ptr<transport::Transport>> transports;
  const auto t_setup = std::chrono::steady_clock::now();
  if (memory) {
    for (int r = 0; r < n; ++r) {
      table.address_of_rank.push_back(host_of(r));
      table.port_of_rank.push_back(static_cast<uint32_t>(1 + r));
    }
    auto hub = std::make_shared<Hub>(n);
    for (int r = 0; r < n; ++r) transports.push_back(std::make_unique<MemTransport>(r, table, hub));
  } else {
    // Each rank: two listeners and an eventfd, and one socket per connection (both ends are in
    // this process). Past the open-file limit a connect fails only at the collective timeout.
    int steps = 0;
    while ((1 << steps) < n) ++steps;
    rlimit fds{};
    const uint64_t need = uint64_t(n) * (3 + 2 * steps) + 64;
    if (::getrlimit(RLIMIT_NOFILE, &fds) == 0 && fds.rlim_cur < need) {
      row.error = "needs about " + std::to_string(need) + " open files, the limit is " +
                  std::to_string(fds.rlim_cur) + " (use --transport memory)";
      return row;
    }
    std::vector<transport::Listener> listeners;
    for (int r = 0; r < n; ++r) {
      Result<transport::Listener> l = transport::Listen(table.addresses[host_of(r)]);
      if (!l.ok()) return row.error = l.status().ToString(), row;
      table.address_of_rank.push_back(host_of(r));
      table.port_of_rank.push_back(l->port);
      listeners.push_back(std::move(l.value()));
    }
    transport::TransportOptions o;
    o.use_shm = false, o.spin = false, o.secret = kSecret;
    for (int r = 0; r < n; ++r) {
      auto t = transport::MakeSocketTransport(r, table, std::move(listeners[r]), o);
      if (!t.ok()) return row.error = t.status().ToString(), row;
      transports.push_back(std::move(t.value()));
    }
  }
  std::vector<std::unique_ptr<engine::Engine>> engines;
  for (int r = 0; r < n; ++r) {
    engine::EngineOptions eo;
    eo.rank = r, eo.size = n, eo.local_rank = r;
    eo.timeout_ms = 600000;
    eo.fusion_threshold = 1 << 16;
    eo.hierarchical = hosts > 1;
    eo.stall.enabled = false;
    eo.log = [](const std::string&) {};
    engines.push_back(std::make_unique<engine::Engine>(std::move(transports[r]), eo));
  }
  // The hello ends when every rank's first exchange is done.
  for (auto& e : engines) {
    while (e->negotiation_counters().rounds == 0 && e->failure().ok()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  row.setup_s = Since(t_setup);

  std::vector<float> values(static_cast<size_t>(n) * tensors * count, 1.0f);
  std::atomic<int> bad{0};
  auto step = [&](int r, bool shuffled) {
    std::vector<int> order(tensors);
    for (int t = 0; t < tensors; ++t) order[t] = t;
    if (shuffled) std::shuffle(order.begin(), order.end(), std::mt19937(r));
    std::vector<engine::HandleState*> hs(tensors, nullptr);
    for (int t : order) {
      engine::TensorArgs a;
      a.count = count;
      a.send = a.recv = &values[(static_cast<size_t>(r) * tensors + t) * count];
      Status st = engines[r]->Submit("g." + std::to_string(t), &a, 1, false, &hs[t]);
      if (!st.ok()) ++bad;
    }
    for (engine::HandleState* h : hs) {
      if (!h) continue;
      if (engine::WaitHandle(*h, 600000) != Code::kOk) ++bad;
      engine::ReleaseHandle(h);
    }
  };
  auto all_ranks = [&](const std::function<void(int)>& body) {
    std::vector<std::thread> threads;
    threads.reserve(n);
    for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
    for (auto& t : threads) t.join();
  };
  std::vector<engine::Engine::NegotiationCounters> c0(n), c1(n), c2(n);
  for (int r = 0; r < n; ++r) c0[r] = engines[r]->negotiation_counters();
  const auto t_cold = std::chrono::steady_clock::now();
  all_ranks([&](int r) { step(r, true); });
  row.cold_ms = Since(t_cold) * 1e3;
  for (int r = 0; r < n; ++r) c1[r] = engines[r]->negotiation_counters();
  const auto t_warm = std::chrono::steady_clock::now();
  all_ranks([&](int r) {
    for (int s = 0; s < steps; ++s) step(r, false);
  });
  row.step_ms = Since(t_warm) * 1e3 / steps;
  double rounds = 0, msgs = 0, bytes = 0;
  for (int r = 0; r < n; ++r) {
    c2[r] = engines[r]->negotiation_counters();
    row.cold_rounds = std::max(row.cold_rounds, c1[r].rounds - c0[r].rounds);
    rounds += static_cast<double>(c2[r].rounds - c1[r].rounds);
    msgs += static_cast<double>(c2[r].messages_sent - c1[r].messages_sent);
    bytes += static_cast<double>(c2[r].bytes_sent - c1[r].bytes_sent);
    const int conns = engines[r]->transport_counters().connections;
    row.conns_max = std::max(row.conns_max, conns);
    row.conns_mean += conns / static_cast<double>(n);
  }
  row.msgs = msgs / rounds, row.bytes = bytes / rounds;
  row.rounds_per_step = rounds / n / steps;
  if (bad > 0) row.error = std::to_string(bad.load()) + " collectives failed";
  for (auto& e : engines) e->Shutdown();
  return row;
}

std::vector<int> ParseList(const char* s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::atoi(item.c_str()));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  bool memory = false;
  std::vector<int> ranks{2, 8, 64, 256};
  int tensors = 8, steps = 20, hosts = 1;
  size_t count = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--transport") {
      memory = std::strcmp(argv[i + 1], "memory") == 0;
    } else if (k == "--ranks") {
      ranks = ParseList(argv[i + 1]);
    } else if (k == "--tensors") {
      tensors = std::atoi(argv[i + 1]);
    } else if (k == "--steps") {
      steps = std::atoi(argv[i + 1]);
    } else if (k == "--count") {
      count = static_cast<size_t>(std::atoll(argv[i + 1]));
    } else if (k == "--hosts") {
      hosts = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--transport socket|memory] [--ranks 2,8,...] "
                   "[--tensors K] [--steps S] [--count C] [--hosts H]\n",
                   argv[0]);
      return 2;
    }
  }
  rlimit fds{};
  if (::getrlimit(RLIMIT_NOFILE, &fds) == 0) {
    fds.rlim_cur = fds.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &fds);
  }
  std::printf("transport=%s tensors=%d count=%zu hosts=%d steps=%d cpus=%u\n",
              memory ? "memory" : "socket", tensors, count, hosts, steps,
              std::thread::hardware_concurrency());
  std::printf("%6s %10s %11s %11s %11s %10s %10s %9s %10s %9s\n", "n", "msgs/round", "bytes/round",
              "rounds/step", "cold_rounds", "conns_max", "conns_mean", "setup_s", "cold_ms",
              "step_ms");
  int rc = 0;
  for (int n : ranks) {
    Row row = RunN(n, memory, tensors, steps, count, hosts);
    if (!row.error.empty()) {
      std::printf("%6d error: %s\n", n, row.error.c_str());
      rc = 1;
      continue;
    }
    std::printf("%6d %10.2f %11.0f %11.2f %11llu %10d %10.1f %9.2f %10.1f %9.2f\n", n, row.msgs,
                row.bytes, row.rounds_per_step, static_cast<unsigned long long>(row.cold_rounds),
                row.conns_max, row.conns_mean, row.setup_s, row.cold_ms, row.step_ms);
    std::fflush(stdout);
  }
  return rc;
}
