// --config-file: Horovod's YAML runtime configuration
// (horovod/runner/common/util/config_parser.py), read into plain settings. Which flag each setting
// stands for is the command line's business (options.cc); this file knows only YAML.
#pragma once

#include <string>
#include <vector>

#include "ringrun/common/status.h"

namespace ringrun::launcher {

// One scalar of the file: `key` is "section.name" ("params.fusion_threshold_mb") or, at the
// top level, "name" ("controller"); `value` is the scalar as written; `line` counts from 1.
struct ConfigSetting {
  std::string key;
  std::string value;
  int line = 0;
};

// Reads `path`. The document is a mapping (or empty); each value is a scalar or a mapping of
// scalars, as in Horovod's schema. Null values are left out (Horovod skips them). Errors are
// InvalidArgument naming the file and line: unreadable file, bad YAML, a sequence or a deeper
// mapping where a scalar belongs. Unknown keys are returned like the others.
Result<std::vector<ConfigSetting>> ReadConfigFile(const std::string& path);

}  // namespace ringrun::launcher
