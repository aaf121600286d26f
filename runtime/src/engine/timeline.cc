#include "runtime/src/engine/timeline.h"

#include <algorithm>
#include <cerrno>
#include <memory>
#include <utility>

namespace ringrun::runtime::engine {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\', out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

Result<std::unique_ptr<Timeline>> Timeline::Open(const std::string& path, int rank,
                                                 const Clock* clock) {
  std::FILE* f = std::fopen(path.c_str(), "we");
  if (!f) return ErrnoStatus("timeline: open " + path, errno);
  return std::unique_ptr<Timeline>(new Timeline(f, path, rank, clock));
}

Timeline::Timeline(std::FILE* f, std::string path, int rank, const Clock* clock)
    : f_(f), path_(std::move(path)), rank_(rank), origin_us_(NowMicros(*clock)) {
  std::fprintf(f_,
               "[\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": "
               "{\"name\": \"rank %d\"}},\n",
               rank_, rank_);
  std::fprintf(f_,
               "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, "
               "\"args\": {\"name\": \"engine\"}},\n",
               rank_);
  std::fflush(f_);
}

Timeline::~Timeline() { Close(); }

void Timeline::Close() {
  if (!f_) return;
  // A last event without a trailing comma, then the bracket: strict JSON when closed cleanly.
  std::fprintf(f_,
               "{\"name\": \"end\", \"ph\": \"i\", \"s\": \"p\", \"pid\": %d, \"tid\": 0, "
               "\"ts\": 0}\n]\n",
               rank_);
  std::fclose(f_);
  f_ = nullptr;
}

int Timeline::Row(const std::string& tensor) {
  auto [it, fresh] = rows_.try_emplace(tensor, static_cast<int>(rows_.size()) + 1);
  if (fresh) {
    std::fprintf(f_,
                 "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, "
                 "\"args\": {\"name\": %s}},\n",
                 rank_, it->second, JsonString(tensor).c_str());
  }
  return it->second;
}

void Timeline::Span(const std::string& tensor, const char* phase, int64_t start_us, int64_t end_us,
                    const std::string& args) {
  if (!f_) return;  // closed
  const int tid = Row(tensor);
  start_us = std::max(start_us, origin_us_);  // begun before the file was opened
  std::fprintf(f_,
               "{\"name\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %lld, "
               "\"dur\": %lld, \"args\": {\"tensor\": %s%s%s}},\n",
               phase, rank_, tid, static_cast<long long>(start_us - origin_us_),
               static_cast<long long>(end_us > start_us ? end_us - start_us : 0),
               JsonString(tensor).c_str(), args.empty() ? "" : ", ", args.c_str());
}

void Timeline::Mark(const char* what, int64_t at_us, const std::string& args) {
  if (!f_) return;
  std::fprintf(f_,
               "{\"name\": \"%s\", \"ph\": \"i\", \"s\": \"t\", \"pid\": %d, \"tid\": 0, "
               "\"ts\": %lld, \"args\": {%s}},\n",
               what, rank_, static_cast<long long>(at_us - origin_us_), args.c_str());
}

void Timeline::MarkCycle(int64_t at_us) {
  if (!f_) return;
  std::fprintf(f_,
               "{\"name\": \"CYCLE_START\", \"ph\": \"i\", \"s\": \"g\", \"pid\": %d, "
               "\"tid\": 0, \"ts\": %lld},\n",
               rank_, static_cast<long long>(at_us - origin_us_));
}

void Timeline::Flush() {
  if (f_) std::fflush(f_);
}

}  // namespace ringrun::runtime::engine
