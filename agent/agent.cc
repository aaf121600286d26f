#include "agent/agent.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>

#include "agent/agent_loop.h"
#include "agent/cpu_binding.h"
#include "agent/launcher_link.h"
#include "ringrun/common/interfaces.h"
#include "ringrun/common/log.h"
#include "ringrun/common/version.h"

namespace ringrun::agent {
namespace {

constexpr int kCloseTimeoutMs = 5000;  // handing the last events over, then the launcher's close

// Binds port (0: any) on every IPv4 address without SO_REUSEADDR and lets it go; returns the
// port that was bound, or 0.
int ProbePort(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(a);
  int bound = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    bound = ntohs(a.sin_port);
  }
  ::close(fd);
  return bound;
}

// MASTER_PORT for rank 0's host: free now, and bound by the ranks only seconds later (torch's
// TCPStore, once torch is imported). A port that bind(0) hands out is an ephemeral one, which
// the kernel may give to any outgoing connection on the host meanwhile (parallel jobs made
// that happen: "Address already in use" in TCPStore). So the port is drawn below the
// ephemeral range (ip_local_port_range), from 10000 up, where only an explicit bind can take
// it; bind(0) is the fallback.
int FindFreePort() {
  int low = 32768, high = 60999;
  if (std::FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &low, &high) != 2) low = 32768;
    std::fclose(f);
  }
  constexpr int kFirst = 10000;
  if (low > kFirst + 1000) {
    std::mt19937 rng(
        static_cast<uint32_t>(::getpid()) ^
        static_cast<uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
    std::uniform_int_distribution<int> pick(kFirst, low - 1);
    for (int i = 0; i < 64; ++i) {
      if (int port = ProbePort(pick(rng))) return port;
    }
  }
  return ProbePort(0);
}

std::string HostName() {
  char host[256] = "";
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

// Waits for the next thing the loop must see (a signal, a command, stdin, ranks' output) until
// its deadline, and hands it over. Returns false when poll() itself failed.
bool WaitAndDispatch(AgentLoop& loop, int sigfd, int wake_fd, int* stdin_fd, const Clock& clock) {
  std::vector<pollfd> pfds = {{sigfd, POLLIN, 0}, {wake_fd, POLLIN, 0}, {*stdin_fd, POLLIN, 0}};
  std::vector<AgentLoop::Watch> watches = loop.watches();
  for (const auto& w : watches) pfds.push_back({w.fd, POLLIN, 0});
  auto wait =
      std::chrono::duration_cast<std::chrono::milliseconds>(loop.next_deadline() - clock.Now());
  int n = ::poll(pfds.data(), pfds.size(), static_cast<int>(std::max<int64_t>(0, wait.count())));
  if (n < 0 && errno != EINTR) {
    spdlog::error("poll: {}", std::strerror(errno));
    return false;
  }
  if (pfds[0].revents & POLLIN) {
    signalfd_siginfo si;
    while (::read(sigfd, &si, sizeof(si)) == sizeof(si)) {
      // SIGUSR1/SIGUSR2 are passed on to the ranks (how Slurm's --signal reaches them).
      if (si.ssi_signo == SIGUSR1 || si.ssi_signo == SIGUSR2) {
        loop.ForwardSignal(static_cast<int>(si.ssi_signo));
      } else if (si.ssi_signo != SIGCHLD) {
        loop.OnSignal(static_cast<int>(si.ssi_signo));
      }
    }
  }
  if (pfds[1].revents & POLLIN) {
    uint64_t v;
    (void)!::read(wake_fd, &v, sizeof(v));
  }
  if (pfds[2].revents & (POLLIN | POLLHUP | POLLERR)) {
    char buf[256];
    ssize_t r = ::read(*stdin_fd, buf, sizeof(buf));
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
      *stdin_fd = -1;
      loop.OnStdinClosed();
    }
  }
  for (size_t i = 0; i < watches.size(); ++i) {
    if (pfds[i + 3].revents & (POLLIN | POLLHUP | POLLERR)) {
      loop.OnPipeReadable(watches[i].rank, watches[i].stream);
    }
  }
  return true;
}

}  // namespace

int RunAgent(const AgentConfig& config, Spawner& spawner) {
  // Signals arrive through a signalfd; the ranks get default dispositions back at exec.
  sigset_t sigs;
  sigemptyset(&sigs);
  // SIGUSR1/SIGUSR2 are passed on to the ranks (Slurm's --signal reaches the agents' step).
  for (int s : {SIGCHLD, SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2}) sigaddset(&sigs, s);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  UniqueFd sigfd(::signalfd(-1, &sigs, SFD_CLOEXEC | SFD_NONBLOCK));
  ::signal(SIGPIPE, SIG_IGN);
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);

  const Clock& clock = SteadyClock();
  const std::string host = HostName();
  std::unique_ptr<LauncherLink> link =
      MakeGrpcLauncherLink(config.launcher_target, config.secret, clock);

  v1::RegisterRequest req;
  req.set_host_index(config.host_index);
  req.set_hostname(host);
  req.set_agent_pid(::getpid());
  req.set_version(RINGRUN_VERSION_STRING);
  req.set_free_port(FindFreePort());
  req.set_service_target(config.launcher_target);
  if (Result<std::vector<NetInterface>> nics = ListInterfaces(); nics.ok()) {
    for (const NetInterface& n : *nics) {
      auto* i = req.add_interfaces();
      i->set_name(n.name);
      i->set_address(n.address);
    }
  } else {
    spdlog::warn("{}: {}", host, nics.status().message());  // --network-interfaces will say more
  }
  Result<v1::RegisterReply> reply = link->Register(req, config.register_timeout_ms);
  if (!reply.ok()) {
    // kAborted: the job was torn down before this host's turn; the launcher says why.
    auto level =
        reply.status().code() == Code::kAborted ? spdlog::level::debug : spdlog::level::err;
    spdlog::log(level, "{}: registering with the job service at {}: {}", host,
                config.launcher_target, reply.status().message());
    return 1;
  }
  spdlog::debug("registered: {} ranks", reply->ranks_size());
  if (Status st = link->OpenSession(config.host_index); !st.ok()) {
    spdlog::error("{}: opening the session with {}: {}", host, config.launcher_target,
                  st.message());
    return 1;
  }

  AgentLoop loop(host, spawner, *link, clock);
  loop.Start(reply.value(), AllowedCpus());
  int stdin_fd = config.stdin_fd;
  while (loop.Step()) {
    if (!WaitAndDispatch(loop, sigfd.get(), link->wake_fd(), &stdin_fd, clock)) {
      loop.Terminate(0, "poll failed");
    }
  }
  spdlog::debug("every rank reported");
  // Every rank is reported: hand the rest to the launcher, then wait for it to close.
  link->Close(loop.lost(), kCloseTimeoutMs);
  return loop.exit_code();
}

}  // namespace ringrun::agent
