// Fuzz target: the Slurm allocation parsers (launcher/hosts/slurm.*): the hostlist grammar
// (SLURM_JOB_NODELIST) and the count list (SLURM_TASKS_PER_NODE).
//
// Input: the text before the first NUL is a hostlist expression, the text after it (or the
// whole input when there is none) a count list.
//
// Properties, for hostlists: an expansion names at most 2^20 hosts, each non-empty and free of
// separators (',', ' ', '\t') and brackets, so the names
// joined with ',' expand to the same list, in order; an error quotes a token of the input
// ("'TOKEN': why") or says the list is too long. For count lists: every count is in
// [0, 65536]; the counts written back in run-length form ("2(x3),1") expand to the same list;
// an error quotes one ','-separated element of the input.
#include "launcher/hosts/slurm.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tests/fuzz/fuzz_check.h"

namespace {

using ringrun::launcher::hosts::ExpandCountList;
using ringrun::launcher::hosts::ExpandHostlist;

// Whether `message` begins with "'X'" for some X that satisfies `is_token`.
template <typename Pred>
bool QuotesToken(const std::string& message, Pred is_token) {
  if (message.empty() || message[0] != '\'') return false;
  for (size_t q = message.find('\'', 1); q != std::string::npos; q = message.find('\'', q + 1)) {
    if (is_token(std::string_view(message).substr(1, q - 1))) return true;
  }
  return false;
}

void CheckHostlist(std::string_view expr) {
  auto names = ringrun::launcher::hosts::ExpandHostlist(expr);
  if (!names.ok()) {
    const std::string& m = names.status().message();
    FUZZ_CHECK(QuotesToken(m,
                           [&](std::string_view t) {
                             return !t.empty() && expr.find(t) != std::string_view::npos;
                           }) ||
               m.rfind("the list names more than ", 0) == 0);
    return;
  }
  FUZZ_CHECK(names->size() <= size_t{1} << 20);
  std::string joined;
  for (const std::string& n : *names) {
    FUZZ_CHECK(!n.empty());
    FUZZ_CHECK(n.find_first_of(", \t[]") == std::string::npos);
    if (!joined.empty()) joined += ',';
    joined += n;
  }
  auto again = ExpandHostlist(joined);
  FUZZ_CHECK(again.ok() && *again == *names);
}

void CheckCounts(std::string_view list) {
  auto counts = ringrun::launcher::hosts::ExpandCountList(list);
  if (!counts.ok()) {
    FUZZ_CHECK(QuotesToken(counts.status().message(), [&](std::string_view t) {
      // One whole element: bounded by ',' or the ends of the list.
      for (size_t at = list.find(t); at != std::string_view::npos; at = list.find(t, at + 1)) {
        const size_t end = at + t.size();
        if ((at == 0 || list[at - 1] == ',') && (end == list.size() || list[end] == ',')) {
          return true;
        }
      }
      return false;
    }));
    return;
  }
  FUZZ_CHECK(!counts->empty());
  std::string runs;
  for (size_t i = 0; i < counts->size();) {
    const int c = (*counts)[i];
    FUZZ_CHECK(c >= 0 && c <= 65536);
    size_t j = i;
    while (j < counts->size() && (*counts)[j] == c && j - i < 65536) ++j;
    if (!runs.empty()) runs += ',';
    runs += std::to_string(c);
    if (j - i > 1) runs += "(x" + std::to_string(j - i) + ")";
    i = j;
  }
  auto again = ExpandCountList(runs);
  FUZZ_CHECK(again.ok() && *again == *counts);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const size_t nul = text.find('\0');
  CheckHostlist(text.substr(0, nul));
  CheckCounts(nul == std::string_view::npos ? text : text.substr(nul + 1));
  return 0;
}
