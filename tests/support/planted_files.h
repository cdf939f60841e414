// Planting files, symlinks and old timestamps in a storage root: what the
// hostile-storage tests (tests/storage/storage_root_test.cc,
// tests/integration/hostile_storage_test.cc) do to a root before they check
// that ckptd neither follows nor deletes what it did not make. Buffered
// I/O and plain paths on purpose: this is the attacker's side.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <iterator>
#include <string>

namespace ckpt::testing {

inline void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  out.close();
  REQUIRE(out.good());
}

// The file's bytes; empty if it cannot be read.
inline std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void Symlink(const std::string& target, const std::string& link) {
  REQUIRE(::symlink(target.c_str(), link.c_str()) == 0);
}

// Sets a path's mtime far back (without following a symlink), so gc sees
// it as older than any commit.
inline void Age(const std::string& path) {
  const timespec times[2] = {{1, 0}, {1, 0}};
  REQUIRE(::utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW) == 0);
}

}  // namespace ckpt::testing
