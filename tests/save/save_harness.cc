#include "save/save_harness.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/save_phase.h"
#include "support/own_process_session.h"

namespace ckpt::testing {
namespace {

// A worker's queue that the harness owns: IoWorkers owns what its factory
// returns, and the test reads the real queue's observations after the
// workers are gone.
class BorrowedQueue final : public IoQueue {
 public:
  explicit BorrowedQueue(IoQueue* queue) : queue_(queue) {}
  absl::string_view name() const override { return queue_->name(); }
  uint32_t depth() const override { return queue_->depth(); }
  absl::Status Submit(absl::Span<const IoRequest> requests,
                      size_t* submitted) override {
    return queue_->Submit(requests, submitted);
  }
  absl::Status Reap(uint32_t min_completions,
                    std::vector<IoCompletion>* out) override {
    return queue_->Reap(min_completions, out);
  }

 private:
  IoQueue* const queue_;
};

// Bytes that differ at every position and between ranks.
std::string RankPattern(size_t size, uint32_t rank) {
  std::string data(size, '\0');
  for (size_t i = 0; i < size; ++i) {
    data[i] = static_cast<char>((i * 131 + rank * 71 + (i >> 10) + 3) & 0xff);
  }
  return data;
}

// One F32 item: elements [offset, offset + count) of a 1-D tensor of
// `global`, at `at` in region `region`.
v1::TensorItem F32Item(const std::string& fqn, uint64_t global,
                       uint64_t offset, uint64_t count, uint64_t region,
                       uint64_t at) {
  v1::TensorItem item;
  item.set_fqn(fqn);
  item.set_dtype(v1::DTYPE_F32);
  item.add_global_shape(global);
  item.add_offsets(offset);
  item.add_local_shape(count);
  item.mutable_memory()->set_region_id(region);
  item.mutable_memory()->set_offset(at);
  item.mutable_memory()->set_length(count * 4);
  return item;
}

}  // namespace

std::shared_ptr<ProgressLog> ProgressLog::Watch(
    SaveCoordinator* coordinator, std::shared_ptr<Session> session,
    uint64_t save_id) {
  std::shared_ptr<ProgressLog> log(
      new ProgressLog(coordinator, std::move(session), save_id));
  log->Arm(log, 0);
  return log;
}

void ProgressLog::Arm(const std::shared_ptr<ProgressLog>& self,
                      uint64_t after) {
  // The listener holds the log: it lives as long as the board keeps the
  // listener, and the test may drop its own reference.
  absl::Status status = coordinator_->WatchNext(
      *session_, id_, after,
      [self](const v1::SaveProgress& progress, uint64_t version) {
        {
          absl::MutexLock lock(&self->mu_);
          self->seen_.push_back(progress);
          self->changed_.SignalAll();
        }
        if (!IsFinalPhase(progress.phase())) self->Arm(self, version);
      });
  if (!status.ok()) {
    absl::MutexLock lock(&mu_);
    watch_error_ = status;
    changed_.SignalAll();
  }
}

std::optional<v1::SaveProgress> ProgressLog::WaitFor(
    const std::function<bool(const v1::SaveProgress&)>& done,
    absl::Duration limit) const {
  const absl::Time deadline = absl::Now() + limit;
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !seen_.empty() && done(seen_.back());
  };
  // WaitWithDeadline is true once the deadline passed.
  while (!ready() && watch_error_.ok() &&
         !changed_.WaitWithDeadline(&mu_, deadline)) {
  }
  if (!ready()) return std::nullopt;
  return seen_.back();
}

std::optional<v1::SaveProgress> ProgressLog::WaitForPhase(
    v1::Phase phase, absl::Duration limit) const {
  return WaitFor(
      [phase](const v1::SaveProgress& p) { return p.phase() == phase; },
      limit);
}

std::optional<v1::SaveProgress> ProgressLog::WaitForEnd(
    absl::Duration limit) const {
  return WaitFor(
      [](const v1::SaveProgress& p) { return IsFinalPhase(p.phase()); },
      limit);
}

std::vector<v1::Phase> ProgressLog::Phases() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::Phase> phases;
  for (const v1::SaveProgress& p : seen_) {
    if (phases.empty() || phases.back() != p.phase()) {
      phases.push_back(p.phase());
    }
  }
  return phases;
}

v1::SaveProgress ProgressLog::Latest() const {
  absl::MutexLock lock(&mu_);
  return seen_.empty() ? v1::SaveProgress() : seen_.back();
}

absl::Status ProgressLog::watch_error() const {
  absl::MutexLock lock(&mu_);
  return watch_error_;
}

std::string ProgressLog::Describe() const {
  std::vector<std::string> names;
  for (v1::Phase phase : Phases()) names.push_back(v1::Phase_Name(phase));
  const v1::SaveProgress latest = Latest();
  return absl::StrCat("save ", id_, " phases [", absl::StrJoin(names, ", "),
                      "], reason '", latest.reason(), "', watch ",
                      watch_error().ToString());
}

SaveHarness::SaveHarness(std::string root, SaveHarnessOptions options)
    : root_(std::move(root)),
      options_(std::move(options)),
      store_(root_),
      tier_(options_.memory_tier_bytes) {
  absl::StatusOr<std::unique_ptr<StagingPool>> pool =
      StagingPool::Create(uint64_t{kPoolBuffers} * kBufferBytes, kBufferBytes);
  INFO(pool.status());
  REQUIRE(pool.ok());
  pool_ = *std::move(pool);
  // Only the constructing thread calls the factory.
  workers_ = std::make_unique<IoWorkers>(
      options_.io_workers, kQueueDepth, *pool_,
      [this](uint32_t depth, absl::Span<const iovec>) -> std::unique_ptr<IoQueue> {
        queues_.push_back(std::make_unique<FaultInjectingQueue>(depth));
        if (options_.faults) options_.faults(*queues_.back());
        return std::make_unique<BorrowedQueue>(queues_.back().get());
      });
  SaveOptions save;
  save.node_id = options_.node_id;
  save.nodes = options_.nodes;
  save.checksum_block_bytes = 64 * 1024;
  save.commit_timeout_ms = options_.commit_timeout_ms;
  save.local_ranks_timeout_ms = options_.local_ranks_timeout_ms;
  coordinator_ = std::make_unique<SaveCoordinator>(
      save, &store_, pool_.get(), workers_.get(), &leases_, &tier_,
      options_.file_ops != nullptr ? *options_.file_ops : DefaultFileOps());
}

SaveHarness::~SaveHarness() {
  ReleaseWorkers();
  StopWorkers();
  coordinator_.reset();
}

SaveHarness::Rank& SaveHarness::AddRank(uint32_t rank, uint32_t world_size,
                                        uint32_t local_world_size) {
  Rank& r = ranks_.emplace_back();
  r.rank = rank;
  const OwnSessionSpec spec{.session_id = options_.node_id * 1000u + rank + 1,
                            .job = kJob,
                            .rank = rank,
                            .world_size = world_size,
                            .local_world_size = local_world_size,
                            .node_id = options_.node_id,
                            .nodes = options_.nodes};
  r.session = OwnProcessSession(spec);
  // As the daemon's OpenSession opens it.
  const absl::Status opened = coordinator().OpenSession(
      r.session, OpenRequestOf(spec), spec.node_id, spec.nodes);
  INFO(opened);
  REQUIRE(opened.ok());
  r.memory = RankPattern((kWeightElements + kBiasElements) * 4, rank);
  const uint64_t region =
      RegisterHostRegion(*r.session, r.memory.data(), r.memory.size());
  r.request.set_job(kJob);
  *r.request.add_tensors() =
      F32Item("model.weight", world_size * kWeightElements,
              rank * kWeightElements, kWeightElements, region, 0);
  *r.request.add_tensors() =
      F32Item("model.bias", world_size * kBiasElements, rank * kBiasElements,
              kBiasElements, region, kWeightElements * 4);
  v1::ByteItem* step = r.request.add_byte_items();
  step->set_fqn(absl::StrCat("trainer.rank", rank, ".step"));
  step->set_data("1000");
  return r;
}

std::shared_ptr<ProgressLog> SaveHarness::Save(Rank& rank,
                                               const std::string& checkpoint) {
  rank.request.set_checkpoint(checkpoint);
  absl::StatusOr<uint64_t> id = coordinator_->Submit(rank.session, rank.request);
  INFO("rank " << rank.rank << ": " << id.status());
  REQUIRE(id.ok());
  return ProgressLog::Watch(coordinator_.get(), rank.session, *id);
}

void SaveHarness::HoldWorkers() {
  REQUIRE(gate_ == nullptr);
  gate_ = std::make_shared<absl::Notification>();
  // Tasks run in FIFO order and a held worker takes no other: one hold per
  // worker occupies them all before anything posted later.
  for (uint32_t i = 0; i < options_.io_workers; ++i) {
    workers_->Post([gate = gate_](IoQueue&) { gate->WaitForNotification(); });
  }
}

void SaveHarness::ReleaseWorkers() {
  if (gate_ == nullptr) return;
  gate_->Notify();
  gate_ = nullptr;
}

void SaveHarness::StopWorkers() {
  ReleaseWorkers();
  if (coordinator_ != nullptr) coordinator_->StopWatching();
  workers_.reset();
}

std::vector<std::string> PathsUnder(const std::string& root) {
  std::vector<std::string> paths;
  for (const auto& entry :
       std::filesystem::recursive_directory_iterator(root)) {
    paths.push_back(std::filesystem::relative(entry.path(), root).string());
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

}  // namespace ckpt::testing
