#include "ringrun/common/status.h"

#include <cerrno>
#include <cstring>

namespace ringrun {

const char* CodeName(Code code) {
  switch (code) {
    case Code::kOk:
      return "ok";
    case Code::kInvalidArgument:
      return "invalid argument";
    case Code::kNotFound:
      return "not found";
    case Code::kTimeout:
      return "timeout";
    case Code::kUnavailable:
      return "unavailable";
    case Code::kPermissionDenied:
      return "permission denied";
    case Code::kAborted:
      return "aborted";
    case Code::kInternal:
      return "internal";
    case Code::kMismatch:
      return "mismatch";
    case Code::kDuplicate:
      return "duplicate name";
    case Code::kJoined:
      return "joined";
  }
  return "unknown";
}

const std::string& Status::message() const {
  static const std::string* const kEmpty = new std::string;  // never freed
  return rep_ ? rep_->message : *kEmpty;
}

Status Status::Annotate(const std::string& context) const {
  if (ok()) return *this;
  return Status(rep_->code, context + ": " + rep_->message);
}

std::string Status::ToString() const { return ok() ? "ok" : rep_->message; }

Status ErrnoStatus(const std::string& what, int err) {
  Code code = Code::kInternal;
  switch (err) {
    case ETIMEDOUT:
    case EAGAIN:
      code = Code::kTimeout;
      break;
    case ENOENT:
    case ENOTDIR:
      code = Code::kNotFound;
      break;
    case EACCES:
    case EPERM:
      code = Code::kPermissionDenied;
      break;
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ECONNABORTED:
    case ENOTCONN:
      code = Code::kUnavailable;
      break;
    case EINVAL:
      code = Code::kInvalidArgument;
      break;
    default:
      break;
  }
  return Status(code, what + ": " + std::strerror(err));
}

}  // namespace ringrun
