// OutputRouter (launcher/job/output.h): the tags, the timestamps, the per-rank files, the stderr
// tail and the line callback, with the console streams captured in memory and the files in a
// temporary directory.
#include "launcher/job/output.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "tests/launcher_unit/temp_dir.h"

namespace ringrun::launcher::job {
namespace {

// A console stream in memory (open_memstream); text() closes it and returns what was written.
class Capture {
 public:
  Capture() : file_(open_memstream(&buf_, &len_)) {}
  ~Capture() {
    if (file_) std::fclose(file_);
    free(buf_);
  }
  Capture(const Capture&) = delete;
  Capture& operator=(const Capture&) = delete;
  FILE* file() const { return file_; }
  std::string text() {
    if (file_) std::fclose(file_), file_ = nullptr;
    return std::string(buf_, len_);
  }

 private:
  char* buf_ = nullptr;
  size_t len_ = 0;
  FILE* file_;
};

using testing::TempDir;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Line {
  int rank;
  bool is_stderr;
  std::string text;
  bool operator==(const Line& o) const {
    return std::tie(rank, is_stderr, text) == std::tie(o.rank, o.is_stderr, o.text);
  }
};

TEST_CASE("output: each line is tagged [rank]<stream>: on the rank's console stream", "[output]") {
  Capture out, err;
  OutputRouter::Config c;
  c.out = out.file();
  c.err = err.file();
  OutputRouter router(c);
  router.Write(0, false, "hello\n");
  router.Write(12, false, "two\nlines\n");
  router.Write(3, true, "oops\n");
  router.Write(0, false, "\n");  // an empty line is still a line
  router.Flush();
  CHECK(out.text() == "[0]<stdout>:hello\n[12]<stdout>:two\n[12]<stdout>:lines\n[0]<stdout>:\n");
  CHECK(err.text() == "[3]<stderr>:oops\n");
}

TEST_CASE("output: a chunk is split at each newline, and a final piece without one is a line",
          "[output]") {
  Capture out;
  OutputRouter::Config c;
  c.out = out.file();
  c.err = out.file();
  std::vector<Line> seen;
  c.on_line = [&](int rank, bool is_stderr, std::string_view l) {
    seen.push_back({rank, is_stderr, std::string(l)});
  };
  OutputRouter router(c);
  router.Write(1, false, "");  // nothing at all
  router.Write(1, false, "a\n\nb\n");
  router.Write(1, true, "last words, no newline");  // a rank's final partial line
  router.Flush();
  CHECK(out.text() ==
        "[1]<stdout>:a\n[1]<stdout>:\n[1]<stdout>:b\n[1]<stderr>:last words, no newline\n");
  const std::vector<Line> want = {
      {1, false, "a"}, {1, false, ""}, {1, false, "b"}, {1, true, "last words, no newline"}};
  CHECK(seen == want);
  CHECK(router.StderrTail(1) == "last words, no newline");
}

TEST_CASE("output: line bytes pass through unchanged: CR, NUL, non-UTF-8, very long lines",
          "[output]") {
  TempDir dir;
  Capture out, err;
  OutputRouter::Config c;
  c.out = out.file();
  c.err = err.file();
  c.output_dir = dir.path();
  std::vector<std::string> seen;
  c.on_line = [&](int, bool, std::string_view l) { seen.emplace_back(l); };
  OutputRouter router(c);
  REQUIRE(router.Open(1).ok());

  // The router splits at '\n' only: a CR before it (CRLF) or inside a line is line content.
  const std::string crlf = "windows line\r";
  const std::string progress = "10%\r20%\r30%";
  const std::string binary("nul\0byte \xff\xfe\x80 end", 16);
  std::string huge(3 << 20, 'x');  // longer than any buffer on the way
  for (size_t i = 0; i < huge.size(); i += 4096) huge[i] = static_cast<char>('a' + i / 4096 % 26);
  const std::vector<std::string> lines = {crlf, progress, binary, huge};
  std::string expect_console, expect_file;
  for (const std::string& l : lines) {
    router.Write(0, true, l + "\n");
    expect_console += "[0]<stderr>:" + l + "\n";
    expect_file += l + "\n";
  }
  router.Flush();
  CHECK((seen == lines));
  CHECK(out.text().empty());
  // (Catch2 would print a 3 MiB string on failure: compare, then report sizes.)
  const std::string console = err.text();
  INFO("console " << console.size() << " bytes, expected " << expect_console.size());
  CHECK((console == expect_console));
  const std::string file = ReadFile(dir.path() + "/rank.0/stderr");
  INFO("file " << file.size() << " bytes, expected " << expect_file.size());
  CHECK((file == expect_file));
  const std::string tail = router.StderrTail(0);
  INFO("tail " << tail.size() << " bytes");
  CHECK((tail == expect_file.substr(0, expect_file.size() - 1)));  // joined by '\n'
}

TEST_CASE("output: --prefix-timestamp puts the local time before the tag, on the console only",
          "[output]") {
  TempDir dir;
  Capture out;
  OutputRouter::Config c;
  c.out = out.file();
  c.err = out.file();
  c.prefix_timestamp = true;
  c.output_dir = dir.path();
  std::vector<std::string> seen;
  c.on_line = [&](int, bool, std::string_view l) { seen.emplace_back(l); };
  OutputRouter router(c);
  REQUIRE(router.Open(1).ok());
  const time_t before = time(nullptr);
  router.Write(0, false, "x\n");
  const time_t after = time(nullptr);
  router.Flush();
  const std::string text = out.text();
  INFO(text);
  // "Sun Dec  6 06:39:14 2026[0]<stdout>:x\n": Python's time.asctime(), as horovodrun's.
  const size_t tag = text.find("[0]<stdout>:x\n");
  REQUIRE(tag != std::string::npos);
  CHECK(tag + std::string("[0]<stdout>:x\n").size() == text.size());
  const std::string stamp = text.substr(0, tag);
  struct tm tm {};
  const char* end = strptime(stamp.c_str(), "%a %b %d %H:%M:%S %Y", &tm);
  REQUIRE(end != nullptr);
  CHECK(*end == '\0');
  tm.tm_isdst = -1;
  const time_t at = mktime(&tm);
  CHECK(at >= before);
  CHECK(at <= after);
  struct tm back {};
  localtime_r(&at, &back);
  char asctime_text[64];
  asctime_r(&back, asctime_text);
  CHECK(stamp == std::string(asctime_text, 24));  // "Dec  6", not "Dec 06"
  // The files and the callback get the bare line.
  CHECK(ReadFile(dir.path() + "/rank.0/stdout") == "x\n");
  CHECK(seen == std::vector<std::string>{"x"});
}

TEST_CASE("output: --output-filename writes DIR/rank.N/stdout and stderr, untagged", "[output]") {
  TempDir tmp;
  const std::string dir = tmp.path() + "/not/yet/there";  // made, parents included
  Capture out, err;
  OutputRouter::Config c;
  c.out = out.file();
  c.err = err.file();
  c.output_dir = dir;
  OutputRouter router(c);
  REQUIRE(router.Open(3).ok());
  for (int r = 0; r < 3; ++r) {
    for (const char* name : {"stdout", "stderr"}) {
      const std::string path = dir + "/rank." + std::to_string(r) + "/" + name;
      INFO(path);
      struct stat st;
      CHECK(::stat(path.c_str(), &st) == 0);  // every rank's files, even a silent rank's
    }
  }
  router.Write(0, false, "out0\n");
  router.Write(0, true, "err0\n");
  router.Write(2, false, "out2 a\nout2 b\n");
  router.Write(2, false, "partial");
  router.Write(7, false, "a new worker\n");  // beyond Open's count: its files at its first line
  router.Flush();                            // the files are complete while the router lives
  CHECK(ReadFile(dir + "/rank.0/stdout") == "out0\n");
  CHECK(ReadFile(dir + "/rank.0/stderr") == "err0\n");
  CHECK(ReadFile(dir + "/rank.1/stdout").empty());
  CHECK(ReadFile(dir + "/rank.1/stderr").empty());
  CHECK(ReadFile(dir + "/rank.2/stdout") == "out2 a\nout2 b\npartial\n");
  CHECK(ReadFile(dir + "/rank.7/stdout") == "a new worker\n");
  CHECK(ReadFile(dir + "/rank.7/stderr").empty());
  // The console still gets everything, tagged.
  CHECK(out.text() ==
        "[0]<stdout>:out0\n[2]<stdout>:out2 a\n[2]<stdout>:out2 b\n[2]<stdout>:partial\n"
        "[7]<stdout>:a new worker\n");
  CHECK(err.text() == "[0]<stderr>:err0\n");
}

TEST_CASE("output: rank folders are zero-padded to the last rank's width, as horovodrun's",
          "[output]") {
  CHECK(RankDirName(0, 1) == "rank.0");
  CHECK(RankDirName(9, 10) == "rank.9");
  CHECK(RankDirName(0, 11) == "rank.00");
  CHECK(RankDirName(7, 11) == "rank.07");
  CHECK(RankDirName(10, 11) == "rank.10");
  CHECK(RankDirName(5, 101) == "rank.005");
  CHECK(RankDirName(99, 100) == "rank.99");
  TempDir tmp;
  OutputRouter::Config c;
  c.echo_to_console = false;
  c.output_dir = tmp.path();
  OutputRouter router(c);
  REQUIRE(router.Open(12).ok());
  router.Write(3, false, "three\n");
  router.Flush();
  CHECK(ReadFile(tmp.path() + "/rank.03/stdout") == "three\n");
  CHECK(std::filesystem::exists(tmp.path() + "/rank.11/stderr"));
  CHECK_FALSE(std::filesystem::exists(tmp.path() + "/rank.3"));
}

TEST_CASE("output: without console echo the files, the tail and the callback still get lines",
          "[output]") {
  TempDir dir;
  Capture out, err;
  OutputRouter::Config c;
  c.echo_to_console = false;
  c.out = out.file();
  c.err = err.file();
  c.output_dir = dir.path();
  int calls = 0;
  c.on_line = [&](int, bool, std::string_view) { ++calls; };
  {
    OutputRouter router(c);
    REQUIRE(router.Open(1).ok());
    router.Write(0, false, "o\n");
    router.Write(0, true, "e\n");
    CHECK(router.StderrTail(0) == "e");
  }  // no Flush: the destructor closes (and so flushes) the files
  CHECK(calls == 2);
  CHECK(out.text().empty());
  CHECK(err.text().empty());
  CHECK(ReadFile(dir.path() + "/rank.0/stdout") == "o\n");
  CHECK(ReadFile(dir.path() + "/rank.0/stderr") == "e\n");
}

TEST_CASE("output: Open truncates the files an earlier job left", "[output]") {
  TempDir dir;
  std::filesystem::create_directories(dir.path() + "/rank.0");
  std::ofstream(dir.path() + "/rank.0/stdout") << "an earlier job's output\n";
  OutputRouter::Config c;
  c.echo_to_console = false;
  c.output_dir = dir.path();
  {
    OutputRouter router(c);
    REQUIRE(router.Open(1).ok());
    router.Write(0, false, "new\n");
  }
  CHECK(ReadFile(dir.path() + "/rank.0/stdout") == "new\n");
}

TEST_CASE("output: Open fails, naming the flag and the path, when a directory cannot be made",
          "[output]") {
  TempDir dir;
  const std::string file = dir.path() + "/a-file";
  std::ofstream(file) << "not a directory\n";
  OutputRouter::Config c;
  c.echo_to_console = false;
  c.output_dir = file;
  OutputRouter router(c);
  Status st = router.Open(2);
  INFO(st.ToString());
  REQUIRE_FALSE(st.ok());
  CHECK(st.message().find("--output-filename") != std::string::npos);
  CHECK(st.message().find(file + "/rank.0") != std::string::npos);
  // Lines still reach the console side (here: nowhere) without crashing on missing files.
  router.Write(0, false, "still fine\n");
}

TEST_CASE("output: no output directory, no files: Open does nothing", "[output]") {
  OutputRouter::Config c;
  c.echo_to_console = false;
  OutputRouter router(c);
  CHECK(router.Open(4).ok());
  CHECK(!std::filesystem::exists("rank.0"));
}

TEST_CASE("output: the stderr tail keeps each rank's last tail_lines stderr lines, oldest first",
          "[output]") {
  OutputRouter::Config c;
  c.echo_to_console = false;
  c.tail_lines = 3;
  OutputRouter router(c);
  CHECK(router.StderrTail(0).empty());  // a rank never heard from
  for (int i = 1; i <= 5; ++i) router.Write(0, true, "e" + std::to_string(i) + "\n");
  router.Write(0, false, "stdout is not kept\n");
  router.Write(1, true, "other rank\n");
  CHECK(router.StderrTail(0) == "e3\ne4\ne5");
  CHECK(router.StderrTail(1) == "other rank");
  router.Write(0, true, "e6\ne7");  // the last piece, without its newline, is a line too
  CHECK(router.StderrTail(0) == "e5\ne6\ne7");

  OutputRouter::Config none = c;
  none.tail_lines = 0;
  OutputRouter keeps_nothing(none);
  keeps_nothing.Write(0, true, "e\n");
  CHECK(keeps_nothing.StderrTail(0).empty());
}

}  // namespace
}  // namespace ringrun::launcher::job
