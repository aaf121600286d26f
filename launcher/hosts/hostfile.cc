#include "launcher/hosts/hostfile.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <map>

#include "ringrun/common/fd.h"
#include "ringrun/common/strings.h"

namespace ringrun::launcher::hosts {
namespace {

// Bounds that keep a typo from turning into a million-rank job or a runaway read.
constexpr long kMaxSlotsPerHost = 65536;
constexpr size_t kMaxHostfileBytes = 16u << 20;

// "4" -> 4. Anything but a plain decimal in [1, kMaxSlotsPerHost] is an error whose message
// shows what was written.
Result<int> ParseSlots(const std::string& text) {
  if (text.empty()) return InvalidArgument("slots must be a positive integer, got nothing");
  bool digits = true;
  for (char c : text) digits = digits && c >= '0' && c <= '9';
  if (!digits) return InvalidArgument("slots must be a positive integer, got '" + text + "'");
  long v = 0;
  for (char c : text) {
    v = v * 10 + (c - '0');
    if (v > kMaxSlotsPerHost) {
      return InvalidArgument("slots=" + text + " is more than " + std::to_string(kMaxSlotsPerHost) +
                             " per host");
    }
  }
  if (v == 0) return InvalidArgument("slots must be a positive integer, got 0");
  return static_cast<int>(v);
}

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '-' || c == '_';
}

bool IsIpv6Literal(const std::string& s) {
  in6_addr a;
  return inet_pton(AF_INET6, s.c_str(), &a) == 1;
}

// Checks a user name or host name for characters that no host or user name has; they are
// almost always a quoting mistake (a space, a comma, a stray '=').
Status CheckName(const std::string& what, const std::string& name) {
  if (name.empty()) return InvalidArgument("missing " + what + " name");
  for (char c : name) {
    if (!IsNameChar(c)) {
      return InvalidArgument(what + " name '" + name + "' contains '" + std::string(1, c) +
                             "', which no " + what + " name has");
    }
  }
  if (name[0] == '-') return InvalidArgument(what + " name '" + name + "' starts with '-'");
  return Status::Ok();
}

}  // namespace

Result<HostSpec> ParseHostToken(const std::string& token, bool* slots_given) {
  *slots_given = false;
  HostSpec spec;
  std::string rest = token;
  size_t at = rest.rfind('@');
  if (at != std::string::npos) {
    spec.user = rest.substr(0, at);
    rest = rest.substr(at + 1);
    RINGRUN_RETURN_IF_ERROR(CheckName("user", spec.user));
  }
  std::string slots_text;
  if (!rest.empty() && rest[0] == '[') {
    size_t close = rest.find(']');
    if (close == std::string::npos) return InvalidArgument("'[' without a closing ']'");
    spec.name = rest.substr(1, close - 1);
    std::string tail = rest.substr(close + 1);
    if (!IsIpv6Literal(spec.name)) {
      return InvalidArgument("'[" + spec.name + "]' is not an IPv6 address");
    }
    if (!tail.empty()) {
      if (tail[0] != ':') return InvalidArgument("unexpected '" + tail + "' after ']'");
      slots_text = tail.substr(1);
      *slots_given = true;
    }
  } else {
    size_t first = rest.find(':');
    size_t last = rest.rfind(':');
    if (first != last) {
      // Several colons and no brackets: only a whole IPv6 address makes sense.
      if (!IsIpv6Literal(rest)) {
        return InvalidArgument("'" + rest +
                               "' is neither host:slots nor an IPv6 address (write [addr]:slots)");
      }
      spec.name = rest;
    } else if (first != std::string::npos) {
      spec.name = rest.substr(0, first);
      slots_text = rest.substr(first + 1);
      *slots_given = true;
    } else {
      spec.name = rest;
    }
    if (spec.name.find(':') == std::string::npos) {
      RINGRUN_RETURN_IF_ERROR(CheckName("host", spec.name));
    }
  }
  if (*slots_given) {
    Result<int> slots = ParseSlots(slots_text);
    if (!slots.ok()) return slots.status();
    spec.slots = *slots;
  }
  return spec;
}

namespace {

// Splits on blanks, and glues "slots = 4" back into "slots=4".
std::vector<std::string> SplitFields(const std::string& line) {
  std::vector<std::string> raw;
  std::string cur;
  for (char c : line) {
    if (IsBlank(c)) {
      if (!cur.empty()) raw.push_back(std::move(cur)), cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  if (!cur.empty()) raw.push_back(std::move(cur));
  std::vector<std::string> out;
  for (size_t i = 0; i < raw.size(); ++i) {
    const std::string& f = raw[i];
    bool glue_prev = !out.empty() && (f[0] == '=' || out.back().back() == '=') && i > 1;
    if (glue_prev) {
      out.back() += f;
    } else {
      out.push_back(f);
    }
  }
  return out;
}

}  // namespace

Result<std::vector<HostSpec>> ParseHostList(const std::string& list) {
  std::vector<HostSpec> hosts;
  std::map<std::string, size_t> seen;  // lower-cased name -> 1-based element index
  if (TrimBlanks(list).empty()) return InvalidArgument("-H: the host list is empty");
  size_t begin = 0;
  size_t index = 0;
  while (true) {
    size_t comma = list.find(',', begin);
    std::string element = TrimBlanks(
        list.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin));
    ++index;
    if (element.empty()) {
      return InvalidArgument("-H " + list + ": element " + std::to_string(index) +
                             " is empty (stray comma?)");
    }
    bool slots_given = false;
    Result<HostSpec> spec = ParseHostToken(element, &slots_given);
    if (!spec.ok()) return spec.status().Annotate("-H " + element);
    auto [it, inserted] = seen.emplace(AsciiLower(spec->name), index);
    if (!inserted) {
      return InvalidArgument("-H " + list + ": host '" + spec->name +
                             "' is listed twice (elements " + std::to_string(it->second) + " and " +
                             std::to_string(index) + ")");
    }
    hosts.push_back(std::move(spec.value()));
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  return hosts;
}

Result<std::vector<HostSpec>> ParseHostfileText(const std::string& text,
                                                const std::string& origin) {
  std::vector<HostSpec> hosts;
  std::map<std::string, int> seen;  // lower-cased name -> line
  int line_no = 0;
  size_t begin = 0;
  // A UTF-8 byte order mark, as some editors write, is not part of the first host name.
  if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) begin = 3;
  while (begin <= text.size()) {
    size_t nl = text.find('\n', begin);
    std::string line = text.substr(begin, nl == std::string::npos ? std::string::npos : nl - begin);
    ++line_no;
    begin = nl == std::string::npos ? text.size() + 1 : nl + 1;

    size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::vector<std::string> fields = SplitFields(line);
    if (fields.empty()) continue;

    const std::string where = origin + ":" + std::to_string(line_no);
    bool slots_given = false;
    Result<HostSpec> spec = ParseHostToken(fields[0], &slots_given);
    if (!spec.ok()) return spec.status().Annotate(where + ": " + fields[0]);

    for (size_t i = 1; i < fields.size(); ++i) {
      const std::string& f = fields[i];
      size_t eq = f.find('=');
      std::string key = eq == std::string::npos ? f : f.substr(0, eq);
      if (eq == std::string::npos || key.empty()) {
        return InvalidArgument(where + ": unexpected '" + f + "' (expected slots=N)");
      }
      if (key != "slots") {
        if (EditDistance(AsciiLower(key), "slots") <= 2) {
          return InvalidArgument(where + ": unknown key '" + key + "' (did you mean slots=?)");
        }
        return InvalidArgument(where + ": unknown key '" + key + "' (only slots=N is understood)");
      }
      if (slots_given) {
        return InvalidArgument(where + ": " + f + ": slots given twice on one line");
      }
      Result<int> slots = ParseSlots(f.substr(eq + 1));
      if (!slots.ok()) return slots.status().Annotate(where + ": " + f);
      spec->slots = *slots;
      slots_given = true;
    }

    auto [it, inserted] = seen.emplace(AsciiLower(spec->name), line_no);
    if (!inserted) {
      return InvalidArgument(where + ": host '" + spec->name + "' is already listed at " + origin +
                             ":" + std::to_string(it->second));
    }
    hosts.push_back(std::move(spec.value()));
  }
  if (hosts.empty()) {
    return InvalidArgument(origin + ": no hosts in hostfile (only blank lines and comments)");
  }
  return hosts;
}

Result<std::vector<HostSpec>> ParseHostfile(const std::string& path) {
  if (path.empty()) return InvalidArgument("--hostfile: empty file name");
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(path + ": cannot open hostfile", errno);
  std::string text;
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(path + ": cannot read hostfile", errno);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMaxHostfileBytes) {
      return InvalidArgument(path + ": hostfile is larger than " +
                             std::to_string(kMaxHostfileBytes >> 20) + " MiB");
    }
  }
  if (text.find('\0') != std::string::npos) {
    return InvalidArgument(path + ": hostfile contains NUL bytes (not a text file?)");
  }
  return ParseHostfileText(text, path);
}

bool IsLocalHost(const std::string& name_in) {
  std::string name = AsciiLower(name_in);
  if (name.size() > 2 && name.front() == '[' && name.back() == ']') {
    name = name.substr(1, name.size() - 2);
  }
  if (name == "localhost" || name == "localhost.localdomain" || name == "ip6-localhost" ||
      name == "ip6-loopback") {
    return true;
  }
  in_addr v4;
  if (inet_pton(AF_INET, name.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, name.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    // ::ffff:127.x.x.x
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  char buf[HOST_NAME_MAX + 1] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return false;
  std::string self = AsciiLower(buf);
  if (self.empty()) return false;
  if (name == self) return true;
  // "node1" names this machine when its hostname is "node1.example.com"; the reverse
  // ("node1.other" for "node1") is not assumed.
  size_t dot = self.find('.');
  return dot != std::string::npos && name.find('.') == std::string::npos &&
         name == self.substr(0, dot);
}

}  // namespace ringrun::launcher::hosts
