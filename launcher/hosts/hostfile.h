// Host lists: `-H a:4,b:4` and hostfiles (`host slots=N`, `host:N`, `host`).
#pragma once

#include <string>
#include <vector>

#include "ringrun/common/status.h"

namespace ringrun::launcher::hosts {

struct HostSpec {
  std::string user;  // from "user@host"; empty means the default (ssh config or current user)
  std::string name;  // host name or address, as the user wrote it
  int slots = 1;

  // "user@name" or "name".
  std::string Display() const { return user.empty() ? name : user + "@" + name; }
};

// Parses "-H" values: comma-separated "host[:slots]" (a bare host has 1 slot).
// Errors name the flag and the offending element, e.g. "-H host:x: slots must be a positive
// integer".
Result<std::vector<HostSpec>> ParseHostList(const std::string& list);

// Parses one element of a host list: "[user@]host[:slots]", "[user@][v6addr]:slots" or
// "[user@]v6addr" (1 slot; brackets are needed to give slots). `slots_given` says whether ":N"
// was present. Host and user names are letters, digits, '.', '-' and '_', not starting with '-';
// slots are in [1, 65536]. Errors say what is wrong with the element, without naming it.
Result<HostSpec> ParseHostToken(const std::string& token, bool* slots_given);

// Parses a hostfile. Lines: "host slots=N", "host:N" or "host"; '#' comments, blank lines,
// CRLF and tabs accepted. Errors name the file and line: "hosts.txt:3: slots=abc: ...".
// A host listed twice (names compared case-insensitively, whatever the user@), an empty file
// and a missing file are errors. Slots are in [1, 65536]. IPv6: "[addr]:N", or a bare address
// for 1 slot.
Result<std::vector<HostSpec>> ParseHostfile(const std::string& path);
// The same, from text already read (`origin` names it in messages).
Result<std::vector<HostSpec>> ParseHostfileText(const std::string& text, const std::string& origin);

// True for names that mean this machine: localhost, 127.x.x.x, ::1, and this machine's hostname.
bool IsLocalHost(const std::string& name);

}  // namespace ringrun::launcher::hosts
