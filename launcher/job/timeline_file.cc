#include "launcher/job/timeline_file.h"

#include <cerrno>

namespace ringrun::launcher::job {

std::string TimelineFile::Named(const std::vector<std::string>& launcher_env,
                                const std::vector<std::pair<std::string, std::string>>& exports,
                                const std::string& cwd) {
  auto value = [&](const std::string& name) -> std::string {
    for (const auto& [n, v] : exports) {
      if (n == name) return v;
    }
    for (const std::string& kv : launcher_env) {  // the first wins, as getenv() has it
      if (kv.size() > name.size() && kv.compare(0, name.size(), name) == 0 &&
          kv[name.size()] == '=') {
        return kv.substr(name.size() + 1);
      }
    }
    return "";
  };
  std::string path = value("RINGRUN_TIMELINE");
  if (path.empty()) path = value("HOROVOD_TIMELINE");
  if (path.empty() || path == "DYNAMIC") return "";
  if (path[0] != '/' && !cwd.empty()) path = (cwd.back() == '/' ? cwd : cwd + "/") + path;
  return path;
}

Result<std::unique_ptr<TimelineFile>> TimelineFile::Open(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "we");
  if (!f) return ErrnoStatus("timeline: open " + path, errno);
  std::fputs("[\n", f);
  std::fflush(f);
  return std::unique_ptr<TimelineFile>(new TimelineFile(f, path));
}

TimelineFile::~TimelineFile() {
  // A last event without a trailing comma, then the bracket.
  std::fputs("{\"name\": \"end\", \"ph\": \"M\", \"pid\": 0, \"args\": {}}\n]\n", f_);
  std::fclose(f_);
}

void TimelineFile::Append(std::string_view data) {
  const size_t end = data.rfind('\n');
  if (end == std::string_view::npos) return;
  std::fwrite(data.data(), 1, end + 1, f_);
  std::fflush(f_);
}

}  // namespace ringrun::launcher::job
