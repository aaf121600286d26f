#include "launcher/options.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>

#include "launcher/hosts/placement.h"
#include "launcher/hosts/scheduler_hosts.h"
#include "launcher/hosts/slurm.h"
#include "launcher/job/environment.h"
#include "ringrun/common/defaults.h"
#include "ringrun/common/strings.h"
#include "ringrun/common/version.h"

namespace ringrun::launcher {
namespace {

// Why the argv is split before CLI11 sees it: the command starts at the first word that is not
// an option or an option's value, and everything from there on belongs to the command, flags
// included ("ringrun -np 2 python -u x.py --lr 1"). That needs to know which flags take a value,
// and horovodrun's spellings include "-np" and "-hostfile", which CLI11 cannot name. So a
// table below lists every flag with its spellings; a first pass finds the command and checks
// spellings and values are present, naming the flag as the user wrote it; CLI11 then parses the
// option part, rewritten to canonical "--long=value" words, and renders --help.

enum class FlagId {
  kNumProc,
  kHosts,
  kHostfile,
  kExport,
  kStartTimeout,
  kGracePeriod,
  kOutputFilename,
  kPrefixTimestamp,
  kDryRun,
  kLogLevel,
  kVerbose,
  kVersion,
  kHelp,
  kSshIdentityFile,
  kSshPort,
  kSshKnownHosts,
  kSshAcceptNewHostKeys,
  kSshFanout,
  kSshConnectTimeout,
  kAgentPath,
  kLauncherAddress,
  kNetworkInterface,
  kWdir,
  kCheckGpu,
  kAllreduce,
  kCheckBuild,
  kStarter,
  kBindTo,
  kFusionThresholdMb,
  kCacheCapacity,
  kNoStallCheck,
  kStallWarningTime,
  kStallShutdownTime,
  kTimelineFilename,
};

struct FlagDef {
  FlagId id;
  const char* cli_names;        // as given to CLI11 (one long name, maybe one short)
  const char* long_name;        // canonical "--name" fed to CLI11
  const char* extra_spellings;  // accepted too, space-separated (horovodrun's "-np", ...)
  bool takes_value;
  bool repeatable;  // -x: every occurrence counts; others: the last one wins
  const char* group;
  const char* value_name;
  const char* help;
};

constexpr FlagDef kFlags[] = {
    {FlagId::kNumProc, "--num-proc", "--num-proc", "-np", true, false, "Job", "N",
     "Number of ranks. Default: the total of the slots; required without hosts."},
    {FlagId::kHosts, "-H,--hosts", "--hosts", "", true, false, "Job", "HOST[:SLOTS],...",
     "Hosts and their slots, e.g. a:4,b:4 (a bare host has 1 slot; user@host allowed)."},
    {FlagId::kHostfile, "--hostfile", "--hostfile", "-hostfile", true, false, "Job", "FILE",
     "File of hosts: lines 'host slots=N', 'host:N' or 'host'; '#' comments."},
    {FlagId::kExport, "-x", "-x", "", true, true, "Job", "NAME[=VALUE]",
     "Set NAME in every rank, to VALUE or to the launcher's value (repeatable)."},
    {FlagId::kWdir, "--wdir", "--wdir", "", true, false, "Job", "DIR",
     "Working directory of the ranks. Default: the launcher's."},
    {FlagId::kStartTimeout, "--start-timeout", "--start-timeout", "", true, false, "Job", "SECONDS",
     "Time for every agent and rank to come up."},
    {FlagId::kGracePeriod, "--grace-period", "--grace-period", "", true, false, "Job", "SECONDS",
     "Time between SIGTERM and SIGKILL at teardown; fractions allowed."},
    {FlagId::kStarter, "--starter", "--starter", "", true, false, "Job", "ssh|slurm|auto",
     "How agents start: SSH, one srun step, or auto (srun inside a Slurm job; default)."},
    {FlagId::kBindTo, "--bind-to", "--bind-to", "", true, false, "Job", "none|core",
     "core: pin each rank to its own share of the host's CPUs; none: no pinning (jobs sharing "
     "a host would share its first cores)."},
    {FlagId::kDryRun, "--dry-run", "--dry-run", "", false, false, "Job", "",
     "Print the placement table and start nothing."},
    {FlagId::kOutputFilename, "--output-filename", "--output-filename", "", true, false, "Output",
     "DIR", "Also write DIR/rank.N/stdout and DIR/rank.N/stderr."},
    {FlagId::kPrefixTimestamp, "--prefix-timestamp", "--prefix-timestamp", "", false, false,
     "Output", "", "Add a timestamp to every output line."},
    {FlagId::kLogLevel, "--log-level", "--log-level", "", true, false, "Output", "LEVEL",
     "ringrun's own log: trace, debug, info, warn (default), error or off."},
    {FlagId::kVerbose, "--verbose", "--verbose", "", false, false, "Output", "",
     "Same as --log-level debug (an explicit --log-level wins)."},
    {FlagId::kSshIdentityFile, "-i,--ssh-identity-file", "--ssh-identity-file", "", true, false,
     "SSH", "FILE", "Private key. Default: ssh-agent, then the default keys."},
    {FlagId::kSshPort, "-p,--ssh-port", "--ssh-port", "", true, false, "SSH", "PORT",
     "SSH port. Default: ~/.ssh/config, or 22."},
    {FlagId::kSshKnownHosts, "--ssh-known-hosts", "--ssh-known-hosts", "", true, false, "SSH",
     "FILE", "known_hosts file. Default: ~/.ssh/known_hosts."},
    {FlagId::kSshAcceptNewHostKeys, "--ssh-accept-new-host-keys", "--ssh-accept-new-host-keys", "",
     false, false, "SSH", "",
     "Accept and record unknown host keys (changed keys are still refused)."},
    {FlagId::kSshFanout, "--ssh-fanout", "--ssh-fanout", "", true, false, "SSH", "N",
     "SSH connections made at once."},
    {FlagId::kSshConnectTimeout, "--ssh-connect-timeout", "--ssh-connect-timeout", "", true, false,
     "SSH", "SECONDS", "Timeout of each step of one SSH connection attempt."},
    {FlagId::kAgentPath, "--agent-path", "--agent-path", "", true, false, "SSH", "PATH",
     "ringrun-agent on remote hosts. Default: the same absolute path as here."},
    {FlagId::kLauncherAddress, "--launcher-address", "--launcher-address", "", true, false, "SSH",
     "ADDR", "Address agents use to reach the launcher."},
    {FlagId::kNetworkInterface, "--network-interface", "--network-interface", "", true, false,
     "SSH", "IFACE", "Take the launcher's address from this interface."},
    {FlagId::kFusionThresholdMb, "--fusion-threshold-mb", "--fusion-threshold-mb", "", true, false,
     "Engine", "MB",
     "Fusion buffer size in MiB (default 64; 0 disables fusion). Sets RINGRUN_FUSION_THRESHOLD."},
    {FlagId::kCacheCapacity, "--cache-capacity", "--cache-capacity", "", true, false, "Engine", "N",
     "Response cache entries (default 1024; 0 disables). Sets RINGRUN_CACHE_CAPACITY."},
    {FlagId::kNoStallCheck, "--no-stall-check", "--no-stall-check", "", false, false, "Engine", "",
     "No stall warnings. Sets RINGRUN_STALL_CHECK=0."},
    {FlagId::kStallWarningTime, "--stall-check-warning-time-seconds",
     "--stall-check-warning-time-seconds", "", true, false, "Engine", "SECONDS",
     "Warn about tensors some ranks submitted and others not after this long (default 60)."},
    {FlagId::kStallShutdownTime, "--stall-check-shutdown-time-seconds",
     "--stall-check-shutdown-time-seconds", "", true, false, "Engine", "SECONDS",
     "Fail the job when such a stall lasts this long (default: never)."},
    {FlagId::kTimelineFilename, "--timeline-filename", "--timeline-filename", "", true, false,
     "Engine", "FILE",
     "Write a Chrome trace per rank: FILE with the rank before its extension (t.json -> "
     "t.0.json)."},
    {FlagId::kCheckGpu, "--check-gpu", "--check-gpu", "", false, false, "Diagnostics", "",
     "Report the CUDA driver, devices and NCCL of every host; run no command."},
    {FlagId::kAllreduce, "--allreduce", "--allreduce", "", false, false, "Diagnostics", "",
     "With --check-gpu: also run an NCCL allreduce across every GPU."},
    {FlagId::kCheckBuild, "--check-build", "--check-build", "-cb", false, false, "Diagnostics", "",
     "Print what this build has (backends and library versions)."},
    {FlagId::kVersion, "--version", "--version", "", false, false, "Diagnostics", "",
     "Print the version."},
    {FlagId::kHelp, "-h,--help", "--help", "", false, false, "Diagnostics", "", "Print this help."},
};

// Far beyond any real job; it keeps a typo like "-np 40000000" from starting a fork storm.
constexpr int kMaxNumProc = 1 << 20;

const char kUsageLine[] = "Usage: ringrun [OPTIONS] [--] COMMAND [ARGS...]";

std::vector<std::string> SplitSpaces(const char* s) {
  std::vector<std::string> out;
  std::string cur;
  for (; *s; ++s) {
    if (*s == ' ') {
      if (!cur.empty()) out.push_back(cur), cur.clear();
    } else {
      cur.push_back(*s);
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

// Every spelling of a flag: CLI11's names and the extra ones.
std::vector<std::string> Spellings(const FlagDef& def) {
  std::vector<std::string> out;
  std::string names = def.cli_names;
  for (char& c : names) c = c == ',' ? ' ' : c;
  for (auto& s : SplitSpaces(names.c_str())) out.push_back(s);
  for (auto& s : SplitSpaces(def.extra_spellings)) out.push_back(s);
  return out;
}

const FlagDef* FindExact(const std::string& spelling) {
  for (const FlagDef& def : kFlags) {
    for (const std::string& s : Spellings(def)) {
      if (s == spelling) return &def;
    }
  }
  return nullptr;
}

std::string Suggest(const std::string& word) {
  std::string best;
  int best_d = 3;
  for (const FlagDef& def : kFlags) {
    for (const std::string& s : Spellings(def)) {
      if (s.size() < 4) continue;  // "-x", "-np": too short to guess from
      int d = EditDistance(word, s);
      if (d < best_d) best_d = d, best = s;
    }
  }
  return best.empty() ? "" : " (did you mean " + best + "?)";
}

// One option occurrence from the first pass.
struct Occurrence {
  const FlagDef* def;
  std::string spelling;  // as the user wrote it, for messages
  std::string value;
};

// A word after which an option's value cannot start: a known flag.
bool LooksLikeKnownFlag(const std::string& word) {
  if (word.size() < 2 || word[0] != '-') return false;
  return FindExact(word.substr(0, word.find('='))) != nullptr;
}

struct FirstPass {
  std::vector<Occurrence> options;
  std::vector<std::string> command;
};

Result<FirstPass> SplitArgv(int argc, const char* const* argv) {
  FirstPass out;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string word = argv[i] ? argv[i] : "";
    if (word == "--") {
      ++i;
      break;
    }
    if (word.size() < 2 || word[0] != '-') break;  // the command starts here

    const FlagDef* def = nullptr;
    std::string spelling = word;
    std::optional<std::string> inline_value;
    if ((def = FindExact(word)) == nullptr) {
      size_t eq = word.find('=');
      if (eq != std::string::npos && (def = FindExact(word.substr(0, eq))) != nullptr) {
        spelling = word.substr(0, eq);
        inline_value = word.substr(eq + 1);
      } else if (word[1] != '-' && (def = FindExact(word.substr(0, 2))) != nullptr &&
                 def->takes_value) {
        // "-Ha:2", "-p2222", "-xFOO=1": a one-letter flag with its value attached.
        spelling = word.substr(0, 2);
        inline_value = word.substr(2);
      } else {
        return InvalidArgument("unknown flag " + word + Suggest(word.substr(0, eq)) +
                               "; see ringrun --help");
      }
    }
    if (!def->takes_value) {
      if (inline_value) return InvalidArgument(spelling + " takes no value (got '" + word + "')");
      out.options.push_back({def, spelling, ""});
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= argc) {
        return InvalidArgument(spelling + " needs a value (" + def->value_name + ")");
      }
      std::string next = argv[i + 1] ? argv[i + 1] : "";
      if (next == "--" || LooksLikeKnownFlag(next)) {
        return InvalidArgument(spelling + " needs a value (" + def->value_name + "), but " + next +
                               " follows it");
      }
      inline_value = next;
      ++i;
    }
    if (inline_value->empty()) {
      return InvalidArgument(spelling + " needs a value (" + def->value_name + "), got ''");
    }
    out.options.push_back({def, spelling, *inline_value});
  }
  for (; i < argc; ++i) out.command.emplace_back(argv[i] ? argv[i] : "");
  return out;
}

// Strict decimal integer in [lo, hi]; messages name the flag as written.
Result<int> ParseIntFlag(const std::string& spelling, const std::string& text, long lo, long hi,
                         const char* unit = "") {
  const char* s = text.c_str();
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(s, &end, 10);
  // strtol would also take leading blanks and '+'; a flag value is digits with an optional '-'.
  bool plain =
      !text.empty() && (std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '-');
  if (!plain || *end != '\0' || end == s) {
    return InvalidArgument(spelling + " " + text + ": not a whole number" + unit);
  }
  if (errno == ERANGE || v > hi) {
    return InvalidArgument(spelling + " " + text + ": must be at most " + std::to_string(hi));
  }
  if (v < lo)
    return InvalidArgument(spelling + " " + text + ": must be at least " + std::to_string(lo));
  return static_cast<int>(v);
}

Result<double> ParseSecondsFlag(const std::string& spelling, const std::string& text, double lo,
                                double hi) {
  // Decimal only: strtod would also take blanks, hex, exponents, "inf" and "nan".
  bool plain = !text.empty() && text.find_first_not_of("0123456789.-") == std::string::npos;
  const char* s = text.c_str();
  char* end = nullptr;
  double v = plain ? std::strtod(s, &end) : 0;
  if (!plain || end == s || *end != '\0' || !std::isfinite(v)) {
    return InvalidArgument(spelling + " " + text + ": not a number of seconds");
  }
  if (v < lo)
    return InvalidArgument(spelling + " " + text + ": must be at least " +
                           CLI::detail::to_string(lo));
  if (v > hi)
    return InvalidArgument(spelling + " " + text + ": must be at most " +
                           CLI::detail::to_string(hi));
  return v;
}

const char kHelpIntro[] =
    "Start COMMAND as a distributed job, one rank per slot, horovodrun-style.\n"
    "Everything after the first word that is neither an option nor an option's value (or\n"
    "after --) is the command; it reaches every rank byte for byte, with no shell between.\n";

// The default --help shows beside a flag, from defaults.h; empty for none.
std::string DefaultText(FlagId id) {
  switch (id) {
    case FlagId::kStartTimeout:
      return std::to_string(kDefaultStartTimeoutS);
    case FlagId::kGracePeriod:
      return kDefaultGraceMs % 1000 == 0 ? std::to_string(kDefaultGraceMs / 1000)
                                         : std::to_string(kDefaultGraceMs / 1000.0);
    case FlagId::kBindTo:
      return "none";
    case FlagId::kSshFanout:
      return std::to_string(kSshFanout);
    case FlagId::kSshConnectTimeout:
      return std::to_string(kSshConnectTimeoutS);
    default:
      return "";
  }
}

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

// Usage comes from us (CLI11 would say "[OPTIONS]" only), and the horovodrun spellings CLI11
// cannot hold as names are shown beside the canonical ones.
class UsageFormatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App*, std::string) const override { return ""; }
  std::string make_option_name(const CLI::Option* opt, bool positional) const override {
    std::string name = CLI::Formatter::make_option_name(opt, positional);
    for (const FlagDef& def : kFlags) {
      if (*def.extra_spellings && opt->check_name(def.long_name)) {
        return std::string(def.extra_spellings) + "," + name;
      }
    }
    return name;
  }
};

// The option values as CLI11 leaves them.
struct RawValues {
  std::map<FlagId, std::string> value;
  std::vector<std::string> exports;
  std::map<FlagId, bool> flag;
};

std::unique_ptr<CLI::App> MakeApp(RawValues* raw) {
  auto app = std::make_unique<CLI::App>("", "ringrun");
  auto formatter = std::make_shared<UsageFormatter>();
  formatter->column_width(34);
  app->formatter(formatter);
  app->set_help_flag();  // --help is ours: it must not throw or print
  for (const FlagDef& def : kFlags) {
    std::string help = def.help;
    const std::string default_text = DefaultText(def.id);
    if (!default_text.empty()) help += " Default: " + default_text + ".";
    CLI::Option* opt = nullptr;
    if (def.id == FlagId::kExport) {
      opt = app->add_option(def.cli_names, raw->exports, help)->type_name(def.value_name);
      opt->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)->allow_extra_args(false);
    } else if (def.takes_value) {
      opt = app->add_option(def.cli_names, raw->value[def.id], help)->type_name(def.value_name);
      opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    } else {
      opt = app->add_flag(def.cli_names, raw->flag[def.id], help);
    }
    opt->group(def.group);
  }
  return app;
}

ParseOutcome UsageError(std::string message) {
  ParseOutcome out;
  out.kind = ParseOutcome::kExitNow;
  out.exit_code = 2;
  out.message = std::move(message);
  return out;
}

}  // namespace

std::string UsageText() {
  RawValues raw;
  std::string options = MakeApp(&raw)->help();
  while (!options.empty() && (options.back() == '\n' || options.back() == ' ')) options.pop_back();
  return std::string(kUsageLine) + "\n\n" + kHelpIntro + "\n" + options + "\n\n" +
         OtherDefaultsText() + "\n" + kHelpOutro;
}

ParseOutcome ParseCommandLine(int argc, const char* const* argv,
                              const std::vector<std::string>& environ_vars) {
  Result<FirstPass> split = SplitArgv(argc, argv);
  if (!split.ok()) return UsageError(split.status().message());
  FirstPass& pass = split.value();

  // Spelling of each flag as last written, and the -H/--hostfile repeat check.
  std::map<FlagId, std::string> spelled;
  for (const Occurrence& occ : pass.options) {
    if ((occ.def->id == FlagId::kHosts || occ.def->id == FlagId::kHostfile) &&
        spelled.count(occ.def->id)) {
      return UsageError(occ.spelling + " given twice; list every host in one " + occ.spelling);
    }
    spelled[occ.def->id] = occ.spelling;
  }
  auto given = [&](FlagId id) { return spelled.count(id) != 0; };
  auto name_of = [&](FlagId id) -> std::string {
    auto it = spelled.find(id);
    if (it != spelled.end()) return it->second;
    for (const FlagDef& def : kFlags) {
      if (def.id == id) return def.long_name;
    }
    return "?";
  };

  ParseOutcome outcome;
  if (given(FlagId::kHelp)) {
    outcome.kind = ParseOutcome::kExitNow;
    outcome.message = UsageText();
    return outcome;
  }
  if (given(FlagId::kVersion)) {
    outcome.kind = ParseOutcome::kExitNow;
    outcome.message = "ringrun " RINGRUN_VERSION_STRING "\n";
    return outcome;
  }

  // CLI11 parses the option words, rewritten to canonical "--long=value" ("-x" keeps its
  // short form, with the value attached, so that a value starting with '-' stays a value).
  std::vector<std::string> words = {"ringrun"};
  for (const Occurrence& occ : pass.options) {
    if (!occ.def->takes_value) {
      words.push_back(occ.def->long_name);
    } else if (occ.def->id == FlagId::kExport) {
      words.push_back(std::string("-x") + occ.value);
    } else {
      words.push_back(std::string(occ.def->long_name) + "=" + occ.value);
    }
  }
  RawValues raw;
  std::unique_ptr<CLI::App> app = MakeApp(&raw);
  try {
    std::vector<const char*> cargv;
    for (const std::string& w : words) cargv.push_back(w.c_str());
    app->parse(static_cast<int>(cargv.size()), cargv.data());
  } catch (const CLI::ParseError& e) {
    return UsageError(e.what());
  }
  auto value = [&](FlagId id) -> const std::string& { return raw.value[id]; };
  auto flag = [&](FlagId id) { return raw.flag[id]; };

  Options& o = outcome.options;
  o.command = std::move(pass.command);
  o.prefix_timestamp = flag(FlagId::kPrefixTimestamp);
  o.dry_run = flag(FlagId::kDryRun);
  o.ssh_accept_new_host_keys = flag(FlagId::kSshAcceptNewHostKeys);
  o.check_gpu = flag(FlagId::kCheckGpu);
  o.check_gpu_allreduce = flag(FlagId::kAllreduce);
  o.check_build = flag(FlagId::kCheckBuild);

  if (given(FlagId::kNumProc)) {
    Result<int> np =
        ParseIntFlag(name_of(FlagId::kNumProc), value(FlagId::kNumProc), 1, kMaxNumProc);
    if (!np.ok()) return UsageError(np.status().message());
    o.np = *np;
  }
  if (given(FlagId::kStartTimeout)) {
    Result<int> t = ParseIntFlag(name_of(FlagId::kStartTimeout), value(FlagId::kStartTimeout), 1,
                                 7 * 24 * 3600, " of seconds");
    if (!t.ok()) return UsageError(t.status().message());
    o.start_timeout_s = *t;
  }
  if (given(FlagId::kGracePeriod)) {
    Result<double> g =
        ParseSecondsFlag(name_of(FlagId::kGracePeriod), value(FlagId::kGracePeriod), 0, 3600);
    if (!g.ok()) return UsageError(g.status().message());
    o.grace_ms = static_cast<int>(std::llround(*g * 1000.0));
  }
  if (given(FlagId::kSshPort)) {
    Result<int> p = ParseIntFlag(name_of(FlagId::kSshPort), value(FlagId::kSshPort), 1, 65535);
    if (!p.ok()) return UsageError(p.status().message());
    o.ssh_port = *p;
  }
  if (given(FlagId::kSshFanout)) {
    Result<int> f = ParseIntFlag(name_of(FlagId::kSshFanout), value(FlagId::kSshFanout), 1, 4096);
    if (!f.ok()) return UsageError(f.status().message());
    o.ssh_fanout = *f;
  }
  if (given(FlagId::kSshConnectTimeout)) {
    Result<int> t = ParseIntFlag(name_of(FlagId::kSshConnectTimeout),
                                 value(FlagId::kSshConnectTimeout), 1, 3600, " of seconds");
    if (!t.ok()) return UsageError(t.status().message());
    o.ssh_connect_timeout_s = *t;
  }
  if (given(FlagId::kLogLevel)) {
    std::string level = value(FlagId::kLogLevel);
    for (char& c : level) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    static const char* const kLevels[] = {"trace", "debug", "info", "warn", "error", "off"};
    bool known = false;
    for (const char* l : kLevels) known = known || level == l;
    if (!known) {
      return UsageError(name_of(FlagId::kLogLevel) + " " + value(FlagId::kLogLevel) +
                        ": not one of trace, debug, info, warn, error, off");
    }
    o.log_level = level;
  } else if (flag(FlagId::kVerbose)) {
    o.log_level = "debug";
  }
  if (given(FlagId::kBindTo)) {
    std::string bind = value(FlagId::kBindTo);
    for (char& c : bind) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (bind == "core") {
      o.bind_to = Options::BindTo::kCore;
    } else if (bind != "none") {
      return UsageError(name_of(FlagId::kBindTo) + " " + value(FlagId::kBindTo) +
                        ": not one of none, core");
    }
  }
  if (given(FlagId::kSshIdentityFile)) {
    o.ssh_identity_file = value(FlagId::kSshIdentityFile);
    if (::access(o.ssh_identity_file.c_str(), R_OK) != 0) {
      return UsageError(name_of(FlagId::kSshIdentityFile) + " " + o.ssh_identity_file + ": " +
                        std::strerror(errno));
    }
  }
  o.output_dir = value(FlagId::kOutputFilename);
  o.ssh_known_hosts = value(FlagId::kSshKnownHosts);
  o.agent_path = value(FlagId::kAgentPath);
  o.launcher_address = value(FlagId::kLauncherAddress);
  o.network_interface = value(FlagId::kNetworkInterface);
  o.wdir = value(FlagId::kWdir);

  // -x, in order; a name given twice keeps its first position and its last value.
  for (const std::string& x : raw.exports) {
    Result<std::pair<std::string, std::string>> kv = job::ParseExportFlag(x, environ_vars);
    if (!kv.ok()) return UsageError(kv.status().message());
    bool replaced = false;
    for (auto& e : o.exports) {
      if (e.first == kv->first) e.second = kv->second, replaced = true;
    }
    if (!replaced) o.exports.push_back(std::move(kv.value()));
  }

  // The engine's flags reach the ranks as the variables they set (after -x: the flag wins).
  auto set_env = [&](const char* name, const std::string& v) {
    for (auto& e : o.exports) {
      if (e.first == name) {
        e.second = v;
        return;
      }
    }
    o.exports.emplace_back(name, v);
  };
  if (given(FlagId::kFusionThresholdMb)) {
    Result<int> mb = ParseIntFlag(name_of(FlagId::kFusionThresholdMb),
                                  value(FlagId::kFusionThresholdMb), 0, 1 << 20, " of MiB");
    if (!mb.ok()) return UsageError(mb.status().message());
    set_env("RINGRUN_FUSION_THRESHOLD", std::to_string(static_cast<long long>(*mb) << 20));
  }
  if (given(FlagId::kCacheCapacity)) {
    Result<int> n =
        ParseIntFlag(name_of(FlagId::kCacheCapacity), value(FlagId::kCacheCapacity), 0, 1 << 24);
    if (!n.ok()) return UsageError(n.status().message());
    set_env("RINGRUN_CACHE_CAPACITY", std::to_string(*n));
  }
  if (flag(FlagId::kNoStallCheck)) set_env("RINGRUN_STALL_CHECK", "0");
  if (given(FlagId::kStallWarningTime)) {
    Result<double> t = ParseSecondsFlag(name_of(FlagId::kStallWarningTime),
                                        value(FlagId::kStallWarningTime), 0.001, 1e7);
    if (!t.ok()) return UsageError(t.status().message());
    set_env("RINGRUN_STALL_WARNING_SECONDS", value(FlagId::kStallWarningTime));
  }
  if (given(FlagId::kStallShutdownTime)) {
    Result<double> t = ParseSecondsFlag(name_of(FlagId::kStallShutdownTime),
                                        value(FlagId::kStallShutdownTime), 0, 1e7);
    if (!t.ok()) return UsageError(t.status().message());
    set_env("RINGRUN_STALL_SHUTDOWN_SECONDS", value(FlagId::kStallShutdownTime));
  }
  if (given(FlagId::kTimelineFilename)) {
    std::string path = value(FlagId::kTimelineFilename);
    if (path.empty()) return UsageError(name_of(FlagId::kTimelineFilename) + ": empty file name");
    set_env("RINGRUN_TIMELINE", path);
  }

  // Combinations.
  if (given(FlagId::kHosts) && given(FlagId::kHostfile)) {
    return UsageError(name_of(FlagId::kHosts) + " and " + name_of(FlagId::kHostfile) +
                      " cannot be used together");
  }
  if (given(FlagId::kLauncherAddress) && given(FlagId::kNetworkInterface)) {
    return UsageError("--launcher-address and --network-interface cannot be used together");
  }
  if (o.check_gpu && o.check_build) {
    return UsageError("--check-gpu and --check-build cannot be used together");
  }
  if (o.check_gpu_allreduce && !o.check_gpu) {
    return UsageError("--allreduce needs --check-gpu");
  }
  const bool diagnostic = o.check_gpu || o.check_build;
  if (diagnostic && !o.command.empty()) {
    return UsageError(std::string(o.check_gpu ? "--check-gpu" : "--check-build") +
                      " runs no command, but '" + o.command[0] + "' was given");
  }
  if (!diagnostic && o.command.empty()) {
    return UsageError(std::string("no command given; ") + kUsageLine + " (see ringrun --help)");
  }

  // Hosts and -np.
  if (given(FlagId::kHosts)) {
    Result<std::vector<hosts::HostSpec>> hosts = hosts::ParseHostList(value(FlagId::kHosts));
    if (!hosts.ok()) return UsageError(hosts.status().message());
    o.hosts = std::move(hosts.value());
  } else if (given(FlagId::kHostfile)) {
    Result<std::vector<hosts::HostSpec>> hosts = hosts::ParseHostfile(value(FlagId::kHostfile));
    if (!hosts.ok()) return UsageError(hosts.status().message());
    o.hosts = std::move(hosts.value());
  }
  if (o.hosts.empty()) {
    // Inside a scheduler's job, its allocation (scheduler_hosts.h).
    Result<std::optional<hosts::SchedulerHosts>> sched = hosts::HostsFromScheduler(environ_vars);
    if (!sched.ok()) return UsageError(sched.status().message());
    if (sched->has_value()) {
      o.hosts = std::move((*sched)->hosts);
      o.host_source = (*sched)->source;
    }
  } else {
    o.host_source = given(FlagId::kHosts)
                        ? name_of(FlagId::kHosts) + " " + value(FlagId::kHosts)
                        : name_of(FlagId::kHostfile) + " " + value(FlagId::kHostfile);
  }
  Result<hosts::StarterChoice> starter =
      hosts::ChooseStarter(value(FlagId::kStarter), environ_vars, o.hosts);
  if (!starter.ok()) return UsageError(starter.status().message());
  o.starter = starter->srun ? Options::Starter::kSlurm : Options::Starter::kSsh;
  o.srun_overlap = starter->overlap;
  if (o.hosts.empty()) {
    o.host_source = "none given: this machine";
    if (o.np == 0 && !diagnostic) {
      return UsageError("-np is required when no hosts are given (-H or --hostfile)");
    }
    if (o.np == 0) o.np = 1;
    hosts::HostSpec local;
    local.name = "localhost";
    local.slots = o.np;
    o.hosts.push_back(local);
  } else if (o.np == 0) {
    o.np = hosts::TotalSlots(o.hosts);
  }
  Status fits = hosts::CheckNumProc(o.hosts, o.np);
  if (!fits.ok()) return UsageError(fits.message());
  return outcome;
}

}  // namespace ringrun::launcher
