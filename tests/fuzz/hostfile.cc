// Fuzz target: the -H host list and the hostfile parser (launcher/hosts/hostfile.*).
// The input is both a -H value (up to its first NUL: an argv word holds none) and, when it has
// no NUL (ParseHostfile refuses those), a hostfile's text. Properties checked on success: the
// documented bounds (slots in [1, 65536], non-empty names without separators, no host twice),
// and that writing the hosts back out parses to the same hosts.
#include "launcher/hosts/hostfile.h"

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_check.h"

namespace {

using ringrun::launcher::hosts::HostSpec;

std::string Lower(std::string s) {
  for (char& c : s) c = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  return s;
}

void CheckHosts(const std::vector<ringrun::launcher::hosts::HostSpec>& hosts) {
  FUZZ_CHECK(!hosts.empty());
  std::set<std::string> names;
  for (const ringrun::launcher::hosts::HostSpec& h : hosts) {
    FUZZ_CHECK(h.slots >= 1 && h.slots <= 65536);
    FUZZ_CHECK(!h.name.empty());
    FUZZ_CHECK(h.name.find_first_of(" \t\r\n,#@=[]") == std::string::npos);
    FUZZ_CHECK(h.user.find_first_of(" \t\r\n,#@=:[]") == std::string::npos);
    FUZZ_CHECK(names.insert(Lower(h.name)).second);
  }
}

bool Same(const std::vector<ringrun::launcher::hosts::HostSpec>& a,
          const std::vector<ringrun::launcher::hosts::HostSpec>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].user != b[i].user || a[i].name != b[i].name || a[i].slots != b[i].slots) return false;
  }
  return true;
}

std::string AsHostList(const std::vector<ringrun::launcher::hosts::HostSpec>& hosts) {
  std::string out;
  for (const ringrun::launcher::hosts::HostSpec& h : hosts) {
    if (!out.empty()) out += ',';
    if (!h.user.empty()) out += h.user + "@";
    bool v6 = h.name.find(':') != std::string::npos;
    out += (v6 ? "[" + h.name + "]" : h.name) + ":" + std::to_string(h.slots);
  }
  return out;
}

std::string AsHostfile(const std::vector<ringrun::launcher::hosts::HostSpec>& hosts) {
  std::string out;
  for (const ringrun::launcher::hosts::HostSpec& h : hosts)
    out += h.Display() + " slots=" + std::to_string(h.slots) + "\n";
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);

  const std::string word = text.substr(0, text.find('\0'));
  auto list = ringrun::launcher::hosts::ParseHostList(word);
  if (list.ok()) {
    CheckHosts(*list);
    auto again = ringrun::launcher::hosts::ParseHostList(AsHostList(*list));
    FUZZ_CHECK(again.ok() && Same(*list, *again));
  } else {
    FUZZ_CHECK(!list.status().message().empty());
  }

  if (text.find('\0') == std::string::npos) {
    auto file = ringrun::launcher::hosts::ParseHostfileText(text, "fuzz");
    if (file.ok()) {
      CheckHosts(*file);
      auto again = ringrun::launcher::hosts::ParseHostfileText(AsHostfile(*file), "again");
      FUZZ_CHECK(again.ok() && Same(*file, *again));
    } else {
      FUZZ_CHECK(!file.status().message().empty());
    }
  }
  return 0;
}
