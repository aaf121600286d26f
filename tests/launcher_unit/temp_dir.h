// A scratch directory for a test, removed with everything in it.
#pragma once

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <system_error>

namespace ringrun::testing {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/ringrun-test.XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace ringrun::testing
