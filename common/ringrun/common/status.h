// Errors as values. A Status is cheap to return; its message names where the error was born
// ("node3: connect 198.18.7.13:22: connection refused"). Exceptions never cross modules.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace ringrun {

enum class Code {
  kOk = 0,
  kInvalidArgument,   // bad input from a user or caller
  kNotFound,          // a file, host, command or peer that is not there
  kTimeout,           // a deadline passed
  kUnavailable,       // a peer or service is gone or unreachable
  kPermissionDenied,  // authentication or host-key refusal
  kAborted,           // the job was torn down under us
  kInternal,          // a bug or an unexpected system failure
  // The collective engine's (runtime/src/engine/):
  kMismatch,   // ranks submitted one name with different arguments
  kDuplicate,  // a name submitted again while it is still in flight on this rank
  kJoined,     // not possible while a rank has joined (ringrun_join)
};

const char* CodeName(Code code);

// One pointer: null when OK, so that returning, testing and destroying an OK Status (the
// common case, on hot paths such as every submission) costs a store, a compare and nothing;
// the code and message are allocated only for an error (as LevelDB's and Abseil's Status).
// Copies copy the message; moves move the pointer and leave the source OK.
class [[nodiscard]] Status {
 public:
  Status() = default;
  // An OK code makes an OK Status (its message is dropped).
  Status(Code code, std::string message)
      : rep_(code == Code::kOk ? nullptr : new Rep{code, std::move(message)}) {}
  Status(const Status& o) : rep_(o.rep_ ? new Rep(*o.rep_) : nullptr) {}
  Status(Status&& o) noexcept : rep_(o.rep_) { o.rep_ = nullptr; }
  Status& operator=(const Status& o) {
    if (this != &o) *this = Status(o);
    return *this;
  }
  Status& operator=(Status&& o) noexcept {  // o is left OK
    if (this != &o) {
      delete rep_;
      rep_ = o.rep_;
      o.rep_ = nullptr;
    }
    return *this;
  }
  ~Status() { delete rep_; }
  static Status Ok() { return Status(); }

  bool ok() const { return rep_ == nullptr; }
  Code code() const { return rep_ ? rep_->code : Code::kOk; }
  // Empty when ok().
  const std::string& message() const;
  // "<context>: <message>", keeping the code.
  Status Annotate(const std::string& context) const;
  std::string ToString() const;

 private:
  struct Rep {
    Code code;
    std::string message;
  };
  Rep* rep_ = nullptr;
};

inline Status InvalidArgument(std::string m) {
  return Status(Code::kInvalidArgument, std::move(m));
}
inline Status NotFound(std::string m) { return Status(Code::kNotFound, std::move(m)); }
inline Status Timeout(std::string m) { return Status(Code::kTimeout, std::move(m)); }
inline Status Unavailable(std::string m) { return Status(Code::kUnavailable, std::move(m)); }
inline Status PermissionDenied(std::string m) {
  return Status(Code::kPermissionDenied, std::move(m));
}
inline Status Aborted(std::string m) { return Status(Code::kAborted, std::move(m)); }
inline Status Internal(std::string m) { return Status(Code::kInternal, std::move(m)); }
// "<what>: <strerror(err)>" with the code chosen from errno (ETIMEDOUT -> kTimeout, ...).
Status ErrnoStatus(const std::string& what, int err);

// A value or the Status that explains its absence.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}  // NOLINT: must not be ok()
  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace ringrun

#define RINGRUN_RETURN_IF_ERROR(expr) \
  do {                                \
    ::ringrun::Status _st = (expr);   \
    if (!_st.ok()) return _st;        \
  } while (0)
