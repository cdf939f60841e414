// Tests of HostProcessMemory against this very process (through
// /proc/self/mem): many small spans, zero-length spans, bit-exact copies,
// faults reported as errors rather than crashes or endless loops, and a
// process that is gone.
#include "session/memory_source.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

// Bytes that differ at every position, so misplaced data is caught.
std::string Pattern(size_t size, uint32_t seed) {
  std::string data(size, '\0');
  for (size_t i = 0; i < size; ++i) {
    data[i] = static_cast<char>((i * 131 + seed * 7 + (i >> 8)) & 0xff);
  }
  return data;
}

uint64_t Addr(const void* p) { return reinterpret_cast<uint64_t>(p); }

// Cuts [0, total) into many spans of 1..97 bytes (a zero-length span every
// seventh), each span's "remote" and "local" offsets being the same.
struct Cut {
  uint64_t offset;
  uint64_t length;
};
std::vector<Cut> ManyCuts(uint64_t total) {
  std::vector<Cut> cuts;
  uint64_t at = 0;
  for (uint64_t i = 0; at < total; ++i) {
    const uint64_t length =
        i % 7 == 3 ? 0 : std::min<uint64_t>(1 + (i * 37) % 97, total - at);
    cuts.push_back({at, length});
    at += length;
  }
  return cuts;
}

// One span per cut, at the cut's offset in both `remote` and `local`.
std::vector<CopySpan> SpansAtCuts(const std::vector<Cut>& cuts,
                                  const char* remote, char* local) {
  std::vector<CopySpan> spans;
  for (const Cut& c : cuts) {
    spans.push_back({Addr(remote + c.offset), local + c.offset, c.length});
  }
  return spans;
}

// An address that is certainly unmapped: a page mapped, then unmapped.
uint64_t UnmappedAddress() {
  const long page = ::sysconf(_SC_PAGESIZE);
  void* p = ::mmap(nullptr, page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(p != MAP_FAILED);
  REQUIRE(::munmap(p, page) == 0);
  return Addr(p);
}

TEST_CASE(
    "HostProcessMemory reads thousands of small spans bit-exactly, "
    "zero-length spans included",
    "[memory_source]") {
  const std::string remote = Pattern(150000, 1);
  const std::vector<Cut> cuts = ManyCuts(remote.size());
  REQUIRE(cuts.size() > 2 * 1024 + 1);
  std::string local(remote.size(), '\0');
  const std::vector<CopySpan> spans =
      SpansAtCuts(cuts, remote.data(), local.data());

  HostProcessMemory memory(::getpid());
  REQUIRE(memory.Read(spans).ok());
  CHECK(local == remote);
}

TEST_CASE(
    "HostProcessMemory writes thousands of small spans bit-exactly, "
    "zero-length spans included",
    "[memory_source]") {
  const std::string local = Pattern(150000, 2);
  std::string remote(local.size(), '\0');
  const std::vector<Cut> cuts = ManyCuts(local.size());
  REQUIRE(cuts.size() > 2 * 1024 + 1);
  const std::vector<CopySpan> spans =
      SpansAtCuts(cuts, remote.data(), const_cast<char*>(local.data()));

  HostProcessMemory memory(::getpid());
  REQUIRE(memory.Write(spans).ok());
  CHECK(remote == local);
}

TEST_CASE(
    "HostProcessMemory gathers scattered remote spans into their local "
    "places",
    "[memory_source]") {
  // Remote spans in reverse order of their local places, with gaps, and
  // spans long enough to cross pages.
  const std::string remote = Pattern(64 * 1024, 3);
  std::string local(remote.size(), 'z');
  std::vector<CopySpan> spans;
  std::string expected(remote.size(), 'z');
  uint64_t local_at = 0;
  for (uint64_t remote_at = remote.size(); remote_at >= 9000;) {
    remote_at -= 9000;
    const uint64_t len = 5000 + remote_at % 3001;
    spans.push_back(
        {Addr(remote.data() + remote_at), local.data() + local_at, len});
    expected.replace(local_at, len, remote, remote_at, len);
    local_at += len + 11;
  }
  HostProcessMemory memory(::getpid());
  REQUIRE(memory.Read(spans).ok());
  CHECK(local == expected);
}

TEST_CASE(
    "HostProcessMemory treats an empty list and only zero-length spans "
    "as a no-op",
    "[memory_source]") {
  HostProcessMemory memory(::getpid());
  CHECK(memory.Read({}).ok());
  char byte = 'q';
  const std::vector<CopySpan> zeros(3000,
                                    CopySpan{UnmappedAddress(), &byte, 0});
  CHECK(memory.Read(zeros).ok());
  CHECK(memory.Write(zeros).ok());
  CHECK(byte == 'q');
}

TEST_CASE(
    "HostProcessMemory reading an unmapped address is an error naming the "
    "address and the pid",
    "[memory_source]") {
  HostProcessMemory memory(::getpid());
  std::string local(4096, '\0');
  const uint64_t unmapped = UnmappedAddress();
  const CopySpan span{unmapped, local.data(), 100};
  const absl::Status status = memory.Read({&span, 1});
  REQUIRE_FALSE(status.ok());
  CHECK_THAT(std::string(status.message()),
             Catch::Contains(absl::StrCat("read of 100 bytes at 0x",
                                          absl::Hex(unmapped), " in pid ",
                                          ::getpid())));
}

TEST_CASE(
    "HostProcessMemory reports a fault after spans that copied as an "
    "error",
    "[memory_source]") {
  // The kernel copies the good spans, stops at the fault and returns a
  // partial count; the next call must report the fault, not loop or succeed.
  const std::string remote = Pattern(3000, 4);
  std::string local(4000, '\0');
  const std::vector<CopySpan> spans = {
      {Addr(remote.data()), local.data(), 1000},
      {Addr(remote.data() + 1000), local.data() + 1000, 2000},
      {UnmappedAddress(), local.data() + 3000, 1000},
  };
  HostProcessMemory memory(::getpid());
  const absl::Status status = memory.Read(spans);
  REQUIRE_FALSE(status.ok());
  CHECK_THAT(std::string(status.message()),
             Catch::Contains(absl::StrCat("read of 1000 bytes at 0x",
                                          absl::Hex(spans[2].remote))));
  CHECK(local.substr(0, 3000) == remote);
}

TEST_CASE(
    "HostProcessMemory writing to an unmapped address is an error naming "
    "the address",
    "[memory_source]") {
  HostProcessMemory memory(::getpid());
  std::string local = Pattern(100, 5);
  const uint64_t unmapped = UnmappedAddress();
  const CopySpan span{unmapped, local.data(), local.size()};
  const absl::Status status = memory.Write({&span, 1});
  REQUIRE_FALSE(status.ok());
  CHECK_THAT(std::string(status.message()),
             Catch::Contains(absl::StrCat("write of 100 bytes at 0x",
                                          absl::Hex(unmapped))));
}

TEST_CASE("HostProcessMemory of a process that had exited is NotFound",
          "[memory_source]") {
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) ::_exit(0);
  int wstatus = 0;
  REQUIRE(::waitpid(child, &wstatus, 0) == child);

  const std::string remote = Pattern(64, 6);
  std::string local(64, '\0');
  const CopySpan span{Addr(remote.data()), local.data(), 64};
  HostProcessMemory memory(child);
  CHECK(memory.Read({&span, 1}).code() == absl::StatusCode::kNotFound);
}

TEST_CASE(
    "HostProcessMemory of a process that exits after it was opened is "
    "Unavailable, for reads and writes",
    "[memory_source]") {
  // The child holds a copy of `remote` (fork), waits for a byte, exits.
  std::string remote = Pattern(64, 7);
  int go[2];
  REQUIRE(::pipe(go) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    char byte;
    ::close(go[1]);
    const ssize_t n = ::read(go[0], &byte, 1);
    ::_exit(n == 1 ? 0 : 1);
  }
  ::close(go[0]);
  HostProcessMemory memory(child);
  std::string local(64, '\0');
  const CopySpan span{Addr(remote.data()), local.data(), 64};
  REQUIRE(memory.Read({&span, 1}).ok());
  CHECK(local == remote);

  REQUIRE(::write(go[1], "x", 1) == 1);
  ::close(go[1]);
  int wstatus = 0;
  REQUIRE(::waitpid(child, &wstatus, 0) == child);
  const absl::Status read = memory.Read({&span, 1});
  CHECK(absl::IsUnavailable(read));
  CHECK_THAT(std::string(read.message()),
             Catch::Contains(absl::StrCat("pid ", child)));
  CHECK(absl::IsUnavailable(memory.Write({&span, 1})));
}

}  // namespace
}  // namespace ckpt
