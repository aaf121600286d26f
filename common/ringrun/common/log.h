// Logging: spdlog to stderr, one format for every ringrun program.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace ringrun {

// name: "ringrun" or "ringrun-agent"; level: trace|debug|info|warn|error|off.
// Returns false for an unknown level name.
bool InitLogging(const std::string& name, const std::string& level);

}  // namespace ringrun
