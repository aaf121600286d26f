// join_bench: how long N simulated ranks take to join one real Rendezvous behind a real gRPC
// server, each getting the whole N-entry peer table back.
//
//   join_bench [N ...]        (default: 1000 8000)
//
// Ranks are callback-API client calls spread over P client processes (P = 4) sharing a few
// channels (64 calls each), against a server in this process (the launcher's own JobService: a raw
// callback Join that checks the secret and forwards to Rendezvous::Join, served by StartJobServer).
// The time runs from "go" until the last rank has its reply. Compare with the peer programs'
// `run.sh join 1024` (torch's TCPStore; benchmarks/README.md).
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "launcher/service/job_server.h"
#include "launcher/service/job_service.h"
#include "launcher/service/rendezvous.h"
#include "ringrun/common/auth.h"
#include "ringrun/common/peer_table.h"
#include "ringrun/common/thread_annotations.h"
#include "ringrun/job.grpc.pb.h"

namespace {

constexpr char kSecret[] = "join-bench-secret";
constexpr int kProcesses = 4;
// Calls per channel stay under gRPC's default of 100 concurrent streams per connection (held
// calls above it would queue behind the barrier they wait for). Real ranks each have their own.
constexpr int kCallsPerChannel = 64;

// One client process: ranks [first, last) as concurrent callback calls. Exit 0 when every
// reply is OK and holds the whole table.
int RunClients(int port, int n, int first, int last) {
  std::vector<std::unique_ptr<ringrun::v1::JobService::Stub>> stubs;
  const int channels = (last - first + kCallsPerChannel - 1) / kCallsPerChannel;
  for (int c = 0; c < channels; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.channel_id", c);  // distinct channels, not one shared subchannel
    args.SetMaxReceiveMessageSize(-1);
    stubs.push_back(ringrun::v1::JobService::NewStub(grpc::CreateCustomChannel(
        "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials(), args)));
  }
  struct Call {
    grpc::ClientContext ctx;
    ringrun::v1::JoinRequest req;
    ringrun::v1::JoinReply reply;
  };
  std::vector<std::unique_ptr<Call>> calls;
  calls.reserve(last - first);
  // The calls' outcomes, counted on gRPC's callback threads.
  struct Tally {
    ringrun::Mutex mu;
    ringrun::CondVar all_done;
    int done GUARDED_BY(mu) = 0;
    int bad GUARDED_BY(mu) = 0;
  } tally;
  for (int r = first; r < last; ++r) {
    auto call = std::make_unique<Call>();
    ringrun::AttachSecret(&call->ctx, kSecret);
    call->ctx.set_deadline(ringrun::DeadlineAfterMs(60000));
    call->ctx.set_wait_for_ready(true);  // as the runtime does: retry a failed connect
    call->req.set_rank(r);
    call->req.set_size(n);
    call->req.set_address("10.0." + std::to_string(r / 8 / 256 % 256) + "." +
                          std::to_string(r / 8 % 256));  // 8 ranks per "host"
    call->req.set_port(20000 + r % 8);
    Call* c = call.get();
    stubs[(r - first) % channels]->async()->Join(
        &c->ctx, &c->req, &c->reply, [&, c, n, first, last](grpc::Status s) {
          // Each simulated rank decodes its own table (outside the shared lock: real ranks share
          // nothing), then lets it go: a real rank holds one table, not this process's 2,000.
          if (s.ok() && !ringrun::UnpackPeerColumns(&c->reply).ok()) s = grpc::Status::CANCELLED;
          const bool good = s.ok() && c->reply.port_of_rank_size() == n;
          c->reply = ringrun::v1::JoinReply();
          ringrun::MutexLock lock(&tally.mu);
          if (!good) {
            if (tally.bad++ == 0) {
              std::fprintf(stderr, "join_bench: %s\n", s.error_message().c_str());
            }
          }
          if (++tally.done == last - first) tally.all_done.SignalAll();
        });
    calls.push_back(std::move(call));
  }
  ringrun::MutexLock lock(&tally.mu);
  while (tally.done != last - first) tally.all_done.Wait(&tally.mu);
  return tally.bad == 0 ? 0 : 1;
}

double Bench(int n) {
  // Clients fork first (no gRPC state yet), then wait for the port on a pipe.
  std::vector<int> go(kProcesses);
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcesses; ++p) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
      close(fds[1]);
      int port = 0;
      if (read(fds[0], &port, sizeof(port)) != sizeof(port)) _exit(2);
      _exit(RunClients(port, n, n * p / kProcesses, n * (p + 1) / kProcesses));
    }
    close(fds[0]);
    go[p] = fds[1];
    pids.push_back(pid);
  }
  ringrun::launcher::service::Rendezvous rendezvous(n, "join-bench");
  // The launcher's own job service (Join only: no agents here).
  ringrun::launcher::service::JobService service(kSecret, nullptr, &rendezvous, 1000, 10000);
  auto started = ringrun::launcher::service::StartJobServer("127.0.0.1:0", service);
  if (!started.ok()) return -1;
  const int port = started->port;
  std::unique_ptr<grpc::Server> server = std::move(started->server);
  const auto t0 = std::chrono::steady_clock::now();
  for (int fd : go) {
    if (write(fd, &port, sizeof(port)) != sizeof(port)) return -1;
    close(fd);
  }
  bool ok = true;
  for (pid_t pid : pids) {
    int st = 0;
    waitpid(pid, &st, 0);
    ok = ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return ok ? s : -1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(std::atoi(argv[i]));
  if (sizes.empty()) sizes = {1000, 8000};
  int rc = 0;
  for (int n : sizes) {
    // Each size in a fresh process: gRPC must not be initialized where Bench forks clients.
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return 1;
    pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      const double t = Bench(n);
      if (write(fds[1], &t, sizeof(t)) != sizeof(t)) _exit(1);
      _exit(0);
    }
    close(fds[1]);
    double s = -1;
    if (read(fds[0], &s, sizeof(s)) != sizeof(s)) s = -1;
    close(fds[0]);
    waitpid(pid, nullptr, 0);
    if (s < 0) {
      std::printf("join_bench ranks=%d FAILED\n", n);
      rc = 1;
    } else {
      std::printf("join_bench ranks=%d processes=%d join_s=%.3f\n", n, kProcesses, s);
    }
    std::fflush(stdout);
  }
  return rc;
}
