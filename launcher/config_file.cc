#include "launcher/config_file.h"

#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstring>
#include <fstream>

namespace ringrun::launcher {
namespace {

std::string At(const std::string& path, const YAML::Mark& mark) {
  return mark.is_null() ? path : path + ":" + std::to_string(mark.line + 1);
}

// The settings under `node` (a mapping), keys prefixed by `prefix`; `depth` 0 is the document.
Status Collect(const std::string& path, const YAML::Node& node, const std::string& prefix,
               int depth, std::vector<ConfigSetting>* out) {
  for (const auto& kv : node) {
    const std::string key = prefix + kv.first.as<std::string>();
    const YAML::Node& v = kv.second;
    if (v.IsNull()) continue;
    if (v.IsScalar()) {
      out->push_back({key, v.Scalar(), v.Mark().line + 1});
    } else if (v.IsMap() && depth == 0) {
      RINGRUN_RETURN_IF_ERROR(Collect(path, v, key + ".", depth + 1, out));
    } else {
      return InvalidArgument(At(path, v.Mark()) + ": " + key + ": expected " +
                             (depth == 0 ? "a value or a section of values" : "a single value"));
    }
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<ConfigSetting>> ReadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return InvalidArgument(path + ": " + std::strerror(errno));
  std::vector<ConfigSetting> out;
  // yaml-cpp reports by exception; none leaves this function.
  try {
    YAML::Node doc = YAML::Load(in);
    if (doc.IsNull()) return out;
    if (!doc.IsMap()) {
      return InvalidArgument(At(path, doc.Mark()) +
                             ": expected a mapping of sections (params:, autotune:, ...)");
    }
    RINGRUN_RETURN_IF_ERROR(Collect(path, doc, "", 0, &out));
  } catch (const YAML::Exception& e) {
    return InvalidArgument(At(path, e.mark) + ": " + e.msg);
  }
  return out;
}

}  // namespace ringrun::launcher
