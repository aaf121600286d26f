// ssh_smoke: starts one agent command on one host through the real SSH agent starter, relays
// its output, and reports how it ended. The cluster tests use it to check the SSH layer on its
// own: host keys, keys, unreachable hosts, the remote command line and the secret on stdin.
//
//   ssh_smoke --host H [-i KEY] [--known-hosts F] [--accept-new] [--port P] [--timeout S]
//             --agent-path PATH [--wait-s S] [--kill-after-ms MS]
// The secret is a fresh random one, as in a job: never on a command line, not even this one.
// Prints "exit=N" (and the stderr tail) when the command ends, or "start failed: CODE: MESSAGE"
// and exits 3 when Start() fails, or "still running" and exits 4 after --wait-s.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "launcher/starters/ssh_agent_starter.h"
#include "ringrun/common/secret.h"

using namespace ringrun;
using namespace ringrun::launcher;

int main(int argc, char** argv) {
  starters::SshConfig cfg;
  starters::AgentLaunch launch;
  launch.service_port = 1;
  Result<std::string> secret = GenerateSecret();
  if (!secret.ok()) {
    std::fprintf(stderr, "%s\n", secret.status().message().c_str());
    return 1;
  }
  launch.secret = *secret;
  launch.log_level = "warn";
  hosts::HostSpec host;
  double wait_s = 10;
  int kill_after_ms = -1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--host") {
      std::string h = next();
      auto at = h.find('@');
      if (at != std::string::npos) {
        host.user = h.substr(0, at);
        h = h.substr(at + 1);
      }
      host.name = h;
    } else if (a == "-i")
      cfg.identity_file = next();
    else if (a == "--known-hosts")
      cfg.known_hosts = next();
    else if (a == "--accept-new")
      cfg.accept_new_host_keys = true;
    else if (a == "--port")
      cfg.port = std::atoi(next().c_str());
    else if (a == "--timeout")
      cfg.connect_timeout_s = std::atoi(next().c_str());
    else if (a == "--agent-path")
      launch.agent_path = next();
    else if (a == "--wait-s")
      wait_s = std::atof(next().c_str());
    else if (a == "--kill-after-ms")
      kill_after_ms = std::atoi(next().c_str());
    else if (a == "--launcher-address")
      cfg.launcher_address = next();
    else if (a == "--network-interface")
      cfg.network_interfaces = {next()};
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  auto starter = starters::MakeSshAgentStarter(cfg);
  auto t0 = std::chrono::steady_clock::now();
  auto handle = starter->Start(host, launch);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!handle.ok()) {
    std::printf("start failed: %s: %s\nseconds=%.3f\n", CodeName(handle.status().code()),
                handle.status().message().c_str(), took);
    return 3;
  }
  auto deadline = t0 + std::chrono::milliseconds(static_cast<int>(wait_s * 1000));
  auto kill_at = t0 + std::chrono::milliseconds(kill_after_ms);
  bool killed = false;
  while (!(*handle)->Poll() && std::chrono::steady_clock::now() < deadline) {
    if (kill_after_ms >= 0 && !killed && std::chrono::steady_clock::now() >= kill_at) {
      (*handle)->Kill();
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  auto code = (*handle)->Poll();
  if (!code) {
    std::printf("still running\n");
    return 4;
  }
  std::printf("exit=%d\n", *code);
  if (*code != 0)
    std::printf(
        "describe=%s\n",
        starters::DescribeRemoteAgentExit(host.Display(), launch.agent_path, *code).c_str());
  std::printf("tail:\n%s\n", (*handle)->StderrTail().c_str());
  return 0;
}
