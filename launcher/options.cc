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
#include <set>
#include <sstream>

#include "launcher/config_file.h"
#include "launcher/hosts/placement.h"
#include "launcher/hosts/scheduler_hosts.h"
#include "launcher/hosts/slurm.h"
#include "launcher/job/environment.h"
#include "launcher/job/job_state_machine.h"
#include "launcher/job/restart_policy.h"
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
                                             const std::string& word,
                                             const std::set<std::string>& preferred) {
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
  auto is_preferred = [&](const Reading& r) {
    const auto& names = flags[r.flag].names;
    return std::any_of(names.begin(), names.end(),
                       [&](const std::string& n) { return preferred.count(n) > 0; });
  };
  if (std::count_if(prefixes.begin(), prefixes.end(), is_preferred) == 1) {
    prefixes.erase(std::remove_if(prefixes.begin(), prefixes.end(),
                                  [&](const Reading& r) { return !is_preferred(r); }),
                   prefixes.end());
  }
  return prefixes;
}

bool IsFlag(const std::vector<FlagSyntax>& flags, const std::string& word,
            const std::set<std::string>& preferred) {
  auto readings = ReadWord(flags, word, preferred);
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
                              const std::vector<std::string>& args,
                              const std::set<std::string>& preferred) {
  MatchedArgs out;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& word = args[i];
    if (word == "--") {
      ++i;
      break;
    }
    std::optional<std::vector<Reading>> readings = ReadWord(flags, word, preferred);
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
      if (next == "--" || IsFlag(flags, next, preferred)) {
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
  std::optional<FlagUse> host_flag;    // -H or --hostfile, once given
  std::string starter;                 // --starter; "" for auto
  bool log_level_given = false;        // --log-level, which wins over --verbose
  bool start_timeout_given = false;    // --start-timeout, which wins over HOROVOD_START_TIMEOUT
  bool elastic_timeout_given = false;  // --elastic-timeout, over HOROVOD_ELASTIC_TIMEOUT
  std::vector<std::pair<std::string, std::string>> engine_vars;  // set after -x: the flags win
  void Note(const FlagUse& u, const std::string& text) {
    std::string line = u.spelling + ": " + text;
    if (std::find(o.notes.begin(), o.notes.end(), line) == o.notes.end()) o.notes.push_back(line);
  }
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

Result<double> ParseDecimalFlag(const FlagUse& u, double lo, double hi,
                                const char* what = "a number of seconds") {
  const std::string& text = u.values[0];
  // Decimal only: strtod would also take blanks, hex, exponents, "inf" and "nan".
  bool plain = text.find_first_not_of("0123456789.-") == std::string::npos;
  const char* s = text.c_str();
  char* end = nullptr;
  double v = plain ? std::strtod(s, &end) : 0;
  if (!plain || end == s || *end != '\0' || !std::isfinite(v)) {
    return InvalidArgument(u.spelling + " " + text + ": not " + what);
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

// What a flag makes of its value: the text to set a variable to.
using Convert = std::function<Result<std::string>(const FlagUse&)>;

// A flag that sets variables in every rank: each of `names` to what `convert` makes of it.
Kind SetsVars(std::vector<const char*> names, Convert convert) {
  return Value([=](const FlagUse& u, Given& g) {
    Result<std::string> v = convert(u);
    if (v.ok()) {
      for (const char* name : names) SetVar(&g.engine_vars, name, *v);
    }
    return v.status();
  });
}
// A switch that sets variables in every rank to fixed values.
Kind SetsValues(std::vector<std::pair<const char*, const char*>> vars) {
  return Action([=](const FlagUse&, Given& g) {
    for (const auto& [name, value] : vars) SetVar(&g.engine_vars, name, value);
    return Status();
  });
}
// `kind`, and a note saying what ringrun does instead.
Kind Noted(Kind kind, const char* note) {
  kind.apply = [apply = kind.apply, note](const FlagUse& u, Given& g) {
    g.Note(u, note);
    return apply ? apply(u, g) : Status();
  };
  return kind;
}
Kind Noted(int nargs, const char* note) { return Noted(Kind{nargs, nullptr}, note); }
Convert Decimal(double lo, double hi, const char* what) {
  return [=](const FlagUse& u) -> Result<std::string> {
    Result<double> v = ParseDecimalFlag(u, lo, hi, what);
    if (!v.ok()) return v.status();
    return u.values[0];
  };
}
Convert Seconds(double lo, double hi) { return Decimal(lo, hi, "a number of seconds"); }
Convert Whole(long lo, long hi, long scale = 1, const char* unit = "") {
  return [=](const FlagUse& u) -> Result<std::string> {
    Result<int> v = ParseIntFlag(u, lo, hi, unit);
    if (!v.ok()) return v.status();
    return std::to_string(static_cast<long long>(*v) * scale);
  };
}
Convert AsIs() {
  return [](const FlagUse& u) -> Result<std::string> { return u.values[0]; };
}

// --log-level: Horovod's names (TRACE DEBUG INFO WARNING ERROR FATAL) and ringrun's (warn,
// off), in any case. The launcher and agents log at the spdlog level; every rank gets it too,
// as RINGRUN_LOG_LEVEL, and Horovod's name as HOROVOD_LOG_LEVEL.
Status ApplyLogLevel(const FlagUse& u, Given& g) {
  struct Level {
    const char* name;
    const char* spdlog;
    const char* horovod;
  };
  static const Level kLevels[] = {
      {"trace", "trace", "TRACE"},    {"debug", "debug", "DEBUG"},    {"info", "info", "INFO"},
      {"warn", "warn", "WARNING"},    {"warning", "warn", "WARNING"}, {"error", "error", "ERROR"},
      {"fatal", "critical", "FATAL"}, {"off", "off", "FATAL"},
  };
  std::vector<std::string> names;
  for (const Level& l : kLevels) names.push_back(l.name);
  Result<std::string> v = ParseChoice(u, names);
  if (!v.ok()) return v.status();
  for (const Level& l : kLevels) {
    if (*v != l.name) continue;
    g.o.log_level = l.spdlog;
    g.log_level_given = true;
    SetVar(&g.engine_vars, "RINGRUN_LOG_LEVEL", l.spdlog);
    SetVar(&g.engine_vars, "HOROVOD_LOG_LEVEL", l.horovod);
  }
  return Status();
}

// --log-with-timestamp and its opposites: the launcher's log, and HOROVOD_LOG_HIDE_TIME as
// horovodrun sets it (config_parser.py, set_env_from_args: the flag's complement).
Kind LogTimestamps(bool with) {
  return Action([with](const FlagUse&, Given& g) {
    g.o.log_timestamps = with;
    SetVar(&g.engine_vars, "HOROVOD_LOG_HIDE_TIME", with ? "0" : "1");
    return Status();
  });
}

// --start-timeout, or (`u.spelling` "HOROVOD_START_TIMEOUT") horovodrun's variable for it.
Status ApplyStartTimeout(const FlagUse& u, Given& g) {
  Result<int> s = ParseIntFlag(u, 1, 7 * 24 * 3600, " of seconds");
  if (s.ok()) g.o.start_timeout_s = *s, g.start_timeout_given = true;
  return s.status();
}

static_assert(job::kTimeoutExitCode == 124, "--help and the README say --timeout exits 124");

// --elastic-timeout, or (`u.spelling` "HOROVOD_ELASTIC_TIMEOUT") horovodrun's variable for it.
Status ApplyElasticTimeout(const FlagUse& u, Given& g) {
  Result<int> s = ParseIntFlag(u, 0, 7 * 24 * 3600, " of seconds");
  if (s.ok()) g.o.elastic.elastic_timeout_s = *s, g.elastic_timeout_given = true;
  return s.status();
}

std::string VersionText() { return "ringrun " RINGRUN_VERSION_STRING "\n"; }

// Every flag, in --help's order. Adding a flag is one entry here (and its field in Options).
// horovodrun's own are all here (HorovodrunOptionNames); what each does is in the README.
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
           {"--oversubscribe", "", Switch(&Options::oversubscribe),
            "Allow more ranks than slots: the extra ranks go to the hosts in turn."},
           {"-x", "NAME[=VALUE]", Value([](const FlagUse& u, Given& g) {
              auto kv = job::ParseExportFlag(u.values[0], g.environ_vars);
              if (kv.ok()) SetVar(&g.o.exports, kv->first, kv->second);
              return kv.status();
            }),
            "Set NAME in every rank, to VALUE or to the launcher's value (repeatable)."},
           {"-wdir --wdir", "DIR", Text(&Options::wdir),
            "Working directory of the ranks. Default: the launcher's."},
           {"--config-file", "FILE", Value([](const FlagUse&, Given&) { return Status(); }),
            "Horovod's YAML settings (params, autotune, timeline, stall_check, "
            "library_options, logging); flags on the command line win."},
           {"--start-timeout", "SECONDS",
            Value([](const FlagUse& u, Given& g) { return ApplyStartTimeout(u, g); }),
            "Time for every agent and rank to come up; else HOROVOD_START_TIMEOUT, as in "
            "horovodrun.",
            std::to_string(kDefaultStartTimeoutS)},
           {"--timeout", "SECONDS", Int(&Options::timeout_s, 1, 365 * 24 * 3600, " of seconds"),
            "End the job when it runs longer than this, its restarts included: exit 124. "
            "Default: no limit."},
           {"--max-restarts --max_restarts", "N", Int(&Options::max_restarts, 0, job::kMaxRestarts),
            "When a rank fails, end every rank and start the whole job again on the same hosts, "
            "up to N times (torchrun's flag); ranks get RINGRUN_RESTART_COUNT and "
            "TORCHELASTIC_RESTART_COUNT. The exit code is the last attempt's.",
            "0"},
           {"--grace-period", "SECONDS", Value([](const FlagUse& u, Given& g) {
              Result<double> s = ParseDecimalFlag(u, 0, 3600);
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
           {"--report-bindings", "", Switch(&Options::report_bindings),
            "Print each rank's CPUs as it starts."},
           {"--dry-run", "", Switch(&Options::dry_run),
            "Print the placement table and start nothing."},
       }},
      {"Output",
       {
           {"--output-filename", "DIR", Text(&Options::output_dir),
            "Also write DIR/rank.N/stdout and DIR/rank.N/stderr (N zero-padded to the width "
            "of the last rank)."},
           {"-prefix-timestamp --prefix-output-with-timestamp --prefix-timestamp", "",
            Switch(&Options::prefix_timestamp), "Add a timestamp to every output line."},
           {"--log-level", "LEVEL", Value(ApplyLogLevel),
            "The log level of ringrun and of every rank (RINGRUN_LOG_LEVEL, HOROVOD_LOG_LEVEL): "
            "TRACE, DEBUG, INFO, WARNING (default), ERROR, FATAL, or off; any case."},
           {"--log-with-timestamp", "", LogTimestamps(true),
            "Timestamps in ringrun's log; HOROVOD_LOG_HIDE_TIME=0 in the ranks."},
           {"--log-without-timestamp", "", LogTimestamps(false),
            "No timestamps in ringrun's log; HOROVOD_LOG_HIDE_TIME=1 in the ranks."},
           {"--log-hide-timestamp", "",
            Noted(LogTimestamps(false),
                  "deprecated in horovodrun; same as --log-without-timestamp"),
            "Old name of --log-without-timestamp."},
           {"--no-log-hide-timestamp", "",
            Noted(LogTimestamps(true), "deprecated in horovodrun; same as --log-with-timestamp"),
            "Old name of --log-with-timestamp."},
           {"--verbose", "", Action([](const FlagUse&, Given& g) {
              if (!g.log_level_given) g.o.log_level = "debug";
              return Status();
            }),
            "ringrun's own log at debug, with timestamps (an explicit --log-level wins)."},
       }},
      {"SSH and network",
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
           {"--network-interfaces --network-interface", "IF[,IF...]",
            Value([](const FlagUse& u, Given& g) {
              for (const std::string& name : SplitOn(u.values[0], ',')) {
                if (name.empty())
                  return InvalidArgument(u.spelling + " " + u.values[0] +
                                         ": an empty interface name");
                auto& list = g.o.network_interfaces;
                if (std::find(list.begin(), list.end(), name) == list.end()) list.push_back(name);
              }
              return Status();
            }),
            "Interfaces to use, first first (repeatable): the launcher's address, each rank's "
            "data-plane address on its host, and NCCL_SOCKET_IFNAME."},
           {"--tcp", "", SetsValues({{"NCCL_IB_DISABLE", "1"}}),
            "TCP only: NCCL_IB_DISABLE=1 (ringrun's own data plane is TCP and shared memory)."},
       }},
      {"Engine (Horovod's knobs: each sets HOROVOD_* in every rank, and ringrun's own variable)",
       {
           {"--fusion-threshold-mb", "MB",
            SetsVars({"RINGRUN_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD"},
                     Whole(0, 1 << 20, 1 << 20, " of MiB")),
            "Fusion buffer size in MiB (default 64; 0 disables fusion)."},
           {"--cycle-time-ms", "MS",
            SetsVars({"HOROVOD_CYCLE_TIME"}, Decimal(0, 1e7, "a number of milliseconds")),
            "Horovod's fusion cycle (HOROVOD_CYCLE_TIME)."},
           {"--cache-capacity", "N",
            SetsVars({"RINGRUN_CACHE_CAPACITY", "HOROVOD_CACHE_CAPACITY"}, Whole(0, 1 << 24)),
            "Response cache entries (default 1024; 0 disables)."},
           {"--hierarchical-allreduce", "", SetsValues({{"HOROVOD_HIERARCHICAL_ALLREDUCE", "1"}}),
            "Allreduce within each host, then across hosts."},
           {"--no-hierarchical-allreduce", "",
            SetsValues({{"HOROVOD_HIERARCHICAL_ALLREDUCE", "0"}}),
            "Flat allreduce, fixed (autotune leaves it)."},
           {"--hierarchical-allgather", "", SetsValues({{"HOROVOD_HIERARCHICAL_ALLGATHER", "1"}}),
            "Allgather within each host, then across hosts."},
           {"--no-hierarchical-allgather", "",
            SetsValues({{"HOROVOD_HIERARCHICAL_ALLGATHER", "0"}}),
            "Flat allgather, fixed (autotune leaves it)."},
           {"--torus-allreduce", "",
            Noted(SetsValues({{"HOROVOD_TORUS_ALLREDUCE", "1"}}),
                  "set in the ranks as HOROVOD_TORUS_ALLREDUCE; ringrun has no torus allreduce "
                  "(its two-level allreduce is --hierarchical-allreduce)"),
            "HOROVOD_TORUS_ALLREDUCE (Horovod's 2D NCCL allreduce; none here)."},
           {"--no-torus-allreduce", "", SetsValues({{"HOROVOD_TORUS_ALLREDUCE", "0"}}),
            "HOROVOD_TORUS_ALLREDUCE=0."},
           {"--autotune", "", SetsValues({{"HOROVOD_AUTOTUNE", "1"}}),
            "Tune the knobs not given while training."},
           {"--no-autotune", "", SetsValues({{"HOROVOD_AUTOTUNE", "0"}}), "No autotuning."},
           {"--autotune-log-file", "FILE", SetsVars({"HOROVOD_AUTOTUNE_LOG"}, AsIs()),
            "Autotune's trials, as CSV."},
           {"--autotune-warmup-samples", "N",
            SetsVars({"HOROVOD_AUTOTUNE_WARMUP_SAMPLES"}, Whole(0, 1 << 30)),
            "Samples discarded before tuning (Horovod: 3)."},
           {"--autotune-steps-per-sample", "N",
            SetsVars({"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE"}, Whole(0, 1 << 30)),
            "Steps per sample (Horovod: 10)."},
           {"--autotune-bayes-opt-max-samples", "N",
            SetsVars({"HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES"}, Whole(0, 1 << 30)),
            "Samples per Bayesian optimization (Horovod: 20)."},
           {"--autotune-gaussian-process-noise", "X",
            SetsVars({"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE"},
                     Decimal(0, 1, "a number in [0, 1]")),
            "Noise regularization in [0, 1] (Horovod: 0.8)."},
           {"--timeline-filename", "FILE",
            SetsVars({"RINGRUN_TIMELINE", "HOROVOD_TIMELINE"}, AsIs()),
            "Write a Chrome trace: FILE is rank 0's, with every rank's negotiation, as Horovod's; "
            "rank r's beside it (t.json -> t.1.json, ...)."},
           {"--timeline-mark-cycles", "", SetsValues({{"HOROVOD_TIMELINE_MARK_CYCLES", "1"}}),
            "Mark cycles on the timeline."},
           {"--no-timeline-mark-cycles", "", SetsValues({{"HOROVOD_TIMELINE_MARK_CYCLES", "0"}}),
            "Do not mark cycles."},
           {"--no-stall-check", "",
            SetsValues({{"RINGRUN_STALL_CHECK", "0"}, {"HOROVOD_STALL_CHECK_DISABLE", "1"}}),
            "No stall warnings."},
           {"--stall-check", "",
            SetsValues({{"RINGRUN_STALL_CHECK", "1"}, {"HOROVOD_STALL_CHECK_DISABLE", "0"}}),
            "Stall warnings (the default)."},
           {"--stall-check-warning-time-seconds", "SECONDS",
            SetsVars({"RINGRUN_STALL_WARNING_SECONDS", "HOROVOD_STALL_CHECK_TIME_SECONDS"},
                     Seconds(0.001, 1e7)),
            "Warn about tensors some ranks submitted and others not after this long (default "
            "60)."},
           {"--stall-check-shutdown-time-seconds", "SECONDS",
            SetsVars({"RINGRUN_STALL_SHUTDOWN_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"},
                     Seconds(0, 1e7)),
            "Fail the job when such a stall lasts this long (default: never)."},
           {"--gloo-timeout-seconds", "SECONDS", Value([](const FlagUse& u, Given& g) {
              Result<int> s = ParseIntFlag(u, 1, 1 << 20, " of seconds");
              if (!s.ok()) return s.status();
              SetVar(&g.engine_vars, "RINGRUN_TIMEOUT_MS", std::to_string(*s * 1000LL));
              SetVar(&g.engine_vars, "HOROVOD_GLOO_TIMEOUT_SECONDS", u.values[0]);
              return Status();
            }),
            "Deadline of each wait in a collective (RINGRUN_TIMEOUT_MS)."},
           {"--num-nccl-streams", "N",
            Noted(SetsVars({"HOROVOD_NUM_NCCL_STREAMS"}, Whole(0, 1024)),
                  "set in the ranks as HOROVOD_NUM_NCCL_STREAMS; ringrun's NCCL backend uses "
                  "one stream per device"),
            "HOROVOD_NUM_NCCL_STREAMS."},
           {"--thread-affinity", "CPU",
            Noted(SetsVars({"HOROVOD_THREAD_AFFINITY"}, Whole(0, 1 << 20)),
                  "set in the ranks as HOROVOD_THREAD_AFFINITY; ringrun does not pin its "
                  "background thread (--bind-to core pins whole ranks)"),
            "HOROVOD_THREAD_AFFINITY."},
       }},
      {"Other launchers' flags (accepted: ringrun says what it does instead)",
       {
           {"--gloo", "",
            Noted(0, "ringrun's own controller and data plane run the job in Gloo's place"),
            "Horovod's Gloo controller."},
           {"--mpi", "",
            Noted(0, "ringrun runs no MPI; its own controller and data plane run the job"),
            "Horovod's MPI controller."},
           {"--jsrun", "",
            Noted(0, "ringrun starts its agents over SSH or in an srun step, not with jsrun"),
            "LSF's jsrun."},
           {"--mpi-args", "ARGS",
            Noted(1,
                  "ignored: ringrun starts ranks without mpirun (-x sets variables, "
                  "--bind-to pins)"),
            "Extra mpirun arguments."},
           {"--binding-args", "ARGS", Noted(1, "ignored: ringrun pins ranks with --bind-to core"),
            "mpirun/jsrun binding arguments."},
           {"--mpi-threads-disable", "",
            Noted(SetsValues({{"HOROVOD_MPI_THREADS_DISABLE", "1"}}),
                  "ringrun runs no MPI; HOROVOD_MPI_THREADS_DISABLE=1 is set for mpi4py"),
            "MPI threading off."},
           {"--no-mpi-threads-disable", "", SetsValues({{"HOROVOD_MPI_THREADS_DISABLE", "0"}}),
            "MPI threading on."},
           {"--disable-cache", "",
            Noted(0, "ringrun keeps no cache of start-up checks; it checks every time"),
            "horovodrun's cache of SSH checks."},
       }},
      {"Elastic (horovodrun's flags; hosts from -H, --hostfile, this machine, or a discovery script)",
       {
           {"--min-np --min-num-proc", "N", Value([](const FlagUse& u, Given& g) {
              Result<int> v = ParseIntFlag(u, 1, kMaxNumProc);
              if (v.ok()) g.o.elastic.min_np = *v, g.o.elastic.enabled = true;
              return v.status();
            }),
            "Fewest ranks to go on with; makes the job elastic: a failed rank's host is left "
            "out and the others go on. Default: -np."},
           {"--max-np --max-num-proc", "N", Value([](const FlagUse& u, Given& g) {
              Result<int> v = ParseIntFlag(u, 1, kMaxNumProc);
              if (v.ok()) g.o.elastic.max_np = *v;
              return v.status();
            }),
            "Most ranks of an elastic job (--min-np or --host-discovery-script); alone it makes "
            "nothing elastic, as with horovodrun. Default: -np."},
           {"--slots-per-host", "N", Value([](const FlagUse& u, Given& g) {
              Result<int> v = ParseIntFlag(u, 1, 65536);
              if (v.ok()) g.o.elastic.slots_per_host = *v;
              return v.status();
            }),
            "Slots of a discovered host listed without ':N'.", "1"},
           {"--host-discovery-script", "FILE", Value([](const FlagUse& u, Given& g) {
              if (TrimBlanks(u.values[0]).empty()) {
                return InvalidArgument(u.spelling + ": an empty command");
              }
              g.o.elastic.discovery_script = u.values[0];
              g.o.elastic.enabled = true;
              return Status();
            }),
            "Prints the hosts now available, 'host' or 'host:slots' a line (run by /bin/sh -c); "
            "makes the job elastic, its hosts come and go."},
           {"--discovery-interval", "SECONDS", Value([](const FlagUse& u, Given& g) {
              Result<int> v = ParseIntFlag(u, 1, 24 * 3600, " of seconds");
              if (v.ok()) g.o.elastic.discovery_interval_s = *v;
              return v.status();
            }),
            "Seconds between two runs of the discovery script.",
            std::to_string(elastic::kDiscoveryIntervalS)},
           {"--discovery-timeout", "SECONDS", Value([](const FlagUse& u, Given& g) {
              Result<int> v = ParseIntFlag(u, 1, 24 * 3600, " of seconds");
              if (v.ok()) g.o.elastic.discovery_timeout_s = *v;
              return v.status();
            }),
            "A discovery script still running after this is killed (a failed run).",
            std::to_string(kDiscoveryTimeoutMs / 1000)},
           {"--elastic-timeout", "SECONDS", Value([](const FlagUse& u, Given& g) {
              return ApplyElasticTimeout(u, g);
            }),
            "Wait for enough slots after a change; else HOROVOD_ELASTIC_TIMEOUT.",
            std::to_string(kElasticTimeoutS)},
           {"--reset-limit", "N", Value([](const FlagUse& u, Given& g) {
              Result<int> v = ParseIntFlag(u, 0, 1 << 30);
              if (v.ok()) g.o.elastic.reset_limit = *v;
              return v.status();
            }),
            "End the job when it needs a new generation after N resets. Default: no limit."},
           {"--blacklist-cooldown-range", "MIN MAX", Kind{2, [](const FlagUse& u, Given& g) {
              FlagUse lo = u, hi = u;
              lo.values = {u.values[0]};
              hi.values = {u.values[1]};
              Result<int> a = ParseIntFlag(lo, 0, 7 * 24 * 3600, " of seconds");
              if (!a.ok()) return a.status();
              Result<int> b = ParseIntFlag(hi, 0, 7 * 24 * 3600, " of seconds");
              if (!b.ok()) return b.status();
              if (*b < *a) {
                return InvalidArgument(u.spelling + " " + u.values[0] + " " + u.values[1] +
                                       ": MAX is less than MIN");
              }
              g.o.elastic.cooldown_s = std::make_pair(*a, *b);
              return Status();
            }},
            "Seconds a failed host is left out (the first time MIN to 1.25 MIN, doubling). "
            "Default: for good."},
       }},
      {"Diagnostics",
       {
           {"--check-gpu", "", Switch(&Options::check_gpu),
            "Report the CUDA driver, devices and NCCL of every host; run no command."},
           {"--allreduce", "", Switch(&Options::check_gpu_allreduce),
            "With --check-gpu: also run an NCCL allreduce across every GPU."},
           {"-cb --check-build", "", Switch(&Options::check_build),
            "Print what this build has (backends and library versions)."},
           {"-v --version", "", Answer(VersionText), "Print the version."},
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
    "2 for a usage error, 124 when --timeout ends the job, 1 when ringrun itself fails;\n"
    "with --max-restarts, the last attempt's.\n";

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

// The elastic flags, once np is known.
Status SettleElastic(Given& g) {
  Options& o = g.o;
  Options::Elastic& e = o.elastic;
  if (!e.enabled) {
    // horovodrun's rule (launch.py's _is_elastic): --min-np or a discovery script make a job
    // elastic; --max-np alone does not.
    if (e.max_np != 0) {
      o.notes.push_back("--max-np " + std::to_string(e.max_np) +
                        " without --min-np or --host-discovery-script: the job is not elastic "
                        "(as with horovodrun), so it has no effect");
      e.max_np = 0;
    }
    if (e.reset_limit || e.cooldown_s || e.elastic_timeout_s != kElasticTimeoutS) {
      o.notes.push_back(
          "--reset-limit, --blacklist-cooldown-range and --elastic-timeout apply to elastic jobs "
          "only (--min-np, --host-discovery-script): no effect here");
    }
    return Status();
  }
  if (!g.elastic_timeout_given) {
    const std::string prefix = "HOROVOD_ELASTIC_TIMEOUT=";
    for (const std::string& kv : g.environ_vars) {
      if (kv.compare(0, prefix.size(), prefix) != 0 || kv.size() == prefix.size()) continue;
      RINGRUN_RETURN_IF_ERROR(ApplyElasticTimeout(
          FlagUse{0, "HOROVOD_ELASTIC_TIMEOUT", {kv.substr(prefix.size())}}, g));
      break;
    }
  }
  if (e.min_np == 0) e.min_np = o.np;
  if (e.max_np == 0) e.max_np = std::max(o.np, e.min_np);
  if (e.min_np > o.np) {
    return InvalidArgument("--min-np " + std::to_string(e.min_np) + " is more than -np " +
                           std::to_string(o.np) + ": an elastic job starts with -np ranks");
  }
  if (e.max_np < o.np) {
    return InvalidArgument("--max-np " + std::to_string(e.max_np) + " is less than -np " +
                           std::to_string(o.np));
  }
  if (o.max_restarts > 0) {
    return InvalidArgument(
        "--max-restarts and an elastic job (--min-np, --host-discovery-script) cannot be used "
        "together");
  }
  if (o.check_gpu || o.check_build) {
    return InvalidArgument(std::string(o.check_gpu ? "--check-gpu" : "--check-build") +
                           " runs no job: --min-np and --max-np do not apply");
  }
  if (!e.discovery_script.empty()) return Status();
  if (o.hosts.size() == 1) {
    o.notes.push_back("--min-np: an elastic job on one host (" + o.hosts[0].name +
                      ") ends at its first failure: the failed rank's host is left out");
  }
  if (e.max_np > o.np) {
    o.notes.push_back("--max-np " + std::to_string(e.max_np) +
                      ": a job on a fixed host set never grows past -np " + std::to_string(o.np));
  }
  return Status();
}

// Horovod's variables that horovodrun sets for its own machinery and that a user may have
// exported before calling it: they are not passed to the ranks (job/environment.cc), so the
// launcher says what each means here, once. HOROVOD_GLOO_IFACE chooses the interface as
// --network-interfaces does, unless that flag was given.
void SettleHorovodEnvironment(Given& g) {
  Options& o = g.o;
  auto value_of = [&](std::string_view name) -> std::optional<std::string> {
    for (const std::string& kv : g.environ_vars) {
      if (kv.size() > name.size() && kv.compare(0, name.size(), name) == 0 &&
          kv[name.size()] == '=') {
        return kv.substr(name.size() + 1);
      }
    }
    return std::nullopt;
  };
  auto exported = [&](std::string_view name) {
    for (const auto& [n, v] : o.exports) {
      if (n == name) return true;
    }
    return false;
  };
  if (std::optional<std::string> v = value_of("HOROVOD_GLOO_IFACE"); v && !v->empty()) {
    if (o.network_interfaces.empty()) {
      for (const std::string& name : SplitOn(*v, ',')) {
        auto& list = o.network_interfaces;
        if (!name.empty() && std::find(list.begin(), list.end(), name) == list.end()) {
          list.push_back(name);
        }
      }
      o.notes.push_back("HOROVOD_GLOO_IFACE=" + *v +
                        ": taken as --network-interfaces (the ranks' data-plane interface and "
                        "NCCL_SOCKET_IFNAME)");
    } else {
      o.notes.push_back("HOROVOD_GLOO_IFACE=" + *v + ": --network-interfaces wins over it");
    }
  }
  for (const char* name : {"HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS"}) {
    std::optional<std::string> v = value_of(name);
    if (!v || exported(name)) continue;
    o.notes.push_back(std::string(name) + "=" + *v +
                      ": not passed to the ranks; ringrun's engine is its own controller and "
                      "runs host collectives on its TCP and shared-memory data plane (Horovod's "
                      "gloo, mpi and ccl do not apply)");
  }
}

// After every flag: the combinations, then the hosts, the starter and np.
Status Settle(Given& g) {
  Options& o = g.o;
  if (!g.start_timeout_given) {  // horovodrun's variable, the first as getenv would find it
    const std::string prefix = "HOROVOD_START_TIMEOUT=";
    for (const std::string& kv : g.environ_vars) {
      if (kv.compare(0, prefix.size(), prefix) != 0 || kv.size() == prefix.size()) continue;
      RINGRUN_RETURN_IF_ERROR(
          ApplyStartTimeout(FlagUse{0, "HOROVOD_START_TIMEOUT", {kv.substr(prefix.size())}}, g));
      break;
    }
  }
  SettleHorovodEnvironment(g);
  if (!o.network_interfaces.empty()) {
    std::string list;
    for (const std::string& name : o.network_interfaces) list += (list.empty() ? "" : ",") + name;
    SetVar(&g.engine_vars, "NCCL_SOCKET_IFNAME", list);
  }
  for (const auto& [name, value] : g.engine_vars) SetVar(&o.exports, name, value);
  if (o.check_gpu && o.check_build) {
    return InvalidArgument("--check-gpu and --check-build cannot be used together");
  }
  if (o.check_gpu_allreduce && !o.check_gpu) {
    return InvalidArgument("--allreduce needs --check-gpu");
  }
  const bool diagnostic = o.check_gpu || o.check_build;
  if (o.check_gpu && !o.command.empty()) {
    return InvalidArgument("--check-gpu runs no command, but '" + o.command[0] + "' was given");
  }
  if (o.check_build && !o.command.empty()) {
    // horovodrun's --check-build prints the build and exits 0 whatever else is on the line
    // (launch.py: check_build() ends in sys.exit(0)); a script written for it gets the same.
    o.notes.push_back("--check-build: the command ('" + o.command[0] +
                      "' ...) is not run, as with horovodrun");
    o.command.clear();
  }
  if (!diagnostic && o.command.empty()) {
    return InvalidArgument(std::string("no command given; ") + kUsageLine +
                           " (see ringrun --help)");
  }

  if (!o.elastic.discovery_script.empty()) {
    // The hosts come from the script, run before the placement (main.cc); ranks start over SSH
    // or on this machine.
    if (g.host_flag) {
      return InvalidArgument("--host-discovery-script and " + g.host_flag->spelling +
                             " cannot be used together: the script lists the hosts");
    }
    if (g.starter == "slurm") {
      return InvalidArgument(
          "--host-discovery-script runs its hosts' agents over SSH: not with "
          "--starter slurm");
    }
    if (o.np == 0) o.np = o.elastic.min_np;
    if (o.np == 0) {
      return InvalidArgument(
          "--host-discovery-script needs -np (or --min-np): the ranks to "
          "start with");
    }
    o.starter = Options::Starter::kSsh;
    o.host_source = "--host-discovery-script " + o.elastic.discovery_script;
    return SettleElastic(g);
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
  RINGRUN_RETURN_IF_ERROR(hosts::CheckNumProc(o.hosts, o.np, o.oversubscribe));
  return SettleElastic(g);
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

const std::set<std::string>& HorovodrunOptionNames() {
  // horovod/runner/launch.py, parse_args(): every option string, in its order.
  static const std::set<std::string> kNames = {"-h",
                                               "--help",
                                               "-v",
                                               "--version",
                                               "-np",
                                               "--num-proc",
                                               "-cb",
                                               "--check-build",
                                               "--disable-cache",
                                               "--start-timeout",
                                               "--network-interfaces",
                                               "--network-interface",
                                               "--output-filename",
                                               "--verbose",
                                               "--config-file",
                                               "-p",
                                               "--ssh-port",
                                               "-i",
                                               "--ssh-identity-file",
                                               "--fusion-threshold-mb",
                                               "--cycle-time-ms",
                                               "--cache-capacity",
                                               "--hierarchical-allreduce",
                                               "--no-hierarchical-allreduce",
                                               "--hierarchical-allgather",
                                               "--no-hierarchical-allgather",
                                               "--torus-allreduce",
                                               "--no-torus-allreduce",
                                               "--autotune",
                                               "--no-autotune",
                                               "--autotune-log-file",
                                               "--autotune-warmup-samples",
                                               "--autotune-steps-per-sample",
                                               "--autotune-bayes-opt-max-samples",
                                               "--autotune-gaussian-process-noise",
                                               "--min-np",
                                               "--min-num-proc",
                                               "--max-np",
                                               "--max-num-proc",
                                               "--slots-per-host",
                                               "--elastic-timeout",
                                               "--reset-limit",
                                               "--blacklist-cooldown-range",
                                               "--timeline-filename",
                                               "--timeline-mark-cycles",
                                               "--no-timeline-mark-cycles",
                                               "--no-stall-check",
                                               "--stall-check",
                                               "--stall-check-warning-time-seconds",
                                               "--stall-check-shutdown-time-seconds",
                                               "--mpi-threads-disable",
                                               "--no-mpi-threads-disable",
                                               "--mpi-args",
                                               "--tcp",
                                               "--binding-args",
                                               "--num-nccl-streams",
                                               "--thread-affinity",
                                               "--gloo-timeout-seconds",
                                               "--log-level",
                                               "--log-with-timestamp",
                                               "--log-without-timestamp",
                                               "-prefix-timestamp",
                                               "--prefix-output-with-timestamp",
                                               "--log-hide-timestamp",
                                               "--no-log-hide-timestamp",
                                               "-H",
                                               "--hosts",
                                               "-hostfile",
                                               "--hostfile",
                                               "--host-discovery-script",
                                               "--gloo",
                                               "--mpi",
                                               "--jsrun"};
  return kNames;
}

namespace {

// horovodrun's mutually exclusive groups (argparse's add_mutually_exclusive_group): at most
// one of each on the command line. (-H and --hostfile are checked where they are read.)
const std::vector<std::vector<std::string>>& ExclusiveFlags() {
  static const std::vector<std::vector<std::string>> kGroups = {
      {"--hierarchical-allreduce", "--no-hierarchical-allreduce"},
      {"--hierarchical-allgather", "--no-hierarchical-allgather"},
      {"--torus-allreduce", "--no-torus-allreduce"},
      {"--autotune", "--no-autotune"},
      {"--timeline-mark-cycles", "--no-timeline-mark-cycles"},
      {"--no-stall-check", "--stall-check"},
      {"--mpi-threads-disable", "--no-mpi-threads-disable"},
      {"--log-with-timestamp", "--log-without-timestamp", "--prefix-output-with-timestamp",
       "--log-hide-timestamp", "--no-log-hide-timestamp"},
      {"--gloo", "--mpi", "--jsrun"},
  };
  return kGroups;
}

// The flag named `name` exactly (a name of the table).
size_t FlagNamed(const std::vector<FlagSyntax>& syntax, const std::string& name) {
  for (size_t i = 0; i < syntax.size(); ++i) {
    const auto& n = syntax[i].names;
    if (std::find(n.begin(), n.end(), name) != n.end()) return i;
  }
  return syntax.size();
}

// The settings of --config-file `path` as flag uses, spelled "FILE:LINE: KEY", leaving out
// those that a flag on the command line overrides.
Result<std::vector<FlagUse>> ConfigUses(const std::string& path,
                                        const std::vector<FlagSyntax>& syntax,
                                        const std::vector<bool>& on_command_line, Given& g) {
  Result<ConfigFlags> file = ReadConfigFlags(path);
  if (!file.ok()) return file.status();
  g.o.notes.insert(g.o.notes.end(), file->notes.begin(), file->notes.end());
  std::vector<FlagUse> uses;
  for (const ConfigFlag& f : file->flags) {
    if (std::any_of(f.overridden_by.begin(), f.overridden_by.end(),
                    [&](const std::string& n) { return on_command_line[FlagNamed(syntax, n)]; })) {
      continue;
    }
    FlagUse use{FlagNamed(syntax, f.flag), f.where, {}};
    if (f.value) use.values.push_back(*f.value);
    uses.push_back(std::move(use));
  }
  return uses;
}

}  // namespace

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
  Result<MatchedArgs> matched = MatchArgs(syntax, args, HorovodrunOptionNames());
  if (!matched.ok()) return UsageError(matched.status().message());

  ParseOutcome outcome;
  for (const FlagUse& use : matched->uses) {
    if (kinds[use.flag]->answer) {
      outcome.kind = ParseOutcome::kExitNow;
      outcome.message = kinds[use.flag]->answer();
      return outcome;
    }
  }
  std::vector<bool> on_command_line(syntax.size(), false);
  for (const FlagUse& use : matched->uses) on_command_line[use.flag] = true;
  for (const auto& group : ExclusiveFlags()) {
    const FlagUse* first = nullptr;
    for (const FlagUse& use : matched->uses) {
      if (std::none_of(group.begin(), group.end(),
                       [&](const std::string& n) { return FlagNamed(syntax, n) == use.flag; })) {
        continue;
      }
      if (first == nullptr) first = &use;
      if (first->flag != use.flag) {
        return UsageError(first->spelling + " and " + use.spelling + " cannot be used together");
      }
    }
  }

  Given given_flags(environ_vars);
  given_flags.o.command = std::move(matched->command);
  // --config-file's settings come first, so that the command line's flags win.
  std::vector<FlagUse> uses;
  const FlagUse* config = nullptr;
  for (const FlagUse& use : matched->uses) {
    if (use.flag == FlagNamed(syntax, "--config-file")) config = &use;  // the last, as argparse
  }
  if (config != nullptr) {
    Result<std::vector<FlagUse>> from_file =
        ConfigUses(config->values[0], syntax, on_command_line, given_flags);
    if (!from_file.ok()) return UsageError(from_file.status().message());
    uses = std::move(from_file.value());
  }
  uses.insert(uses.end(), matched->uses.begin(), matched->uses.end());
  for (const FlagUse& use : uses) {
    Status st = kinds[use.flag]->apply(use, given_flags);
    if (!st.ok()) return UsageError(st.message());
  }
  Status st = Settle(given_flags);
  if (!st.ok()) return UsageError(st.message());
  outcome.options = std::move(given_flags.o);
  return outcome;
}

}  // namespace ringrun::launcher
