// Ranks as threads over real loopback sockets (and real shared memory), as in Gloo's tests.
// Catch2 is not thread-safe, so rank bodies report failures as strings that the test thread
// checks after joining them.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/src/runtime.h"
#include "runtime/src/transport/transport.h"

namespace ringrun::runtime::testing {

inline constexpr char kThreadJobSecret[] = "thread-job-secret-0123456789abcdef";

struct ThreadJobOptions {
  int np = 2;
  // Address of each rank's host; ranks sharing an address share a "host". 127.0.0.0/8 all
  // works on loopback, so {"127.0.0.1","127.0.0.1","127.0.0.2","127.0.0.2"} is two hosts.
  std::vector<std::string> hosts;
  transport::TransportOptions transport;
  int timeout_ms = 20000;
  // Ranks whose local (Unix) listener is closed before the job starts: same-host peers must
  // reach them over TCP instead of shared memory.
  std::vector<int> without_local_listener;
};

// Collects failures from rank threads.
class Failures {
 public:
  void Add(int rank, const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    if (list_.size() < 20) list_.push_back("rank " + std::to_string(rank) + ": " + what);
  }
  std::vector<std::string> list() const {
    std::lock_guard<std::mutex> lock(mu_);
    return list_;
  }
  std::string Joined() const {
    std::string s;
    for (const auto& f : list()) s += f + "\n";
    return s;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> list_;
};

// Builds np transports over one peer table. Returns an error string on setup failure.
inline std::string MakeThreadTransports(const ThreadJobOptions& o,
                                        std::vector<std::unique_ptr<transport::Transport>>* out) {
  transport::PeerTable table;
  table.job_id = "thread-job";
  std::vector<transport::Listener> listeners;
  for (int r = 0; r < o.np; ++r) {
    const std::string host = o.hosts.empty() ? "127.0.0.1" : o.hosts[r];
    Result<transport::Listener> l = transport::Listen(host);
    if (!l.ok()) return l.status().ToString();
    if (o.transport.use_shm && !l->local.valid()) {
      return "rank " + std::to_string(r) + ": no local listener (shared memory needs one)";
    }
    for (int without : o.without_local_listener) {
      if (without == r) l->local.Reset();
    }
    uint32_t index = 0;
    while (index < table.addresses.size() && table.addresses[index] != host) ++index;
    if (index == table.addresses.size()) table.addresses.push_back(host);
    table.address_of_rank.push_back(index);
    table.port_of_rank.push_back(l->port);
    listeners.push_back(std::move(l.value()));
  }
  transport::TransportOptions topts = o.transport;
  if (topts.secret.empty()) topts.secret = kThreadJobSecret;
  for (int r = 0; r < o.np; ++r) {
    Result<std::unique_ptr<transport::Transport>> t =
        transport::MakeSocketTransport(r, table, std::move(listeners[r]), topts);
    if (!t.ok()) return t.status().ToString();
    out->push_back(std::move(t.value()));
  }
  return "";
}

// Builds np runtimes (each with its engine) over one peer table.
inline std::string MakeThreadJob(const ThreadJobOptions& o,
                                 std::vector<std::unique_ptr<Runtime>>* out,
                                 const EngineSettings& settings = {}) {
  std::vector<std::unique_ptr<transport::Transport>> transports;
  std::string err = MakeThreadTransports(o, &transports);
  if (!err.empty()) return err;
  EngineSettings with_sets = settings;  // process sets connect as the job does
  if (!with_sets.set_transport) {
    with_sets.set_transport = o.transport;
    if (with_sets.set_transport->secret.empty()) with_sets.set_transport->secret = kThreadJobSecret;
  }
  for (int r = 0; r < o.np; ++r) {
    Shape shape;
    shape.rank = r, shape.size = o.np, shape.local_rank = -1, shape.cross_rank = -1;
    out->push_back(
        std::make_unique<Runtime>(std::move(transports[r]), shape, o.timeout_ms, with_sets));
  }
  return "";
}

// Runs body(rank, runtime) on np threads and returns the failures.
inline std::string RunThreadJob(const ThreadJobOptions& o,
                                const std::function<void(int, Runtime&, Failures&)>& body,
                                const EngineSettings& settings = {}) {
  std::vector<std::unique_ptr<Runtime>> runtimes;
  std::string err = MakeThreadJob(o, &runtimes, settings);
  if (!err.empty()) return "setup: " + err;
  Failures failures;
  std::vector<std::thread> threads;
  for (int r = 0; r < o.np; ++r) {
    threads.emplace_back([&, r] { body(r, *runtimes[r], failures); });
  }
  for (auto& t : threads) t.join();
  return failures.Joined();
}

}  // namespace ringrun::runtime::testing
