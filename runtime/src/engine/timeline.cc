#include "runtime/src/engine/timeline.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
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
  return std::unique_ptr<Timeline>(new Timeline(f, UniqueFd(), path, rank, clock));
}

Result<std::unique_ptr<Timeline>> Timeline::OpenPipe(int fd, const std::string& name, int rank,
                                                     const Clock* clock) {
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return ErrnoStatus("timeline: the launcher's pipe (fd " + std::to_string(fd) + ")", errno);
  }
  if (!S_ISFIFO(st.st_mode)) {
    return InvalidArgument("timeline: fd " + std::to_string(fd) + " is not the launcher's pipe");
  }
  UniqueFd copy(::fcntl(fd, F_DUPFD_CLOEXEC, 3));
  if (!copy.valid()) return ErrnoStatus("timeline: fcntl(F_DUPFD_CLOEXEC)", errno);
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);  // the program's children do not write into it
  RINGRUN_RETURN_IF_ERROR(SetNonBlocking(copy.get(), true));
  return std::unique_ptr<Timeline>(new Timeline(nullptr, std::move(copy), name, rank, clock));
}

Timeline::Timeline(std::FILE* f, UniqueFd pipe, std::string path, int rank, const Clock* clock)
    : f_(f),
      pipe_(std::move(pipe)),
      path_(std::move(path)),
      rank_(rank),
      origin_us_(NowMicros(*clock)),
      // A file's ts counts from its opening; the launcher's file holds every rank's events, on
      // a clock they share: the wall clock's microseconds (each viewer shows them from the
      // first event).
      ts_zero_us_(f ? origin_us_ : origin_us_ - WallMicros()) {
  if (f_) std::fputs("[\n", f_);
  Put("{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": "
      "{\"name\": \"rank %d\"}},\n",
      rank_, rank_);
  Put("{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": %d, \"args\": "
      "{\"sort_index\": %d}},\n",
      rank_, rank_);
  Put("{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, "
      "\"args\": {\"name\": \"engine\"}},\n",
      rank_);
  Flush();
}

Timeline::~Timeline() { Close(); }

int64_t Timeline::WallMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void Timeline::Put(const char* format, ...) {
  if (!open_) return;
  char small[512];
  va_list ap;
  va_start(ap, format);
  const int n = std::vsnprintf(small, sizeof(small), format, ap);
  va_end(ap);
  if (n < 0) return;
  std::string big;
  const char* line = small;
  if (static_cast<size_t>(n) >= sizeof(small)) {
    big.resize(static_cast<size_t>(n) + 1);
    va_start(ap, format);
    std::vsnprintf(big.data(), big.size(), format, ap);
    va_end(ap);
    line = big.data();
  }
  if (f_) {
    std::fwrite(line, 1, static_cast<size_t>(n), f_);
    return;
  }
  if (!pipe_.valid() || pending_.size() + static_cast<size_t>(n) > kMaxTimelinePendingBytes) {
    if (dropped_++ == 0 && pipe_.valid()) {
      std::fprintf(stderr,
                   "ringrun: rank %d: timeline: the launcher is not keeping up; dropping events "
                   "beyond %zu bytes waiting (counted at the end)\n",
                   rank_, kMaxTimelinePendingBytes);
    }
    return;
  }
  pending_.append(line, static_cast<size_t>(n));
}

bool Timeline::Drain() {
  size_t done = 0;
  while (done < pending_.size()) {
    const ssize_t n = ::write(pipe_.get(), pending_.data() + done, pending_.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;
    } else {  // the agent is gone: nothing more can be sent
      dropped_ += static_cast<uint64_t>(std::count(pending_.begin() + done, pending_.end(), '\n'));
      pending_.clear();
      pipe_.Reset();
      return false;
    }
  }
  pending_.erase(0, done);
  return true;
}

void Timeline::Close() {
  if (!open_) return;
  // A last event without a trailing comma, then the bracket: strict JSON when closed cleanly.
  // The launcher ends its file itself, after every rank's events.
  if (f_) {
    std::fprintf(f_,
                 "{\"name\": \"end\", \"ph\": \"i\", \"s\": \"p\", \"pid\": %d, \"tid\": 0, "
                 "\"ts\": 0}\n]\n",
                 rank_);
    std::fclose(f_);
    f_ = nullptr;
  } else {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(kTimelineCloseDrainMs);
    while (pipe_.valid() && Drain() && !pending_.empty()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      struct pollfd p = {pipe_.get(), POLLOUT, 0};
      ::poll(&p, 1, static_cast<int>(left.count()));
    }
    dropped_ += static_cast<uint64_t>(std::count(pending_.begin(), pending_.end(), '\n'));
    pending_.clear();
    pipe_.Reset();
    if (dropped_ > 0) {
      std::fprintf(stderr,
                   "ringrun: rank %d: timeline: %llu events dropped (the launcher did "
                   "not keep up)\n",
                   rank_, static_cast<unsigned long long>(dropped_));
    }
  }
  open_ = false;
}

int Timeline::Row(const std::string& tensor) {
  auto [it, fresh] = rows_.try_emplace(tensor, static_cast<int>(rows_.size()) + 1);
  if (fresh) {
    Put("{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, "
        "\"args\": {\"name\": %s}},\n",
        rank_, it->second, JsonString(tensor).c_str());
  }
  return it->second;
}

void Timeline::Span(const std::string& tensor, const char* phase, int64_t start_us, int64_t end_us,
                    const std::string& args) {
  if (!open_) return;  // closed
  const int tid = Row(tensor);
  start_us = std::max(start_us, origin_us_);  // begun before the file was opened
  Put("{\"name\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %lld, "
      "\"dur\": %lld, \"args\": {\"tensor\": %s%s%s}},\n",
      phase, rank_, tid, static_cast<long long>(start_us - ts_zero_us_),
      static_cast<long long>(end_us > start_us ? end_us - start_us : 0), JsonString(tensor).c_str(),
      args.empty() ? "" : ", ", args.c_str());
}

void Timeline::Mark(const char* what, int64_t at_us, const std::string& args) {
  if (!open_) return;
  Put("{\"name\": \"%s\", \"ph\": \"i\", \"s\": \"t\", \"pid\": %d, \"tid\": 0, "
      "\"ts\": %lld, \"args\": {%s}},\n",
      what, rank_, static_cast<long long>(at_us - ts_zero_us_), args.c_str());
}

void Timeline::MarkCycle(int64_t at_us) {
  if (!open_) return;
  Put("{\"name\": \"CYCLE_START\", \"ph\": \"i\", \"s\": \"g\", \"pid\": %d, "
      "\"tid\": 0, \"ts\": %lld},\n",
      rank_, static_cast<long long>(at_us - ts_zero_us_));
}

void Timeline::Flush() {
  if (f_) {
    std::fflush(f_);
  } else if (pipe_.valid() && !pending_.empty()) {
    Drain();
  }
}

}  // namespace ringrun::runtime::engine
