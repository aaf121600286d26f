// Logging: spdlog to stderr, one format for every ringrun program.
#pragma once

#include <spdlog/spdlog.h>

#include <optional>
#include <string>

namespace ringrun {

// name: "ringrun" or "ringrun-agent"; level: trace|debug|info|warn|error|critical|off.
// `timestamps`: whether lines carry the time; unset: at debug and trace only.
// Returns false for an unknown level name.
bool InitLogging(const std::string& name, const std::string& level,
                 std::optional<bool> timestamps = std::nullopt);

}  // namespace ringrun
