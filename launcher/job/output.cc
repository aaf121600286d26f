#include "launcher/job/output.h"

#include <errno.h>
#include <sys/stat.h>
#include <time.h>

#include <algorithm>

namespace ringrun::launcher::job {
namespace {

Status MakeDirs(const std::string& path) {
  std::string cur;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (!cur.empty() && ::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) {
        return ErrnoStatus("--output-filename: mkdir " + cur, errno);
      }
    }
    if (i < path.size()) cur.push_back(path[i]);
  }
  return Status::Ok();
}

}  // namespace

std::string RankDirName(int rank, int num_ranks) {
  const size_t width = std::to_string(std::max(num_ranks - 1, 0)).size();
  std::string digits = std::to_string(rank);
  return "rank." + std::string(width > digits.size() ? width - digits.size() : 0, '0') + digits;
}

OutputRouter::OutputRouter(Config config) : config_(std::move(config)) {}

OutputRouter::~OutputRouter() {
  for (auto& [rank, f] : files_) {
    if (f.out) std::fclose(f.out);
    if (f.err) std::fclose(f.err);
  }
}

Status OutputRouter::Open(int num_ranks) {
  num_ranks_ = num_ranks;
  if (config_.output_dir.empty()) return Status::Ok();
  for (int r = 0; r < num_ranks; ++r) RINGRUN_RETURN_IF_ERROR(OpenFiles(r));
  return Status::Ok();
}

Status OutputRouter::OpenFiles(int rank) {
  std::string dir = config_.output_dir + "/" + RankDirName(rank, std::max(num_ranks_, rank + 1));
  RINGRUN_RETURN_IF_ERROR(MakeDirs(dir));
  Files f;
  const char* mode = config_.append ? "ae" : "we";
  f.out = std::fopen((dir + "/stdout").c_str(), mode);
  if (!f.out) return ErrnoStatus("--output-filename: open " + dir + "/stdout", errno);
  f.err = std::fopen((dir + "/stderr").c_str(), mode);
  if (!f.err) {
    std::fclose(f.out);
    return ErrnoStatus("--output-filename: open " + dir + "/stderr", errno);
  }
  files_[rank] = f;
  return Status::Ok();
}

void OutputRouter::Write(int rank, bool is_stderr, std::string_view data) {
  size_t start = 0;
  while (start < data.size()) {
    size_t nl = data.find('\n', start);
    size_t end = nl == std::string_view::npos ? data.size() : nl;
    EmitLine(rank, is_stderr, data.substr(start, end - start));
    start = end + 1;
  }
}

void OutputRouter::EmitLine(int rank, bool is_stderr, std::string_view line) {
  if (config_.on_line) config_.on_line(rank, is_stderr, line);
  if (is_stderr) tails_.try_emplace(rank, config_.tail_lines).first->second.Push(line);
  auto fit = files_.find(rank);
  if (fit == files_.end() && !config_.output_dir.empty() && rank >= num_ranks_ &&
      !unopened_.count(rank)) {
    if (Status st = OpenFiles(rank); !st.ok()) {
      unopened_.insert(rank);
      std::fprintf(stderr, "ringrun: %s\n", st.message().c_str());
    }
    fit = files_.find(rank);
  }
  if (fit != files_.end()) {
    FILE* f = is_stderr ? fit->second.err : fit->second.out;
    std::fwrite(line.data(), 1, line.size(), f);
    std::fputc('\n', f);
  }
  if (!config_.echo_to_console) return;
  FILE* f = is_stderr ? config_.err : config_.out;
  if (config_.prefix_timestamp) {
    // horovodrun's format: "Mon Dec  2 15:30:01 2026[3]<stdout>:line"
    char ts[64];
    time_t now = time(nullptr);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(ts, sizeof(ts), "%a %b %e %H:%M:%S %Y", &tm);
    std::fputs(ts, f);
  }
  std::fprintf(f, "[%d]<%s>:", rank, is_stderr ? "stderr" : "stdout");
  std::fwrite(line.data(), 1, line.size(), f);
  std::fputc('\n', f);
}

std::string OutputRouter::StderrTail(int rank) const {
  auto it = tails_.find(rank);
  return it == tails_.end() ? std::string() : it->second.Text();
}

void OutputRouter::Flush() {
  std::fflush(config_.out);
  std::fflush(config_.err);
  for (auto& [rank, f] : files_) {
    std::fflush(f.out);
    std::fflush(f.err);
  }
}

}  // namespace ringrun::launcher::job
