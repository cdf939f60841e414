// Tests of IoPipeline's retry loop against a fault-injecting queue, and of
// the whole path on a real io_uring with O_DIRECT and registered buffers.
// The buffers' ownership (leases held until their completion is reaped) is
// tested in io_pipeline_buffers_test.cc.
#include "io/io_pipeline.h"

#include <fcntl.h>
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
#include "io/pipeline_on_file.h"
#include "io/staging_pool.h"
#include "support/fault_injecting_queue.h"
#include "support/skip.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

using ::ckpt::testing::FaultInjectingQueue;
using ::ckpt::testing::MakeRequest;
using ::ckpt::testing::Pattern;
using ::ckpt::testing::PipelineOnFile;
using ::ckpt::testing::PipelineTransfer;
using ::ckpt::testing::RunAll;
using ::ckpt::testing::TempDir;

const std::vector<uint32_t> kOddSizes = {1,     4095, 4097, (1 << 20) + 3,
                                         12345, 65536};

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
  CHECK(io.queue.returned_while_outstanding == 0);
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
  StagingLease whole = io.pool->TryAcquire();
  StagingLease beyond = io.pool->TryAcquire();
  REQUIRE(whole);
  REQUIRE(beyond);

  const auto kRead = IoRequest::Kind::kRead;
  std::vector<PipelineTransfer> reads;
  reads.push_back(
      {MakeRequest(kRead, io.fd.get(), whole.data(), 16384, 0, 7), std::move(whole)});
  reads.push_back({MakeRequest(kRead, io.fd.get(), beyond.data(), 100, 20000, 8),
                   std::move(beyond)});
  auto finished = RunAll(io.pipeline, std::move(reads));

  CHECK(finished[7].status.ok());
  CHECK(finished[7].bytes == 10000);
  REQUIRE(finished[7].buffer);
  CHECK(std::string(finished[7].buffer.data(), 10000) == data);
  CHECK(finished[8].status.ok());
  CHECK(finished[8].bytes == 0);
}

TEST_CASE("Pipeline holds back transfers beyond the queue depth",
          "[io_pipeline]") {
  PipelineOnFile io(2, 4096, 10);
  io.queue.max_transfer = 1024;
  std::vector<PipelineTransfer> transfers =
      io.Writes(std::vector<uint32_t>(10, 4096), 6);

  for (PipelineTransfer& t : transfers) {
    REQUIRE(io.pipeline.Start(t.request, std::move(t.buffer)).ok());
  }
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
  PipelineOnFile io(1, 4096, 2);
  StagingLease first = io.pool->TryAcquire();
  StagingLease second = io.pool->TryAcquire();
  const IoRequest r = MakeRequest(IoRequest::Kind::kRead, -1, first.data(), 1, 0, 1);
  // Its EBADF waits, unreaped, in the queue.
  REQUIRE(io.pipeline.Start(r, std::move(first)).ok());
  IoRequest again = r;
  again.buffer = second.data();
  CHECK(io.pipeline.Start(again, std::move(second)).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(io.pipeline.unfinished() == 1);
  // The refused transfer's buffer went back; the started one's did not.
  CHECK(io.pool->free_bytes() == 4096);
}

TEST_CASE("Pipeline refuses a transfer outside its buffer and returns the buffer",
          "[io_pipeline]") {
  const bool outside = GENERATE(true, false);
  PipelineOnFile io(1, 4096, 2);
  StagingLease buffer = io.pool->TryAcquire();
  char elsewhere = 0;
  const IoRequest r =
      outside ? MakeRequest(IoRequest::Kind::kRead, io.fd.get(), &elsewhere, 1, 0, 1)
              : MakeRequest(IoRequest::Kind::kRead, io.fd.get(), buffer.data() + 1,
                            4096, 0, 1);  // one byte past its end
  CHECK(io.pipeline.Start(r, std::move(buffer)).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(io.pipeline.unfinished() == 0);
  CHECK(io.queue.submissions == 0);
  CHECK(io.pool->free_bytes() == 2 * 4096);
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
  std::unique_ptr<StagingPool> pool = PipelineOnFile::MustCreatePool(kChunk, kDepth);
  auto queue = CreateUringQueue(kDepth, pool->iovecs());
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
    uint64_t next = 0;
    uint64_t verified = 0;
    while (next < kChunks || pipeline.unfinished() > 0) {
      for (StagingLease buffer = pool->TryAcquire(); buffer && next < kChunks;
           buffer = pool->TryAcquire()) {
        if (kind == IoRequest::Kind::kWrite) {
          const std::string piece =
              Pattern(kChunk, static_cast<uint32_t>(next));
          std::memcpy(buffer.data(), piece.data(), kChunk);
        }
        const IoRequest r = MakeRequest(kind, fd.get(), buffer.data(), kChunk,
                                        next * kChunk, next);
        REQUIRE(pipeline.Start(r, std::move(buffer)).ok());
        ++next;
      }
      std::vector<IoPipeline::Finished> done;
      REQUIRE(pipeline.WaitSome(&done).ok());
      for (const auto& f : done) {
        INFO("chunk " << f.tag << ": " << f.status.ToString());
        REQUIRE(f.status.ok());
        REQUIRE(f.bytes == kChunk);
        REQUIRE(f.buffer);
        if (kind == IoRequest::Kind::kRead) {
          const std::string expected =
              Pattern(kChunk, static_cast<uint32_t>(f.tag));
          // One assertion per chunk, not per byte.
          REQUIRE(std::memcmp(f.buffer.data(), expected.data(), kChunk) == 0);
          ++verified;
        }
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
  CHECK(pool->free_bytes() == pool->pool_bytes());
}

}  // namespace
}  // namespace ckpt
