// PipelineOnFile: the fixture of the IoPipeline tests. A file in a fresh
// temp dir, a staging pool, a fault-injecting queue that watches the pool
// (buffers returned while a request on them is outstanding are counted) and
// a pipeline over that queue. Tests set the queue's faults, then write with
// Writes/WriteAll or build their own transfers.
//
// Thread-safety: none; one test owns it.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/unique_fd.h"
#include "io/io_pipeline.h"
#include "io/io_queue.h"
#include "io/staging_pool.h"
#include "support/fault_injecting_queue.h"
#include "support/temp_dir.h"

namespace ckpt::testing {

// Large enough for the largest odd size below; six of them stay under the
// default RLIMIT_MEMLOCK of 8 MiB, so the pool is pinned as in production.
inline constexpr uint32_t kPipelineBufferBytes = (1 << 20) + 4096;

inline std::string ReadWholeFile(int fd) {
  struct stat st {};
  REQUIRE(::fstat(fd, &st) == 0);
  std::string data(static_cast<size_t>(st.st_size), '\0');
  REQUIRE(::pread(fd, data.data(), data.size(), 0) == st.st_size);
  return data;
}

// Bytes that differ at every position, so misplaced data is caught.
inline std::string Pattern(size_t size, uint32_t seed) {
  std::string data(size, '\0');
  for (size_t i = 0; i < size; ++i) {
    data[i] = static_cast<char>((i * 131 + seed * 7 + (i >> 12)) & 0xff);
  }
  return data;
}

// An IoRequest in one line; the designated-initializer form takes six.
inline IoRequest MakeRequest(IoRequest::Kind kind, int fd, char* buffer,
                             uint32_t length, uint64_t offset, uint64_t tag) {
  return {.kind = kind,
          .fd = fd,
          .buffer = buffer,
          .length = length,
          .offset = offset,
          .tag = tag};
}

// A request and the lease of the buffer it uses, ready for Start.
struct PipelineTransfer {
  IoRequest request;
  StagingLease buffer;
};

// Starts every transfer, waits for all of them and returns them by tag
// (with their buffers, back from the pipeline).
inline std::map<uint64_t, IoPipeline::Finished> RunAll(
    IoPipeline& pipeline, std::vector<PipelineTransfer> transfers) {
  for (PipelineTransfer& t : transfers) {
    REQUIRE(pipeline.Start(t.request, std::move(t.buffer)).ok());
  }
  std::map<uint64_t, IoPipeline::Finished> by_tag;
  while (pipeline.unfinished() > 0) {
    std::vector<IoPipeline::Finished> done;
    REQUIRE(pipeline.WaitSome(&done).ok());
    REQUIRE(!done.empty());
    for (auto& f : done) {
      const uint64_t tag = f.tag;
      REQUIRE(by_tag.emplace(tag, std::move(f)).second);
    }
  }
  return by_tag;
}

inline uint64_t Total(const std::vector<uint32_t>& sizes) {
  uint64_t total = 0;
  for (uint32_t s : sizes) total += s;
  return total;
}

struct PipelineOnFile {
  explicit PipelineOnFile(uint32_t depth,
                          uint32_t buffer_bytes = kPipelineBufferBytes,
                          uint64_t buffers = 6)
      : pool(MustCreatePool(buffer_bytes, buffers)),
        queue(depth),
        pipeline(&queue) {
    REQUIRE(fd.valid());
    queue.WatchPool(pool.get());
  }

  static std::unique_ptr<StagingPool> MustCreatePool(uint32_t buffer_bytes,
                                                     uint64_t buffers) {
    absl::StatusOr<std::unique_ptr<StagingPool>> made =
        StagingPool::Create(buffer_bytes * buffers, buffer_bytes);
    INFO(made.status());
    REQUIRE(made.ok());
    return *std::move(made);
  }

  // Fills `data` with a pattern of the sizes' total and returns one write
  // per size, laid out back to back from offset 0, tagged 0, 1, ..., each
  // from its own buffer holding its piece of `data`.
  std::vector<PipelineTransfer> Writes(const std::vector<uint32_t>& sizes,
                                       uint32_t seed) {
    data = Pattern(Total(sizes), seed);
    std::vector<PipelineTransfer> transfers;
    uint64_t offset = 0;
    for (uint32_t size : sizes) {
      StagingLease buffer = pool->TryAcquire();
      REQUIRE(buffer);
      REQUIRE(size <= buffer.size());
      std::memcpy(buffer.data(), data.data() + offset, size);
      transfers.push_back(
          {MakeRequest(IoRequest::Kind::kWrite, fd.get(), buffer.data(), size,
                       offset, transfers.size()),
           std::move(buffer)});
      offset += size;
    }
    return transfers;
  }

  // Runs Writes(sizes, seed) to completion; returns them by tag.
  std::map<uint64_t, IoPipeline::Finished> WriteAll(
      const std::vector<uint32_t>& sizes, uint32_t seed) {
    return RunAll(pipeline, Writes(sizes, seed));
  }

  std::string OnDisk() const { return ReadWholeFile(fd.get()); }

  // Declared in this order so that the pipeline (which may still wait for
  // transfers) goes first, then the queue (which stops watching the pool),
  // then the pool, then the file.
  TempDir dir;
  const UniqueFd fd{
      ::open(dir.File("file").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600)};
  std::unique_ptr<StagingPool> pool;
  FaultInjectingQueue queue;
  IoPipeline pipeline;
  std::string data;  // what Writes() writes
};

}  // namespace ckpt::testing
