// The job's secret: 256 random bits per job, carried as 64 hex characters in gRPC metadata.
// It reaches agents on stdin and ranks through their environment, never a command line.
#pragma once

#include <string>
#include <string_view>

#include "ringrun/common/status.h"

namespace ringrun {

inline constexpr size_t kSecretBytes = 32;
// 64 lowercase hex characters from getrandom(2).
Result<std::string> GenerateSecret();
// Compares in time that depends only on the lengths.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

}  // namespace ringrun
