// Host lists (-H) and hostfiles: every accepted form and every rejected one, each rejection
// naming the -H element or the file and line.
#include "launcher/hosts/hostfile.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <climits>
#include <string>

using Catch::Matchers::Contains;
using ringrun::Code;
using ringrun::launcher::hosts::HostSpec;
using ringrun::launcher::hosts::IsLocalHost;
using ringrun::launcher::hosts::ParseHostfile;
using ringrun::launcher::hosts::ParseHostfileText;
using ringrun::launcher::hosts::ParseHostList;

namespace {

std::string Fixture(const std::string& name) {
  return std::string(RINGRUN_HOSTFILES_DIR) + "/fixtures/" + name;
}

std::string Shape(const std::vector<ringrun::launcher::hosts::HostSpec>& hosts) {
  std::string s;
  for (const ringrun::launcher::hosts::HostSpec& h : hosts) {
    if (!s.empty()) s += ",";
    s += h.Display() + ":" + std::to_string(h.slots);
  }
  return s;
}

// The error message of a parse that must fail.
template <typename R>
std::string ErrorOf(const R& r) {
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() != Code::kOk);
  return r.status().message();
}

}  // namespace

TEST_CASE("hosts: -H accepts host:slots, bare hosts and user@host", "[hostfile]") {
  auto r = ringrun::launcher::hosts::ParseHostList("a:4,b:4");
  REQUIRE(r.ok());
  CHECK(Shape(*r) == "a:4,b:4");

  r = ParseHostList("a");
  REQUIRE(r.ok());
  CHECK(Shape(*r) == "a:1");

  r = ParseHostList("alice@node-1.example.com:2,node_2,10.0.0.7:3");
  REQUIRE(r.ok());
  REQUIRE(r->size() == 3);
  CHECK((*r)[0].user == "alice");
  CHECK((*r)[0].name == "node-1.example.com");
  CHECK((*r)[0].slots == 2);
  CHECK((*r)[1].user.empty());
  CHECK((*r)[1].slots == 1);
  CHECK((*r)[2].name == "10.0.0.7");
  CHECK((*r)[2].slots == 3);
}

TEST_CASE("hosts: -H trims blanks around elements", "[hostfile]") {
  auto r = ringrun::launcher::hosts::ParseHostList(" a:2 , b ");
  REQUIRE(r.ok());
  CHECK(Shape(*r) == "a:2,b:1");
}

TEST_CASE("hosts: -H accepts IPv6: bracketed with slots, bare without", "[hostfile]") {
  auto r = ringrun::launcher::hosts::ParseHostList("[fe80::1]:2,::1");
  REQUIRE(r.ok());
  REQUIRE(r->size() == 2);
  CHECK((*r)[0].name == "fe80::1");
  CHECK((*r)[0].slots == 2);
  CHECK((*r)[1].name == "::1");
  CHECK((*r)[1].slots == 1);
}

TEST_CASE("hosts: -H host:x is rejected naming the element", "[hostfile]") {
  std::string m = ErrorOf(ringrun::launcher::hosts::ParseHostList("a:2,host:x"));
  CHECK_THAT(m, Contains("-H host:x"));
  CHECK_THAT(m, Contains("slots must be a positive integer"));
}

TEST_CASE("hosts: -H :2 is rejected: no host name", "[hostfile]") {
  std::string m = ErrorOf(ringrun::launcher::hosts::ParseHostList(":2"));
  CHECK_THAT(m, Contains("-H :2"));
  CHECK_THAT(m, Contains("missing host name"));
}

TEST_CASE("hosts: -H zero, negative and huge slots are rejected", "[hostfile]") {
  CHECK_THAT(ErrorOf(ringrun::launcher::hosts::ParseHostList("a:0")), Contains("-H a:0"));
  CHECK_THAT(ErrorOf(ringrun::launcher::hosts::ParseHostList("a:-3")), Contains("-H a:-3"));
  CHECK_THAT(ErrorOf(ringrun::launcher::hosts::ParseHostList("a:")), Contains("-H a:"));
  CHECK_THAT(ErrorOf(ringrun::launcher::hosts::ParseHostList("a:99999999999999999999")),
             Contains("-H a:9999"));
}

TEST_CASE("hosts: -H empty elements are rejected", "[hostfile]") {
  CHECK_THAT(ErrorOf(ringrun::launcher::hosts::ParseHostList("a,,b")),
             Contains("element 2 is empty"));
  CHECK_THAT(ErrorOf(ringrun::launcher::hosts::ParseHostList("a,")),
             Contains("element 2 is empty"));
  CHECK_THAT(ErrorOf(ringrun::launcher::hosts::ParseHostList(",a")),
             Contains("element 1 is empty"));
  CHECK_THAT(ErrorOf(ringrun::launcher::hosts::ParseHostList("")), Contains("-H"));
  CHECK_THAT(ErrorOf(ringrun::launcher::hosts::ParseHostList("  ")), Contains("-H"));
}

TEST_CASE("hosts: -H rejects a host listed twice, naming both", "[hostfile]") {
  std::string m = ErrorOf(ringrun::launcher::hosts::ParseHostList("a:2,b,A:1"));
  CHECK_THAT(m, Contains("'A'"));
  CHECK_THAT(m, Contains("elements 1 and 3"));
}

TEST_CASE("hosts: -H rejects names no host has", "[hostfile]") {
  CHECK_THAT(ErrorOf(ringrun::launcher::hosts::ParseHostList("a b")), Contains("-H a b"));
  CHECK_THAT(ErrorOf(ringrun::launcher::hosts::ParseHostList("a/b")), Contains("'/'"));
  CHECK_THAT(ErrorOf(ringrun::launcher::hosts::ParseHostList("@a")), Contains("missing user name"));
  CHECK_THAT(ErrorOf(ringrun::launcher::hosts::ParseHostList("fe80::1:x")),
             Contains("[addr]:slots"));
  CHECK_THAT(ErrorOf(ringrun::launcher::hosts::ParseHostList("[a]:2")),
             Contains("not an IPv6 address"));
  CHECK_THAT(ErrorOf(ringrun::launcher::hosts::ParseHostList("-a")), Contains("starts with '-'"));
}

TEST_CASE("hostfile: every form, comments, blank lines", "[hostfile]") {
  const std::string text =
      "# comment\n"
      "\n"
      "a slots=4\n"
      "b:2   # trailing comment\n"
      "c\n"
      "bob@d slots=3\n"
      "e slots = 5\n"
      "[::1]:2\n";
  auto r = ringrun::launcher::hosts::ParseHostfileText(text, "h.txt");
  REQUIRE(r.ok());
  CHECK(Shape(*r) == "a:4,b:2,c:1,bob@d:3,e:5,::1:2");
}

TEST_CASE("hostfile: no trailing newline, UTF-8 BOM", "[hostfile]") {
  auto r = ringrun::launcher::hosts::ParseHostfileText(
      "\xEF\xBB\xBF"
      "a slots=2\nb",
      "h.txt");
  REQUIRE(r.ok());
  CHECK(Shape(*r) == "a:2,b:1");
}

TEST_CASE("hostfile: CRLF line ends are accepted", "[hostfile]") {
  auto r = ringrun::launcher::hosts::ParseHostfile(Fixture("good-crlf.txt"));
  REQUIRE(r.ok());
  CHECK(Shape(*r) == "a:2,b:3,c:1");
}

TEST_CASE("hostfile: tabs are accepted", "[hostfile]") {
  auto r = ringrun::launcher::hosts::ParseHostfile(Fixture("good-tabs.txt"));
  REQUIRE(r.ok());
  CHECK(Shape(*r) == "a:2,b:3,c:4");
}

TEST_CASE("hostfile: comments anywhere", "[hostfile]") {
  auto r = ringrun::launcher::hosts::ParseHostfile(Fixture("good-comments.txt"));
  REQUIRE(r.ok());
  CHECK(Shape(*r) == "a:1,b:2");
}

TEST_CASE("hostfile: the samples parse", "[hostfile]") {
  auto r =
      ringrun::launcher::hosts::ParseHostfile(std::string(RINGRUN_HOSTFILES_DIR) + "/example.txt");
  REQUIRE(r.ok());
  CHECK(Shape(*r) == "node1:4,node2:4,node3:1,alice@node4:2,node5:8,fe80::1:2");
  r = ParseHostfile(std::string(RINGRUN_HOSTFILES_DIR) + "/localhost.txt");
  REQUIRE(r.ok());
  CHECK(Shape(*r) == "localhost:4");
}

TEST_CASE("hostfile: slots=abc names file and line", "[hostfile]") {
  std::string m = ErrorOf(ringrun::launcher::hosts::ParseHostfile(Fixture("bad-slots-abc.txt")));
  CHECK_THAT(m, Contains("bad-slots-abc.txt:3: slots=abc"));
  CHECK_THAT(m, Contains("'abc'"));
}

TEST_CASE("hostfile: slots=0 names file and line", "[hostfile]") {
  std::string m = ErrorOf(ringrun::launcher::hosts::ParseHostfile(Fixture("bad-slots-zero.txt")));
  CHECK_THAT(m, Contains("bad-slots-zero.txt:2: slots=0"));
  CHECK_THAT(m, Contains("positive"));
}

TEST_CASE("hostfile: slots=-3 names file and line", "[hostfile]") {
  std::string m =
      ErrorOf(ringrun::launcher::hosts::ParseHostfile(Fixture("bad-slots-negative.txt")));
  CHECK_THAT(m, Contains("bad-slots-negative.txt:4: slots=-3"));
}

TEST_CASE("hostfile: slot=2 is a typo and says so", "[hostfile]") {
  std::string m = ErrorOf(ringrun::launcher::hosts::ParseHostfile(Fixture("bad-slot-typo.txt")));
  CHECK_THAT(m, Contains("bad-slot-typo.txt:2"));
  CHECK_THAT(m, Contains("unknown key 'slot'"));
  CHECK_THAT(m, Contains("did you mean slots="));
  CHECK_THAT(ErrorOf(ringrun::launcher::hosts::ParseHostfileText("a max_procs=2\n", "h")),
             Contains("h:1: unknown key 'max_procs' (only slots=N is understood)"));
  CHECK_THAT(ErrorOf(ringrun::launcher::hosts::ParseHostfileText("a b\n", "h")),
             Contains("h:1: unexpected 'b'"));
  CHECK_THAT(ErrorOf(ringrun::launcher::hosts::ParseHostfileText("a:2 slots=2\n", "h")),
             Contains("h:1: slots=2: slots given twice"));
}

TEST_CASE("hostfile: the same host on two lines names both", "[hostfile]") {
  std::string m = ErrorOf(ringrun::launcher::hosts::ParseHostfile(Fixture("bad-duplicate.txt")));
  CHECK_THAT(m, Contains("bad-duplicate.txt:4: host 'a' is already listed at"));
  CHECK_THAT(m, Contains("bad-duplicate.txt:2"));
}

TEST_CASE("hostfile: an empty file is rejected", "[hostfile]") {
  CHECK_THAT(ErrorOf(ringrun::launcher::hosts::ParseHostfile(Fixture("bad-empty.txt"))),
             Contains("bad-empty.txt: no hosts"));
  CHECK_THAT(ErrorOf(ringrun::launcher::hosts::ParseHostfile(Fixture("bad-comments-only.txt"))),
             Contains("bad-comments-only.txt: no hosts"));
}

TEST_CASE("hostfile: a missing file is rejected with strerror", "[hostfile]") {
  auto r = ringrun::launcher::hosts::ParseHostfile(Fixture("no-such-file.txt"));
  std::string m = ErrorOf(r);
  CHECK_THAT(m, Contains("no-such-file.txt"));
  CHECK_THAT(m, Contains("No such file or directory"));
  CHECK(r.status().code() == Code::kNotFound);
  CHECK_THAT(ErrorOf(ParseHostfile(RINGRUN_HOSTFILES_DIR)), Contains("Is a directory"));
}

TEST_CASE("hostfile: host:x and :2 lines name file and line", "[hostfile]") {
  CHECK_THAT(ErrorOf(ringrun::launcher::hosts::ParseHostfile(Fixture("bad-host-colon-x.txt"))),
             Contains("bad-host-colon-x.txt:2: a:x: slots must be a positive integer"));
  CHECK_THAT(ErrorOf(ringrun::launcher::hosts::ParseHostfile(Fixture("bad-no-host.txt"))),
             Contains("bad-no-host.txt:2: :2: missing host name"));
}

TEST_CASE("hostfile: line numbers count CRLF lines and comments", "[hostfile]") {
  CHECK_THAT(ErrorOf(ringrun::launcher::hosts::ParseHostfileText("a\r\n# c\r\n\r\nb slots=x\r\n",
                                                                 "w.txt")),
             Contains("w.txt:4: slots=x"));
}

TEST_CASE("hosts: IsLocalHost", "[hostfile]") {
  CHECK(ringrun::launcher::hosts::IsLocalHost("localhost"));
  CHECK(IsLocalHost("LOCALHOST"));
  CHECK(IsLocalHost("127.0.0.1"));
  CHECK(IsLocalHost("127.1.2.3"));
  CHECK(IsLocalHost("::1"));
  CHECK(IsLocalHost("[::1]"));
  CHECK(IsLocalHost("::ffff:127.0.0.1"));
  char buf[HOST_NAME_MAX + 1] = {};
  REQUIRE(gethostname(buf, sizeof buf - 1) == 0);
  CHECK(IsLocalHost(buf));
  CHECK_FALSE(IsLocalHost("198.18.0.2"));
  CHECK_FALSE(IsLocalHost("10.0.0.1"));
  CHECK_FALSE(IsLocalHost("fe80::1"));
  CHECK_FALSE(IsLocalHost("not-this-host.invalid"));
  CHECK_FALSE(IsLocalHost(""));
}
