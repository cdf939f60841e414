// VerifyCheckpoint holds a read lease for as long as it reads: retention
// that runs in the middle of a verify skips the checkpoint, so the verify
// never reports the files retention deleted under it as damage.
//
// The checkpoints are real ones (saved through the SaveHarness); the verify
// runs on an I/O worker whose queue holds its first read until the test
// lets it go, so retention runs at a known point: lease taken, COMMIT read,
// no byte verified yet.
#include "restore/verifier.h"

#include <xxhash.h>

#include <catch2/catch.hpp>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/damage_list.h"
#include "common/names.h"
#include "io/io_queue.h"
#include "io/io_workers.h"
#include "io/staging_pool.h"
#include "save/save_harness.h"
#include "storage/checkpoint_leases.h"
#include "storage/checkpoint_store.h"
#include "storage/retention.h"
#include "support/committed_checkpoint.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

using ::ckpt::testing::ProgressLog;
using ::ckpt::testing::SaveHarness;
using ::ckpt::testing::TempDir;

constexpr absl::Duration kWaitLimit = absl::Seconds(30);
// Larger than the harness's 64 KiB checksum blocks by more than a page: a
// reader verifies a whole block in one buffer (restore/shard_reader.h).
constexpr uint32_t kBufferBytes = 128 * 1024;

// Holds the first Submit of any queue made with it until Open.
class Gate {
 public:
  void Pass() {
    absl::MutexLock lock(&mu_);
    if (entered_) return;  // only the first submission waits
    entered_ = true;
    mu_.Await(absl::Condition(&open_));
  }
  bool WaitEntered() {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&entered_), kWaitLimit);
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }

 private:
  absl::Mutex mu_;
  bool entered_ ABSL_GUARDED_BY(mu_) = false;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
};

// The pwrite queue behind the gate.
class GatedQueue final : public IoQueue {
 public:
  GatedQueue(uint32_t depth, Gate* gate)
      : inner_(CreatePwriteQueue(depth)), gate_(gate) {}
  absl::string_view name() const override { return "gated"; }
  uint32_t depth() const override { return inner_->depth(); }
  absl::Status Submit(absl::Span<const IoRequest> requests,
                      size_t* submitted) override {
    gate_->Pass();
    return inner_->Submit(requests, submitted);
  }
  absl::Status Reap(uint32_t min_completions,
                    std::vector<IoCompletion>* out) override {
    return inner_->Reap(min_completions, out);
  }

 private:
  std::unique_ptr<IoQueue> inner_;
  Gate* const gate_;
};

// A verify's outcome, delivered on the worker.
class VerifyResult {
 public:
  void Set(absl::StatusOr<v1::VerifyResponse> result) {
    absl::MutexLock lock(&mu_);
    result_ = std::move(result);
  }
  std::optional<absl::StatusOr<v1::VerifyResponse>> Wait() {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(this, &VerifyResult::Done), kWaitLimit);
    return result_;
  }

 private:
  bool Done() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return result_.has_value(); }
  absl::Mutex mu_;
  std::optional<absl::StatusOr<v1::VerifyResponse>> result_ ABSL_GUARDED_BY(mu_);
};

TEST_CASE(
    "retention that runs while a verify reads a checkpoint skips it, the "
    "verify finds no damage, and retention deletes it once the verify ended",
    "[verifier][retention][lease]") {
  TempDir root;
  {
    SaveHarness harness(root.path());
    SaveHarness::Rank& rank = harness.AddRank(0, 1, 1);
    for (const char* name : {"step-1", "step-2"}) {
      const std::shared_ptr<ProgressLog> log = harness.Save(rank, name);
      const std::optional<v1::SaveProgress> end = log->WaitForEnd();
      INFO(log->Describe());
      REQUIRE(end.has_value());
      REQUIRE(end->phase() == v1::PHASE_COMMITTED);
    }
  }
  CheckpointStore store(root.path());
  REQUIRE(store.status().ok());
  CheckpointLeases leases;
  absl::StatusOr<std::unique_ptr<StagingPool>> pool =
      StagingPool::Create(8 * kBufferBytes, kBufferBytes);
  REQUIRE(pool.ok());
  Gate gate;
  VerifyResult result;
  {
    IoWorkers workers(1, 8, **pool,
                      [&gate](uint32_t depth, absl::Span<const iovec>)
                          -> std::unique_ptr<IoQueue> {
                        return std::make_unique<GatedQueue>(depth, &gate);
                      });
    // Whatever happens below, the worker is let go before it is joined.
    struct OpenOnExit {
      Gate& gate;
      ~OpenOnExit() { gate.Open(); }
    } open_on_exit{gate};
    VerifyCheckpoint(&store, pool->get(), &workers, &leases, SaveHarness::kJob,
                     "step-1", [&result](absl::StatusOr<v1::VerifyResponse> r) {
                       result.Set(std::move(r));
                     });
    REQUIRE(gate.WaitEntered());

    // step-2 is newer: keeping one, retention would delete step-1 now.
    const absl::StatusOr<std::vector<std::string>> during =
        ApplyRetention(store, leases, SaveHarness::kJob, 1);
    INFO(during.status());
    REQUIRE(during.ok());
    CHECK(during->empty());
    CHECK(store.IsCommitted(SaveHarness::kJob, "step-1"));
    gate.Open();

    const std::optional<absl::StatusOr<v1::VerifyResponse>> verified =
        result.Wait();
    REQUIRE(verified.has_value());
    INFO(verified->status());
    REQUIRE(verified->ok());
    const v1::VerifyResponse& response = **verified;
    INFO("damage: " << absl::StrJoin(response.damage(), "; "));
    CHECK(response.checkpoint() == "step-1");
    CHECK(response.damage().empty());
    CHECK(response.bytes_verified() >= SaveHarness::kWeightElements * 4);
  }

  // The verify's lease is gone: the next pass deletes step-1.
  const absl::StatusOr<std::vector<std::string>> after =
      ApplyRetention(store, leases, SaveHarness::kJob, 1);
  REQUIRE(after.ok());
  CHECK(*after == std::vector<std::string>{"step-1"});
  CHECK_FALSE(store.IsCommitted(SaveHarness::kJob, "step-1"));
}

TEST_CASE(
    "a verify of a checkpoint that retention is deleting is NotFound, not "
    "damage",
    "[verifier][retention][lease]") {
  TempDir root;
  {
    SaveHarness harness(root.path());
    const std::shared_ptr<ProgressLog> log =
        harness.Save(harness.AddRank(0, 1, 1), "step-1");
    const std::optional<v1::SaveProgress> end = log->WaitForEnd();
    REQUIRE(end.has_value());
    REQUIRE(end->phase() == v1::PHASE_COMMITTED);
  }
  CheckpointStore store(root.path());
  CheckpointLeases leases;
  // Retention's claim, as ApplyRetention takes it just before deleting.
  REQUIRE(leases.ClaimForDeletion(SaveHarness::kJob, "step-1"));
  absl::StatusOr<std::unique_ptr<StagingPool>> pool =
      StagingPool::Create(8 * kBufferBytes, kBufferBytes);
  REQUIRE(pool.ok());
  VerifyResult result;
  {
    IoWorkers workers(1, 8, **pool);
    VerifyCheckpoint(&store, pool->get(), &workers, &leases, SaveHarness::kJob,
                     "latest", [&result](absl::StatusOr<v1::VerifyResponse> r) {
                       result.Set(std::move(r));
                     });
    const std::optional<absl::StatusOr<v1::VerifyResponse>> verified =
        result.Wait();
    REQUIRE(verified.has_value());
    INFO(verified->status());
    CHECK(absl::IsNotFound(verified->status()));
  }
  leases.Deleted(SaveHarness::kJob, "step-1");
}

// A committed checkpoint of `items` byte items (fqn `prefix` + index), the
// first `damaged` of them with a wrong checksum: damage without data files.
void CommitByteItems(const CheckpointStore& store, const std::string& name,
                     const std::string& prefix, int items, int damaged) {
  v1::CommitRecord record =
      ::ckpt::testing::OneNodeCommitRecord("job", name, 1'000'000);
  for (int i = 0; i < items; ++i) {
    v1::StoredBytes& b = *record.mutable_index()->add_byte_items();
    b.set_fqn(absl::StrCat(prefix, i));
    b.set_data(absl::StrCat("bytes of ", i));
    b.set_xxh3(XXH3_64bits(b.data().data(), b.data().size()) + (i < damaged ? 1 : 0));
  }
  REQUIRE(store.PrepareForSave("job", name, 0).ok());
  const absl::Status written = store.WriteCommit(record);
  INFO(written);
  REQUIRE(written.ok());
}

absl::StatusOr<v1::VerifyResponse> VerifyNow(const CheckpointStore& store,
                                             const std::string& name) {
  CheckpointLeases leases;
  absl::StatusOr<std::unique_ptr<StagingPool>> pool =
      StagingPool::Create(8 * kBufferBytes, kBufferBytes);
  REQUIRE(pool.ok());
  VerifyResult result;
  IoWorkers workers(1, 8, **pool);
  VerifyCheckpoint(&store, pool->get(), &workers, &leases, "job", name,
                   [&result](absl::StatusOr<v1::VerifyResponse> r) {
                     result.Set(std::move(r));
                   });
  std::optional<absl::StatusOr<v1::VerifyResponse>> verified = result.Wait();
  REQUIRE(verified.has_value());
  return *std::move(verified);
}

TEST_CASE(
    "a verify that finds thousands of damaged items lists the first ones and "
    "states the total in a reply of bounded size",
    "[verifier][damage]") {
  TempDir root;
  CheckpointStore store(root.path());
  REQUIRE(store.status().ok());
  // Short lines: the count bounds the list.
  CommitByteItems(store, "many", "item.", 5000, 4800);
  // Long fqns (the longest valid): the bytes bound it first.
  CommitByteItems(store, "long", std::string(kMaxFqnLength - 8, 'x'), 1200, 1200);
  // Damage up to the bound: listed whole, no summary line.
  CommitByteItems(store, "bound", "item.", kMaxListedDamage + 10, kMaxListedDamage);
  CommitByteItems(store, "clean", "item.", 3000, 0);

  for (const auto& [name, damaged] :
       std::vector<std::pair<std::string, uint64_t>>{
           {"many", 4800}, {"long", 1200}, {"bound", kMaxListedDamage}, {"clean", 0}}) {
    INFO(name);
    const absl::StatusOr<v1::VerifyResponse> response = VerifyNow(store, name);
    INFO(response.status());
    REQUIRE(response.ok());
    // The verdict is exact, and so is the total.
    CHECK(response->damage().empty() == (damaged == 0));
    CHECK(DamageTotal(response->damage()) == damaged);
    CHECK(response->damage_size() <= static_cast<int>(kMaxListedDamage) + 1);
    CHECK(response->ByteSizeLong() <= kMaxListedDamageBytes + kMaxDamageLineBytes);
    if (damaged > kMaxListedDamage || name == "long") {
      const int listed = response->damage_size() - 1;
      CHECK(response->damage(listed) ==
            absl::StrCat("and ", damaged - listed,
                         " more problems not listed: ", damaged, " in all"));
      CHECK_THAT(response->damage(0), Catch::Contains("checksum mismatch"));
    } else {
      CHECK(response->damage_size() == static_cast<int>(damaged));
    }
  }
}

}  // namespace
}  // namespace ckpt
