// Tests of IoPipeline's hold on staging buffers: a transfer's lease comes
// back only with its reaped completion, and neither destroying the pipeline,
// Abort, a failing queue nor a batch the queue takes only in part lets a
// buffer go back to the pool while a request on it is outstanding. The
// fault-injecting queue watches the pool and counts any buffer that does.
#include <catch2/catch.hpp>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "io/io_pipeline.h"
#include "io/pipeline_on_file.h"
#include "io/staging_pool.h"
#include "support/fault_injecting_queue.h"

namespace ckpt {
namespace {

using ::ckpt::testing::kPipelineBufferBytes;
using ::ckpt::testing::PipelineOnFile;
using ::ckpt::testing::PipelineTransfer;

constexpr uint64_t kBuffers = 6;  // PipelineOnFile's default pool

uint64_t FreeBuffers(const PipelineOnFile& io) {
  return io.pool->free_bytes() / kPipelineBufferBytes;
}

void StartAll(IoPipeline& pipeline, std::vector<PipelineTransfer>& transfers) {
  for (PipelineTransfer& t : transfers) {
    REQUIRE(pipeline.Start(t.request, std::move(t.buffer)).ok());
  }
}

TEST_CASE(
    "Pipeline keeps a transfer's buffer until its completion is reaped and "
    "then hands that same buffer back",
    "[io_pipeline]") {
  PipelineOnFile io(4);
  std::vector<PipelineTransfer> writes = io.Writes({4096, 8192, 100}, 1);
  std::map<uint64_t, int> index_of_tag;
  for (const PipelineTransfer& t : writes) {
    index_of_tag[t.request.tag] = t.buffer.index();
  }
  StartAll(io.pipeline, writes);
  // The pwrite-based queue has run them, but nothing is reaped yet.
  CHECK(io.queue.in_flight == 3);
  CHECK(FreeBuffers(io) == kBuffers - 3);

  std::vector<IoPipeline::Finished> done;
  while (io.pipeline.unfinished() > 0) REQUIRE(io.pipeline.WaitSome(&done).ok());
  REQUIRE(done.size() == 3);
  for (const IoPipeline::Finished& f : done) {
    INFO("tag " << f.tag);
    CHECK(f.status.ok());
    REQUIRE(f.buffer);
    CHECK(f.buffer.index() == index_of_tag[f.tag]);
  }
  // Reaped, but still the caller's until it lets them go.
  CHECK(FreeBuffers(io) == kBuffers - 3);
  done.clear();
  CHECK(FreeBuffers(io) == kBuffers);
  CHECK(io.OnDisk() == io.data);
  CHECK(io.queue.returned_while_outstanding == 0);
}

TEST_CASE(
    "Destroying a pipeline with transfers in flight and held back waits for "
    "them before their buffers go back",
    "[io_pipeline]") {
  PipelineOnFile io(4);
  // A pipeline of its own, so that it can be destroyed mid-way.
  auto pipeline = std::make_unique<IoPipeline>(&io.queue);
  io.queue.max_transfer = 1000;  // every write is short at least once
  std::vector<PipelineTransfer> writes =
      io.Writes({5000, 5000, 5000, 5000, 5000, 5000}, 2);
  StartAll(*pipeline, writes);
  CHECK(io.queue.in_flight == 4);  // two more held back
  CHECK(FreeBuffers(io) == 0);

  pipeline.reset();

  CHECK(io.queue.in_flight == 0);
  CHECK(io.queue.returned_while_outstanding == 0);
  CHECK(FreeBuffers(io) == kBuffers);
  CHECK(io.pool->withheld_buffers() == 0);
}

TEST_CASE(
    "Pipeline Abort after a transient Reap failure waits for every transfer "
    "and returns every buffer",
    "[io_pipeline]") {
  PipelineOnFile io(4);
  std::vector<PipelineTransfer> writes = io.Writes({4096, 4096, 4096, 4096, 4096}, 3);
  StartAll(io.pipeline, writes);
  io.queue.failing_reap = 1;
  io.queue.failing_reaps = 2;  // Abort tries three times

  const absl::Status status = io.pipeline.Abort();

  CHECK(status.code() == absl::StatusCode::kInternal);  // reported all the same
  CHECK(io.pipeline.unfinished() == 0);
  CHECK(io.queue.in_flight == 0);
  CHECK(io.queue.returned_while_outstanding == 0);
  CHECK(FreeBuffers(io) == kBuffers);
}

TEST_CASE(
    "Pipeline Abort withholds the buffers of transfers whose completions can "
    "never be reaped and returns the rest",
    "[io_pipeline]") {
  PipelineOnFile io(4);
  std::vector<PipelineTransfer> writes = io.Writes({4096, 4096, 4096, 4096, 4096}, 4);
  StartAll(io.pipeline, writes);  // four in flight, one held back
  io.queue.failing_reap = 1;
  io.queue.failing_reaps = 1000;  // the queue is broken for good

  const absl::Status status = io.pipeline.Abort();

  CHECK(status.code() == absl::StatusCode::kInternal);
  CHECK_THAT(std::string(status.message()), Catch::Contains("injected failure of Reap"));
  CHECK(io.pipeline.unfinished() == 0);
  CHECK(io.pool->withheld_buffers() == 4);
  CHECK(FreeBuffers(io) == kBuffers - 4);  // the held one came back
  CHECK(io.queue.returned_while_outstanding == 0);
}

TEST_CASE(
    "Pipeline keeps in flight the part of a batch the queue took before "
    "refusing the rest, and finishes everything after",
    "[io_pipeline]") {
  PipelineOnFile io(2);
  std::vector<PipelineTransfer> writes = io.Writes({4096, 4096, 4096, 4096, 4096}, 5);
  StartAll(io.pipeline, writes);  // two in flight, three held back
  // The batch refilling the two freed slots: its first request is taken,
  // its second refused.
  io.queue.refuse_nth = 4;

  std::vector<IoPipeline::Finished> done;
  const absl::Status refused = io.pipeline.WaitSome(&done);

  CHECK(refused.code() == absl::StatusCode::kUnavailable);
  CHECK(done.size() == 2);
  CHECK(io.queue.in_flight == 1);
  CHECK(io.pipeline.unfinished() == 3);
  while (io.pipeline.unfinished() > 0) REQUIRE(io.pipeline.WaitSome(&done).ok());
  REQUIRE(done.size() == 5);
  for (const IoPipeline::Finished& f : done) CHECK(f.status.ok());
  CHECK(io.OnDisk() == io.data);
  done.clear();
  CHECK(io.queue.returned_while_outstanding == 0);
  CHECK(FreeBuffers(io) == kBuffers);
}

TEST_CASE("A Start the queue refuses returns its buffer to the pool",
          "[io_pipeline]") {
  PipelineOnFile io(2);
  std::vector<PipelineTransfer> writes = io.Writes({4096}, 6);
  io.queue.refuse_nth = 1;

  CHECK(io.pipeline.Start(writes[0].request, std::move(writes[0].buffer)).code() ==
        absl::StatusCode::kUnavailable);

  CHECK(io.pipeline.unfinished() == 0);
  CHECK(FreeBuffers(io) == kBuffers);
}

}  // namespace
}  // namespace ckpt
