// Host discovery for elastic jobs: Horovod's --host-discovery-script contract.
//
// The script is run by /bin/sh -c (as Horovod runs it, so "./hosts.sh --zone a" works), with
// stdin on /dev/null, in a process group of its own; once it has exited, whatever it left
// running in that group is killed (SIGKILL). Its stdout lists the hosts available now,
// one per line: "host" (the default slots, --slots-per-host) or "host:slots". Blank lines and
// whitespace around a line are ignored; an empty output is valid and means no hosts. Host names
// follow the hostfile's rules (launcher/hosts/hostfile.h): letters, digits, '.', '-', '_', or an
// IP address ("[v6addr]:slots" for an IPv6 address with slots); slots are in [1, 65536].
//
// Errors, as values (never thrown), each naming the script:
//   - a bad line names its number and text: "./hosts.sh: line 3 'h1:x': slots must be a
//     positive integer, got 'x'"; a host listed twice (names compared case-insensitively) names
//     both lines;
//   - a non-zero exit, or death by a signal, with the last lines of the script's stderr;
//   - a script that has not exited (or not closed its stdout and stderr) by the timeout is a
//     kTimeout error; its whole process group is killed with SIGKILL first;
//   - more than kDiscoveryOutputBytes of stdout, and a script that cannot be started.
// Deciding what an error means for the job (the first call's failure ends it; a later one keeps
// the last host set) is the caller's.
#pragma once

#include <string>
#include <vector>

#include "ringrun/common/defaults.h"
#include "ringrun/common/status.h"

namespace ringrun::launcher::elastic {

struct Host {
  std::string name;  // as the script wrote it
  int slots = 1;

  bool operator==(const Host& o) const { return name == o.name && slots == o.slots; }
};

// Hosts in the order the script listed them; names are unique.
using HostSet = std::vector<Host>;

// --discovery-interval's default: seconds between the end of one run and the start of the next.
inline constexpr int kDiscoveryIntervalS = 1;

struct DiscoveryOptions {
  std::string script;     // a shell command line
  int default_slots = 1;  // --slots-per-host: for lines without ":slots"
  int timeout_ms = kDiscoveryTimeoutMs;
};

// Runs the script once and parses its output. Blocks for at most about timeout_ms (plus the
// reaping of a killed group). Thread-safe: each call has its own process and pipes.
Result<HostSet> RunDiscoveryScript(const DiscoveryOptions& options);

// The parser alone: `text` is the script's stdout; `script` names it in errors.
Result<HostSet> ParseDiscoveryOutput(const std::string& text, const std::string& script,
                                     int default_slots);

}  // namespace ringrun::launcher::elastic
