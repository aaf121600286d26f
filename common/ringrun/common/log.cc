#include "ringrun/common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace ringrun {

bool InitLogging(const std::string& name, const std::string& level,
                 std::optional<bool> timestamps) {
  auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") return false;
  auto logger = spdlog::stderr_color_mt(name);
  const bool with_time = timestamps.value_or(lvl <= spdlog::level::debug);
  logger->set_pattern(with_time ? "%^" + name + " %H:%M:%S.%f %l%$: %v"
                                : "%^" + name + " %l%$: %v");
  logger->set_level(lvl);
  spdlog::set_default_logger(logger);
  return true;
}

}  // namespace ringrun
