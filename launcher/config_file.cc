#include "launcher/config_file.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
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

// A key of Horovod's config file and the flag it stands for: `flag` takes the value, or, for
// a yes/no key, `flag` means yes and `if_false` no.
struct ConfigKey {
  const char* key;
  const char* flag;
  const char* if_false = nullptr;
};

// config_parser.py, set_args_from_config. "controller: gloo|mpi"
// stands for --gloo or --mpi.
const std::vector<ConfigKey>& ConfigKeys() {
  static const std::vector<ConfigKey> kKeys = {
      {"params.fusion_threshold_mb", "--fusion-threshold-mb"},
      {"params.cycle_time_ms", "--cycle-time-ms"},
      {"params.cache_capacity", "--cache-capacity"},
      {"params.hierarchical_allreduce", "--hierarchical-allreduce", "--no-hierarchical-allreduce"},
      {"params.hierarchical_allgather", "--hierarchical-allgather", "--no-hierarchical-allgather"},
      {"params.torus_allreduce", "--torus-allreduce", "--no-torus-allreduce"},
      {"autotune.enabled", "--autotune", "--no-autotune"},
      {"autotune.log_file", "--autotune-log-file"},
      {"autotune.warmup_samples", "--autotune-warmup-samples"},
      {"autotune.steps_per_sample", "--autotune-steps-per-sample"},
      {"autotune.bayes_opt_max_samples", "--autotune-bayes-opt-max-samples"},
      {"autotune.gaussian_process_noise", "--autotune-gaussian-process-noise"},
      {"timeline.filename", "--timeline-filename"},
      {"timeline.mark_cycles", "--timeline-mark-cycles", "--no-timeline-mark-cycles"},
      {"stall_check.enabled", "--stall-check", "--no-stall-check"},
      {"stall_check.warning_time_seconds", "--stall-check-warning-time-seconds"},
      {"stall_check.shutdown_time_seconds", "--stall-check-shutdown-time-seconds"},
      {"library_options.mpi_threads_disable", "--mpi-threads-disable", "--no-mpi-threads-disable"},
      {"library_options.num_nccl_streams", "--num-nccl-streams"},
      {"library_options.thread_affinity", "--thread-affinity"},
      {"library_options.ccl_bgt_affinity", "--thread-affinity"},  // its name before Horovod 0.21.1
      {"library_options.gloo_timeout_seconds", "--gloo-timeout-seconds"},
      {"logging.level", "--log-level"},
      {"logging.with_timestamp", "--log-with-timestamp", "--log-without-timestamp"},
      {"controller", "--gloo", "--mpi"},
  };
  return kKeys;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
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

Result<ConfigFlags> ReadConfigFlags(const std::string& path) {
  Result<std::vector<ConfigSetting>> settings = ReadConfigFile(path);
  if (!settings.ok()) return InvalidArgument("--config-file " + settings.status().message());
  ConfigFlags out;
  for (const ConfigSetting& s : *settings) {
    const std::string where = path + ":" + std::to_string(s.line) + ": " + s.key;
    auto key = std::find_if(ConfigKeys().begin(), ConfigKeys().end(),
                            [&](const ConfigKey& k) { return s.key == k.key; });
    if (key == ConfigKeys().end()) {
      out.notes.push_back(where + ": not a horovodrun setting; ignored, as horovodrun does");
      continue;
    }
    ConfigFlag f{key->flag, std::nullopt, {key->flag}, where};
    if (key->if_false) f.overridden_by.push_back(key->if_false);
    const std::string v = Lower(s.value);
    if (s.key == "controller") {
      if (v != "gloo" && v != "mpi") {
        return InvalidArgument(where + " " + s.value + ": not gloo or mpi");
      }
      if (v == "mpi") f.flag = key->if_false;
    } else if (key->if_false) {
      const bool yes = v == "true" || v == "yes" || v == "on";
      if (!yes && v != "false" && v != "no" && v != "off") {
        return InvalidArgument(where + " " + s.value + ": not true or false");
      }
      if (!yes) f.flag = key->if_false;
    } else {
      f.value = s.value;
    }
    out.flags.push_back(std::move(f));
  }
  return out;
}

}  // namespace ringrun::launcher
