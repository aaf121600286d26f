// Small string helpers shared by the launcher's parsers.
#pragma once

#include <string>
#include <vector>

namespace ringrun {

// Levenshtein distance, for "did you mean" hints ("slot=" -> "slots=", "--hostflie").
int EditDistance(const std::string& a, const std::string& b);

// The pieces of `s` between `sep`s, empty ones included: "a,,b" is {"a", "", "b"}, "" is {""}.
std::vector<std::string> SplitOn(const std::string& s, char sep);

}  // namespace ringrun
