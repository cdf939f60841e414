// TempDir: a fresh directory under /tmp for one test, removed with
// everything in it when the test ends. /tmp is a real file system here
// (O_DIRECT works on it), unlike a tmpfs.
//
// Thread-safety: none; one test owns it.
#pragma once

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

namespace ckpt::testing {

class TempDir {
 public:
  TempDir() {
    char templ[] = "/tmp/ckpt_unit_XXXXXX";
    REQUIRE(::mkdtemp(templ) != nullptr);
    path_ = templ;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace ckpt::testing
