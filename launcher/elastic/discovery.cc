#include "launcher/elastic/discovery.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <thread>

#include "launcher/hosts/hostfile.h"
#include "ringrun/common/clock.h"
#include "ringrun/common/line_tail.h"
#include "ringrun/common/spawn.h"
#include "ringrun/common/strings.h"

namespace ringrun::launcher::elastic {
namespace {

constexpr size_t kStderrTailBytes = 64 << 10;  // stderr kept for the message, at most
constexpr int kReapPollMs = 10;

int RemainingMs(Deadline deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(left.count());
}

// The last kStderrTailLines lines of `text`, for a failure message.
std::string Tail(const std::string& text) {
  LineTail tail(kStderrTailLines);
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    tail.Push(text.substr(start, nl - start));
    start = nl + 1;
  }
  return tail.Text();
}

// Reads the child's stdout and stderr until both close or the deadline passes. False on timeout.
Result<bool> Drain(ChildProcess& child, Deadline deadline, const std::string& script,
                   std::string* out, std::string* err) {
  UniqueFd* fds[2] = {&child.out, &child.err};
  std::string* bufs[2] = {out, err};
  char chunk[4096];
  while (child.out.valid() || child.err.valid()) {
    pollfd p[2];
    int n = 0;
    int which[2];
    for (int i = 0; i < 2; ++i) {
      if (fds[i]->valid()) {
        p[n] = pollfd{fds[i]->get(), POLLIN, 0};
        which[n++] = i;
      }
    }
    const int left = RemainingMs(deadline);
    if (left == 0) return false;
    const int r = ::poll(p, n, left);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ErrnoStatus(script + ": poll", errno);
    for (int k = 0; k < n; ++k) {
      if (p[k].revents == 0) continue;
      const int i = which[k];
      const ssize_t got = ::read(fds[i]->get(), chunk, sizeof(chunk));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        fds[i]->Reset();
        continue;
      }
      bufs[i]->append(chunk, static_cast<size_t>(got));
      if (i == 0 && out->size() > static_cast<size_t>(kDiscoveryOutputBytes)) {
        return InvalidArgument(script + ": more than " + std::to_string(kDiscoveryOutputBytes) +
                               " bytes of output");
      }
      if (i == 1 && err->size() > kStderrTailBytes) err->erase(0, err->size() - kStderrTailBytes);
    }
  }
  return true;
}

// Waits for the child until the deadline. The wait status, or nullopt on timeout.
Result<std::optional<int>> Reap(pid_t pid, Deadline deadline, const std::string& script) {
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return std::optional<int>(status);
    if (r < 0 && errno != EINTR) return ErrnoStatus(script + ": waitpid", errno);
    if (RemainingMs(deadline) == 0) return std::optional<int>();
    std::this_thread::sleep_for(std::chrono::milliseconds(kReapPollMs));
  }
}

void KillGroup(pid_t pid) {
  ::killpg(pid, SIGKILL);
  while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace

Result<HostSet> ParseDiscoveryOutput(const std::string& text, const std::string& script,
                                     int default_slots) {
  HostSet hosts;
  std::map<std::string, int> line_of;  // lower-cased name -> its line
  size_t start = 0;
  for (int number = 1; start < text.size(); ++number) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    const std::string line = TrimBlanks(text.substr(start, nl - start));
    start = nl + 1;
    if (line.empty()) continue;
    const std::string where = script + ": line " + std::to_string(number) + " '" + line + "'";
    if (line.find('@') != std::string::npos) {
      return InvalidArgument(where + ": user@ is not part of the discovery contract (host or " +
                             "host:slots)");
    }
    bool slots_given = false;
    Result<hosts::HostSpec> spec = hosts::ParseHostToken(line, &slots_given);
    if (!spec.ok()) return InvalidArgument(where + ": " + spec.status().message());
    auto [it, inserted] = line_of.emplace(AsciiLower(spec->name), number);
    if (!inserted) {
      return InvalidArgument(where + ": host '" + spec->name + "' is already listed at line " +
                             std::to_string(it->second));
    }
    hosts.push_back(Host{spec->name, slots_given ? spec->slots : default_slots});
  }
  return hosts;
}

Result<HostSet> RunDiscoveryScript(const DiscoveryOptions& options) {
  const std::string& script = options.script;
  if (TrimBlanks(script).empty()) return InvalidArgument("host discovery script: empty command");
  const Deadline deadline = DeadlineAfter(options.timeout_ms);
  SpawnOptions spawn;
  spawn.path = "/bin/sh";
  spawn.argv = {"sh", "-c", script};
  spawn.in = ChildStream::DevNull();
  spawn.out = ChildStream::NewPipe();
  spawn.err = ChildStream::NewPipe();
  spawn.new_process_group = true;
  spawn.reset_signals = true;
  spawn.close_other_fds = true;
  Result<ChildProcess> child = SpawnProcess(spawn);
  if (!child.ok()) return child.status().Annotate("host discovery script " + script);

  auto timed_out = [&] {
    return Timeout(script + ": no exit within " + std::to_string(options.timeout_ms) +
                   " ms; killed it (its process group)");
  };
  std::string out, err;
  Result<bool> drained = Drain(*child, deadline, script, &out, &err);
  if (!drained.ok() || !*drained) {
    KillGroup(child->pid);
    if (!drained.ok()) return drained.status();
    return timed_out();
  }
  Result<std::optional<int>> status = Reap(child->pid, deadline, script);
  if (!status.ok() || !status->has_value()) {
    KillGroup(child->pid);
    if (!status.ok()) return status.status();
    return timed_out();
  }
  // The script is gone; anything it left in its group goes too.
  ::killpg(child->pid, SIGKILL);
  const int ws = **status;
  std::string how;
  if (WIFEXITED(ws) && WEXITSTATUS(ws) != 0) {
    how = "exited with code " + std::to_string(WEXITSTATUS(ws));
  } else if (WIFSIGNALED(ws)) {
    how = "killed by signal " + std::to_string(WTERMSIG(ws));
  }
  if (!how.empty()) {
    const std::string tail = Tail(err);
    return Unavailable(script + ": " + how +
                       (tail.empty() ? " (no stderr)" : "; its stderr ends:\n" + tail));
  }
  return ParseDiscoveryOutput(out, script, options.default_slots);
}

}  // namespace ringrun::launcher::elastic
