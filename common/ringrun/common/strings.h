// Small string helpers shared by the launcher's parsers.
#pragma once

#include <string>
#include <vector>

namespace ringrun {

// Levenshtein distance, for "did you mean" hints ("slot=" -> "slots=", "--hostflie").
int EditDistance(const std::string& a, const std::string& b);

// ' ', '\t', '\r', '\v', '\f' (not '\n': callers split lines first).
bool IsBlank(char c);
// `s` without blanks at either end.
std::string TrimBlanks(const std::string& s);
// ASCII letters lower-cased (host names compare so).
std::string AsciiLower(std::string s);

// The pieces of `s` between `sep`s, empty ones included: "a,,b" is {"a", "", "b"}, "" is {""}.
std::vector<std::string> SplitOn(const std::string& s, char sep);

}  // namespace ringrun
