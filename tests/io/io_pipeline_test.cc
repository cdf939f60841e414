// Tests of IoPipeline's retry loop against a fault-injecting queue, and of
// the whole path on a real io_uring with O_DIRECT and registered buffers.
#include "io/io_pipeline.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "io/io_queue.h"
#include "support/fault_injecting_queue.h"
#include "support/skip.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

using ::ckpt::testing::FaultInjectingQueue;
using ::ckpt::testing::TempDir;

UniqueFd OpenFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
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

const std::vector<uint32_t> kOddSizes = {1,     4095, 4097, (1 << 20) + 3,
                                         12345, 65536};
uint32_t Total(const std::vector<uint32_t>& sizes) {
  uint32_t total = 0;
  for (uint32_t s : sizes) total += s;
  return total;
}

// A file in a fresh temp dir and a pipeline over a fault-injecting queue of
// `depth`. Tests set the queue's faults, then write with Writes/WriteAll.
struct PipelineOnFile {
  explicit PipelineOnFile(uint32_t depth) : queue(depth), pipeline(&queue) {}

  // Fills `data` with a pattern of the sizes' total and returns one write
  // request per size, laid out back to back from offset 0, tagged 0, 1, ...
  std::vector<IoRequest> Writes(const std::vector<uint32_t>& sizes,
                                uint32_t seed) {
    data = Pattern(Total(sizes), seed);
    std::vector<IoRequest> requests;
    uint64_t offset = 0;
    for (uint32_t size : sizes) {
      requests.push_back(MakeRequest(IoRequest::Kind::kWrite, fd.get(),
                                     data.data() + offset, size, offset,
                                     requests.size()));
      offset += size;
    }
    REQUIRE(offset == data.size());
    return requests;
  }

  // Runs Writes(sizes, seed) to completion; returns them by tag.
  std::map<uint64_t, IoPipeline::Finished> WriteAll(
      const std::vector<uint32_t>& sizes, uint32_t seed) {
    return RunAll(pipeline, Writes(sizes, seed));
  }

  std::string OnDisk() const { return ReadWholeFile(fd.get()); }

  TempDir dir;
  const UniqueFd fd = OpenFile(dir.File("file"));
  FaultInjectingQueue queue;
  IoPipeline pipeline;
  std::string data;  // what Writes() writes
};

TEST_CASE("Pipeline writes a file bit-exact when transfers are cut short",
          "[io_pipeline]") {
  const bool halve = GENERATE(true, false);
  PipelineOnFile io(4);
  if (halve) {
    io.queue.halve = true;
  } else {
    io.queue.max_transfer = 4096;
  }

  auto finished = io.WriteAll(kOddSizes, 1);

  REQUIRE(finished.size() == kOddSizes.size());
  for (const auto& [tag, f] : finished) {
    CHECK(f.status.ok());
    CHECK(f.bytes == kOddSizes[tag]);
  }
  CHECK(io.queue.submissions > kOddSizes.size());  // short writes were requeued
  CHECK(io.OnDisk() == io.data);
}

TEST_CASE("Pipeline requeues transfers that return EAGAIN until they succeed",
          "[io_pipeline]") {
  PipelineOnFile io(2);
  io.queue.eagain_left = 5;
  const std::vector<uint32_t> sizes = {4096, 8192, 100};

  auto finished = io.WriteAll(sizes, 2);

  for (const auto& [tag, f] : finished) CHECK(f.status.ok());
  CHECK(io.queue.submissions == sizes.size() + 5);
  CHECK(io.OnDisk() == io.data);
}

TEST_CASE("Pipeline reports EIO for one transfer and still finishes the others",
          "[io_pipeline]") {
  PipelineOnFile io(4);
  io.queue.eio_tag = 2;
  io.queue.max_transfer = 1000;  // the others need several rounds

  auto finished = io.WriteAll({5000, 5000, 5000, 5000}, 3);

  REQUIRE(finished.size() == 4);
  const absl::Status& failed = finished[2].status;
  CHECK(failed.code() == absl::StatusCode::kInternal);
  CHECK_THAT(std::string(failed.message()),
             Catch::Contains("write 5000 bytes at offset 10000") &&
                 Catch::Contains(std::strerror(EIO)));
  CHECK(finished[2].bytes == 0);
  const std::string on_disk = io.OnDisk();
  for (uint64_t tag : {0, 1, 3}) {
    CHECK(finished[tag].status.ok());
    CHECK(finished[tag].bytes == 5000);
    CHECK(on_disk.substr(tag * 5000, 5000) == io.data.substr(tag * 5000, 5000));
  }
}

TEST_CASE("Pipeline fails a write that makes no progress", "[io_pipeline]") {
  PipelineOnFile io(2);
  io.queue.zero_write_tag = 1;

  auto finished = io.WriteAll({4096, 4096}, 4);

  CHECK(finished[0].status.ok());
  CHECK_FALSE(finished[1].status.ok());
  CHECK_THAT(std::string(finished[1].status.message()),
             Catch::Contains("write 4096 bytes at offset 4096") &&
                 Catch::Contains("wrote 0 bytes"));
}

TEST_CASE("Pipeline finishes a read at end of file with the bytes read so far",
          "[io_pipeline]") {
  PipelineOnFile io(2);
  const std::string data = Pattern(10000, 5);
  REQUIRE(::pwrite(io.fd.get(), data.data(), data.size(), 0) == 10000);
  io.queue.max_transfer = 4096;  // 4096 + 4096 + 1808, then 0 at end of file
  std::string whole(16384, '\0');
  std::string beyond(100, '\0');

  const auto kRead = IoRequest::Kind::kRead;
  auto finished =
      RunAll(io.pipeline,
             {MakeRequest(kRead, io.fd.get(), whole.data(), 16384, 0, 7),
              MakeRequest(kRead, io.fd.get(), beyond.data(), 100, 20000, 8)});

  CHECK(finished[7].status.ok());
  CHECK(finished[7].bytes == 10000);
  CHECK(whole.substr(0, 10000) == data);
  CHECK(finished[8].status.ok());
  CHECK(finished[8].bytes == 0);
}

TEST_CASE("Pipeline holds back transfers beyond the queue depth",
          "[io_pipeline]") {
  PipelineOnFile io(2);
  io.queue.max_transfer = 1024;
  const std::vector<IoRequest> requests =
      io.Writes(std::vector<uint32_t>(10, 4096), 6);

  for (const IoRequest& r : requests) REQUIRE(io.pipeline.Start(r).ok());
  CHECK(io.queue.in_flight == 2);
  CHECK(io.pipeline.unfinished() == 10);
  size_t finished = 0;
  while (io.pipeline.unfinished() > 0) {
    std::vector<IoPipeline::Finished> done;
    REQUIRE(io.pipeline.WaitSome(&done).ok());
    for (const auto& f : done) CHECK(f.status.ok());
    finished += done.size();
  }

  CHECK(finished == 10);
  CHECK(io.queue.max_in_flight == 2);
  CHECK(io.OnDisk() == io.data);
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
