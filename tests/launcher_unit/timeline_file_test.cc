#include "launcher/job/timeline_file.h"

#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <string>

namespace ringrun::launcher::job {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST_CASE("timeline file: the name the ranks would read, -x over the environment", "[timeline]") {
  CHECK(TimelineFile::Named({"PATH=/bin"}, {}, "/w") == "");
  CHECK(TimelineFile::Named({"HOROVOD_TIMELINE=t.json"}, {}, "/w") == "/w/t.json");
  CHECK(TimelineFile::Named({"HOROVOD_TIMELINE=/a/t.json"}, {}, "/w") == "/a/t.json");
  CHECK(TimelineFile::Named({"HOROVOD_TIMELINE=a.json", "RINGRUN_TIMELINE=b.json"}, {}, "/w/") ==
        "/w/b.json");
  CHECK(TimelineFile::Named({"HOROVOD_TIMELINE=a.json"}, {{"HOROVOD_TIMELINE", "c.json"}}, "/w") ==
        "/w/c.json");
  // DYNAMIC: the program's own files (start_timeline), none for the launcher.
  CHECK(TimelineFile::Named({}, {{"HOROVOD_TIMELINE", "DYNAMIC"}}, "/w") == "");
  CHECK(TimelineFile::Named({"HOROVOD_TIMELINE_X=1"}, {}, "/w") == "");
}

TEST_CASE("timeline file: ranks' whole lines, a torn last one dropped, strict JSON at the end",
          "[timeline]") {
  char dir[] = "/tmp/ringrun-timeline-file-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string path = std::string(dir) + "/t.json";
  {
    auto t = TimelineFile::Open(path);
    REQUIRE(t.ok());
    t.value()->Append("{\"pid\": 0},\n");
    t.value()->Append("{\"pid\": 1},\n{\"pid\": 1, \"torn");    // rank 1 died mid-event
    CHECK(Slurp(path) == "[\n{\"pid\": 0},\n{\"pid\": 1},\n");  // flushed as it comes
  }
  const std::string text = Slurp(path);
  CHECK(text.rfind("[\n{\"pid\": 0},\n{\"pid\": 1},\n{", 0) == 0);
  REQUIRE(text.size() >= 4);
  CHECK(text.substr(text.size() - 4) == "}\n]\n");
  CHECK(text.find("torn") == std::string::npos);
  std::remove(path.c_str());
  ::rmdir(dir);

  auto bad = TimelineFile::Open("/nonexistent-dir/t.json");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("timeline: open /nonexistent-dir/t.json"));
}

}  // namespace
}  // namespace ringrun::launcher::job
