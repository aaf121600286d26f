#include "launcher/options.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <optional>
#include <sstream>

#include "launcher/hosts/placement.h"
#include "launcher/hosts/scheduler_hosts.h"
#include "launcher/hosts/slurm.h"
#include "launcher/job/environment.h"
#include "ringrun/common/defaults.h"
#include "ringrun/common/strings.h"
#include "ringrun/common/version.h"

namespace ringrun::launcher {
namespace {

// ---- The matcher ----

// One way to read a word as a flag.
struct Reading {
  size_t flag;
  std::string name;                  // the name it matched
  std::optional<std::string> value;  // after '=', or attached to a one-letter name
};

// Every flag `word` may be, by argparse's rules (options.h); nullopt when it is not a flag.
std::optional<std::vector<Reading>> ReadWord(const std::vector<FlagSyntax>& flags,
                                             const std::string& word) {
  if (word.size() < 2 || word[0] != '-') return std::nullopt;
  const size_t eq = word.find('=');
  const std::string head = word.substr(0, eq);
  std::optional<std::string> tail;
  if (eq != std::string::npos) tail = word.substr(eq + 1);
  const bool one_dash = word[1] != '-';
  std::optional<Reading> with_value;  // "NAME=VALUE"
  std::vector<Reading> prefixes;
  for (size_t i = 0; i < flags.size(); ++i) {
    for (const std::string& name : flags[i].names) {
      if (name == word) return std::vector<Reading>{{i, name, std::nullopt}};
      if (tail && name == head) {
        with_value = Reading{i, name, tail};
      } else if (one_dash && name.size() == 2 && word.compare(0, 2, name) == 0) {
        prefixes.push_back({i, name, word.substr(2)});
      } else if (name.compare(0, head.size(), head) == 0 &&
                 std::none_of(prefixes.begin(), prefixes.end(),
                              [&](const Reading& r) { return r.flag == i; })) {
        prefixes.push_back({i, name, tail});
      }
    }
  }
  if (with_value) return std::vector<Reading>{*with_value};
  // A switch takes no text, so "-hostf" is -hostfile, not -h with "ostf" attached.
  auto switch_with_text = [&](const Reading& r) { return flags[r.flag].nargs == 0 && r.value; };
  if (!std::all_of(prefixes.begin(), prefixes.end(), switch_with_text)) {
    prefixes.erase(std::remove_if(prefixes.begin(), prefixes.end(), switch_with_text),
                   prefixes.end());
  }
  return prefixes;
}

bool IsFlag(const std::vector<FlagSyntax>& flags, const std::string& word) {
  auto readings = ReadWord(flags, word);
  return readings && !readings->empty();
}

std::string Suggest(const std::vector<FlagSyntax>& flags, const std::string& word) {
  std::string best;
  int best_d = 3;
  for (const FlagSyntax& flag : flags) {
    for (const std::string& name : flag.names) {
      if (name.size() < 4) continue;  // "-x", "-np": too short to guess from
      int d = EditDistance(word.substr(0, word.find('=')), name);
      if (d < best_d) best_d = d, best = name;
    }
  }
  return best.empty() ? "" : " (did you mean " + best + "?)";
}

}  // namespace

Result<MatchedArgs> MatchArgs(const std::vector<FlagSyntax>& flags,
                              const std::vector<std::string>& args) {
  MatchedArgs out;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& word = args[i];
    if (word == "--") {
      ++i;
      break;
    }
    std::optional<std::vector<Reading>> readings = ReadWord(flags, word);
    if (!readings) break;  // the command starts here
    if (readings->empty()) {
      return InvalidArgument("unknown flag " + word + Suggest(flags, word) +
                             "; see ringrun --help");
    }
    if (readings->size() > 1) {
      std::string names;
      for (const Reading& r : *readings) names += (names.empty() ? "" : ", ") + r.name;
      return InvalidArgument("ambiguous flag " + word + ": it could be " + names);
    }
    const Reading& r = readings->front();
    const FlagSyntax& syntax = flags[r.flag];
    const size_t nargs = static_cast<size_t>(syntax.nargs);
    const std::string needs = r.name + " needs " +
                              (nargs == 1 ? "a value" : std::to_string(nargs) + " values") + " (" +
                              syntax.metavar + ")";
    FlagUse use{r.flag, r.name, {}};
    if (r.value) {
      if (nargs == 0) return InvalidArgument(r.name + " takes no value (got '" + word + "')");
      if (nargs > 1) return InvalidArgument(needs + " as separate words, not '" + word + "'");
      use.values.push_back(*r.value);
    }
    while (use.values.size() < nargs) {
      if (i + 1 == args.size()) return InvalidArgument(needs);
      const std::string& next = args[i + 1];
      if (next == "--" || IsFlag(flags, next)) {
        return InvalidArgument(needs + ", but " + next + " follows it");
      }
      use.values.push_back(next);
      ++i;
    }
    for (const std::string& v : use.values) {
      if (v.empty()) return InvalidArgument(needs + ", got ''");
    }
    out.uses.push_back(std::move(use));
  }
  out.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  return out;
}

namespace {

// ---- ringrun's flags ----

// Far beyond any real job; it keeps a typo like "-np 40000000" from starting a fork storm.
constexpr int kMaxNumProc = 1 << 20;

const char kUsageLine[] = "Usage: ringrun [OPTIONS] [--] COMMAND [ARGS...]";

// What the flags say, read in order. Hosts, np and the starter are settled once all are read.
struct Given {
  explicit Given(const std::vector<std::string>& env) : environ_vars(env) {}
  const std::vector<std::string>& environ_vars;
  Options o;
  std::optional<FlagUse> host_flag;  // -H or --hostfile, once given
  std::string starter;               // --starter; "" for auto
  bool log_level_given = false;      // --log-level, which wins over --verbose
  std::vector<std::pair<std::string, std::string>> engine_vars;  // set after -x: the flags win
};

using Apply = std::function<Status(const FlagUse&, Given&)>;

// What a flag takes and does: `nargs` values, which `apply` checks, naming the flag as written,
// and sets. `answer` (--help, --version) is printed instead, before any value is checked.
struct Kind {
  int nargs;
  Apply apply;
  std::string (*answer)() = nullptr;
};

// One flag: its names (space-separated), its values in --help, its kind, help and default.
struct Flag {
  const char* names;
  const char* metavar;
  Kind kind;
  const char* help;
  std::string default_text = "";  // --help adds " Default: TEXT."
};

struct FlagGroup {
  const char* name;  // its section of --help
  std::vector<Flag> flags;
};

std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// Strict decimal integer in [lo, hi]; messages name the flag as written.
Result<int> ParseIntFlag(const FlagUse& u, long lo, long hi, const char* unit = "") {
  const std::string& text = u.values[0];
  const char* s = text.c_str();
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(s, &end, 10);
  // strtol would also take leading blanks and '+'; a flag value is digits with an optional '-'.
  bool plain = std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '-';
  if (!plain || *end != '\0' || end == s) {
    return InvalidArgument(u.spelling + " " + text + ": not a whole number" + unit);
  }
  if (errno == ERANGE || v > hi) {
    return InvalidArgument(u.spelling + " " + text + ": must be at most " + std::to_string(hi));
  }
  if (v < lo) {
    return InvalidArgument(u.spelling + " " + text + ": must be at least " + std::to_string(lo));
  }
  return static_cast<int>(v);
}

Result<double> ParseSecondsFlag(const FlagUse& u, double lo, double hi) {
  const std::string& text = u.values[0];
  // Decimal only: strtod would also take blanks, hex, exponents, "inf" and "nan".
  bool plain = text.find_first_not_of("0123456789.-") == std::string::npos;
  const char* s = text.c_str();
  char* end = nullptr;
  double v = plain ? std::strtod(s, &end) : 0;
  if (!plain || end == s || *end != '\0' || !std::isfinite(v)) {
    return InvalidArgument(u.spelling + " " + text + ": not a number of seconds");
  }
  if (v < lo) return InvalidArgument(u.spelling + " " + text + ": must be at least " + Number(lo));
  if (v > hi) return InvalidArgument(u.spelling + " " + text + ": must be at most " + Number(hi));
  return v;
}

// The value, lowercased, if it is one of `choices`.
Result<std::string> ParseChoice(const FlagUse& u, std::vector<std::string> choices) {
  std::string v = u.values[0];
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string list;
  for (const std::string& c : choices) {
    if (c == v) return v;
    list += (list.empty() ? "" : ", ") + c;
  }
  return InvalidArgument(u.spelling + " " + u.values[0] + ": not one of " + list);
}

// NAME=VALUE into `vars`: a NAME already there keeps its place and takes the new value.
void SetVar(std::vector<std::pair<std::string, std::string>>* vars, const std::string& name,
            const std::string& value) {
  for (auto& [n, v] : *vars) {
    if (n == name) {
      v = value;
      return;
    }
  }
  vars->emplace_back(name, value);
}

// The kinds of flag.
Kind Switch(bool Options::*field) {
  return {0, [field](const FlagUse&, Given& g) {
            g.o.*field = true;
            return Status();
          }};
}
Kind Int(int Options::*field, long lo, long hi, const char* unit = "") {
  return {1, [=](const FlagUse& u, Given& g) {
            Result<int> v = ParseIntFlag(u, lo, hi, unit);
            if (v.ok()) g.o.*field = *v;
            return v.status();
          }};
}
Kind Text(std::string Options::*field) {
  return {1, [field](const FlagUse& u, Given& g) {
            g.o.*field = u.values[0];
            return Status();
          }};
}
Kind Value(Apply apply) { return {1, std::move(apply)}; }
Kind Action(Apply apply) { return {0, std::move(apply)}; }
Kind Answer(std::string (*answer)()) { return {0, nullptr, answer}; }
// -H and --hostfile: one of them, once.
Kind Hosts(Result<std::vector<hosts::HostSpec>> (*parse)(const std::string&)) {
  return Value([parse](const FlagUse& u, Given& g) -> Status {
    if (g.host_flag && g.host_flag->flag == u.flag) {
      return InvalidArgument(u.spelling + " given twice; list every host in one " + u.spelling);
    }
    if (g.host_flag) {
      return InvalidArgument(g.host_flag->spelling + " and " + u.spelling +
                             " cannot be used together");
    }
    Result<std::vector<hosts::HostSpec>> list = parse(u.values[0]);
    if (!list.ok()) return list.status();
    g.o.hosts = std::move(list.value());
    g.o.host_source = u.spelling + " " + u.values[0];
    g.host_flag = u;
    return Status();
  });
}
// An engine flag: the variable it sets in every rank, to what `value` makes of the flag.
Kind SetsVar(const char* name, std::function<Result<std::string>(const FlagUse&)> value) {
  return Value([=](const FlagUse& u, Given& g) {
    Result<std::string> v = value(u);
    if (v.ok()) SetVar(&g.engine_vars, name, *v);
    return v.status();
  });
}
std::function<Result<std::string>(const FlagUse&)> Seconds(double lo, double hi) {
  return [=](const FlagUse& u) -> Result<std::string> {
    Result<double> v = ParseSecondsFlag(u, lo, hi);
    if (!v.ok()) return v.status();
    return u.values[0];
  };
}

std::string VersionText() { return "ringrun " RINGRUN_VERSION_STRING "\n"; }

// Every flag, in --help's order. Adding a flag is one entry here (and its field in Options).
const std::vector<FlagGroup>& FlagGroups() {
  static const std::vector<FlagGroup> kGroups = {
      {"Job",
       {
           {"-np --num-proc", "N", Int(&Options::np, 1, kMaxNumProc),
            "Number of ranks. Default: the total of the slots; required without hosts."},
           {"-H --hosts", "HOST[:SLOTS],...", Hosts(hosts::ParseHostList),
            "Hosts and their slots, e.g. a:4,b:4 (a bare host has 1 slot; user@host allowed)."},
           {"-hostfile --hostfile", "FILE", Hosts(hosts::ParseHostfile),
            "File of hosts: lines 'host slots=N', 'host:N' or 'host'; '#' comments."},
           {"-x", "NAME[=VALUE]", Value([](const FlagUse& u, Given& g) {
              auto kv = job::ParseExportFlag(u.values[0], g.environ_vars);
              if (kv.ok()) SetVar(&g.o.exports, kv->first, kv->second);
              return kv.status();
            }),
            "Set NAME in every rank, to VALUE or to the launcher's value (repeatable)."},
           {"--wdir", "DIR", Text(&Options::wdir),
            "Working directory of the ranks. Default: the launcher's."},
           {"--start-timeout", "SECONDS",
            Int(&Options::start_timeout_s, 1, 7 * 24 * 3600, " of seconds"),
            "Time for every agent and rank to come up.", std::to_string(kDefaultStartTimeoutS)},
           {"--grace-period", "SECONDS", Value([](const FlagUse& u, Given& g) {
              Result<double> s = ParseSecondsFlag(u, 0, 3600);
              if (s.ok()) g.o.grace_ms = static_cast<int>(std::llround(*s * 1000.0));
              return s.status();
            }),
            "Time between SIGTERM and SIGKILL at teardown; fractions allowed.",
            Number(kDefaultGraceMs / 1000.0)},
           {"--starter", "ssh|slurm|auto", Value([](const FlagUse& u, Given& g) {
              g.starter = u.values[0];  // checked with the hosts: hosts::ChooseStarter
              return Status();
            }),
            "How agents start: SSH, one srun step, or auto (srun inside a Slurm job; default)."},
           {"--bind-to", "none|core", Value([](const FlagUse& u, Given& g) {
              Result<std::string> v = ParseChoice(u, {"none", "core"});
              g.o.bind_to =
                  v.ok() && *v == "core" ? Options::BindTo::kCore : Options::BindTo::kNone;
              return v.status();
            }),
            "core: pin each rank to its own share of the host's CPUs; none: no pinning (jobs "
            "sharing a host would share its first cores).",
            "none"},
           {"--dry-run", "", Switch(&Options::dry_run),
            "Print the placement table and start nothing."},
       }},
      {"Output",
       {
           {"--output-filename", "DIR", Text(&Options::output_dir),
            "Also write DIR/rank.N/stdout and DIR/rank.N/stderr."},
           {"-prefix-timestamp --prefix-timestamp", "", Switch(&Options::prefix_timestamp),
            "Add a timestamp to every output line."},
           {"--log-level", "LEVEL", Value([](const FlagUse& u, Given& g) {
              Result<std::string> v =
                  ParseChoice(u, {"trace", "debug", "info", "warn", "error", "off"});
              if (v.ok()) g.o.log_level = *v, g.log_level_given = true;
              return v.status();
            }),
            "ringrun's own log: trace, debug, info, warn (default), error or off."},
           {"--verbose", "", Action([](const FlagUse&, Given& g) {
              if (!g.log_level_given) g.o.log_level = "debug";
              return Status();
            }),
            "Same as --log-level debug (an explicit --log-level wins)."},
       }},
      {"SSH",
       {
           {"-i --ssh-identity-file", "FILE", Value([](const FlagUse& u, Given& g) {
              if (::access(u.values[0].c_str(), R_OK) != 0) {
                return InvalidArgument(u.spelling + " " + u.values[0] + ": " +
                                       std::strerror(errno));
              }
              g.o.ssh_identity_file = u.values[0];
              return Status();
            }),
            "Private key. Default: ssh-agent, then the default keys."},
           {"-p --ssh-port", "PORT", Int(&Options::ssh_port, 1, 65535),
            "SSH port. Default: ~/.ssh/config, or 22."},
           {"--ssh-known-hosts", "FILE", Text(&Options::ssh_known_hosts),
            "known_hosts file. Default: ~/.ssh/known_hosts."},
           {"--ssh-accept-new-host-keys", "", Switch(&Options::ssh_accept_new_host_keys),
            "Accept and record unknown host keys (changed keys are still refused)."},
           {"--ssh-fanout", "N", Int(&Options::ssh_fanout, 1, 4096),
            "SSH connections made at once.", std::to_string(kSshFanout)},
           {"--ssh-connect-timeout", "SECONDS",
            Int(&Options::ssh_connect_timeout_s, 1, 3600, " of seconds"),
            "Timeout of each step of one SSH connection attempt.",
            std::to_string(kSshConnectTimeoutS)},
           {"--agent-path", "PATH", Text(&Options::agent_path),
            "ringrun-agent on remote hosts. Default: the same absolute path as here."},
           {"--launcher-address", "ADDR", Text(&Options::launcher_address),
            "Address agents use to reach the launcher."},
           {"--network-interface", "IFACE", Text(&Options::network_interface),
            "Take the launcher's address from this interface."},
       }},
      {"Engine",
       {
           {"--fusion-threshold-mb", "MB",
            SetsVar("RINGRUN_FUSION_THRESHOLD",
                    [](const FlagUse& u) -> Result<std::string> {
                      Result<int> mb = ParseIntFlag(u, 0, 1 << 20, " of MiB");
                      if (!mb.ok()) return mb.status();
                      return std::to_string(static_cast<long long>(*mb) << 20);
                    }),
            "Fusion buffer size in MiB (default 64; 0 disables fusion). Sets "
            "RINGRUN_FUSION_THRESHOLD."},
           {"--cache-capacity", "N",
            SetsVar("RINGRUN_CACHE_CAPACITY",
                    [](const FlagUse& u) -> Result<std::string> {
                      Result<int> n = ParseIntFlag(u, 0, 1 << 24);
                      if (!n.ok()) return n.status();
                      return std::to_string(*n);
                    }),
            "Response cache entries (default 1024; 0 disables). Sets RINGRUN_CACHE_CAPACITY."},
           {"--no-stall-check", "", Action([](const FlagUse&, Given& g) {
              SetVar(&g.engine_vars, "RINGRUN_STALL_CHECK", "0");
              return Status();
            }),
            "No stall warnings. Sets RINGRUN_STALL_CHECK=0."},
           {"--stall-check-warning-time-seconds", "SECONDS",
            SetsVar("RINGRUN_STALL_WARNING_SECONDS", Seconds(0.001, 1e7)),
            "Warn about tensors some ranks submitted and others not after this long (default "
            "60)."},
           {"--stall-check-shutdown-time-seconds", "SECONDS",
            SetsVar("RINGRUN_STALL_SHUTDOWN_SECONDS", Seconds(0, 1e7)),
            "Fail the job when such a stall lasts this long (default: never)."},
           {"--timeline-filename", "FILE",
            SetsVar("RINGRUN_TIMELINE",
                    [](const FlagUse& u) -> Result<std::string> { return u.values[0]; }),
            "Write a Chrome trace: FILE is rank 0's, with every rank's negotiation, as Horovod's; "
            "rank r's beside it (t.json -> t.1.json, ...)."},
       }},
      {"Diagnostics",
       {
           {"--check-gpu", "", Switch(&Options::check_gpu),
            "Report the CUDA driver, devices and NCCL of every host; run no command."},
           {"--allreduce", "", Switch(&Options::check_gpu_allreduce),
            "With --check-gpu: also run an NCCL allreduce across every GPU."},
           {"-cb --check-build", "", Switch(&Options::check_build),
            "Print what this build has (backends and library versions)."},
           {"--version", "", Answer(VersionText), "Print the version."},
           {"-h --help", "", Answer(UsageText), "Print this help."},
       }},
  };
  return kGroups;
}

const char kHelpIntro[] =
    "Start COMMAND as a distributed job, one rank per slot, horovodrun-style.\n"
    "Everything after the first word that is neither an option nor an option's value (or\n"
    "after --) is the command; it reaches every rank byte for byte, with no shell between.\n"
    "Options are read as horovodrun (Python argparse) reads them: --name VALUE, --name=VALUE,\n"
    "a unique prefix of a name (--hostf), a one-letter name with its value attached (-Ha:4).\n";

// The waits that have no flag, from defaults.h.
std::string OtherDefaultsText() {
  return "Other defaults: an agent or the launcher silent for " +
         std::to_string(kHeartbeatTimeoutMs / 1000) + " s is lost; an SSH connection that fails\n" +
         "transiently is tried " + std::to_string(kSshConnectAttempts) +
         " times; a rank waits at most " + std::to_string(kJoinTimeoutMs / 1000) +
         " s in ringrun_init and " + std::to_string(kDefaultCollectiveTimeoutMs) +
         " ms\nin a collective (RINGRUN_TIMEOUT_MS, e.g. -x RINGRUN_TIMEOUT_MS=5000).\n";
}

const char kHelpOutro[] =
    "Examples:\n"
    "  ringrun -np 4 python train.py\n"
    "  ringrun -np 8 -H a:4,b:4 -x NCCL_DEBUG=INFO ./bench --size 1M\n"
    "  ringrun --hostfile hosts.txt --check-gpu --allreduce\n"
    "\n"
    "Exit status: the first failing rank's code (128+signal if a signal killed it),\n"
    "2 for a usage error, 1 when ringrun itself fails.\n";

std::vector<std::string> Names(const Flag& f) {
  std::istringstream in(f.names);
  return {std::istream_iterator<std::string>(in), std::istream_iterator<std::string>()};
}

// "  -np, --num-proc N", then its help and default from column 34, wrapped at 100.
std::string HelpEntry(const Flag& f) {
  constexpr size_t kColumn = 34, kWidth = 100;
  std::string line = " ";
  for (const std::string& name : Names(f)) line += (line.size() > 1 ? ", " : " ") + name;
  if (*f.metavar) line += std::string(" ") + f.metavar;
  std::string out;
  if (line.size() >= kColumn) out += line + "\n", line.clear();
  line.resize(kColumn, ' ');
  std::istringstream words(std::string(f.help) +
                           (f.default_text.empty() ? "" : " Default: " + f.default_text + "."));
  bool line_empty = true;
  for (std::string word; words >> word;) {
    if (!line_empty && line.size() + 1 + word.size() > kWidth) {
      out += line + "\n";
      line.assign(kColumn, ' ');
      line_empty = true;
    }
    line += (line_empty ? "" : " ") + word;
    line_empty = false;
  }
  return out + line + "\n";
}

ParseOutcome UsageError(std::string message) {
  ParseOutcome out;
  out.kind = ParseOutcome::kExitNow;
  out.exit_code = 2;
  out.message = std::move(message);
  return out;
}

// After every flag: the combinations, then the hosts, the starter and np.
Status Settle(Given& g) {
  Options& o = g.o;
  for (const auto& [name, value] : g.engine_vars) SetVar(&o.exports, name, value);
  if (!o.launcher_address.empty() && !o.network_interface.empty()) {
    return InvalidArgument("--launcher-address and --network-interface cannot be used together");
  }
  if (o.check_gpu && o.check_build) {
    return InvalidArgument("--check-gpu and --check-build cannot be used together");
  }
  if (o.check_gpu_allreduce && !o.check_gpu) {
    return InvalidArgument("--allreduce needs --check-gpu");
  }
  const bool diagnostic = o.check_gpu || o.check_build;
  if (diagnostic && !o.command.empty()) {
    return InvalidArgument(std::string(o.check_gpu ? "--check-gpu" : "--check-build") +
                           " runs no command, but '" + o.command[0] + "' was given");
  }
  if (!diagnostic && o.command.empty()) {
    return InvalidArgument(std::string("no command given; ") + kUsageLine +
                           " (see ringrun --help)");
  }

  if (o.hosts.empty()) {
    // Inside a scheduler's job, its allocation (scheduler_hosts.h).
    Result<std::optional<hosts::SchedulerHosts>> sched = hosts::HostsFromScheduler(g.environ_vars);
    if (!sched.ok()) return sched.status();
    if (sched->has_value()) {
      o.hosts = std::move((*sched)->hosts);
      o.host_source = (*sched)->source;
    }
  }
  Result<hosts::StarterChoice> starter = hosts::ChooseStarter(g.starter, g.environ_vars, o.hosts);
  if (!starter.ok()) return starter.status();
  o.starter = starter->srun ? Options::Starter::kSlurm : Options::Starter::kSsh;
  o.srun_overlap = starter->overlap;
  if (o.hosts.empty()) {
    o.host_source = "none given: this machine";
    if (o.np == 0 && !diagnostic) {
      return InvalidArgument("-np is required when no hosts are given (-H or --hostfile)");
    }
    if (o.np == 0) o.np = 1;
    hosts::HostSpec local;
    local.name = "localhost";
    local.slots = o.np;
    o.hosts.push_back(local);
  } else if (o.np == 0) {
    o.np = hosts::TotalSlots(o.hosts);
  }
  return hosts::CheckNumProc(o.hosts, o.np);
}

}  // namespace

std::string UsageText() {
  std::string out = std::string(kUsageLine) + "\n\n" + kHelpIntro;
  for (const FlagGroup& group : FlagGroups()) {
    out += std::string("\n") + group.name + ":\n";
    for (const Flag& f : group.flags) out += HelpEntry(f);
  }
  return out + "\n" + OtherDefaultsText() + "\n" + kHelpOutro;
}

ParseOutcome ParseCommandLine(int argc, const char* const* argv,
                              const std::vector<std::string>& environ_vars) {
  std::vector<const Kind*> kinds;
  std::vector<FlagSyntax> syntax;
  for (const FlagGroup& group : FlagGroups()) {
    for (const Flag& f : group.flags) {
      kinds.push_back(&f.kind);
      syntax.push_back({Names(f), f.kind.nargs, f.metavar});
    }
  }
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i] ? argv[i] : "");
  Result<MatchedArgs> matched = MatchArgs(syntax, args);
  if (!matched.ok()) return UsageError(matched.status().message());

  ParseOutcome outcome;
  for (const FlagUse& use : matched->uses) {
    if (kinds[use.flag]->answer) {
      outcome.kind = ParseOutcome::kExitNow;
      outcome.message = kinds[use.flag]->answer();
      return outcome;
    }
  }
  Given given(environ_vars);
  given.o.command = std::move(matched->command);
  for (const FlagUse& use : matched->uses) {
    Status st = kinds[use.flag]->apply(use, given);
    if (!st.ok()) return UsageError(st.message());
  }
  Status st = Settle(given);
  if (!st.ok()) return UsageError(st.message());
  outcome.options = std::move(given.o);
  return outcome;
}

}  // namespace ringrun::launcher
