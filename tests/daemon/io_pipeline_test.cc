// Tests of IoPipeline's retry loop against a fault-injecting queue, and of
// the whole path on a real io_uring with O_DIRECT and registered buffers.
#include "daemon/io_pipeline.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>

#include "support/skip.h"
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "daemon/io_queue.h"

namespace ckpt {
namespace {

// A fresh directory under /tmp (ext4 here, so O_DIRECT works), removed with
// everything in it when the test ends.
class TempDir {
 public:
  TempDir() {
    char templ[] = "/tmp/ckpt_io_pipeline_XXXXXX";
    REQUIRE(::mkdtemp(templ) != nullptr);
    path_ = templ;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string File(const char* name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

UniqueFd OpenFile(const std::string& path, int extra_flags = 0) {
  UniqueFd fd(
      ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | extra_flags, 0600));
  REQUIRE(fd.valid());
  return fd;
}

std::string ReadWholeFile(int fd) {
  struct stat st {};
  REQUIRE(::fstat(fd, &st) == 0);
  std::string data(static_cast<size_t>(st.st_size), '\0');
  REQUIRE(::pread(fd, data.data(), data.size(), 0) == st.st_size);
  return data;
}

// Bytes that differ at every position, so misplaced data is caught.
std::string Pattern(size_t size, uint32_t seed) {
  std::string data(size, '\0');
  for (size_t i = 0; i < size; ++i) {
    data[i] = static_cast<char>((i * 131 + seed * 7 + (i >> 12)) & 0xff);
  }
  return data;
}

// Wraps the pwrite queue and breaks it on purpose. Faults are public
// fields set by the test before use; so are the observations.
class FaultInjectingQueue final : public IoQueue {
 public:
  explicit FaultInjectingQueue(uint32_t depth)
      : inner_(CreatePwriteQueue(depth)) {}

  // Faults.
  bool halve = false;                      // cut transfers of > 1 byte to half
  uint32_t max_transfer = UINT32_MAX;      // cut transfers to at most this
  int eagain_left = 0;                     // the next N submissions get -EAGAIN
  std::optional<uint64_t> eio_tag;         // this tag always gets -EIO
  std::optional<uint64_t> zero_write_tag;  // writes of this tag return 0

  // Observations.
  uint32_t in_flight = 0;
  uint32_t max_in_flight = 0;
  uint32_t submissions = 0;

  absl::string_view name() const override { return "fault-injecting"; }
  uint32_t depth() const override { return inner_->depth(); }

  absl::Status Submit(absl::Span<const IoRequest> requests) override {
    if (in_flight + requests.size() > depth()) {
      return absl::FailedPreconditionError("submitted beyond depth");
    }
    for (const IoRequest& r : requests) {
      ++submissions;
      if (eagain_left > 0) {
        --eagain_left;
        injected_.push_back({r.tag, -EAGAIN});
      } else if (eio_tag == r.tag) {
        injected_.push_back({r.tag, -EIO});
      } else if (zero_write_tag == r.tag && r.kind == IoRequest::Kind::kWrite) {
        injected_.push_back({r.tag, 0});
      } else {
        IoRequest cut = r;
        if (halve && cut.length > 1) cut.length /= 2;
        cut.length = std::min(cut.length, max_transfer);
        if (absl::Status s = inner_->Submit({&cut, 1}); !s.ok()) return s;
      }
    }
    in_flight += static_cast<uint32_t>(requests.size());
    max_in_flight = std::max(max_in_flight, in_flight);
    return absl::OkStatus();
  }

  absl::Status Reap(uint32_t min_completions,
                    std::vector<IoCompletion>* out) override {
    const size_t before = out->size();
    out->insert(out->end(), injected_.begin(), injected_.end());
    injected_.clear();
    const auto got = static_cast<uint32_t>(out->size() - before);
    absl::Status s =
        inner_->Reap(min_completions > got ? min_completions - got : 0, out);
    in_flight -= static_cast<uint32_t>(out->size() - before);
    return s;
  }

 private:
  std::unique_ptr<IoQueue> inner_;
  std::deque<IoCompletion> injected_;
};

// An IoRequest in one line; the designated-initializer form takes six.
IoRequest MakeRequest(IoRequest::Kind kind, int fd, char* buffer,
                      uint32_t length, uint64_t offset, uint64_t tag,
                      int registered_index = -1) {
  return {.kind = kind,
          .fd = fd,
          .buffer = buffer,
          .length = length,
          .offset = offset,
          .registered_index = registered_index,
          .tag = tag};
}

// Starts every request, waits for all of them and returns them by tag.
std::map<uint64_t, IoPipeline::Finished> RunAll(
    IoPipeline& pipeline, const std::vector<IoRequest>& requests) {
  for (const IoRequest& r : requests) REQUIRE(pipeline.Start(r).ok());
  std::map<uint64_t, IoPipeline::Finished> by_tag;
  while (pipeline.unfinished() > 0) {
    std::vector<IoPipeline::Finished> done;
    REQUIRE(pipeline.WaitSome(&done).ok());
    REQUIRE(!done.empty());
    for (auto& f : done) REQUIRE(by_tag.emplace(f.tag, f).second);
  }
  return by_tag;
}

// One write request per piece of `data`, laid out back to back.
std::vector<IoRequest> SplitWrites(int fd, std::string& data,
                                   const std::vector<uint32_t>& sizes) {
  std::vector<IoRequest> requests;
  uint64_t offset = 0;
  for (uint32_t size : sizes) {
    requests.push_back(MakeRequest(IoRequest::Kind::kWrite, fd,
                                   data.data() + offset, size, offset,
                                   requests.size()));
    offset += size;
  }
  REQUIRE(offset == data.size());
  return requests;
}

const std::vector<uint32_t> kOddSizes = {1,     4095, 4097, (1 << 20) + 3,
                                         12345, 65536};
uint32_t Total(const std::vector<uint32_t>& sizes) {
  uint32_t total = 0;
  for (uint32_t s : sizes) total += s;
  return total;
}

TEST_CASE("Pipeline writes a file bit-exact when transfers are cut short",
          "[io_pipeline]") {
  const bool halve = GENERATE(true, false);
  TempDir dir;
  UniqueFd fd = OpenFile(dir.File("out"));
  FaultInjectingQueue queue(4);
  if (halve) {
    queue.halve = true;
  } else {
    queue.max_transfer = 4096;
  }
  IoPipeline pipeline(&queue);
  std::string data = Pattern(Total(kOddSizes), 1);

  auto finished = RunAll(pipeline, SplitWrites(fd.get(), data, kOddSizes));

  REQUIRE(finished.size() == kOddSizes.size());
  for (const auto& [tag, f] : finished) {
    CHECK(f.status.ok());
    CHECK(f.bytes == kOddSizes[tag]);
  }
  CHECK(queue.submissions > kOddSizes.size());  // short writes were requeued
  CHECK(ReadWholeFile(fd.get()) == data);
}

TEST_CASE("Pipeline requeues transfers that return EAGAIN until they succeed",
          "[io_pipeline]") {
  TempDir dir;
  UniqueFd fd = OpenFile(dir.File("out"));
  FaultInjectingQueue queue(2);
  queue.eagain_left = 5;
  IoPipeline pipeline(&queue);
  const std::vector<uint32_t> sizes = {4096, 8192, 100};
  std::string data = Pattern(Total(sizes), 2);

  auto finished = RunAll(pipeline, SplitWrites(fd.get(), data, sizes));

  for (const auto& [tag, f] : finished) CHECK(f.status.ok());
  CHECK(queue.submissions == sizes.size() + 5);
  CHECK(ReadWholeFile(fd.get()) == data);
}

TEST_CASE("Pipeline reports EIO for one transfer and still finishes the others",
          "[io_pipeline]") {
  TempDir dir;
  UniqueFd fd = OpenFile(dir.File("out"));
  FaultInjectingQueue queue(4);
  queue.eio_tag = 2;
  queue.max_transfer = 1000;  // the others need several rounds
  IoPipeline pipeline(&queue);
  const std::vector<uint32_t> sizes = {5000, 5000, 5000, 5000};
  std::string data = Pattern(Total(sizes), 3);

  auto finished = RunAll(pipeline, SplitWrites(fd.get(), data, sizes));

  REQUIRE(finished.size() == 4);
  const absl::Status& failed = finished[2].status;
  CHECK(failed.code() == absl::StatusCode::kInternal);
  CHECK_THAT(std::string(failed.message()),
             Catch::Contains("write 5000 bytes at offset 10000") &&
                 Catch::Contains(std::strerror(EIO)));
  CHECK(finished[2].bytes == 0);
  const std::string on_disk = ReadWholeFile(fd.get());
  for (uint64_t tag : {0, 1, 3}) {
    CHECK(finished[tag].status.ok());
    CHECK(finished[tag].bytes == 5000);
    CHECK(on_disk.substr(tag * 5000, 5000) == data.substr(tag * 5000, 5000));
  }
}

TEST_CASE("Pipeline fails a write that makes no progress", "[io_pipeline]") {
  TempDir dir;
  UniqueFd fd = OpenFile(dir.File("out"));
  FaultInjectingQueue queue(2);
  queue.zero_write_tag = 1;
  IoPipeline pipeline(&queue);
  const std::vector<uint32_t> sizes = {4096, 4096};
  std::string data = Pattern(Total(sizes), 4);

  auto finished = RunAll(pipeline, SplitWrites(fd.get(), data, sizes));

  CHECK(finished[0].status.ok());
  CHECK_FALSE(finished[1].status.ok());
  CHECK_THAT(std::string(finished[1].status.message()),
             Catch::Contains("write 4096 bytes at offset 4096") &&
                 Catch::Contains("wrote 0 bytes"));
}

TEST_CASE("Pipeline finishes a read at end of file with the bytes read so far",
          "[io_pipeline]") {
  TempDir dir;
  UniqueFd fd = OpenFile(dir.File("in"));
  const std::string data = Pattern(10000, 5);
  REQUIRE(::pwrite(fd.get(), data.data(), data.size(), 0) == 10000);
  FaultInjectingQueue queue(2);
  queue.max_transfer = 4096;  // 4096 + 4096 + 1808, then 0 at end of file
  IoPipeline pipeline(&queue);
  std::string whole(16384, '\0');
  std::string beyond(100, '\0');

  const auto kRead = IoRequest::Kind::kRead;
  auto finished = RunAll(
      pipeline, {MakeRequest(kRead, fd.get(), whole.data(), 16384, 0, 7),
                 MakeRequest(kRead, fd.get(), beyond.data(), 100, 20000, 8)});

  CHECK(finished[7].status.ok());
  CHECK(finished[7].bytes == 10000);
  CHECK(whole.substr(0, 10000) == data);
  CHECK(finished[8].status.ok());
  CHECK(finished[8].bytes == 0);
}

TEST_CASE("Pipeline holds back transfers beyond the queue depth",
          "[io_pipeline]") {
  TempDir dir;
  UniqueFd fd = OpenFile(dir.File("out"));
  FaultInjectingQueue queue(2);
  queue.max_transfer = 1024;
  IoPipeline pipeline(&queue);
  const std::vector<uint32_t> sizes(10, 4096);
  std::string data = Pattern(Total(sizes), 6);
  const std::vector<IoRequest> requests = SplitWrites(fd.get(), data, sizes);

  for (const IoRequest& r : requests) REQUIRE(pipeline.Start(r).ok());
  CHECK(queue.in_flight == 2);
  CHECK(pipeline.unfinished() == 10);
  size_t finished = 0;
  while (pipeline.unfinished() > 0) {
    std::vector<IoPipeline::Finished> done;
    REQUIRE(pipeline.WaitSome(&done).ok());
    for (const auto& f : done) CHECK(f.status.ok());
    finished += done.size();
  }

  CHECK(finished == 10);
  CHECK(queue.max_in_flight == 2);
  CHECK(ReadWholeFile(fd.get()) == data);
}

TEST_CASE("Pipeline rejects a tag that is already in use", "[io_pipeline]") {
  FaultInjectingQueue queue(1);
  IoPipeline pipeline(&queue);
  char byte = 0;
  const IoRequest r = MakeRequest(IoRequest::Kind::kRead, -1, &byte, 1, 0, 1);
  REQUIRE(pipeline.Start(r).ok());  // its EBADF waits, unreaped, in the queue
  CHECK(pipeline.Start(r).code() == absl::StatusCode::kInvalidArgument);
  CHECK(pipeline.unfinished() == 1);
}

TEST_CASE("Pipeline returns at once when nothing is unfinished",
          "[io_pipeline]") {
  FaultInjectingQueue queue(1);
  IoPipeline pipeline(&queue);
  std::vector<IoPipeline::Finished> done;
  CHECK(pipeline.WaitSome(&done).ok());
  CHECK(pipeline.Poll(&done).ok());
  CHECK(done.empty());
}

// Page-aligned anonymous memory, unmapped when destroyed: O_DIRECT needs
// the buffer, length and offset aligned to the logical block size.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t size) : size_(size) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    data_ = static_cast<char*>(p);
  }
  ~AlignedBuffer() { ::munmap(data_, size_); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  char* data() const { return data_; }

 private:
  char* data_;
  size_t size_;
};

TEST_CASE(
    "io_uring pipeline writes and reads back a 64 MiB O_DIRECT file "
    "through registered buffers",
    "[io_pipeline][io_uring]") {
  constexpr uint32_t kDepth = 8;
  // 8 x 512 KiB = 4 MiB pinned: under the default RLIMIT_MEMLOCK of 8 MiB
  // that registered buffers are charged against.
  constexpr uint32_t kChunk = 512 << 10;
  constexpr uint64_t kFileSize = 64 << 20;
  constexpr uint64_t kChunks = kFileSize / kChunk;
  AlignedBuffer slab(kDepth * kChunk);
  std::vector<iovec> iovs;
  for (uint32_t i = 0; i < kDepth; ++i) {
    iovs.push_back({slab.data() + i * kChunk, kChunk});
  }
  auto queue = CreateUringQueue(kDepth, iovs);
  if (!queue.ok()) {
    CKPT_SKIP("io_uring unavailable: " << queue.status().ToString());
  }
  REQUIRE((*queue)->name() == "io_uring");
  TempDir dir;
  UniqueFd fd(::open(dir.File("big").c_str(),
                     O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600));
  if (!fd.valid() && errno == EINVAL) {
    CKPT_SKIP("/tmp does not support O_DIRECT");
  }
  REQUIRE(fd.valid());
  IoPipeline pipeline(queue->get());

  for (IoRequest::Kind kind :
       {IoRequest::Kind::kWrite, IoRequest::Kind::kRead}) {
    std::vector<int> free_slots = {0, 1, 2, 3, 4, 5, 6, 7};
    std::vector<int> slot_of(kChunks, -1);
    uint64_t next = 0;
    uint64_t verified = 0;
    while (next < kChunks || pipeline.unfinished() > 0) {
      while (next < kChunks && !free_slots.empty()) {
        const int slot = free_slots.back();
        free_slots.pop_back();
        char* buffer = slab.data() + slot * kChunk;
        if (kind == IoRequest::Kind::kWrite) {
          const std::string piece =
              Pattern(kChunk, static_cast<uint32_t>(next));
          std::memcpy(buffer, piece.data(), kChunk);
        }
        slot_of[next] = slot;
        REQUIRE(pipeline
                    .Start(MakeRequest(kind, fd.get(), buffer, kChunk,
                                       next * kChunk, next, slot))
                    .ok());
        ++next;
      }
      std::vector<IoPipeline::Finished> done;
      REQUIRE(pipeline.WaitSome(&done).ok());
      for (const auto& f : done) {
        INFO("chunk " << f.tag << ": " << f.status.ToString());
        REQUIRE(f.status.ok());
        REQUIRE(f.bytes == kChunk);
        const int slot = slot_of[f.tag];
        if (kind == IoRequest::Kind::kRead) {
          const std::string expected =
              Pattern(kChunk, static_cast<uint32_t>(f.tag));
          // One assertion per chunk, not per byte.
          REQUIRE(std::memcmp(slab.data() + slot * kChunk, expected.data(),
                              kChunk) == 0);
          ++verified;
        }
        free_slots.push_back(slot);
      }
    }
    if (kind == IoRequest::Kind::kWrite) {
      struct stat st {};
      REQUIRE(::fstat(fd.get(), &st) == 0);
      CHECK(static_cast<uint64_t>(st.st_size) == kFileSize);
    } else {
      CHECK(verified == kChunks);
    }
  }
}

}  // namespace
}  // namespace ckpt
