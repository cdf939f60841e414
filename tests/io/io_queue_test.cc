// Tests of the raw IoQueue implementations: results are reported as the
// kernel gives them (bytes or -errno), never retried.
#include "io/io_queue.h"

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <memory>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "support/skip.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

using ::ckpt::testing::TempDir;

// A file holding "hello" in a fresh temp dir, removed at the end.
class TempFile {
 public:
  TempFile() {
    REQUIRE(fd_.valid());
    REQUIRE(::pwrite(fd_.get(), "hello", 5, 0) == 5);
  }
  int fd() const { return fd_.get(); }

 private:
  TempDir dir_;
  // Declared after dir_, so it is closed before dir_ is removed.
  UniqueFd fd_{
      ::open(dir_.File("f").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600)};
};

// Submits `requests` and waits for all of their completions.
std::vector<IoCompletion> RunBatch(IoQueue& queue,
                                   const std::vector<IoRequest>& requests) {
  size_t submitted = 0;
  REQUIRE(queue.Submit(requests, &submitted).ok());
  REQUIRE(submitted == requests.size());
  std::vector<IoCompletion> out;
  REQUIRE(queue.Reap(static_cast<uint32_t>(requests.size()), &out).ok());
  REQUIRE(out.size() == requests.size());
  return out;
}

// Both queues must report the same raw results for the same requests.
void CheckRawResults(IoQueue& queue) {
  TempFile file;
  char buf[16] = {};
  auto out = RunBatch(queue, {{.kind = IoRequest::Kind::kRead,
                               .fd = file.fd(),
                               .buffer = buf,
                               .length = sizeof(buf),
                               .offset = 0,
                               .tag = 1},
                              {.kind = IoRequest::Kind::kWrite,
                               .fd = -1,
                               .buffer = buf,
                               .length = 1,
                               .offset = 0,
                               .tag = 2}});
  for (const IoCompletion& c : out) {
    if (c.tag == 1) {
      CHECK(c.result == 5);  // short read at end of file, not retried
      CHECK(std::string(buf, 5) == "hello");
    } else {
      CHECK(c.tag == 2);
      CHECK(c.result == -EBADF);
    }
  }
}

TEST_CASE("Pwrite queue reports short reads and -errno raw", "[io_queue]") {
  auto queue = CreatePwriteQueue(4);
  CHECK(queue->name() == "pwrite");
  CheckRawResults(*queue);
}

TEST_CASE("Pwrite queue refuses a batch beyond its depth", "[io_queue]") {
  auto queue = CreatePwriteQueue(1);
  char byte = 0;
  const IoRequest r{
      .kind = IoRequest::Kind::kRead, .fd = -1, .buffer = &byte, .length = 1};
  size_t submitted = 99;
  CHECK(queue->Submit({r, r}, &submitted).code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(submitted == 0);
}

TEST_CASE("io_uring queue reports short reads and -errno raw",
          "[io_queue][io_uring]") {
  auto queue = CreateUringQueue(4, {});
  if (!queue.ok()) {
    CKPT_SKIP("io_uring unavailable: " << queue.status().ToString());
  }
  CHECK((*queue)->name() == "io_uring (unregistered buffers)");
  CheckRawResults(**queue);
}

TEST_CASE("io_uring queue rejects a registered index it does not have",
          "[io_queue][io_uring]") {
  alignas(4096) static char buffer[4096];
  const iovec one{buffer, sizeof(buffer)};
  auto queue = CreateUringQueue(2, {&one, 1});
  if (!queue.ok()) {
    CKPT_SKIP("io_uring unavailable: " << queue.status().ToString());
  }
  CHECK((*queue)->name() == "io_uring");
  const IoRequest r{.kind = IoRequest::Kind::kRead,
                    .fd = 0,
                    .buffer = buffer,
                    .length = 1,
                    .registered_index = 1};
  size_t submitted = 99;
  CHECK((*queue)->Submit({r}, &submitted).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(submitted == 0);
  std::vector<IoCompletion> out;
  CHECK((*queue)->Reap(0, &out).ok());
  CHECK(out.empty());  // the rejected batch left nothing in the ring
}

TEST_CASE("Best queue always returns a usable queue", "[io_queue]") {
  auto queue = CreateBestIoQueue(4, {});
  REQUIRE(queue != nullptr);
  CHECK(queue->depth() == 4);
  CheckRawResults(*queue);
}

}  // namespace
}  // namespace ckpt
