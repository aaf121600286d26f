// Fuzz target: the ringrun command line (launcher/options.*). The input is argv after
// "ringrun", one word per NUL-separated piece. Properties: the documented outcome contract of
// ParseCommandLine (a run has hosts, np in [1, total slots] (or >= 1 with --oversubscribe) and a
// command; a usage error is exit code 2 with a one-line message) and that it never crashes or
// hangs.
//
// The parser reads --hostfile files: words that could name a device, /proc or a file outside
// the working directory are replaced, so that the target never blocks on /dev/stdin or reads
// the machine. scripts/fuzz.sh runs it in an empty directory.
#include "launcher/options.h"

#include <cstdint>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_check.h"

namespace {

constexpr size_t kMaxWords = 64;

bool Risky(const std::string& w) {
  for (const char* bad : {"dev", "proc", "sys", "..", "/"}) {
    if (w.find(bad) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> words{"ringrun"};
  std::string cur;
  bool newline = false;
  for (size_t i = 0; i <= size && words.size() <= kMaxWords; ++i) {
    if (i == size || data[i] == 0) {
      words.push_back(Risky(cur) ? "x" : cur);
      newline = newline || cur.find('\n') != std::string::npos;
      cur.clear();
    } else {
      cur.push_back(static_cast<char>(data[i]));
    }
  }
  std::vector<const char*> argv;
  for (const std::string& w : words) argv.push_back(w.c_str());
  argv.push_back(nullptr);
  const std::vector<std::string> environ_vars{"PATH=/usr/bin:/bin", "FOO=bar", "EMPTY="};

  ringrun::launcher::ParseOutcome out = ringrun::launcher::ParseCommandLine(
      static_cast<int>(words.size()), argv.data(), environ_vars);

  if (out.kind == ringrun::launcher::ParseOutcome::kExitNow) {
    FUZZ_CHECK(out.exit_code == 0 || out.exit_code == 2);
    FUZZ_CHECK(!out.message.empty());
    if (out.exit_code == 2) {
      FUZZ_CHECK(out.message.rfind("ringrun:", 0) != 0);
      if (!newline) FUZZ_CHECK(out.message.find('\n') == std::string::npos);
    }
    return 0;
  }
  const ringrun::launcher::Options& o = out.options;
  FUZZ_CHECK(!o.hosts.empty());
  long total = 0;
  for (const auto& h : o.hosts) {
    FUZZ_CHECK(h.slots >= 1);
    total += h.slots;
  }
  FUZZ_CHECK(o.np >= 1 && (o.np <= total || o.oversubscribe));
  FUZZ_CHECK(!o.command.empty() || o.check_gpu || o.check_build);
  return 0;
}
