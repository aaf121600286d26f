// Small string helpers shared by the launcher's parsers.
#pragma once

#include <string>

namespace ringrun {

// Levenshtein distance, for "did you mean" hints ("slot=" -> "slots=", "--hostflie").
int EditDistance(const std::string& a, const std::string& b);

}  // namespace ringrun
