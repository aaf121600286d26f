// The command line: every flag, every usage error (exit 2, naming the flag or file:line), and
// the command arriving byte for byte.
#include "launcher/options.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "ringrun/common/version.h"

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using ringrun::launcher::FlagSyntax;
using ringrun::launcher::MatchArgs;
using ringrun::launcher::Options;
using ringrun::launcher::ParseCommandLine;
using ringrun::launcher::ParseOutcome;

namespace {

std::string Fixture(const std::string& name) {
  return std::string(RINGRUN_HOSTFILES_DIR) + "/fixtures/" + name;
}

ParseOutcome Parse(std::vector<std::string> args, std::vector<std::string> env = {}) {
  args.insert(args.begin(), "ringrun");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  argv.push_back(nullptr);
  return ParseCommandLine(static_cast<int>(args.size()), argv.data(), env);
}

// A parse that must succeed and run.
Options Ok(std::vector<std::string> args, std::vector<std::string> env = {}) {
  ParseOutcome out = Parse(std::move(args), std::move(env));
  INFO(out.message);
  REQUIRE(out.kind == ParseOutcome::kRun);
  CHECK(out.message.empty());
  return out.options;
}

// A parse that must be a usage error; returns its message.
std::string Usage(std::vector<std::string> args, std::vector<std::string> env = {}) {
  ParseOutcome out = Parse(std::move(args), std::move(env));
  INFO(out.message);
  REQUIRE(out.kind == ParseOutcome::kExitNow);
  CHECK(out.exit_code == 2);
  CHECK_FALSE(out.message.empty());
  CHECK(out.message.find('\n') == std::string::npos);
  return out.message;
}

std::string Shape(const Options& o) {
  std::string s;
  for (const auto& h : o.hosts) {
    if (!s.empty()) s += ",";
    s += h.Display() + ":" + std::to_string(h.slots);
  }
  return s;
}

}  // namespace

// ---- valid forms ----

TEST_CASE("cli: -np with no hosts means localhost with np slots", "[options]") {
  Options o = Ok({"-np", "4", "prog"});
  CHECK(o.np == 4);
  CHECK(Shape(o) == "localhost:4");
  CHECK(o.command == std::vector<std::string>{"prog"});
}

TEST_CASE("cli: -np spellings", "[options]") {
  CHECK(Ok({"--num-proc", "3", "p"}).np == 3);
  CHECK(Ok({"--num-proc=3", "p"}).np == 3);
  CHECK(Ok({"-np=3", "p"}).np == 3);
}

TEST_CASE("cli: -np defaults to the total of the slots", "[options]") {
  Options o = Ok({"-H", "a:4,b:4", "prog"});
  CHECK(o.np == 8);
  CHECK(Shape(o) == "a:4,b:4");
  CHECK(Ok({"--hosts=a,b:2", "prog"}).np == 3);
  CHECK(Ok({"-Ha:2", "prog"}).np == 2);
  CHECK(Ok({"-np", "5", "-H", "a:4,b:4", "prog"}).np == 5);
}

TEST_CASE("cli: --hostfile", "[options]") {
  Options o = Ok({"--hostfile", Fixture("good-crlf.txt"), "prog"});
  CHECK(Shape(o) == "a:2,b:3,c:1");
  CHECK(o.np == 6);
  CHECK(Shape(Ok({"-hostfile", Fixture("good-tabs.txt"), "prog"})) == "a:2,b:3,c:4");
  CHECK(Shape(Ok({"--hostfile=" + Fixture("good-comments.txt"), "prog"})) == "a:1,b:2");
}

TEST_CASE("cli: -x, repeatable, NAME and NAME=VALUE", "[options]") {
  Options o =
      Ok({"-x", "FOO", "-x", "BAR=a b", "-xBAZ=", "-x", "FOO=2", "-np", "1", "prog"}, {"FOO=1"});
  REQUIRE(o.exports.size() == 3);
  CHECK(o.exports[0] == std::make_pair(std::string("FOO"), std::string("2")));
  CHECK(o.exports[1] == std::make_pair(std::string("BAR"), std::string("a b")));
  CHECK(o.exports[2] == std::make_pair(std::string("BAZ"), std::string("")));
  o = Ok({"-x", "V=-np 3", "-np", "1", "prog"});
  CHECK(o.exports[0].second == "-np 3");
  CHECK(o.np == 1);
}

TEST_CASE("cli: timing and output flags", "[options]") {
  Options o = Ok({"-np", "1", "--start-timeout", "7", "--grace-period", "2.5", "--output-filename",
                  "/tmp/out", "--prefix-timestamp", "--dry-run", "prog"});
  CHECK(o.start_timeout_s == 7);
  CHECK(o.grace_ms == 2500);
  CHECK(o.output_dir == "/tmp/out");
  CHECK(o.prefix_timestamp);
  CHECK(o.dry_run);
  CHECK(Ok({"-np", "1", "--grace-period=0", "p"}).grace_ms == 0);
  CHECK(Ok({"-np", "1", "--grace-period", "3", "p"}).grace_ms == 3000);
}

TEST_CASE("cli: defaults", "[options]") {
  Options o = Ok({"-np", "1", "p"});
  CHECK(o.start_timeout_s == ringrun::kDefaultStartTimeoutS);
  CHECK(o.grace_ms == ringrun::kDefaultGraceMs);
  CHECK(o.log_level == "warn");
  CHECK(o.ssh_port == 0);
  CHECK(o.ssh_fanout == ringrun::kSshFanout);
  CHECK(o.ssh_connect_timeout_s == ringrun::kSshConnectTimeoutS);
  CHECK_FALSE(o.dry_run);
  CHECK_FALSE(o.prefix_timestamp);
  CHECK_FALSE(o.check_gpu);
  CHECK(o.output_dir.empty());
  CHECK(o.exports.empty());
}

TEST_CASE("cli: --log-level and --verbose", "[options]") {
  CHECK(Ok({"-np", "1", "--verbose", "p"}).log_level == "debug");
  CHECK(Ok({"-np", "1", "--log-level", "TRACE", "p"}).log_level == "trace");
  CHECK(Ok({"-np", "1", "--log-level=off", "p"}).log_level == "off");
  CHECK(Ok({"-np", "1", "--verbose", "--log-level", "error", "p"}).log_level == "error");
  for (const char* level : {"trace", "debug", "info", "warn", "error", "off"}) {
    CHECK(Ok({"-np", "1", "--log-level", level, "p"}).log_level == level);
  }
}

TEST_CASE("cli: SSH flags", "[options]") {
  const std::string key =
      std::string(RINGRUN_HOSTFILES_DIR) + "/localhost.txt";  // any readable file
  Options o = Ok({"-H",
                  "alice@h1:2,h2",
                  "-i",
                  key,
                  "-p",
                  "2222",
                  "--ssh-known-hosts",
                  "/tmp/kh",
                  "--ssh-accept-new-host-keys",
                  "--ssh-fanout",
                  "8",
                  "--ssh-connect-timeout",
                  "3",
                  "--agent-path",
                  "/opt/ringrun-agent",
                  "--launcher-address",
                  "198.18.0.1",
                  "--wdir",
                  "/srv/job",
                  "prog"});
  CHECK(o.ssh_identity_file == key);
  CHECK(o.ssh_port == 2222);
  CHECK(o.ssh_known_hosts == "/tmp/kh");
  CHECK(o.ssh_accept_new_host_keys);
  CHECK(o.ssh_fanout == 8);
  CHECK(o.ssh_connect_timeout_s == 3);
  CHECK(o.agent_path == "/opt/ringrun-agent");
  CHECK(o.launcher_address == "198.18.0.1");
  CHECK(o.wdir == "/srv/job");
  CHECK(o.hosts[0].user == "alice");
  CHECK(Ok({"-np", "1", "--ssh-identity-file=" + key, "--ssh-port=22", "p"}).ssh_port == 22);
  CHECK(Ok({"-np", "1", "-p2200", "p"}).ssh_port == 2200);
  CHECK(Ok({"-np", "1", "--network-interface", "eth0", "p"}).network_interfaces ==
        std::vector<std::string>{"eth0"});
}

TEST_CASE("cli: --check-gpu, --allreduce, --check-build need no command", "[options]") {
  Options o = Ok({"--check-gpu"});
  CHECK(o.check_gpu);
  CHECK(o.command.empty());
  CHECK(Shape(o) == "localhost:1");
  o = Ok({"--check-gpu", "--allreduce", "-H", "a,b"});
  CHECK(o.check_gpu_allreduce);
  CHECK(Shape(o) == "a:1,b:1");
  o = Ok({"--check-build"});
  CHECK(o.check_build);
  CHECK(Ok({"-cb"}).check_build);
  CHECK(o.np == 1);
  // horovodrun's habit: a command after --check-build is not run, and a note says so.
  o = Ok({"-np", "2", "--check-build", "python", "train.py"});
  CHECK(o.check_build);
  CHECK(o.command.empty());
  REQUIRE(o.notes.size() == 1);
  CHECK(o.notes[0] == "--check-build: the command ('python' ...) is not run, as with horovodrun");
}

TEST_CASE("cli: --help and --version exit 0", "[options]") {
  ParseOutcome out = Parse({"--help"});
  CHECK(out.kind == ParseOutcome::kExitNow);
  CHECK(out.exit_code == 0);
  CHECK_THAT(out.message, StartsWith("Usage: ringrun [OPTIONS] [--] COMMAND [ARGS...]"));
  for (const char* flag : {"--num-proc",          "-np",
                           "-prefix-timestamp",   "--starter",
                           "--bind-to",           "--fusion-threshold-mb",
                           "--timeline-filename", "--hosts",
                           "--hostfile",          "-x",
                           "--start-timeout",     "--grace-period",
                           "--output-filename",   "--prefix-timestamp",
                           "--dry-run",           "--log-level",
                           "--verbose",           "--version",
                           "--ssh-identity-file", "--ssh-port",
                           "--ssh-known-hosts",   "--ssh-accept-new-host-keys",
                           "--ssh-fanout",        "--ssh-connect-timeout",
                           "--agent-path",        "--launcher-address",
                           "--network-interface", "--wdir",
                           "--check-gpu",         "--allreduce",
                           "--check-build"}) {
    INFO(flag);
    CHECK_THAT(out.message, Contains(flag));
  }
  CHECK(Parse({"-h"}).exit_code == 0);
  CHECK(Parse({"-h"}).kind == ParseOutcome::kExitNow);
  // --help wins over later problems in the options.
  CHECK(Parse({"--help", "-np", "0"}).exit_code == 0);

  out = Parse({"--version"});
  CHECK(out.kind == ParseOutcome::kExitNow);
  CHECK(out.exit_code == 0);
  CHECK(out.message == std::string("ringrun ") + RINGRUN_VERSION_STRING + "\n");
}

// ---- usage errors: exit 2, naming the flag or the file and line ----

TEST_CASE("cli error: -np 0 and -np -1", "[options]") {
  CHECK_THAT(Usage({"-np", "0", "prog"}), Contains("-np 0: must be at least 1"));
  CHECK_THAT(Usage({"-np", "-1", "prog"}), Contains("-np -1: must be at least 1"));
  CHECK_THAT(Usage({"--num-proc", "0", "prog"}), Contains("--num-proc 0"));
  CHECK_THAT(Usage({"-np", "abc", "prog"}), Contains("-np abc: not a whole number"));
  CHECK_THAT(Usage({"-np", "4x", "prog"}), Contains("-np 4x"));
  CHECK_THAT(Usage({"-np", "99999999999999", "prog"}),
             Contains("-np 99999999999999: must be at most"));
  CHECK_THAT(Usage({"-np", "40000000", "prog"}), Contains("-np 40000000: must be at most"));
  CHECK_THAT(Usage({"-np", " 4", "prog"}), Contains("-np  4: not a whole number"));
  CHECK_THAT(Usage({"-np", "+4", "prog"}), Contains("-np +4: not a whole number"));
}

TEST_CASE("cli error: -np larger than the slots names the slots per host", "[options]") {
  CHECK(Usage({"-np", "9", "-H", "a:4,b:4", "prog"}) ==
        "-np 9 exceeds the 8 slots available (a:4, b:4); --oversubscribe allows more ranks than "
        "slots");
  CHECK_THAT(Usage({"-np", "7", "--hostfile", Fixture("good-crlf.txt"), "prog"}),
             Contains("(a:2, b:3, c:1)"));
}

TEST_CASE("cli error: unknown flag", "[options]") {
  CHECK_THAT(Usage({"--bogus", "prog"}), Contains("unknown flag --bogus"));
  CHECK_THAT(Usage({"--hostfiel", "x", "prog"}), Contains("did you mean --hostfile?"));
  CHECK_THAT(Usage({"-np4", "prog"}), Contains("unknown flag -np4"));  // only -X takes -XVALUE
  CHECK_THAT(Usage({"-q", "prog"}), Contains("unknown flag -q"));
  CHECK_THAT(Usage({"--dry-run=yes", "-np", "1", "prog"}), Contains("--dry-run takes no value"));
}

TEST_CASE("cli error: a flag without its value", "[options]") {
  CHECK_THAT(Usage({"-np"}), Contains("-np needs a value"));
  CHECK_THAT(Usage({"-np", "1", "--hostfile"}), Contains("--hostfile needs a value"));
  CHECK_THAT(Usage({"-H"}), Contains("-H needs a value"));
  CHECK_THAT(Usage({"-x"}), Contains("-x needs a value"));
  CHECK_THAT(Usage({"-np", "--dry-run", "prog"}),
             Contains("-np needs a value (N), but --dry-run follows it"));
  CHECK_THAT(Usage({"-np", "--", "prog"}), Contains("-np needs a value"));
  CHECK_THAT(Usage({"--hosts=", "prog"}), Contains("--hosts needs a value"));
  CHECK_THAT(Usage({"-np", "", "prog"}), Contains("-np needs a value"));
  for (const char* flag : {"--start-timeout", "--grace-period", "--output-filename", "--log-level",
                           "-i", "--ssh-identity-file", "-p", "--ssh-port", "--ssh-known-hosts",
                           "--ssh-fanout", "--ssh-connect-timeout", "--agent-path",
                           "--launcher-address", "--network-interface", "--wdir"}) {
    INFO(flag);
    CHECK_THAT(Usage({"-np", "1", flag}), Contains(std::string(flag) + " needs a value"));
  }
}

TEST_CASE("cli error: hostfile problems name file and line", "[options]") {
  CHECK_THAT(Usage({"--hostfile", Fixture("bad-slots-abc.txt"), "p"}),
             Contains("bad-slots-abc.txt:3: slots=abc"));
  CHECK_THAT(Usage({"--hostfile", Fixture("bad-slots-zero.txt"), "p"}),
             Contains("bad-slots-zero.txt:2: slots=0"));
  CHECK_THAT(Usage({"--hostfile", Fixture("bad-slots-negative.txt"), "p"}),
             Contains("bad-slots-negative.txt:4: slots=-3"));
  CHECK_THAT(Usage({"--hostfile", Fixture("bad-slot-typo.txt"), "p"}),
             Contains("bad-slot-typo.txt:2"));
  CHECK_THAT(Usage({"--hostfile", Fixture("bad-duplicate.txt"), "p"}),
             Contains("bad-duplicate.txt:4"));
  CHECK_THAT(Usage({"--hostfile", Fixture("bad-empty.txt"), "p"}),
             Contains("bad-empty.txt: no hosts"));
  CHECK_THAT(Usage({"--hostfile", Fixture("nonexistent.txt"), "p"}),
             Contains("nonexistent.txt: cannot open hostfile: No such file or directory"));
}

TEST_CASE("cli error: -H host:x and -H :2", "[options]") {
  CHECK_THAT(Usage({"-H", "host:x", "p"}), Contains("-H host:x"));
  CHECK_THAT(Usage({"-H", ":2", "p"}), Contains("-H :2"));
  CHECK_THAT(Usage({"-H", "a,,b", "p"}), Contains("element 2 is empty"));
}

TEST_CASE("cli error: -H with --hostfile, -H twice", "[options]") {
  CHECK_THAT(Usage({"-H", "a", "--hostfile", Fixture("good-crlf.txt"), "p"}),
             Contains("-H and --hostfile cannot be used together"));
  CHECK_THAT(Usage({"-H", "a", "-H", "b", "p"}), Contains("-H given twice"));
}

TEST_CASE("cli error: no hosts and no -np, no command", "[options]") {
  CHECK(Usage({"prog"}) == "-np is required when no hosts are given (-H or --hostfile)");
  CHECK_THAT(Usage({"-np", "2"}), Contains("no command given"));
  CHECK_THAT(Usage({"-np", "2", "--"}), Contains("no command given"));
  CHECK_THAT(Usage({}), Contains("no command given"));
}

TEST_CASE("cli error: values out of range name the flag", "[options]") {
  CHECK_THAT(Usage({"-np", "1", "--start-timeout", "0", "p"}),
             Contains("--start-timeout 0: must be at least 1"));
  CHECK_THAT(Usage({"-np", "1", "--start-timeout", "1.5", "p"}), Contains("--start-timeout 1.5"));
  CHECK_THAT(Usage({"-np", "1", "--grace-period", "-1", "p"}), Contains("--grace-period -1"));
  CHECK_THAT(Usage({"-np", "1", "--grace-period", "soon", "p"}),
             Contains("--grace-period soon: not a number"));
  CHECK_THAT(Usage({"-np", "1", "--grace-period", "nan", "p"}), Contains("--grace-period nan"));
  CHECK_THAT(Usage({"-np", "1", "--grace-period", "0x10", "p"}), Contains("--grace-period 0x10"));
  CHECK_THAT(Usage({"-np", "1", "--grace-period", "1e3", "p"}), Contains("--grace-period 1e3"));
  CHECK_THAT(Usage({"-np", "1", "--grace-period", "3601", "p"}), Contains("must be at most"));
  CHECK_THAT(Usage({"-np", "1", "-p", "0", "p"}), Contains("-p 0: must be at least 1"));
  CHECK_THAT(Usage({"-np", "1", "--ssh-port", "70000", "p"}),
             Contains("--ssh-port 70000: must be at most 65535"));
  CHECK_THAT(Usage({"-np", "1", "--ssh-fanout", "0", "p"}), Contains("--ssh-fanout 0"));
  CHECK_THAT(Usage({"-np", "1", "--ssh-connect-timeout", "x", "p"}),
             Contains("--ssh-connect-timeout x"));
  CHECK_THAT(Usage({"-np", "1", "--log-level", "loud", "p"}),
             Contains("--log-level loud: not one of"));
  CHECK_THAT(Usage({"-np", "1", "-i", "/nonexistent/key", "p"}),
             Contains("-i /nonexistent/key: No such file or directory"));
}

TEST_CASE("cli: --bind-to none|core, none by default and in --help", "[options]") {
  CHECK(Ok({"-np", "1", "p"}).bind_to == Options::BindTo::kNone);
  CHECK(Ok({"-np", "2", "--bind-to", "core", "p"}).bind_to == Options::BindTo::kCore);
  CHECK(Ok({"-np", "2", "--bind-to=CORE", "p"}).bind_to == Options::BindTo::kCore);
  CHECK(Ok({"-np", "2", "--bind-to", "core", "--bind-to", "none", "p"}).bind_to ==
        Options::BindTo::kNone);
  // The value is the flag's, not the command's.
  Options o = Ok({"-np", "2", "--bind-to", "none", "core"});
  CHECK(o.bind_to == Options::BindTo::kNone);
  CHECK(o.command == std::vector<std::string>{"core"});
  CHECK_THAT(ringrun::launcher::UsageText(),
             Contains("--bind-to none|core") && Contains("Default: none."));
}

TEST_CASE("cli error: --bind-to with a bad or missing value names the flag", "[options]") {
  CHECK(Usage({"-np", "2", "--bind-to", "socket", "p"}) ==
        "--bind-to socket: not one of none, core");
  CHECK_THAT(Usage({"-np", "2", "--bind-to=", "p"}), Contains("--bind-to"));
  CHECK_THAT(Usage({"-np", "2", "--bind-to"}), Contains("--bind-to needs a value"));
}

TEST_CASE("cli error: -x problems name the flag", "[options]") {
  CHECK_THAT(Usage({"-np", "1", "-x", "NOT_SET_ANYWHERE", "p"}), Contains("-x NOT_SET_ANYWHERE"));
  CHECK_THAT(Usage({"-np", "1", "-x", "9BAD=1", "p"}), Contains("-x 9BAD=1"));
  CHECK_THAT(Usage({"-np", "1", "-x", "RANK=1", "p"}), Contains("-x RANK=1"));
}

TEST_CASE("cli error: diagnostics combinations", "[options]") {
  CHECK_THAT(Usage({"-np", "1", "--allreduce", "p"}), Contains("--allreduce needs --check-gpu"));
  CHECK_THAT(Usage({"--check-gpu", "prog"}), Contains("--check-gpu runs no command"));
  CHECK_THAT(Usage({"--check-gpu", "--check-build"}), Contains("cannot be used together"));
}

// ---- argument integrity ----

TEST_CASE("cli: the command arrives byte for byte", "[options][integrity]") {
  const std::vector<std::string> command = {
      "prog",
      "a b",
      "'single'",
      "\"double\"",
      "$(touch /tmp/pwned)",
      "`id`",
      "a;b",
      "x && y",
      "line1\nline2",
      "tab\there",
      "caf\xC3\xA9 \xE2\x9C\x93 \xF0\x9F\x9A\x80",
      "",
      "*",
      "~",
      "back\\slash",
      "--hostfile",
      "-np",
      "0",
      "--",
      "-x",
      "--help",
      "--version",
      "",
  };
  std::vector<std::string> args = {"-np", "2"};
  args.insert(args.end(), command.begin(), command.end());
  Options o = Ok(args);
  CHECK(o.command == command);
  CHECK(o.np == 2);
}

TEST_CASE("cli: -- starts the command, even before a dash word", "[options][integrity]") {
  Options o = Ok({"-np", "1", "--", "-weird", "--help"});
  CHECK(o.command == std::vector<std::string>{"-weird", "--help"});
  o = Ok({"-np", "1", "--", "--"});
  CHECK(o.command == std::vector<std::string>{"--"});
  o = Ok({"-np", "1", "--", ""});
  CHECK(o.command == std::vector<std::string>{""});
}

TEST_CASE("cli: flags after the command belong to the command", "[options][integrity]") {
  Options o = Ok({"-np", "2", "python", "-u", "train.py", "-np", "5", "-H", "x:9", "--dry-run"});
  CHECK(o.command ==
        std::vector<std::string>{"python", "-u", "train.py", "-np", "5", "-H", "x:9", "--dry-run"});
  CHECK(o.np == 2);
  CHECK(Shape(o) == "localhost:2");
  CHECK_FALSE(o.dry_run);
  // --help and --version after the command are the command's.
  CHECK(Parse({"-np", "1", "prog", "--help"}).kind == ParseOutcome::kRun);
  CHECK(Parse({"-np", "1", "prog", "--version"}).kind == ParseOutcome::kRun);
}

TEST_CASE("cli: option values are not taken for the command", "[options][integrity]") {
  Options o = Ok({"-x", "A=b", "-np", "1", "--wdir", "/tmp", "--output-filename", "out", "cmd"});
  CHECK(o.command == std::vector<std::string>{"cmd"});
  CHECK(o.wdir == "/tmp");
  CHECK(o.output_dir == "out");
  // A value that starts with '-' is still the flag's value.
  o = Ok({"-np", "1", "--wdir", "-odd-dir", "cmd"});
  CHECK(o.wdir == "-odd-dir");
  CHECK(o.command == std::vector<std::string>{"cmd"});
  // An empty word and a lone dash start the command.
  CHECK(Ok({"-np", "1", "", "x"}).command == std::vector<std::string>{"", "x"});
  CHECK(Ok({"-np", "1", "-"}).command == std::vector<std::string>{"-"});
}

TEST_CASE("cli: option values keep odd bytes", "[options][integrity]") {
  const std::string odd = "a b;$(id)`x`\n\xC3\xA9";
  Options o = Ok({"-np", "1", "-x", "V=" + odd, "--wdir", odd, "--output-filename=" + odd, "cmd"});
  CHECK(o.exports[0].second == odd);
  CHECK(o.wdir == odd);
  CHECK(o.output_dir == odd);
}

TEST_CASE("cli: engine flags become the ranks' variables", "[options]") {
  Options o =
      Ok({"-np", "2", "-x", "RINGRUN_FUSION_THRESHOLD=1", "--fusion-threshold-mb", "32",
          "--cache-capacity", "0", "--no-stall-check", "--stall-check-warning-time-seconds", "2.5",
          "--stall-check-shutdown-time-seconds", "10", "--timeline-filename", "t.json", "prog"});
  using Pairs = std::vector<std::pair<std::string, std::string>>;
  CHECK(o.exports == Pairs{{"RINGRUN_FUSION_THRESHOLD", "33554432"},
                           {"HOROVOD_FUSION_THRESHOLD", "33554432"},
                           {"RINGRUN_CACHE_CAPACITY", "0"},
                           {"HOROVOD_CACHE_CAPACITY", "0"},
                           {"RINGRUN_STALL_CHECK", "0"},
                           {"HOROVOD_STALL_CHECK_DISABLE", "1"},
                           {"RINGRUN_STALL_WARNING_SECONDS", "2.5"},
                           {"HOROVOD_STALL_CHECK_TIME_SECONDS", "2.5"},
                           {"RINGRUN_STALL_SHUTDOWN_SECONDS", "10"},
                           {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "10"},
                           {"RINGRUN_TIMELINE", "t.json"},
                           {"HOROVOD_TIMELINE", "t.json"}});
  CHECK(Ok({"-np", "1", "--fusion-threshold-mb", "0", "prog"}).exports ==
        Pairs{{"RINGRUN_FUSION_THRESHOLD", "0"}, {"HOROVOD_FUSION_THRESHOLD", "0"}});
  CHECK_THAT(Usage({"-np", "1", "--fusion-threshold-mb", "x", "prog"}),
             Contains("--fusion-threshold-mb x: not a whole number of MiB"));
  CHECK_THAT(Usage({"-np", "1", "--stall-check-warning-time-seconds", "soon", "prog"}),
             Contains("--stall-check-warning-time-seconds soon"));
}

// ---- argparse's rules, as horovodrun reads its flags ----

TEST_CASE("cli: a unique prefix of a name is the flag", "[options][argparse]") {
  CHECK(Ok({"--num-p", "3", "p"}).np == 3);
  CHECK(Ok({"--num-p=3", "p"}).np == 3);
  CHECK(Ok({"-n", "3", "p"}).np == 3);  // one dash: a prefix of -np
  CHECK(Shape(Ok({"--hostf", Fixture("good-tabs.txt"), "p"})) == "a:2,b:3,c:4");
  CHECK(Shape(Ok({"--hostfil=" + Fixture("good-tabs.txt"), "p"})) == "a:2,b:3,c:4");
  // -h takes no value, so "-hostf" can only be -hostfile.
  CHECK(Shape(Ok({"-hostf", Fixture("good-tabs.txt"), "p"})) == "a:2,b:3,c:4");
  Options o = Ok({"-np", "1", "--dry", "--ssh-p", "2222", "--log-l", "info", "--verb", "p"});
  CHECK(o.dry_run);
  CHECK(o.ssh_port == 2222);
  CHECK(o.log_level == "info");
  // Messages name the flag a prefix stands for.
  CHECK_THAT(Usage({"--num-p", "0", "p"}), Contains("--num-proc 0: must be at least 1"));
  CHECK_THAT(Usage({"-np", "1", "--dry=yes", "p"}), Contains("--dry-run takes no value"));
}

TEST_CASE("cli error: an ambiguous prefix names every flag it could be", "[options][argparse]") {
  CHECK(Usage({"--host", "a", "p"}) ==
        "ambiguous flag --host: it could be --hosts, --hostfile, --host-discovery-script");
  CHECK_THAT(Usage({"-np", "1", "--log", "info", "p"}),
             Contains("--log-level, --log-with-timestamp, --log-without-timestamp"));
  CHECK_THAT(Usage({"-np", "1", "--ssh", "x", "p"}),
             Contains("--ssh-identity-file, --ssh-port, --ssh-known-hosts"));
  // One dash: "-pr" could be -p with "r" attached, or -prefix-timestamp.
  CHECK(Usage({"-pr", "p"}) == "ambiguous flag -pr: it could be -prefix-timestamp, -p");
  // A word that reads as a flag, ambiguous or not, is no flag's value.
  CHECK_THAT(Usage({"-np", "1", "--wdir", "--ssh", "p"}),
             Contains("--wdir needs a value (DIR), but --ssh follows it"));
}

TEST_CASE("cli: a one-letter name takes its value attached, a longer one not",
          "[options][argparse]") {
  const std::string key = std::string(RINGRUN_HOSTFILES_DIR) + "/localhost.txt";
  Options o = Ok({"-Ha:2,b", "-p2222", "-i" + key, "-xA=1", "prog"});
  CHECK(Shape(o) == "a:2,b:1");
  CHECK(o.ssh_port == 2222);
  CHECK(o.ssh_identity_file == key);
  CHECK(o.exports[0] == std::make_pair(std::string("A"), std::string("1")));
  CHECK(Ok({"-H=a:2", "p"}).np == 2);  // "NAME=VALUE" before "-H" with "=a:2" attached
  CHECK_THAT(Usage({"-np", "1", "-pabc", "p"}), Contains("-p abc: not a whole number"));
  CHECK_THAT(Usage({"-hx", "p"}), Contains("-h takes no value"));
}

TEST_CASE("cli: horovodrun's -prefix-timestamp is the flag, not -p with a value",
          "[options][argparse]") {
  Options o = Ok({"-np", "1", "-prefix-timestamp", "p"});
  CHECK(o.prefix_timestamp);
  CHECK(o.ssh_port == 0);
}

TEST_CASE("cli: -- ends the flags, words after it are the command's", "[options][argparse]") {
  Options o = Ok({"-np", "1", "--", "-np", "2", "--"});
  CHECK(o.np == 1);
  CHECK(o.command == std::vector<std::string>{"-np", "2", "--"});
  // An ambiguous or unknown word in the command is the command's.
  CHECK(Ok({"-np", "1", "p", "--host", "--bogus"}).command ==
        std::vector<std::string>{"p", "--host", "--bogus"});
}

TEST_CASE("MatchArgs: nargs=2, repeats and switches from a table", "[options][argparse]") {
  const std::vector<FlagSyntax> flags = {{{"--blacklist-cooldown-range"}, 2, "MIN MAX"},
                                         {{"-x"}, 1, "NAME=VALUE"},
                                         {{"--tcp"}, 0, ""}};
  auto match = [&](std::vector<std::string> args) { return MatchArgs(flags, args); };
  auto m = match({"--blacklist-cooldown-range", "60", "300", "-x", "A=1", "--tcp", "-x", "B=2",
                  "cmd", "--tcp"});
  REQUIRE(m.ok());
  REQUIRE(m->uses.size() == 4);
  CHECK(m->uses[0].flag == 0);
  CHECK(m->uses[0].values == std::vector<std::string>{"60", "300"});
  CHECK(m->uses[1].values == std::vector<std::string>{"A=1"});
  CHECK(m->uses[2].flag == 2);
  CHECK(m->uses[2].values.empty());
  CHECK(m->uses[3].values == std::vector<std::string>{"B=2"});
  CHECK(m->command == std::vector<std::string>{"cmd", "--tcp"});

  m = match({"--black", "1", "-2", "c"});  // a prefix; "-2" reads as no flag, so it is a value
  REQUIRE(m.ok());
  CHECK(m->uses[0].spelling == "--blacklist-cooldown-range");
  CHECK(m->uses[0].values == std::vector<std::string>{"1", "-2"});

  CHECK(match({"--blacklist-cooldown-range", "60"}).status().message() ==
        "--blacklist-cooldown-range needs 2 values (MIN MAX)");
  CHECK(match({"--blacklist-cooldown-range", "60", "--tcp", "c"}).status().message() ==
        "--blacklist-cooldown-range needs 2 values (MIN MAX), but --tcp follows it");
  CHECK_THAT(match({"--blacklist-cooldown-range=60", "300", "c"}).status().message(),
             Contains("needs 2 values (MIN MAX) as separate words"));
  CHECK_THAT(match({"--tcp=1", "c"}).status().message(), Contains("--tcp takes no value"));
  CHECK_THAT(match({"-x", "", "c"}).status().message(),
             Contains("-x needs a value (NAME=VALUE), got ''"));
  CHECK(match({}).value().command.empty());
  CHECK(match({"-", "-x"}).value().command == std::vector<std::string>{"-", "-x"});
}
