// The SSH agent starter against a fake connector, the quoting through a real /bin/sh, and the
// libssh connector's failure classification against loopback sockets.
#include "launcher/starters/ssh_agent_starter.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>
#include <vector>

#include "ringrun/common/fd.h"
#include "tests/ssh_unit/fake_ssh.h"

extern char** environ;

namespace ringrun::launcher::starters {
namespace {

using testing::FakeConnector;
using testing::FakeRemote;

// Runs /bin/sh -c `script` and returns its stdout.
std::string RunShell(const std::string& script) {
  Result<Pipe> p = MakePipe();
  REQUIRE(p.ok());
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, p->write.get(), 1);
  const char* argv[] = {"/bin/sh", "-c", script.c_str(), nullptr};
  pid_t pid;
  REQUIRE(posix_spawn(&pid, "/bin/sh", &fa, nullptr, const_cast<char**>(argv), environ) == 0);
  posix_spawn_file_actions_destroy(&fa);
  p->write.Reset();
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(p->read.get(), buf, sizeof(buf))) > 0) out.append(buf, n);
  int st;
  waitpid(pid, &st, 0);
  return out;
}

template <typename Pred>
bool WaitFor(Pred pred, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return pred();
}

AgentLaunch MakeLaunch() {
  AgentLaunch l;
  l.host_index = 3;
  l.service_port = 4242;
  l.secret = std::string(64, 'a');
  l.agent_path = "/opt/ring run/bin/ringrun-agent";
  l.log_level = "info";
  return l;
}

const std::vector<std::string> kNastyWords = {"plain",
                                              "with space",
                                              "it's",
                                              "\"dq\"",
                                              "$(touch /tmp/ringrun-pwned)",
                                              "`id`",
                                              "a;b",
                                              "x\ny",
                                              "tab\there",
                                              "ünïcødé ✓",
                                              "",
                                              "\\back\\slash",
                                              "$HOME",
                                              "*",
                                              "'",
                                              "''",
                                              "--",
                                              "-e"};

TEST_CASE("ShellQuote round-trips every byte through /bin/sh", "[ssh][unit]") {
  std::string script = "printf '%s\\0'";
  for (const auto& w : kNastyWords) script += " " + ShellQuote(w);
  std::string out = RunShell(script);
  std::vector<std::string> got;
  size_t start = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == '\0') {
      got.emplace_back(out, start, i - start);
      start = i + 1;
    }
  }
  CHECK(got == kNastyWords);
}

TEST_CASE("BuildAgentCommand runs the agent by its quoted path with the contract's flags",
          "[ssh][unit]") {
  char dir_tmpl[] = "/tmp/ringrun-ssh-unit-XXXXXX";
  REQUIRE(mkdtemp(dir_tmpl) != nullptr);
  std::string dir = dir_tmpl;
  std::string agent = dir + "/it's a $(dir)/ringrun-agent";
  REQUIRE(system(("mkdir -p " + ShellQuote(dir + "/it's a $(dir)")).c_str()) == 0);
  {
    std::ofstream f(agent);
    f << "#!/bin/sh\nfor a in \"$@\"; do printf '%s|' \"$a\"; done\n";
  }
  REQUIRE(system(("chmod +x " + ShellQuote(agent)).c_str()) == 0);

  AgentLaunch l = MakeLaunch();
  l.agent_path = agent;
  CHECK(RunShell(BuildAgentCommand(l, "198.18.0.1")) ==
        "--launcher|198.18.0.1:4242|--host-index|3|--log-level|info|");
  CHECK(RunShell(BuildAgentCommand(l, "fd00::1")) ==
        "--launcher|[fd00::1]:4242|--host-index|3|--log-level|info|");
  CHECK(BuildAgentCommand(l, "198.18.0.1").find(l.secret) == std::string::npos);

  SECTION("a missing agent exits 127 and prints nothing") {
    l.agent_path = dir + "/missing/ringrun-agent";
    std::string cmd = "(" + BuildAgentCommand(l, "198.18.0.1") + ") 2>&1; echo \"rc=$?\"";
    CHECK(RunShell(cmd) == "rc=127\n");
  }
  REQUIRE(system(("rm -rf " + ShellQuote(dir)).c_str()) == 0);
}

TEST_CASE("ClassifyConnectError maps libssh's texts", "[ssh][unit]") {
  CHECK(ClassifyConnectError("Failed to resolve hostname nohost (Name or service not known)") ==
        SshFailure::kResolution);
  CHECK(ClassifyConnectError("Connection refused") == SshFailure::kRefused);
  CHECK(ClassifyConnectError("Timeout connecting to 198.18.0.200") == SshFailure::kTimeout);
  CHECK(ClassifyConnectError("No route to host") == SshFailure::kUnreachable);
  CHECK(ClassifyConnectError("Socket error: Connection reset by peer") == SshFailure::kTransient);
  CHECK(ClassifyConnectError("Socket error: disconnected") == SshFailure::kTransient);
  CHECK(ClassifyConnectError("something else") == SshFailure::kOther);
  CHECK(IsTransient(SshFailure::kTransient));
  CHECK_FALSE(IsTransient(SshFailure::kRefused));
  CHECK(SshFailureCode(SshFailure::kHostKeyChanged) == Code::kPermissionDenied);
  CHECK(SshFailureCode(SshFailure::kTimeout) == Code::kTimeout);
}

TEST_CASE("Start sends the secret on stdin, relays output, reports the exit", "[ssh][unit]") {
  auto fake = std::make_shared<FakeConnector>();
  auto remote = fake->For("h1").remote;
  SshConfig cfg;
  auto starter = MakeSshAgentStarter(cfg, fake);
  AgentLaunch l = MakeLaunch();
  auto handle = starter->Start(hosts::HostSpec{"", "h1", 1}, l);
  REQUIRE(handle.ok());

  CHECK(remote->Get(&FakeRemote::stdin_data) == l.secret + "\n");
  std::string cmd = remote->Get(&FakeRemote::command);
  CHECK(cmd.find("'198.18.0.1:4242'") != std::string::npos);
  CHECK(cmd.find("exec '/opt/ring run/bin/ringrun-agent'") != std::string::npos);
  CHECK(cmd.find(l.secret) == std::string::npos);
  CHECK_FALSE((*handle)->Poll().has_value());

  remote->Emit("out line\n", "first\nsecond\npart");
  remote->Exit(3);
  REQUIRE(WaitFor([&] { return (*handle)->Poll().has_value(); }));
  CHECK(*(*handle)->Poll() == 3);
  std::string tail = (*handle)->StderrTail();
  CHECK(tail.find("first\nsecond") != std::string::npos);
  CHECK(tail.find("part") != std::string::npos);  // a partial last line is flushed
}

TEST_CASE("StderrTail keeps only the last lines", "[ssh][unit]") {
  auto fake = std::make_shared<FakeConnector>();
  auto remote = fake->For("h1").remote;
  auto starter = MakeSshAgentStarter(SshConfig{}, fake);
  auto handle = starter->Start(hosts::HostSpec{"", "h1", 1}, MakeLaunch());
  REQUIRE(handle.ok());
  std::string err;
  for (int i = 0; i < 50; ++i) err += "line " + std::to_string(i) + "\n";
  remote->Emit("", err);
  remote->Exit(1);
  REQUIRE(WaitFor([&] { return (*handle)->Poll().has_value(); }));
  std::string tail = (*handle)->StderrTail();
  CHECK(tail.find("line 49") != std::string::npos);
  CHECK(tail.find("line 39") == std::string::npos);
}

TEST_CASE("The launcher address: override, interface, else the SSH socket's", "[ssh][unit]") {
  auto fake = std::make_shared<FakeConnector>();
  fake->For("h1").local_address = "198.18.0.77";
  SshConfig cfg;

  SECTION("socket address by default") {
    auto h = MakeSshAgentStarter(cfg, fake)->Start(hosts::HostSpec{"", "h1", 1}, MakeLaunch());
    REQUIRE(h.ok());
    CHECK(fake->For("h1").remote->Get(&FakeRemote::command).find("'198.18.0.77:4242'") !=
          std::string::npos);
  }
  SECTION("launch.service_address wins") {
    AgentLaunch l = MakeLaunch();
    l.service_address = "198.18.0.9";
    auto h = MakeSshAgentStarter(cfg, fake)->Start(hosts::HostSpec{"", "h1", 1}, l);
    REQUIRE(h.ok());
    CHECK(fake->For("h1").remote->Get(&FakeRemote::command).find("'198.18.0.9:4242'") !=
          std::string::npos);
  }
  SECTION("--network-interfaces nosuchif0,lo: the first one that has an address") {
    cfg.network_interfaces = {"nosuchif0", "lo"};
    auto h = MakeSshAgentStarter(cfg, fake)->Start(hosts::HostSpec{"", "h1", 1}, MakeLaunch());
    REQUIRE(h.ok());
    CHECK(fake->For("h1").remote->Get(&FakeRemote::command).find("'127.0.0.1:4242'") !=
          std::string::npos);
  }
  SECTION("an unknown interface is an error naming it and the host") {
    cfg.network_interfaces = {"nosuchif0"};
    auto h = MakeSshAgentStarter(cfg, fake)->Start(hosts::HostSpec{"", "h1", 1}, MakeLaunch());
    REQUIRE_FALSE(h.ok());
    CHECK(h.status().message().find("h1") != std::string::npos);
    CHECK(h.status().message().find("nosuchif0") != std::string::npos);
  }
}

TEST_CASE("Transient failures are retried, the others are not", "[ssh][unit]") {
  auto fake = std::make_shared<FakeConnector>();
  SshConfig cfg;
  cfg.retry_backoff_ms = 1;
  cfg.connect_attempts = 3;
  auto starter = MakeSshAgentStarter(cfg, fake);

  fake->For("flaky").failures = {{SshFailure::kTransient, "reset"},
                                 {SshFailure::kTransient, "reset"}};
  auto ok = starter->Start(hosts::HostSpec{"", "flaky", 1}, MakeLaunch());
  CHECK(ok.ok());
  CHECK(fake->connects("flaky") == 3);

  fake->For("down").failures = {{SshFailure::kTransient, "reset"},
                                {SshFailure::kTransient, "reset"},
                                {SshFailure::kTransient, "reset"}};
  auto down = starter->Start(hosts::HostSpec{"", "down", 1}, MakeLaunch());
  REQUIRE_FALSE(down.ok());
  CHECK(fake->connects("down") == 3);
  CHECK(down.status().message().find("after 3 attempts") != std::string::npos);

  for (SshFailure kind : {SshFailure::kRefused, SshFailure::kAuthDenied, SshFailure::kTimeout,
                          SshFailure::kHostKeyChanged, SshFailure::kResolution}) {
    std::string host = std::string("bad-") + SshFailureName(kind);
    fake->For(host).failures = {{kind, SshFailureName(kind)}};
    auto r = starter->Start(hosts::HostSpec{"", host, 1}, MakeLaunch());
    REQUIRE_FALSE(r.ok());
    CHECK(fake->connects(host) == 1);
    CHECK(r.status().code() == SshFailureCode(kind));
    CHECK(r.status().message().find(host) != std::string::npos);
  }
}

TEST_CASE("Start from many threads keeps within the fan-out", "[ssh][unit]") {
  auto fake = std::make_shared<FakeConnector>();
  fake->set_connect_delay(std::chrono::milliseconds(20));
  SshConfig cfg;
  cfg.fanout = 3;
  auto starter = MakeSshAgentStarter(cfg, fake);
  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<AgentHandle>> handles(12);
  for (int i = 0; i < 12; ++i) {
    threads.emplace_back([&, i] {
      auto r = starter->Start(hosts::HostSpec{"", "h" + std::to_string(i), 1}, MakeLaunch());
      if (r.ok()) handles[i] = std::move(*r);
    });
  }
  for (auto& t : threads) t.join();
  for (auto& h : handles) CHECK(h != nullptr);
  CHECK(fake->max_in_flight() <= 3);
  CHECK(fake->max_in_flight() >= 2);
}

TEST_CASE("Kill terminates the remote command, a lost connection reads 255", "[ssh][unit]") {
  auto fake = std::make_shared<FakeConnector>();
  auto starter = MakeSshAgentStarter(SshConfig{}, fake);

  auto a = starter->Start(hosts::HostSpec{"", "a", 1}, MakeLaunch());
  REQUIRE(a.ok());
  auto start = std::chrono::steady_clock::now();
  (*a)->Kill();
  (*a)->Kill();  // idempotent
  REQUIRE(WaitFor([&] { return (*a)->Poll().has_value(); }));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(500));
  CHECK(*(*a)->Poll() == 137);
  CHECK(fake->For("a").remote->Get(&FakeRemote::terminated));

  auto b = starter->Start(hosts::HostSpec{"", "b", 1}, MakeLaunch());
  REQUIRE(b.ok());
  fake->For("b").remote->LoseConnection();
  REQUIRE(WaitFor([&] { return (*b)->Poll().has_value(); }));
  CHECK(*(*b)->Poll() == 255);
  CHECK((*b)->StderrTail().find("connection lost") != std::string::npos);

  // Destroying a running handle does not wait for the remote side.
  auto c = starter->Start(hosts::HostSpec{"", "c", 1}, MakeLaunch());
  REQUIRE(c.ok());
  start = std::chrono::steady_clock::now();
  c->reset();
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(500));
  CHECK(fake->For("c").remote->Get(&FakeRemote::terminated));
}

// Threads of this process now.
int ThreadCount() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  }
  return -1;
}

TEST_CASE("One I/O thread drives every running agent's session", "[ssh][unit]") {
  // 100 agents: their output, exits and kills all go through the starter's one poller thread.
  constexpr int kAgents = 100;
  auto fake = std::make_shared<FakeConnector>();
  auto starter = MakeSshAgentStarter(SshConfig{}, fake);
  const int before = ThreadCount();
  std::vector<std::unique_ptr<AgentHandle>> handles;
  for (int i = 0; i < kAgents; ++i) {
    auto h = starter->Start(hosts::HostSpec{"", "h" + std::to_string(i), 1}, MakeLaunch());
    REQUIRE(h.ok());
    handles.push_back(std::move(*h));
  }
  CHECK(ThreadCount() == before + 1);
  // Every agent's output reaches its own tail, and each exit its own handle.
  for (int i = 0; i < kAgents; ++i) {
    fake->For("h" + std::to_string(i)).remote->Emit("", "agent " + std::to_string(i) + " says\n");
  }
  for (int i = 0; i < kAgents; i += 2) fake->For("h" + std::to_string(i)).remote->Exit(i % 7);
  for (int i = 1; i < kAgents; i += 4) handles[i]->Kill();
  for (int i = 0; i < kAgents; ++i) {
    INFO("agent " << i);
    const bool ends = i % 2 == 0 || i % 4 == 1;
    if (ends) {
      REQUIRE(WaitFor([&] { return handles[i]->Poll().has_value(); }));
      CHECK(*handles[i]->Poll() == (i % 2 == 0 ? i % 7 : 137));
    }
    if (i % 4 != 1) {  // a killed agent's output may be cut short
      REQUIRE(WaitFor([&] {
        return handles[i]->StderrTail().find("agent " + std::to_string(i) + " says") !=
               std::string::npos;
      }));
    }
  }
  for (int i = 3; i < kAgents; i += 4) CHECK_FALSE(handles[i]->Poll().has_value());
  // Destroying them all is prompt, and the poller goes with the last one.
  const auto start = std::chrono::steady_clock::now();
  handles.clear();
  starter.reset();
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(2));
  CHECK(ThreadCount() == before);
}

TEST_CASE("DescribeRemoteAgentExit names the host and the path", "[ssh][unit]") {
  CHECK(DescribeRemoteAgentExit("rr-h2", "/x/ringrun-agent", 127) ==
        "rr-h2: ringrun-agent not found at /x/ringrun-agent (exit status 127)");
  CHECK(DescribeRemoteAgentExit("rr-h2", "/x", 137).find("SIGKILL") != std::string::npos);
}

// ---- The real libssh connector, on loopback only. ----

int ListenLoopback(int* port, bool listen_too) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  if (listen_too) REQUIRE(listen(fd, 8) == 0);
  return fd;
}

TEST_CASE("libssh connector: refused and timeout are classified with the host", "[ssh][unit]") {
  auto connector = MakeLibsshConnector();
  SshConfig cfg;
  cfg.connect_timeout_s = 1;
  cfg.known_hosts = "/dev/null";

  SECTION("refused") {
    int port;
    UniqueFd fd(ListenLoopback(&port, /*listen_too=*/false));  // bound, not listening
    cfg.port = port;
    auto out = connector->Connect(hosts::HostSpec{"", "127.0.0.1", 1}, cfg);
    REQUIRE(out.session == nullptr);
    CHECK(out.failure == SshFailure::kRefused);
    CHECK(out.status.message().find("127.0.0.1") != std::string::npos);
    CHECK(out.status.message().find("libssh:") != std::string::npos);
  }
  SECTION("a server that never speaks times out within the connect timeout") {
    int port;
    UniqueFd fd(ListenLoopback(&port, /*listen_too=*/true));  // accepts in the kernel, silent
    cfg.port = port;
    auto start = std::chrono::steady_clock::now();
    auto out = connector->Connect(hosts::HostSpec{"", "127.0.0.1", 1}, cfg);
    auto took = std::chrono::steady_clock::now() - start;
    REQUIRE(out.session == nullptr);
    CHECK(out.failure == SshFailure::kTimeout);
    CHECK(took < std::chrono::seconds(3));
  }
}

}  // namespace
}  // namespace ringrun::launcher::starters
