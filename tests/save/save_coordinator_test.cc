// Tests of SaveCoordinator through its seams (save/save_harness.h): the I/O
// workers on fault-injecting queues, the data files' and the node
// manifest's FileOps, sessions of this very process. No daemon, no gRPC.
//
// What a failed or cancelled save must leave is checked on the storage root
// itself: nothing of the checkpoint (the job's directory may stay), and
// every staging buffer back in the pool.
#include "save/save_coordinator.h"

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "save/save_harness.h"
#include "storage/durable_file.h"
#include "storage/memory_tier.h"
#include "support/fault_injecting_queue.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

using ::ckpt::testing::FaultInjectingQueue;
using ::ckpt::testing::PathsUnder;
using ::ckpt::testing::ProgressLog;
using ::ckpt::testing::SaveHarness;
using ::ckpt::testing::SaveHarnessOptions;
using ::ckpt::testing::TempDir;

constexpr char kCheckpoint[] = "step-1";
const std::vector<std::string> kOnlyTheJobDir = {SaveHarness::kJob};

SaveHarnessOptions WithFileOps(FileOps* ops) {
  SaveHarnessOptions options;
  options.file_ops = ops;
  return options;
}

SaveHarnessOptions NodeOfTwo(uint32_t node_id) {
  SaveHarnessOptions options;
  options.node_id = node_id;
  options.nodes = 2;
  return options;
}

bool IsDataFile(const std::string& path) {
  return absl::EndsWith(path, ".safetensors");
}

// The real file operations, except that one step fails on every path that
// contains `path_part`; counts the failures.
class FailingFileOps final : public FileOps {
 public:
  enum class Step { kTruncate, kFsync, kWriteAll };
  FailingFileOps(Step step, std::string path_part)
      : step_(step), path_part_(std::move(path_part)) {}

  int failures() const { return failures_.load(); }

  absl::Status Truncate(int fd, uint64_t size,
                        const std::string& path) override {
    if (Fails(Step::kTruncate, path)) return Injected("ftruncate", path);
    return FileOps::Truncate(fd, size, path);
  }
  absl::Status Fsync(int fd, const std::string& path) override {
    if (Fails(Step::kFsync, path)) return Injected("fsync", path);
    return FileOps::Fsync(fd, path);
  }
  absl::Status WriteAll(int fd, absl::string_view bytes,
                        const std::string& path) override {
    if (Fails(Step::kWriteAll, path)) return Injected("write", path);
    return FileOps::WriteAll(fd, bytes, path);
  }

 private:
  bool Fails(Step step, const std::string& path) const {
    return step == step_ && absl::StrContains(path, path_part_);
  }
  absl::Status Injected(const char* what, const std::string& path) {
    ++failures_;
    return absl::DataLossError(absl::StrCat("injected ", what, " failure of ", path));
  }

  const Step step_;
  const std::string path_part_;
  std::atomic<int> failures_{0};
};

// The real file operations, except that a data file's ftruncate (after its
// last write completed, before its fsync: the part is STAGED, not durable)
// waits until Release.
class BlockingDataFileOps final : public FileOps {
 public:
  absl::Status Truncate(int fd, uint64_t size,
                        const std::string& path) override {
    if (IsDataFile(path)) {
      absl::MutexLock lock(&mu_);
      ++blocked_;
      mu_.Await(absl::Condition(&released_));
    }
    return FileOps::Truncate(fd, size, path);
  }
  // True once a data file's ftruncate waits, within `limit`.
  bool WaitUntilBlocked(absl::Duration limit) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(
        absl::Condition(this, &BlockingDataFileOps::HasBlocked), limit);
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
  }

 private:
  bool HasBlocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return blocked_ > 0;
  }

  absl::Mutex mu_;
  int blocked_ ABSL_GUARDED_BY(mu_) = 0;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

// Waits for the save's final progress; the test fails if it does not come.
v1::SaveProgress WaitForEnd(const ProgressLog& log) {
  std::optional<v1::SaveProgress> end = log.WaitForEnd();
  INFO(log.Describe());
  REQUIRE(end.has_value());
  return *end;
}

v1::SaveProgress WaitForPhase(const ProgressLog& log, v1::Phase phase) {
  std::optional<v1::SaveProgress> reached = log.WaitForPhase(phase);
  INFO("waiting for " << v1::Phase_Name(phase) << ": " << log.Describe());
  REQUIRE(reached.has_value());
  return *reached;
}

// What a failed save must leave once the workers are done: nothing of the
// checkpoint under the root, and every staging buffer back in the pool.
void CheckNothingLeft(SaveHarness& harness, const TempDir& root) {
  harness.StopWorkers();  // the removal of the files runs on a worker
  CHECK(PathsUnder(root.path()) == kOnlyTheJobDir);
  CHECK(harness.pool().free_bytes() == harness.pool().pool_bytes());
  absl::StatusOr<std::vector<v1::CheckpointInfo>> listed =
      harness.store().List(SaveHarness::kJob);
  REQUIRE(listed.ok());
  CHECK(listed->empty());
}

TEST_CASE(
    "SaveCoordinator takes a clean save through ACCEPTED, STAGED, DURABLE "
    "and COMMITTED to a checkpoint the store lists as committed",
    "[save_coordinator]") {
  TempDir root;
  SaveHarness harness(root.path());
  SaveHarness::Rank& rank0 = harness.AddRank(0, 2, 2);
  SaveHarness::Rank& rank1 = harness.AddRank(1, 2, 2);
  // Held, so that each watch starts at ACCEPTED.
  harness.HoldWorkers();
  const std::vector<std::shared_ptr<ProgressLog>> logs = {
      harness.Save(rank0, kCheckpoint), harness.Save(rank1, kCheckpoint)};
  harness.ReleaseWorkers();

  for (const auto& log : logs) {
    const v1::SaveProgress end = WaitForEnd(*log);
    INFO(log->Describe());
    REQUIRE(end.phase() == v1::PHASE_COMMITTED);
    CHECK(log->Phases() ==
          std::vector<v1::Phase>{v1::PHASE_ACCEPTED, v1::PHASE_STAGED,
                                 v1::PHASE_DURABLE, v1::PHASE_COMMITTED});
    CHECK(end.accepted_unix_micros() > 0);
    CHECK(end.staged_unix_micros() >= end.accepted_unix_micros());
    CHECK(end.durable_unix_micros() >= end.staged_unix_micros());
    CHECK(end.committed_unix_micros() >= end.durable_unix_micros());
    CHECK(end.ranks_submitted() == 2);
    CHECK(end.total_bytes() > SaveHarness::kWeightElements * 4);
    CHECK(end.bytes_staged() == end.total_bytes());
  }

  absl::StatusOr<std::vector<v1::CheckpointInfo>> listed =
      harness.store().List(SaveHarness::kJob);
  INFO(listed.status());
  REQUIRE(listed.ok());
  REQUIRE(listed->size() == 1);
  CHECK(listed->front().checkpoint() == kCheckpoint);
  CHECK(listed->front().committed());
  CHECK(listed->front().latest());
  CHECK(listed->front().world_size() == 2);
  absl::StatusOr<v1::CommitRecord> commit =
      harness.store().ReadCommit(SaveHarness::kJob, kCheckpoint);
  INFO(commit.status());
  REQUIRE(commit.ok());
  CHECK(commit->index().files_size() == 2);  // one per rank
  CHECK(commit->index().tensors_size() == 4);
  CHECK(commit->index().byte_items_size() == 2);
  harness.StopWorkers();
  CHECK(harness.pool().free_bytes() == harness.pool().pool_bytes());
}

TEST_CASE(
    "SaveCoordinator ends the checkpoint FAILED for every rank when a write "
    "fails with EIO while several are in flight, and leaves none of its "
    "files",
    "[save_coordinator]") {
  TempDir root;
  SaveHarnessOptions options;
  options.faults = [](FaultInjectingQueue& q) {
    q.lazy = true;  // polls find nothing: writes pile up in flight
    q.eio_nth = 3;
  };
  SaveHarness harness(root.path(), options);
  SaveHarness::Rank& rank0 = harness.AddRank(0, 2, 2);
  SaveHarness::Rank& rank1 = harness.AddRank(1, 2, 2);
  const std::vector<std::shared_ptr<ProgressLog>> logs = {
      harness.Save(rank0, kCheckpoint), harness.Save(rank1, kCheckpoint)};

  std::string reason;
  for (const auto& log : logs) {
    const v1::SaveProgress end = WaitForEnd(*log);
    INFO(log->Describe());
    CHECK(end.phase() == v1::PHASE_FAILED);
    CHECK_THAT(end.reason(), Catch::Contains("Input/output error"));
    if (reason.empty()) reason = end.reason();
    CHECK(end.reason() == reason);  // every rank hears the same error
  }
  CheckNothingLeft(harness, root);
  bool several_in_flight = false;
  for (const auto& queue : harness.queues()) {
    CHECK(queue->in_flight == 0);
    if (queue->in_flight_at_fault.value_or(0) > 1) several_in_flight = true;
  }
  CHECK(several_in_flight);
}

TEST_CASE(
    "SaveCoordinator ends the checkpoint FAILED when a data file's ftruncate "
    "or fsync fails, and leaves none of its files",
    "[save_coordinator]") {
  using Step = FailingFileOps::Step;
  const Step step = GENERATE(Step::kTruncate, Step::kFsync);
  const char* what = step == Step::kTruncate ? "ftruncate" : "fsync";
  INFO("failing " << what);
  TempDir root;
  FailingFileOps ops(step, ".safetensors");
  SaveHarness harness(root.path(), WithFileOps(&ops));
  SaveHarness::Rank& rank0 = harness.AddRank(0, 2, 2);
  SaveHarness::Rank& rank1 = harness.AddRank(1, 2, 2);
  const std::vector<std::shared_ptr<ProgressLog>> logs = {
      harness.Save(rank0, kCheckpoint), harness.Save(rank1, kCheckpoint)};

  for (const auto& log : logs) {
    const v1::SaveProgress end = WaitForEnd(*log);
    INFO(log->Describe());
    CHECK(end.phase() == v1::PHASE_FAILED);
    CHECK_THAT(end.reason(),
               Catch::Contains(absl::StrCat("injected ", what, " failure")));
  }
  CheckNothingLeft(harness, root);
  CHECK(ops.failures() >= 1);
}

TEST_CASE(
    "SaveCoordinator ends the checkpoint FAILED when its node manifest "
    "cannot be written, and leaves none of its files",
    "[save_coordinator]") {
  TempDir root;
  FailingFileOps ops(FailingFileOps::Step::kWriteAll, ".manifest");
  SaveHarness harness(root.path(), WithFileOps(&ops));
  SaveHarness::Rank& rank0 = harness.AddRank(0, 1, 1);
  const std::shared_ptr<ProgressLog> log = harness.Save(rank0, kCheckpoint);

  const v1::SaveProgress end = WaitForEnd(*log);
  INFO(log->Describe());
  CHECK(end.phase() == v1::PHASE_FAILED);
  CHECK_THAT(end.reason(), Catch::StartsWith("node manifest: "));
  CHECK_THAT(end.reason(), Catch::Contains("injected write failure"));
  CHECK(ops.failures() == 1);
  CheckNothingLeft(harness, root);
}

TEST_CASE(
    "SaveCoordinator cancelled before DURABLE ends the checkpoint CANCELLED "
    "for every rank and leaves none of its files",
    "[save_coordinator]") {
  TempDir root;
  BlockingDataFileOps ops;
  SaveHarness harness(root.path(), WithFileOps(&ops));
  // Declared after the harness, so the writers are let go before the
  // harness waits for them, however the test ends.
  struct ReleaseOnExit {
    BlockingDataFileOps& ops;
    ~ReleaseOnExit() { ops.Release(); }
  } release_on_exit{ops};
  SaveHarness::Rank& rank0 = harness.AddRank(0, 2, 2);
  SaveHarness::Rank& rank1 = harness.AddRank(1, 2, 2);
  const std::vector<std::shared_ptr<ProgressLog>> logs = {
      harness.Save(rank0, kCheckpoint), harness.Save(rank1, kCheckpoint)};

  // A data file is written whole and waits for its ftruncate.
  REQUIRE(ops.WaitUntilBlocked(::ckpt::testing::kPhaseWaitLimit));
  std::vector<std::string> during = PathsUnder(root.path());
  INFO("under the root while blocked: " << absl::StrJoin(during, " "));
  CHECK(std::any_of(during.begin(), during.end(), IsDataFile));
  absl::StatusOr<uint32_t> cancelled =
      harness.coordinator().CancelSave(*rank0.session, logs[0]->save_id());
  INFO(cancelled.status());
  REQUIRE(cancelled.ok());
  CHECK(*cancelled == 2);

  for (const auto& log : logs) {
    const v1::SaveProgress end = WaitForEnd(*log);
    INFO(log->Describe());
    CHECK(end.phase() == v1::PHASE_CANCELLED);
    CHECK(end.reason() == "cancelled by rank 0");
    CHECK(end.durable_unix_micros() == 0);
  }
  ops.Release();
  CheckNothingLeft(harness, root);
}

TEST_CASE(
    "SaveCoordinator on one node of two refuses a cancel once the node is "
    "DURABLE and leaves the checkpoint durable but uncommitted",
    "[save_coordinator]") {
  TempDir root;
  SaveHarness harness(root.path(), NodeOfTwo(0));
  SaveHarness::Rank& rank0 = harness.AddRank(0, 2, 1);
  const std::shared_ptr<ProgressLog> log = harness.Save(rank0, kCheckpoint);
  WaitForPhase(*log, v1::PHASE_DURABLE);

  const absl::StatusOr<uint32_t> by_rank =
      harness.coordinator().CancelSave(*rank0.session, log->save_id());
  CHECK(by_rank.status().code() == absl::StatusCode::kFailedPrecondition);
  const absl::StatusOr<uint32_t> by_operator =
      harness.coordinator().CancelCheckpoint(SaveHarness::kJob, kCheckpoint);
  CHECK(by_operator.status().code() == absl::StatusCode::kFailedPrecondition);

  // Several commit attempts later, it still waits for node 1.
  absl::SleepFor(absl::Milliseconds(300));
  CHECK(log->Latest().phase() == v1::PHASE_DURABLE);
  CHECK_FALSE(harness.store().IsCommitted(SaveHarness::kJob, kCheckpoint));
  absl::StatusOr<std::vector<uint32_t>> manifests =
      harness.store().ListNodeManifests(SaveHarness::kJob, kCheckpoint);
  REQUIRE(manifests.ok());
  CHECK(*manifests == std::vector<uint32_t>{0});
  const std::vector<std::string> paths = PathsUnder(root.path());
  CHECK(std::count_if(paths.begin(), paths.end(), IsDataFile) == 1);
  const std::vector<v1::SaveProgress> in_flight =
      harness.coordinator().InFlight();
  REQUIRE(in_flight.size() == 1);
  CHECK(in_flight[0].phase() == v1::PHASE_DURABLE);
}

TEST_CASE(
    "SaveCoordinator on two nodes sharing a root commits once the second "
    "node's manifest is out, and the first node's rank then sees COMMITTED",
    "[save_coordinator]") {
  TempDir root;
  SaveHarness node0(root.path(), NodeOfTwo(0));
  SaveHarness node1(root.path(), NodeOfTwo(1));
  const std::shared_ptr<ProgressLog> first =
      node0.Save(node0.AddRank(0, 2, 1), kCheckpoint);
  WaitForPhase(*first, v1::PHASE_DURABLE);
  const std::shared_ptr<ProgressLog> last =
      node1.Save(node1.AddRank(1, 2, 1), kCheckpoint);

  for (const auto& log : {first, last}) {
    const v1::SaveProgress end = WaitForEnd(*log);
    INFO(log->Describe());
    CHECK(end.phase() == v1::PHASE_COMMITTED);
  }
  absl::StatusOr<v1::CommitRecord> commit =
      node0.store().ReadCommit(SaveHarness::kJob, kCheckpoint);
  INFO(commit.status());
  REQUIRE(commit.ok());
  CHECK(commit->index().files_size() == 2);
  CHECK(commit->index().nodes() == 2);
}

SaveHarnessOptions WithLocalRanksTimeout(uint64_t ms) {
  SaveHarnessOptions options;
  options.local_ranks_timeout_ms = ms;
  return options;
}

TEST_CASE(
    "SaveCoordinator fails a checkpoint whose local ranks have not all "
    "submitted within the timeout, naming the missing ranks to every waiter, "
    "and leaves none of the files the others wrote",
    "[save_coordinator]") {
  TempDir root;
  SaveHarness harness(root.path(), WithLocalRanksTimeout(1000));
  // Four ranks on this node: 0 and 2 submit, 1 is connected and never
  // submits, 3 never connects.
  SaveHarness::Rank& rank0 = harness.AddRank(0, 4, 4);
  harness.AddRank(1, 4, 4);
  SaveHarness::Rank& rank2 = harness.AddRank(2, 4, 4);
  const absl::Time first_part = absl::Now();
  const std::vector<std::shared_ptr<ProgressLog>> parts = {
      harness.Save(rank0, kCheckpoint), harness.Save(rank2, kCheckpoint)};
  // A second watcher of rank 0's save (another thread of the trainer, or
  // ckptctl's view) must hear the end as well.
  const std::vector<std::shared_ptr<ProgressLog>> waiters = {
      parts[0], parts[1],
      ProgressLog::Watch(&harness.coordinator(), rank0.session,
                         parts[0]->save_id())};

  // The parts that came are written whole, and their files are on disk,
  // before the deadline.
  for (const auto& log : parts) WaitForPhase(*log, v1::PHASE_STAGED);
  const std::vector<std::string> during = PathsUnder(root.path());
  INFO("under the root before the deadline: " << absl::StrJoin(during, " "));
  CHECK(std::count_if(during.begin(), during.end(), IsDataFile) == 2);

  for (const auto& log : waiters) {
    const v1::SaveProgress end = WaitForEnd(*log);
    INFO(log->Describe());
    CHECK(end.phase() == v1::PHASE_FAILED);
    CHECK(end.reason() ==
          "rank 3 (never connected) and rank 1 (connected) did not submit "
          "within 1000 ms of the first part (2 of 4 local ranks submitted: 0, "
          "2)");
  }
  CHECK(absl::Now() - first_part >= absl::Milliseconds(1000));
  CHECK(harness.coordinator().InFlight().empty());
  CheckNothingLeft(harness, root);
}

TEST_CASE(
    "SaveCoordinator frees the name of a checkpoint that timed out waiting "
    "for a local rank, and a new attempt of it by every rank commits",
    "[save_coordinator]") {
  TempDir root;
  SaveHarness harness(root.path(), WithLocalRanksTimeout(300));
  SaveHarness::Rank& rank0 = harness.AddRank(0, 2, 2);
  SaveHarness::Rank& rank1 = harness.AddRank(1, 2, 2);
  const std::shared_ptr<ProgressLog> alone = harness.Save(rank0, kCheckpoint);
  const v1::SaveProgress failed = WaitForEnd(*alone);
  INFO(alone->Describe());
  REQUIRE(failed.phase() == v1::PHASE_FAILED);
  CHECK_THAT(failed.reason(), Catch::StartsWith("rank 1 (connected) did not submit"));

  // The name is refused (Unavailable) only while the failed attempt's
  // files are being removed.
  absl::StatusOr<uint64_t> again;
  const absl::Time deadline = absl::Now() + ::ckpt::testing::kPhaseWaitLimit;
  do {
    again = harness.coordinator().Submit(rank0.session, rank0.request);
    if (!absl::IsUnavailable(again.status())) break;
    absl::SleepFor(absl::Milliseconds(10));
  } while (absl::Now() < deadline);
  INFO(again.status());
  REQUIRE(again.ok());
  CHECK(*again != alone->save_id());
  const std::vector<std::shared_ptr<ProgressLog>> logs = {
      ProgressLog::Watch(&harness.coordinator(), rank0.session, *again),
      harness.Save(rank1, kCheckpoint)};
  for (const auto& log : logs) {
    const v1::SaveProgress end = WaitForEnd(*log);
    INFO(log->Describe());
    CHECK(end.phase() == v1::PHASE_COMMITTED);
  }
  CHECK(harness.store().IsCommitted(SaveHarness::kJob, kCheckpoint));
}

TEST_CASE(
    "SaveCoordinator keeps a checkpoint whose local ranks all submitted in "
    "time, however long after the timeout its files take to write",
    "[save_coordinator]") {
  TempDir root;
  SaveHarness harness(root.path(), WithLocalRanksTimeout(200));
  SaveHarness::Rank& rank0 = harness.AddRank(0, 2, 2);
  SaveHarness::Rank& rank1 = harness.AddRank(1, 2, 2);
  harness.HoldWorkers();
  const std::vector<std::shared_ptr<ProgressLog>> logs = {
      harness.Save(rank0, kCheckpoint), harness.Save(rank1, kCheckpoint)};
  // Several deadline checks pass while nothing is written.
  absl::SleepFor(absl::Milliseconds(500));
  for (const auto& log : logs) CHECK(log->Latest().phase() == v1::PHASE_ACCEPTED);
  harness.ReleaseWorkers();
  for (const auto& log : logs) {
    const v1::SaveProgress end = WaitForEnd(*log);
    INFO(log->Describe());
    CHECK(end.phase() == v1::PHASE_COMMITTED);
  }
}

// The real file operations; at the rename that makes COMMIT visible, asks
// the tier for an image of each of the checkpoint's data files, as a load
// that found that COMMIT would, and counts the files it had none for.
class TierAtCommitFileOps final : public FileOps {
 public:
  void set_tier(const MemoryTier* tier) { tier_ = tier; }
  int data_files() const { return data_files_.load(); }
  int missing_images() const { return missing_images_.load(); }

  absl::Status Rename(const StorageDir& dir, const std::string& from,
                      const std::string& to) override {
    if (to == "COMMIT") {
      const std::filesystem::path checkpoint_dir = dir.path();
      for (const auto& entry : std::filesystem::directory_iterator(checkpoint_dir)) {
        const std::string name = entry.path().filename().string();
        if (!IsDataFile(name)) continue;
        ++data_files_;
        if (tier_->Find(SaveHarness::kJob, checkpoint_dir.filename().string(), name,
                        entry.file_size()) == nullptr) {
          ++missing_images_;
        }
      }
    }
    return FileOps::Rename(dir, from, to);
  }

 private:
  const MemoryTier* tier_ = nullptr;  // set before any save
  std::atomic<int> data_files_{0};
  std::atomic<int> missing_images_{0};
};

TEST_CASE(
    "SaveCoordinator makes a checkpoint's memory-tier images readable before "
    "its COMMIT is visible, so a load that finds the COMMIT reads memory",
    "[save_coordinator]") {
  TempDir root;
  TierAtCommitFileOps ops;
  SaveHarnessOptions options = WithFileOps(&ops);
  options.memory_tier_bytes = 64 << 20;
  SaveHarness harness(root.path(), options);
  ops.set_tier(&harness.tier());
  SaveHarness::Rank& rank0 = harness.AddRank(0, 2, 2);
  SaveHarness::Rank& rank1 = harness.AddRank(1, 2, 2);
  const std::vector<std::shared_ptr<ProgressLog>> logs = {
      harness.Save(rank0, kCheckpoint), harness.Save(rank1, kCheckpoint)};
  for (const auto& log : logs) {
    const v1::SaveProgress end = WaitForEnd(*log);
    INFO(log->Describe());
    REQUIRE(end.phase() == v1::PHASE_COMMITTED);
  }
  CHECK(ops.data_files() == 2);  // one per rank
  CHECK(ops.missing_images() == 0);
}

}  // namespace
}  // namespace ckpt
