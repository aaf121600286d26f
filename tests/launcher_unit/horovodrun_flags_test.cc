// horovodrun's options, group by group: each is accepted with its meaning, sets what it sets in
// Horovod, or says what ringrun does instead; the elastic ones make the job elastic (host discovery
// is refused). Also --config-file (Horovod's YAML schema) and the mpirun habits (-wdir, --timeout,
// --oversubscribe, ...).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "launcher/config_file.h"
#include "launcher/job/restart_policy.h"
#include "launcher/options.h"
#include "ringrun/common/interfaces.h"

namespace ringrun::launcher {
namespace {

using Catch::Matchers::Contains;
using Pairs = std::vector<std::pair<std::string, std::string>>;

ParseOutcome Parse(std::vector<std::string> args, std::vector<std::string> env = {}) {
  args.insert(args.begin(), "ringrun");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  argv.push_back(nullptr);
  return ParseCommandLine(static_cast<int>(args.size()), argv.data(), env);
}

Options Ok(std::vector<std::string> args, std::vector<std::string> env = {}) {
  ParseOutcome out = Parse(std::move(args), std::move(env));
  INFO(out.message);
  REQUIRE(out.kind == ParseOutcome::kRun);
  return out.options;
}

std::string Usage(std::vector<std::string> args) {
  ParseOutcome out = Parse(std::move(args));
  INFO(out.message);
  REQUIRE(out.kind == ParseOutcome::kExitNow);
  CHECK(out.exit_code == 2);
  CHECK(out.message.find('\n') == std::string::npos);
  return out.message;
}

// The value of NAME among the ranks' variables the flags set; "" when unset.
std::string Var(const Options& o, const std::string& name) {
  for (const auto& [n, v] : o.exports) {
    if (n == name) return v;
  }
  return "";
}

// A file holding `text`, removed at the end of the test.
struct TempFile {
  explicit TempFile(const std::string& text) {
    char tmpl[] = "/tmp/ringrun-config-XXXXXX";
    int fd = ::mkstemp(tmpl);
    REQUIRE(fd >= 0);
    path = tmpl;
    REQUIRE(::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
    ::close(fd);
  }
  ~TempFile() { std::remove(path.c_str()); }
  std::string path;
};

// A value each value-taking option of horovodrun accepts.
const std::map<std::string, std::vector<std::string>>& SampleValues() {
  static const std::map<std::string, std::vector<std::string>> kValues = {
      {"-np", {"2"}},
      {"--num-proc", {"2"}},
      {"--start-timeout", {"30"}},
      {"--network-interfaces", {"lo"}},
      {"--network-interface", {"lo"}},
      {"--output-filename", {"/tmp/out"}},
      {"--config-file", {"/dev/null"}},
      {"-p", {"22"}},
      {"--ssh-port", {"22"}},
      {"-i", {"/dev/null"}},
      {"--ssh-identity-file", {"/dev/null"}},
      {"--fusion-threshold-mb", {"32"}},
      {"--cycle-time-ms", {"2.5"}},
      {"--cache-capacity", {"512"}},
      {"--autotune-log-file", {"at.csv"}},
      {"--autotune-warmup-samples", {"3"}},
      {"--autotune-steps-per-sample", {"10"}},
      {"--autotune-bayes-opt-max-samples", {"20"}},
      {"--autotune-gaussian-process-noise", {"0.8"}},
      {"--min-np", {"1"}},
      {"--min-num-proc", {"1"}},
      {"--max-np", {"4"}},
      {"--max-num-proc", {"4"}},
      {"--slots-per-host", {"2"}},
      {"--elastic-timeout", {"600"}},
      {"--reset-limit", {"3"}},
      {"--blacklist-cooldown-range", {"60", "300"}},
      {"--timeline-filename", {"t.json"}},
      {"--stall-check-warning-time-seconds", {"60"}},
      {"--stall-check-shutdown-time-seconds", {"120"}},
      {"--mpi-args", {"--map-by ppr:6:node"}},
      {"--binding-args", {"--rankfile f"}},
      {"--num-nccl-streams", {"2"}},
      {"--thread-affinity", {"0"}},
      {"--gloo-timeout-seconds", {"30"}},
      {"--log-level", {"WARNING"}},
      {"-H", {"localhost:2"}},
      {"--hosts", {"localhost:2"}},
      {"-hostfile", {std::string(RINGRUN_HOSTFILES_DIR) + "/localhost.txt"}},
      {"--hostfile", {std::string(RINGRUN_HOSTFILES_DIR) + "/localhost.txt"}},
      {"--host-discovery-script", {"./discover.sh"}},
  };
  return kValues;
}

TEST_CASE("horovodrun: every option of launch.py is accepted or refused by name",
          "[options][horovodrun]") {
  CHECK(HorovodrunOptionNames().size() == 73);  // 62 options with -h, 11 of them with two names
  for (const std::string& name : HorovodrunOptionNames()) {
    INFO(name);
    std::vector<std::string> args = {"-np", "1", name};
    auto v = SampleValues().find(name);
    if (v != SampleValues().end()) args.insert(args.end(), v->second.begin(), v->second.end());
    if (name == "-np" || name == "--num-proc") args.erase(args.begin(), args.begin() + 2);
    args.push_back("prog");
    ParseOutcome out = Parse(args);
    INFO(out.message);
    CHECK(out.message.find("unknown flag") == std::string::npos);
    if (name == "-h" || name == "--help" || name == "-v" || name == "--version") {
      CHECK(out.kind == ParseOutcome::kExitNow);
      CHECK(out.exit_code == 0);
    } else if (name == "-cb" || name == "--check-build") {
      // As horovodrun's: the build is printed, the command is not run (said in a note).
      REQUIRE(out.kind == ParseOutcome::kRun);
      CHECK(out.options.check_build);
      CHECK(out.options.command.empty());
      REQUIRE(out.options.notes.size() == 1);
      CHECK_THAT(out.options.notes[0], Contains("the command ('prog' ...) is not run"));
    } else {
      CHECK(out.kind == ParseOutcome::kRun);
    }
  }
}

TEST_CASE("horovodrun: a prefix horovodrun reads as one option reads as that option here",
          "[options][horovodrun][argparse]") {
  const auto& names = HorovodrunOptionNames();
  for (const std::string& name : names) {
    if (name.rfind("--", 0) != 0) continue;
    for (size_t len = 3; len < name.size(); ++len) {
      const std::string prefix = name.substr(0, len);
      int matches = 0;
      for (const std::string& other : names) matches += other.rfind(prefix, 0) == 0 ? 1 : 0;
      if (matches != 1) continue;  // argparse too finds it ambiguous
      INFO(prefix << " for " << name);
      std::vector<std::string> args = {"-np", "1", prefix};
      auto v = SampleValues().find(name);
      if (v != SampleValues().end()) args.insert(args.end(), v->second.begin(), v->second.end());
      args.push_back("prog");
      ParseOutcome out = Parse(args);
      CHECK(out.message.find("unknown flag") == std::string::npos);
      CHECK(out.message.find("ambiguous") == std::string::npos);
    }
  }
  // ringrun's own flags do not take horovodrun's abbreviations away.
  CHECK(Ok({"-np", "1", "--start", "7", "prog"}).start_timeout_s == 7);  // not --starter
  CHECK(Ok({"--check"}).check_build);                                    // not --check-gpu
  CHECK(Ok({"-np", "1", "--timeo", "9", "prog"}).timeout_s == 9);
  CHECK_THAT(Usage({"-np", "1", "--time", "9", "prog"}),
             Contains("--timeline-filename, --timeline-mark-cycles"));  // as argparse
  // -prefix-timestamp whole, and "-prefix" as argparse reads it: -p or -prefix-timestamp.
  CHECK(Ok({"-np", "1", "-prefix-timestamp", "prog"}).prefix_timestamp);
  CHECK(Usage({"-np", "1", "-prefix", "prog"}) ==
        "ambiguous flag -prefix: it could be -prefix-timestamp, -p");
}

TEST_CASE("horovodrun: tuning knobs set HOROVOD_* in every rank, and ringrun's own",
          "[options][horovodrun]") {
  Options o = Ok({"-np",
                  "1",
                  "--fusion-threshold-mb",
                  "8",
                  "--cycle-time-ms",
                  "3.5",
                  "--cache-capacity",
                  "64",
                  "--hierarchical-allreduce",
                  "--hierarchical-allgather",
                  "--timeline-filename",
                  "tl.json",
                  "--timeline-mark-cycles",
                  "--stall-check-warning-time-seconds",
                  "30",
                  "--stall-check-shutdown-time-seconds",
                  "90",
                  "--gloo-timeout-seconds",
                  "45",
                  "--num-nccl-streams",
                  "2",
                  "--thread-affinity",
                  "3",
                  "prog"});
  CHECK(Var(o, "HOROVOD_FUSION_THRESHOLD") == "8388608");
  CHECK(Var(o, "RINGRUN_FUSION_THRESHOLD") == "8388608");
  CHECK(Var(o, "HOROVOD_CYCLE_TIME") == "3.5");
  CHECK(Var(o, "HOROVOD_CACHE_CAPACITY") == "64");
  CHECK(Var(o, "RINGRUN_CACHE_CAPACITY") == "64");
  CHECK(Var(o, "HOROVOD_HIERARCHICAL_ALLREDUCE") == "1");
  CHECK(Var(o, "HOROVOD_HIERARCHICAL_ALLGATHER") == "1");
  CHECK(Var(o, "HOROVOD_TIMELINE") == "tl.json");
  CHECK(Var(o, "RINGRUN_TIMELINE") == "tl.json");
  CHECK(Var(o, "HOROVOD_TIMELINE_MARK_CYCLES") == "1");
  CHECK(Var(o, "HOROVOD_STALL_CHECK_TIME_SECONDS") == "30");
  CHECK(Var(o, "RINGRUN_STALL_WARNING_SECONDS") == "30");
  CHECK(Var(o, "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS") == "90");
  CHECK(Var(o, "RINGRUN_STALL_SHUTDOWN_SECONDS") == "90");
  CHECK(Var(o, "HOROVOD_GLOO_TIMEOUT_SECONDS") == "45");
  CHECK(Var(o, "RINGRUN_TIMEOUT_MS") == "45000");
  CHECK(Var(o, "HOROVOD_NUM_NCCL_STREAMS") == "2");
  CHECK(Var(o, "HOROVOD_THREAD_AFFINITY") == "3");

  o = Ok({"-np", "1", "--no-hierarchical-allreduce", "--no-hierarchical-allgather",
          "--no-timeline-mark-cycles", "--no-stall-check", "prog"});
  CHECK(Var(o, "HOROVOD_HIERARCHICAL_ALLREDUCE") == "0");
  CHECK(Var(o, "HOROVOD_HIERARCHICAL_ALLGATHER") == "0");
  CHECK(Var(o, "HOROVOD_TIMELINE_MARK_CYCLES") == "0");
  CHECK(Var(o, "HOROVOD_STALL_CHECK_DISABLE") == "1");
  CHECK(Var(o, "RINGRUN_STALL_CHECK") == "0");
  o = Ok({"-np", "1", "--stall-check", "prog"});
  CHECK(Var(o, "HOROVOD_STALL_CHECK_DISABLE") == "0");
  CHECK(Var(o, "RINGRUN_STALL_CHECK") == "1");

  // A flag wins over -x of the same variable, wherever they stand.
  o = Ok({"-np", "1", "--cache-capacity", "5", "-x", "HOROVOD_CACHE_CAPACITY=9", "prog"});
  CHECK(Var(o, "HOROVOD_CACHE_CAPACITY") == "5");

  CHECK_THAT(Usage({"-np", "1", "--cycle-time-ms", "soon", "prog"}),
             Contains("--cycle-time-ms soon: not a number of milliseconds"));
  CHECK_THAT(Usage({"-np", "1", "--cache-capacity", "-1", "prog"}),
             Contains("--cache-capacity -1: must be at least 0"));
  CHECK_THAT(Usage({"-np", "1", "--gloo-timeout-seconds", "0", "prog"}),
             Contains("--gloo-timeout-seconds 0: must be at least 1"));
}

TEST_CASE("horovodrun: Horovod's own machinery variables are named at start, GLOO_IFACE is used",
          "[options][horovodrun]") {
  auto has = [](const Options& o, const std::string& text) {
    for (const std::string& n : o.notes) {
      if (n.find(text) != std::string::npos) return true;
    }
    return false;
  };
  Options o = Ok({"-np", "2", "prog"}, {"HOROVOD_GLOO_IFACE=eth1,eth0", "HOROVOD_CONTROLLER=gloo",
                                        "HOROVOD_CPU_OPERATIONS=mpi"});
  CHECK(o.network_interfaces == std::vector<std::string>{"eth1", "eth0"});
  CHECK(has(o, "HOROVOD_GLOO_IFACE=eth1,eth0: taken as --network-interfaces"));
  CHECK(has(o, "HOROVOD_CONTROLLER=gloo: not passed to the ranks"));
  CHECK(has(o, "HOROVOD_CPU_OPERATIONS=mpi: not passed to the ranks"));
  bool nccl_ifname = false;
  for (const auto& [n, v] : o.exports) nccl_ifname |= n == "NCCL_SOCKET_IFNAME" && v == "eth1,eth0";
  CHECK(nccl_ifname);
  // The flag wins; nothing set, nothing said.
  o = Ok({"-np", "2", "--network-interfaces", "lo", "prog"}, {"HOROVOD_GLOO_IFACE=eth1"});
  CHECK(o.network_interfaces == std::vector<std::string>{"lo"});
  CHECK(has(o, "HOROVOD_GLOO_IFACE=eth1: --network-interfaces wins over it"));
  o = Ok({"-np", "2", "prog"});
  CHECK_FALSE(has(o, "HOROVOD_"));
}

TEST_CASE("horovodrun: --max-np alone makes no job elastic, as horovodrun's _is_elastic",
          "[options][horovodrun]") {
  Options o = Ok({"-np", "2", "--max-np", "2", "prog"});
  CHECK_FALSE(o.elastic.enabled);
  REQUIRE(o.notes.size() == 1);
  CHECK_THAT(o.notes[0], Contains("--max-np 2 without --min-np or --host-discovery-script: the "
                                  "job is not elastic (as with horovodrun)"));
  o = Ok({"-np", "2", "--min-np", "1", "prog"});
  CHECK(o.elastic.enabled);
  REQUIRE(o.notes.size() == 1);
  CHECK_THAT(o.notes[0], Contains("--min-np: an elastic job on one host"));
  o = Ok({"-np", "2", "--max-np", "4", "--host-discovery-script", "./hosts.sh", "prog"});
  CHECK(o.elastic.enabled);
  CHECK(o.elastic.max_np == 4);
}

TEST_CASE("horovodrun: --torus-allreduce reaches the ranks, with a note that none runs here",
          "[options][horovodrun]") {
  Options o = Ok({"-np", "1", "--torus-allreduce", "prog"});
  CHECK(Var(o, "HOROVOD_TORUS_ALLREDUCE") == "1");
  REQUIRE(o.notes.size() == 1);
  CHECK_THAT(o.notes[0], Contains("--torus-allreduce: set in the ranks as HOROVOD_TORUS_ALLREDUCE; "
                                  "ringrun has no torus allreduce"));
  // Its abbreviation, as argparse reads it; the "no" flag asks for what ringrun does anyway.
  CHECK(Var(Ok({"-np", "1", "--torus", "prog"}), "HOROVOD_TORUS_ALLREDUCE") == "1");
  o = Ok({"-np", "1", "--no-torus-allreduce", "prog"});
  CHECK(Var(o, "HOROVOD_TORUS_ALLREDUCE") == "0");
  CHECK(o.notes.empty());
}

TEST_CASE("horovodrun: autotune flags", "[options][horovodrun]") {
  Options o =
      Ok({"-np", "1", "--autotune", "--autotune-log-file", "at.csv", "--autotune-warmup-samples",
          "2", "--autotune-steps-per-sample", "5", "--autotune-bayes-opt-max-samples", "7",
          "--autotune-gaussian-process-noise", "0.5", "prog"});
  CHECK(Var(o, "HOROVOD_AUTOTUNE") == "1");
  CHECK(Var(o, "HOROVOD_AUTOTUNE_LOG") == "at.csv");
  CHECK(Var(o, "HOROVOD_AUTOTUNE_WARMUP_SAMPLES") == "2");
  CHECK(Var(o, "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE") == "5");
  CHECK(Var(o, "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES") == "7");
  CHECK(Var(o, "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE") == "0.5");
  CHECK(Var(Ok({"-np", "1", "--no-autotune", "prog"}), "HOROVOD_AUTOTUNE") == "0");
  CHECK_THAT(Usage({"-np", "1", "--autotune-gaussian-process-noise", "1.5", "prog"}),
             Contains("--autotune-gaussian-process-noise 1.5: must be at most 1"));
  CHECK_THAT(Usage({"-np", "1", "--autotune-warmup-samples", "-2", "prog"}),
             Contains("--autotune-warmup-samples -2: must be at least 0"));
}

TEST_CASE("horovodrun: mutually exclusive flags, as its argparse groups", "[options][horovodrun]") {
  CHECK(Usage({"-np", "1", "--hierarchical-allreduce", "--no-hierarchical-allreduce", "p"}) ==
        "--hierarchical-allreduce and --no-hierarchical-allreduce cannot be used together");
  CHECK_THAT(Usage({"-np", "1", "--autotune", "--no-autotune", "p"}),
             Contains("cannot be used together"));
  CHECK_THAT(Usage({"-np", "1", "--stall-check", "--no-stall-check", "p"}),
             Contains("cannot be used together"));
  CHECK(Usage({"-np", "1", "--no-torus", "--torus-allreduce", "p"}) ==
        "--no-torus-allreduce and --torus-allreduce cannot be used together");
  CHECK_THAT(Usage({"-np", "1", "--gloo", "--mpi", "p"}), Contains("cannot be used together"));
  CHECK_THAT(Usage({"-np", "1", "--log-with-timestamp", "-prefix-timestamp", "p"}),
             Contains("--log-with-timestamp and -prefix-timestamp cannot be used together"));
  // The same flag twice is no conflict.
  CHECK(Var(Ok({"-np", "1", "--autotune", "--autotune", "p"}), "HOROVOD_AUTOTUNE") == "1");
}

TEST_CASE("horovodrun: --log-level takes Horovod's names and reaches the ranks",
          "[options][horovodrun]") {
  struct Case {
    const char* given;
    const char* spdlog;
    const char* horovod;
  };
  for (const Case& c : {Case{"TRACE", "trace", "TRACE"}, Case{"DEBUG", "debug", "DEBUG"},
                        Case{"INFO", "info", "INFO"}, Case{"WARNING", "warn", "WARNING"},
                        Case{"warn", "warn", "WARNING"}, Case{"ERROR", "error", "ERROR"},
                        Case{"FATAL", "critical", "FATAL"}, Case{"Fatal", "critical", "FATAL"},
                        Case{"off", "off", "FATAL"}}) {
    INFO(c.given);
    Options o = Ok({"-np", "1", "--log-level", c.given, "prog"});
    CHECK(o.log_level == c.spdlog);
    CHECK(Var(o, "RINGRUN_LOG_LEVEL") == c.spdlog);
    CHECK(Var(o, "HOROVOD_LOG_LEVEL") == c.horovod);
  }
  CHECK(Var(Ok({"-np", "1", "--verbose", "prog"}), "HOROVOD_LOG_LEVEL").empty());
  CHECK_THAT(Usage({"-np", "1", "--log-level", "loud", "prog"}),
             Contains("--log-level loud: not one of trace, debug, info, warn, warning, error, "
                      "fatal, off"));
}

TEST_CASE("horovodrun: log timestamps and output timestamps", "[options][horovodrun]") {
  Options o = Ok({"-np", "1", "--log-with-timestamp", "prog"});
  CHECK(o.log_timestamps == true);
  CHECK(Var(o, "HOROVOD_LOG_HIDE_TIME") == "0");
  o = Ok({"-np", "1", "--log-without-timestamp", "prog"});
  CHECK(o.log_timestamps == false);
  CHECK(Var(o, "HOROVOD_LOG_HIDE_TIME") == "1");
  o = Ok({"-np", "1", "--log-hide-timestamp", "prog"});
  CHECK(o.log_timestamps == false);
  REQUIRE(o.notes.size() == 1);
  CHECK_THAT(o.notes[0], Contains("--log-hide-timestamp: deprecated"));
  CHECK(Ok({"-np", "1", "--no-log-hide-timestamp", "prog"}).log_timestamps == true);
  CHECK_FALSE(Ok({"-np", "1", "prog"}).log_timestamps.has_value());
  CHECK(Ok({"-np", "1", "--prefix-output-with-timestamp", "prog"}).prefix_timestamp);
  CHECK(Ok({"-np", "1", "--prefix-timestamp", "prog"}).prefix_timestamp);
}

TEST_CASE("horovodrun: other machines' flags are accepted with a note saying what ringrun does",
          "[options][horovodrun]") {
  struct Case {
    std::vector<std::string> args;
    const char* note;
  };
  for (const Case& c : {
           Case{{"--gloo"}, "--gloo: ringrun's own controller"},
           Case{{"--mpi"}, "--mpi: ringrun runs no MPI"},
           Case{{"--jsrun"}, "--jsrun: ringrun starts its agents over SSH"},
           Case{{"--mpi-args", "--map-by ppr:2:node"}, "--mpi-args: ignored"},
           Case{{"--mpi-args=-x FOO"}, "--mpi-args: ignored"},
           Case{{"--binding-args", "--rankfile r"}, "--binding-args: ignored"},
           Case{{"--mpi-threads-disable"}, "--mpi-threads-disable: ringrun runs no MPI"},
           Case{{"--disable-cache"}, "--disable-cache: ringrun keeps no cache"},
           Case{{"--num-nccl-streams", "4"}, "--num-nccl-streams: set in the ranks"},
           Case{{"--thread-affinity", "1"}, "--thread-affinity: set in the ranks"},
       }) {
    std::vector<std::string> args = {"-np", "1"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    args.push_back("prog");
    INFO(args[2]);
    Options o = Ok(args);
    REQUIRE(o.notes.size() == 1);
    CHECK_THAT(o.notes[0], Contains(c.note));
    CHECK(o.command == std::vector<std::string>{"prog"});
  }
  // A note is said once, however often its flag is given.
  CHECK(Ok({"-np", "1", "--gloo", "--gloo", "prog"}).notes.size() == 1);
  CHECK(Var(Ok({"-np", "1", "--mpi-threads-disable", "prog"}), "HOROVOD_MPI_THREADS_DISABLE") ==
        "1");
  // Horovod's --tcp: no InfiniBand for NCCL.
  Options o = Ok({"-np", "1", "--tcp", "prog"});
  CHECK(Var(o, "NCCL_IB_DISABLE") == "1");
  CHECK(o.notes.empty());
}

TEST_CASE("horovodrun: elastic flags and their defaults", "[options][horovodrun][elastic]") {
  Options o = Ok({"-np", "4", "-H", "localhost:2,127.0.0.1:2", "--min-np", "2", "prog"});
  CHECK(o.elastic.enabled);
  CHECK(o.elastic.min_np == 2);
  CHECK(o.elastic.max_np == 4);  // -np
  CHECK(o.elastic.elastic_timeout_s == 600);
  CHECK_FALSE(o.elastic.reset_limit);
  CHECK_FALSE(o.elastic.cooldown_s);
  o = Ok({"-np", "4", "--host-discovery-script", "./hosts.sh", "--max-num-proc", "6",
          "--reset-limit", "3", "--elastic-timeout", "30", "--blacklist-cooldown-range", "10",
          "100", "--slots-per-host", "2", "prog"});
  CHECK(o.elastic.enabled);
  CHECK(o.elastic.min_np == 4);  // -np, as horovodrun
  CHECK(o.elastic.max_np == 6);
  CHECK(o.elastic.reset_limit == 3);
  CHECK(o.elastic.elastic_timeout_s == 30);
  CHECK(o.elastic.cooldown_s == std::make_pair(10, 100));
  CHECK(o.elastic.slots_per_host == 2);
  // horovodrun's variable, below the flag.
  o = Ok({"-np", "2", "--min-np", "1", "prog"}, {"HOROVOD_ELASTIC_TIMEOUT=42"});
  CHECK(o.elastic.elastic_timeout_s == 42);
  o = Ok({"-np", "2", "--min-np", "1", "--elastic-timeout", "7", "prog"},
         {"HOROVOD_ELASTIC_TIMEOUT=42"});
  CHECK(o.elastic.elastic_timeout_s == 7);
  // Not elastic without --min-np or --max-np: the others change nothing, with a note.
  o = Ok({"-np", "2", "--reset-limit", "1", "prog"});
  CHECK_FALSE(o.elastic.enabled);
  CHECK_THAT(o.notes.at(0), Contains("apply to elastic jobs only"));
  // One host: a note that the first failure ends the job.
  o = Ok({"-np", "2", "--min-np", "1", "prog"});
  CHECK_THAT(o.notes.at(0), Contains("an elastic job on one host (localhost) ends at its first"));
  // --max-np above -np: a note (a fixed host set does not grow).
  o = Ok({"-np", "2", "--min-np", "1", "--max-np", "4", "-H", "localhost:2,127.0.0.1:2", "prog"});
  CHECK(o.elastic.max_np == 4);
  CHECK_THAT(o.notes.at(0), Contains("never grows past -np 2"));
}

TEST_CASE("horovodrun: elastic usage errors start nothing", "[options][horovodrun][elastic]") {
  CHECK_THAT(Usage({"-np", "4", "--min-np", "5", "prog"}),
             Contains("--min-np 5 is more than -np 4"));
  CHECK_THAT(Usage({"-np", "4", "--min-np", "2", "--max-np", "3", "prog"}),
             Contains("--max-np 3 is less than -np 4"));
  CHECK_THAT(Usage({"-np", "2", "--min-np", "0", "prog"}), Contains("--min-np 0"));
  CHECK_THAT(Usage({"-np", "2", "--min-np", "x", "prog"}),
             Contains("--min-np x: not a whole number"));
  CHECK_THAT(Usage({"-np", "2", "--min-np", "1", "--reset-limit", "-1", "prog"}),
             Contains("--reset-limit -1"));
  CHECK_THAT(Usage({"-np", "2", "--min-np", "1", "--blacklist-cooldown-range", "10", "5", "prog"}),
             Contains("MAX is less than MIN"));
  CHECK_THAT(Usage({"-np", "2", "--min-np", "1", "--max-restarts", "2", "prog"}),
             Contains("--max-restarts and an elastic job"));
  CHECK_THAT(Usage({"-np", "2", "--host-discovery-script", "d.sh", "-H", "a:2", "prog"}),
             Contains("--host-discovery-script and -H cannot be used together"));
  CHECK_THAT(Usage({"--host-discovery-script", "d.sh", "prog"}),
             Contains("--host-discovery-script needs -np (or --min-np)"));
  CHECK_THAT(Usage({"-np", "2", "--host-discovery-script", " ", "prog"}),
             Contains("--host-discovery-script: an empty command"));
  CHECK_THAT(
      Usage({"-np", "2", "--host-discovery-script", "d.sh", "--discovery-interval", "0", "prog"}),
      Contains("--discovery-interval 0"));
  CHECK_THAT(
      Usage({"-np", "2", "--host-discovery-script", "d.sh", "--discovery-timeout", "x", "prog"}),
      Contains("--discovery-timeout x"));
  CHECK_THAT(Usage({"-np", "2", "--host-discovery-script", "d.sh", "--starter", "slurm", "prog"}),
             Contains("not with --starter slurm"));
}

TEST_CASE("horovodrun: --host-discovery-script makes the job elastic, its hosts to come",
          "[options][horovodrun][elastic]") {
  Options o = Ok({"-np", "2", "--host-discovery-script", "./hosts.sh --zone a", "prog"});
  CHECK(o.elastic.enabled);
  CHECK(o.elastic.discovery_script == "./hosts.sh --zone a");
  CHECK(o.elastic.discovery_interval_s == 1);
  CHECK(o.elastic.discovery_timeout_s == 10);
  CHECK(o.elastic.min_np == 2);
  CHECK(o.elastic.max_np == 2);
  CHECK(o.hosts.empty());  // the script's first run gives them (main.cc)
  CHECK(o.starter == Options::Starter::kSsh);
  CHECK(o.notes.empty());  // no note about one host or a fixed host set
  o = Ok({"--min-np", "1", "--max-np", "4", "--host-discovery-script", "d.sh",
          "--discovery-interval", "3", "--discovery-timeout", "20", "--slots-per-host", "2",
          "prog"});
  CHECK(o.np == 1);  // -np defaults to --min-np
  CHECK(o.elastic.max_np == 4);
  CHECK(o.elastic.discovery_interval_s == 3);
  CHECK(o.elastic.discovery_timeout_s == 20);
  CHECK(o.elastic.slots_per_host == 2);
}

TEST_CASE("horovodrun: --network-interfaces, repeatable and comma-separated",
          "[options][horovodrun]") {
  Options o = Ok({"-np", "1", "--network-interfaces", "eth0,ib0", "--network-interface", "eth1",
                  "--network-interface", "eth0", "prog"});
  CHECK(o.network_interfaces == std::vector<std::string>{"eth0", "ib0", "eth1"});
  CHECK(Var(o, "NCCL_SOCKET_IFNAME") == "eth0,ib0,eth1");
  CHECK(Var(Ok({"-np", "1", "prog"}), "NCCL_SOCKET_IFNAME").empty());
  // With --launcher-address the launcher's address is that; the ranks' still follow the list.
  o = Ok({"-np", "1", "--launcher-address", "10.0.0.1", "--network-interfaces", "lo", "prog"});
  CHECK(o.launcher_address == "10.0.0.1");
  CHECK_THAT(Usage({"-np", "1", "--network-interfaces", "eth0,,ib0", "prog"}),
             Contains("--network-interfaces eth0,,ib0: an empty interface name"));
}

TEST_CASE("network interfaces: the first listed that has an address", "[options][horovodrun]") {
  std::vector<NetInterface> nics = {{"lo", "127.0.0.1"}, {"eth0", ""}, {"ib0", "10.1.0.5"}};
  CHECK(*FirstInterfaceAddress(nics, {"ib0", "lo"}) == "10.1.0.5");
  CHECK(*FirstInterfaceAddress(nics, {"eth0", "lo"}) == "127.0.0.1");
  auto none = FirstInterfaceAddress(nics, {"eth0", "eth9"});
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().message() ==
        "--network-interfaces eth0: no usable address; eth9: no such interface");
  auto here = ListInterfaces();
  REQUIRE(here.ok());
  CHECK(*FirstInterfaceAddress(*here, {"lo"}) == "127.0.0.1");
}

TEST_CASE("horovodrun: HOROVOD_START_TIMEOUT when --start-timeout is not given",
          "[options][horovodrun]") {
  const std::vector<std::string> env = {"HOROVOD_START_TIMEOUT=75"};
  ParseOutcome out = Parse({"-np", "1", "prog"}, env);
  REQUIRE(out.kind == ParseOutcome::kRun);
  CHECK(out.options.start_timeout_s == 75);
  out = Parse({"-np", "1", "--start-timeout", "9", "prog"}, env);
  REQUIRE(out.kind == ParseOutcome::kRun);
  CHECK(out.options.start_timeout_s == 9);
  out = Parse({"-np", "1", "prog"}, {"HOROVOD_START_TIMEOUT=soon"});
  CHECK(out.exit_code == 2);
  CHECK(out.message == "HOROVOD_START_TIMEOUT soon: not a whole number of seconds");
  CHECK(Ok({"-np", "1", "prog"}).start_timeout_s == 30);
}

TEST_CASE("torchrun's --max-restarts: both spellings, a whole number from 0", "[options]") {
  CHECK(Ok({"-np", "1", "prog"}).max_restarts == 0);
  CHECK(Ok({"-np", "1", "--max-restarts", "3", "prog"}).max_restarts == 3);
  CHECK(Ok({"-np", "1", "--max-restarts=0", "prog"}).max_restarts == 0);
  CHECK(Ok({"-np", "1", "--max_restarts", "2", "prog"}).max_restarts == 2);
  CHECK(Ok({"-np", "1", "--max_restarts=4", "prog"}).max_restarts == 4);
  CHECK(Ok({"-np", "1", "--max-r", "5", "prog"}).max_restarts == 5);  // a unique prefix
  CHECK(Usage({"-np", "1", "--max-restarts", "-1", "prog"}) ==
        "--max-restarts -1: must be at least 0");
  CHECK(Usage({"-np", "1", "--max_restarts", "two", "prog"}) ==
        "--max_restarts two: not a whole number");
  CHECK(Usage({"-np", "1", "--max-restarts", "1.5", "prog"}) ==
        "--max-restarts 1.5: not a whole number");
  CHECK(Usage({"-np", "1", "--max-restarts", "99999999999", "prog"}) ==
        "--max-restarts 99999999999: must be at most " + std::to_string(job::kMaxRestarts));
  // Whole-job restarts and an elastic job are two answers to a failure: one at a time.
  CHECK(Usage({"-np", "2", "--max-restarts", "3", "--min-np", "1", "prog"}) ==
        "--max-restarts and an elastic job (--min-np, --host-discovery-script) cannot be used "
        "together");
}

TEST_CASE("mpirun habits: -wdir, --timeout, --report-bindings, --oversubscribe",
          "[options][horovodrun]") {
  CHECK(Ok({"-np", "1", "-wdir", "/srv", "prog"}).wdir == "/srv");
  CHECK(Ok({"-np", "1", "--wdir", "/srv", "prog"}).wdir == "/srv");
  CHECK(Ok({"-np", "1", "--timeout", "30", "prog"}).timeout_s == 30);
  CHECK(Ok({"-np", "1", "prog"}).timeout_s == 0);
  CHECK_THAT(Usage({"-np", "1", "--timeout", "0", "prog"}),
             Contains("--timeout 0: must be at least 1"));
  CHECK_THAT(Usage({"-np", "1", "--timeout", "1.5", "prog"}),
             Contains("--timeout 1.5: not a whole number of seconds"));
  CHECK(Ok({"-np", "1", "--report-bindings", "prog"}).report_bindings);
  CHECK(Usage({"-np", "3", "-H", "a:2", "prog"}) ==
        "-np 3 exceeds the 2 slots available (a:2); --oversubscribe allows more ranks than slots");
  Options o = Ok({"-np", "3", "-H", "a:2", "--oversubscribe", "prog"});
  CHECK(o.np == 3);
  CHECK(o.oversubscribe);
}

TEST_CASE("config file: Horovod's schema becomes the flags it stands for",
          "[options][horovodrun][config]") {
  TempFile f(
      "# horovodrun --config-file\n"
      "params:\n"
      "  fusion_threshold_mb: 32\n"
      "  cycle_time_ms: 10\n"
      "  cache_capacity: 2048\n"
      "  hierarchical_allreduce: false\n"
      "  hierarchical_allgather: true\n"
      "  torus_allreduce: false\n"
      "autotune:\n"
      "  enabled: true\n"
      "  log_file: /tmp/at.csv\n"
      "  warmup_samples: 1\n"
      "  steps_per_sample: 2\n"
      "  bayes_opt_max_samples: 3\n"
      "  gaussian_process_noise: 0.2\n"
      "timeline:\n"
      "  filename: /tmp/tl.json\n"
      "  mark_cycles: yes\n"
      "stall_check:\n"
      "  enabled: false\n"
      "  warning_time_seconds: 5\n"
      "  shutdown_time_seconds: 50\n"
      "library_options:\n"
      "  mpi_threads_disable: true\n"
      "  num_nccl_streams: 2\n"
      "  thread_affinity: 1\n"
      "  gloo_timeout_seconds: 20\n"
      "logging:\n"
      "  level: DEBUG\n"
      "  with_timestamp: true\n"
      "controller: gloo\n");
  Options o = Ok({"-np", "1", "--config-file", f.path, "prog"});
  CHECK(Var(o, "HOROVOD_FUSION_THRESHOLD") == "33554432");
  CHECK(Var(o, "HOROVOD_CYCLE_TIME") == "10");
  CHECK(Var(o, "HOROVOD_CACHE_CAPACITY") == "2048");
  CHECK(Var(o, "HOROVOD_HIERARCHICAL_ALLREDUCE") == "0");
  CHECK(Var(o, "HOROVOD_HIERARCHICAL_ALLGATHER") == "1");
  CHECK(Var(o, "HOROVOD_TORUS_ALLREDUCE") == "0");
  CHECK(Var(o, "HOROVOD_AUTOTUNE") == "1");
  CHECK(Var(o, "HOROVOD_AUTOTUNE_LOG") == "/tmp/at.csv");
  CHECK(Var(o, "HOROVOD_AUTOTUNE_WARMUP_SAMPLES") == "1");
  CHECK(Var(o, "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE") == "2");
  CHECK(Var(o, "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES") == "3");
  CHECK(Var(o, "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE") == "0.2");
  CHECK(Var(o, "HOROVOD_TIMELINE") == "/tmp/tl.json");
  CHECK(Var(o, "HOROVOD_TIMELINE_MARK_CYCLES") == "1");
  CHECK(Var(o, "HOROVOD_STALL_CHECK_DISABLE") == "1");
  CHECK(Var(o, "HOROVOD_STALL_CHECK_TIME_SECONDS") == "5");
  CHECK(Var(o, "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS") == "50");
  CHECK(Var(o, "HOROVOD_MPI_THREADS_DISABLE") == "1");
  CHECK(Var(o, "HOROVOD_NUM_NCCL_STREAMS") == "2");
  CHECK(Var(o, "HOROVOD_THREAD_AFFINITY") == "1");
  CHECK(Var(o, "RINGRUN_TIMEOUT_MS") == "20000");
  CHECK(Var(o, "HOROVOD_LOG_LEVEL") == "DEBUG");
  CHECK(o.log_level == "debug");
  CHECK(o.log_timestamps == true);
  for (const std::string& n : o.notes) CHECK_THAT(n, !Contains("not a horovodrun setting"));
  bool gloo_noted = false;
  for (const std::string& n : o.notes) gloo_noted |= n.find("controller") != std::string::npos;
  CHECK(gloo_noted);
}

TEST_CASE("config file: library_options.ccl_bgt_affinity, thread_affinity's old name",
          "[options][horovodrun][config]") {
  TempFile f("library_options:\n  ccl_bgt_affinity: 2\n");
  Options o = Ok({"-np", "1", "--config-file", f.path, "prog"});
  CHECK(Var(o, "HOROVOD_THREAD_AFFINITY") == "2");
}

TEST_CASE("config file: flags on the command line win, wherever they stand",
          "[options][horovodrun][config]") {
  TempFile f(
      "params:\n"
      "  fusion_threshold_mb: 32\n"
      "  hierarchical_allreduce: true\n"
      "stall_check:\n"
      "  enabled: false\n"
      "controller: mpi\n");
  for (bool before : {true, false}) {
    std::vector<std::string> flags = {"--fusion-threshold-mb", "4", "--no-hierarchical-allreduce",
                                      "--stall-check", "--gloo"};
    std::vector<std::string> args = {"-np", "1"};
    if (before) args.insert(args.end(), flags.begin(), flags.end());
    args.push_back("--config-file");
    args.push_back(f.path);
    if (!before) args.insert(args.end(), flags.begin(), flags.end());
    args.push_back("prog");
    INFO(before);
    Options o = Ok(args);
    CHECK(Var(o, "HOROVOD_FUSION_THRESHOLD") == "4194304");
    CHECK(Var(o, "HOROVOD_HIERARCHICAL_ALLREDUCE") == "0");
    CHECK(Var(o, "HOROVOD_STALL_CHECK_DISABLE") == "0");
    REQUIRE(o.notes.size() == 1);
    CHECK_THAT(o.notes[0], Contains("--gloo"));  // the file's "mpi" is left out
  }
}

TEST_CASE("config file: errors name the file and the line", "[options][horovodrun][config]") {
  {
    TempFile f("params:\n  fusion_threshold_mb: [1, 2]\n");
    CHECK_THAT(Usage({"-np", "1", "--config-file", f.path, "p"}),
               Contains(f.path + ":2: params.fusion_threshold_mb: expected a single value"));
  }
  {
    TempFile f("params:\n  fusion_threshold_mb: 1\n   cycle_time_ms: 2\n");
    CHECK_THAT(Usage({"-np", "1", "--config-file", f.path, "p"}),
               Contains("--config-file " + f.path + ":3: "));
  }
  {
    TempFile f("params:\n  cache_capacity: lots\n");
    CHECK(Usage({"-np", "1", "--config-file", f.path, "p"}) ==
          f.path + ":2: params.cache_capacity lots: not a whole number");
  }
  {
    TempFile f("timeline:\n  mark_cycles: maybe\n");
    CHECK(Usage({"-np", "1", "--config-file", f.path, "p"}) ==
          f.path + ":2: timeline.mark_cycles maybe: not true or false");
  }
  {
    TempFile f("controller: nccl\n");
    CHECK(Usage({"-np", "1", "--config-file", f.path, "p"}) ==
          f.path + ":1: controller nccl: not gloo or mpi");
  }
  {
    TempFile f("- a\n- b\n");
    CHECK_THAT(Usage({"-np", "1", "--config-file", f.path, "p"}),
               Contains(f.path + ":1: expected a mapping of sections"));
  }
  CHECK_THAT(Usage({"-np", "1", "--config-file", "/nonexistent/c.yaml", "p"}),
             Contains("--config-file /nonexistent/c.yaml: No such file or directory"));
  // Keys Horovod does not know are ignored, as horovodrun does, with a note.
  TempFile f("params:\n  fusion_threshold: 3\nempty:\n");
  Options o = Ok({"-np", "1", "--config-file", f.path, "p"});
  REQUIRE(o.notes.size() == 1);
  CHECK(o.notes[0] == f.path +
                          ":2: params.fusion_threshold: not a horovodrun setting; ignored, "
                          "as horovodrun does");
  CHECK(Ok({"-np", "1", "--config-file", "/dev/null", "p"}).exports.empty());
  // Given twice, the last file counts; the first is not read.
  CHECK(Ok({"-np", "1", "--config-file", "/nonexistent/c.yaml", "--config-file", "/dev/null", "p"})
            .notes.empty());
}

TEST_CASE("config file: ReadConfigFile keeps scalars as written, with their lines",
          "[options][config]") {
  TempFile f("a: 1\nsec:\n  b: 'x y'\n  c: ~\n  d: true\n");
  auto s = ReadConfigFile(f.path);
  REQUIRE(s.ok());
  REQUIRE(s->size() == 3);
  CHECK((*s)[0].key == "a");
  CHECK((*s)[0].line == 1);
  CHECK((*s)[1].key == "sec.b");
  CHECK((*s)[1].value == "x y");
  CHECK((*s)[1].line == 3);
  CHECK((*s)[2].key == "sec.d");
  CHECK((*s)[2].value == "true");
}

}  // namespace
}  // namespace ringrun::launcher
