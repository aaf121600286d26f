// --config-file: Horovod's YAML runtime configuration
// (horovod/runner/common/util/config_parser.py), read into plain settings. Which flag each setting
// stands for is the command line's business (options.cc); this file knows only YAML.
#pragma once

#include <optional>
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

// One setting as the flag it stands for.
struct ConfigFlag {
  std::string flag;                        // "--fusion-threshold-mb"; for a yes/no setting the
                                           // flag that says it ("--no-autotune" for false)
  std::optional<std::string> value;        // for a flag that takes one: the setting as written
  std::vector<std::string> overridden_by;  // flags that, on the command line, leave it out
  std::string where;                       // "FILE:LINE: section.key", for messages
};

struct ConfigFlags {
  std::vector<ConfigFlag> flags;   // in the file's order
  std::vector<std::string> notes;  // "FILE:LINE: key: not a horovodrun setting; ignored, ..."
};

// ReadConfigFile, then each setting of Horovod's schema as its flag: `params`, `autotune`,
// `timeline`, `stall_check`, `library_options`, `logging` and `controller: gloo|mpi` (as
// set_args_from_config reads them). Keys Horovod does not know become notes, as horovodrun
// ignores them. Errors: ReadConfigFile's, prefixed "--config-file "; a yes/no setting that is
// not true/false/yes/no/on/off, or another controller, as "FILE:LINE: key VALUE: ...".
Result<ConfigFlags> ReadConfigFlags(const std::string& path);

}  // namespace ringrun::launcher
