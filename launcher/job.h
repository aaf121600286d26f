// One ringrun job, from placement to the last rank's exit: starts the job service and the
// agents, forwards output, applies the first-failure rule, forwards signals, tears down.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "launcher/agent_starter.h"
#include "launcher/options.h"

namespace ringrun::launcher {

// Optional hooks for programs that run a job for their own purposes (--check-gpu).
struct JobHooks {
  // Every output line of every rank (without its '\n'), as it arrives. Called from one thread.
  std::function<void(int rank, bool is_stderr, std::string_view line)> on_line;
  // Print lines to the console with [rank]<stream>: tags (the default for user jobs).
  bool echo_to_console = true;
};

// The starters the job uses: `local` for hosts that are this machine, `remote` for the rest
// (nullptr: remote hosts are an error).
struct Starters {
  AgentStarter* local = nullptr;
  AgentStarter* remote = nullptr;
};

// Runs the job described by `options` (already validated) and returns ringrun's exit code:
// 0 when every rank exited 0; the first failing rank's code (128+signo for a signal);
// 130/143 after SIGINT/SIGTERM; 1 when ringrun itself failed (the reason is printed).
// Installs handlers for SIGINT, SIGTERM, SIGUSR1, SIGUSR2, SIGHUP for its duration.
int RunJob(const Options& options, const Starters& starters, const JobHooks& hooks = {});

}  // namespace ringrun::launcher
