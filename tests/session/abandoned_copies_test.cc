// AbandonedCopies on the simulated device, in this process: a save whose
// copies wait for a trainer stream stuck short of the ready event fails,
// and its buffers and mapping stay out of use only until the copies end:
// when the trainer's stream gets there after all, or once the trainer
// exits (a child process stands for it). Copies that still do not end,
// or that failed, are kept for good. A save whose device failed (a sticky
// error) while its copies waited has the staged record it enqueued
// completed from the CPU, so the trainer's stream goes on. A trainer that
// rewinds its ready event's `recorded` and exits gets no more than an
// honest dead one: its events are completed up to what the daemon's waits
// cover. A live trainer whose stream never gets there loses its save at
// the copy timeout, not the buffers.
#include "session/abandoned_copies.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gpu/simulated_device.h"
#include "gpu/simulated_test_support.h"
#include "session/gpu_regions_fixture.h"
#include "session/peer_copy_out.h"
#include "session/staged_records.h"

namespace ckpt {
namespace {

using ::ckpt::testing::GpuRegionsFixture;
using ::ckpt::testing::kRegionBytes;
using ::ckpt::testing::kSpan;
using ::ckpt::testing::Mismatch;
using ::ckpt::testing::Pattern;

// A process that stands for the trainer: it runs until killed.
class ChildTrainer {
 public:
  ChildTrainer() {
    pid_ = ::fork();
    if (pid_ == 0) {
      for (;;) ::pause();
    }
    REQUIRE(pid_ > 0);
    pidfd_ = UniqueFd(static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0)));
    REQUIRE(pidfd_.valid());
  }
  ~ChildTrainer() { Kill(); }
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  pid_t pid() const { return pid_; }
  int pidfd() const { return pidfd_.get(); }

 private:
  pid_t pid_ = -1;
  UniqueFd pidfd_;
};

// The trainer's stream stuck short of its ready event (a step hung in a
// collective) until End(), which the destructor calls: on every path, a
// failed REQUIRE included, the step ends before the fixture's stream must
// drain.
class StuckStep {
 public:
  explicit StuckStep(GpuRegionsFixture& f) {
    f.trainer_stream.Enqueue([ends = ends_] { ends->WaitForNotification(); });
  }
  ~StuckStep() { End(); }
  void End() {
    if (!ends_->HasBeenNotified()) ends_->Notify();
  }

 private:
  // Shared with the stream's work, which may still be returning from its
  // wait when this object goes.
  const std::shared_ptr<absl::Notification> ends_ = std::make_shared<absl::Notification>();
};

// Waits up to 10 s for `done`.
template <typename Done>
bool Eventually(Done done) {
  for (const absl::Time end = absl::Now() + absl::Seconds(10); absl::Now() < end;) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return done();
}

// The trainer's ready event page of device 0, mapped here as the trainer
// maps it: a lying trainer writes it at will.
class ReadyPage {
 public:
  explicit ReadyPage(GpuRegionsFixture& f) {
    absl::StatusOr<GpuEventHandles> events = f.trainer.Events(SimulatedDeviceUuid(0));
    REQUIRE(events.ok());
    void* page = ::mmap(nullptr, SimulatedPageSize(), PROT_READ | PROT_WRITE, MAP_SHARED,
                        events->ready.peer_fd, 0);
    REQUIRE(page != MAP_FAILED);
    words_ = static_cast<uint64_t*>(page);
  }
  ~ReadyPage() { ::munmap(words_, SimulatedPageSize()); }
  ReadyPage(const ReadyPage&) = delete;
  ReadyPage& operator=(const ReadyPage&) = delete;

  uint64_t recorded() const { return std::atomic_ref<uint64_t>(words_[0]).load(); }
  uint64_t completed() const { return std::atomic_ref<uint64_t>(words_[1]).load(); }
  // The lie: no record was ever made.
  void RewindRecorded() { std::atomic_ref<uint64_t>(words_[0]).store(0); }
  // What a CUDA stream's plain write of an earlier record does.
  void SetCompleted(uint64_t value) { std::atomic_ref<uint64_t>(words_[1]).store(value); }

 private:
  uint64_t* words_ = nullptr;
};

TEST_CASE("a save's copies that outlive it keep their buffer and mapping only "
          "until the trainer's stream gets to the ready event, or the trainer exits",
          "[gpu][session]") {
  GpuRegionsFixture f(/*copy_timeout=*/absl::Milliseconds(200));
  ChildTrainer trainer;
  const std::string bytes = Pattern(kRegionBytes, 1);
  const uint64_t a = f.Allocate(bytes);
  f.Register(1, a);
  // The trainer's stream is stuck before its ready event (a step hung in a
  // collective).
  StuckStep stuck_step(f);
  f.RecordReady();

  std::weak_ptr<GpuMapping> mapping;
  {
    absl::StatusOr<std::shared_ptr<const GpuRegion>> region = f.regions->Find(a, kSpan);
    REQUIRE(region.ok());
    mapping = (*region)->mapping;
  }
  StagingLease lease = f.Buffer();
  char* out = lease.data();
  auto batch = std::make_unique<PeerCopyOut>(/*host=*/nullptr, f.regions.get(),
                                             trainer.pidfd(), trainer.pid(),
                                             /*staged=*/nullptr);
  absl::StatusOr<uint64_t> ticket = batch->Enqueue(std::vector<CopySpan>{{a, out, kSpan}});
  REQUIRE(ticket.ok());
  REQUIRE(batch->AllEnqueued().ok());
  CHECK(absl::IsDeadlineExceeded(batch->Wait(*ticket)));
  // The trainer lives on: Drain cannot make sure the copy will not run.
  CHECK_FALSE(batch->Drain().ok());
  std::vector<StagingLease> buffers;
  buffers.push_back(std::move(lease));
  batch->KeepUntilCopiesEnd(std::move(buffers));
  // The session ends; the batch keeps the region's mapping for its copy.
  f.regions->Release(1);
  batch.reset();

  AbandonedCopies& abandoned = f.backend->abandoned();
  CHECK(abandoned.pending() == 1);
  CHECK(f.pool->free_bytes() == f.pool->pool_bytes() - f.pool->buffer_bytes());
  CHECK_FALSE(mapping.expired());

  SECTION("the trainer's stream gets there after all") {
    stuck_step.End();
  }
  SECTION("the trainer exits") {
    trainer.Kill();
  }
  CHECK(Eventually([&] { return abandoned.pending() == 0; }));
  CHECK(abandoned.kept_for_good() == 0);
  CHECK(f.pool->free_bytes() == f.pool->pool_bytes());
  CHECK(f.pool->withheld_buffers() == 0);
  CHECK(mapping.expired());
  // The copy ran before its buffer went back, from the allocation the
  // mapping kept alive.
  CHECK(Mismatch(std::string(out, kSpan), bytes.substr(0, kSpan)).empty());
}

TEST_CASE("a save whose device fails while its copies wait has the staged "
          "record it enqueued completed from the CPU, so the trainer's stream "
          "goes on",
          "[gpu][session]") {
  GpuRegionsFixture f;
  ChildTrainer trainer;
  const uint64_t a = f.Allocate(Pattern(kRegionBytes, 1));
  f.Register(1, a);
  StuckStep stuck_step(f);
  f.RecordReady();
  // The save is accepted: its staged record is reserved, and the trainer's
  // next step waits for it on the GPU.
  StagedRecords staged = f.regions->ReserveStaged();
  REQUIRE(staged.records().size() == 1);
  SimulatedStream step_stream;
  REQUIRE(f.trainer
              .WaitStagedRecord(SimulatedDeviceUuid(0), &step_stream,
                                staged.records()[0].number)
              .ok());
  std::atomic<bool> stepped{false};
  step_stream.Enqueue([&stepped] { stepped = true; });

  StagingLease lease = f.Buffer();
  auto batch = std::make_unique<PeerCopyOut>(/*host=*/nullptr, f.regions.get(),
                                             trainer.pidfd(), trainer.pid(), &staged);
  absl::StatusOr<uint64_t> ticket =
      batch->Enqueue(std::vector<CopySpan>{{a, lease.data(), kSpan}});
  REQUIRE(ticket.ok());
  REQUIRE(batch->AllEnqueued().ok());  // the record, behind the copy
  static_cast<SimulatedDevice*>(f.backend->device())
      ->FailDevice(0, absl::InternalError("injected: illegal address"));
  const absl::Status waited = batch->Wait(*ticket);
  CHECK(absl::IsFailedPrecondition(waited));
  CHECK(absl::StrContains(waited.message(), "injected: illegal address"));
  CHECK_FALSE(batch->Drain().ok());
  std::vector<StagingLease> buffers;
  buffers.push_back(std::move(lease));
  batch->KeepUntilCopiesEnd(std::move(buffers));
  batch.reset();

  // The device's stream will never reach the record; the trainer's stream
  // goes on all the same, with the trainer's own stream still stuck.
  CHECK(Eventually([&] { return stepped.load(); }));
  CHECK(Eventually([&] { return f.backend->staged_completer().pending() == 0; }));
  // Whether the failed copies wrote their buffer is not known: kept.
  CHECK(f.backend->abandoned().kept_for_good() == 1);
}

TEST_CASE("a trainer that rewinds its ready event's record count and exits "
          "does not keep the save's buffers: the daemon completes the event up "
          "to what its own waits cover",
          "[gpu][session]") {
  ChildTrainer trainer;
  const std::string bytes = Pattern(kRegionBytes, 3);

  SECTION("the trainer exits while the save waits (Drain)") {
    GpuRegionsFixture f(/*copy_timeout=*/absl::Seconds(20));
    const uint64_t a = f.Allocate(bytes);
    f.Register(1, a);
    StuckStep stuck_step(f);  // its stream never reaches the ready record
    f.RecordReady();
    ReadyPage page(f);
    REQUIRE(page.recorded() == 1);
    StagingLease lease = f.Buffer();
    PeerCopyOut batch(/*host=*/nullptr, f.regions.get(), trainer.pidfd(), trainer.pid(),
                      /*staged=*/nullptr);
    absl::StatusOr<uint64_t> ticket =
        batch.Enqueue(std::vector<CopySpan>{{a, lease.data(), kSpan}});
    REQUIRE(ticket.ok());
    REQUIRE(batch.AllEnqueued().ok());
    page.RewindRecorded();
    trainer.Kill();
    CHECK(absl::IsUnavailable(batch.Wait(*ticket)));
    // The wait covered record 1: completed up to it, the copy runs.
    const absl::Status drained = batch.Drain();
    INFO(drained.ToString());
    CHECK(drained.ok());
    CHECK(page.completed() >= 1);
    CHECK(Mismatch(std::string(lease.data(), kSpan), bytes.substr(0, kSpan)).empty());
  }

  SECTION("the trainer exits after the save abandoned its copies") {
    GpuRegionsFixture f;
    AbandonedCopies abandoned(/*poll=*/absl::Milliseconds(10),
                              /*grace=*/absl::Milliseconds(500));
    const uint64_t a = f.Allocate(bytes);
    f.Register(1, a);
    StuckStep stuck_step(f);
    f.RecordReady();
    ReadyPage page(f);
    absl::StatusOr<std::shared_ptr<const GpuRegion>> region = f.regions->Find(a, kSpan);
    REQUIRE(region.ok());
    absl::StatusOr<std::unique_ptr<GpuStream>> stream = f.backend->device()->CreateStream(0);
    REQUIRE(stream.ok());
    absl::StatusOr<uint64_t> waited = (*stream)->WaitEvent(*(*region)->ready);
    REQUIRE(waited.ok());
    CHECK(*waited == 1);
    StagingLease lease = f.Buffer();
    char* out = lease.data();
    const GpuCopy copy{(*region)->Translate(a), out, kSpan};
    REQUIRE((*stream)->CopyToHost({&copy, 1}).ok());
    AbandonedCopies::Batch batch;
    batch.what = "the test's save";
    batch.trainer_pid = trainer.pid();
    batch.trainer_pidfd = UniqueFd(::dup(trainer.pidfd()));
    batch.ready_waits.push_back({(*region)->ready.get(), *waited});
    batch.streams.push_back(*std::move(stream));
    batch.regions.push_back(*std::move(region));
    batch.buffers.push_back(std::move(lease));
    abandoned.Adopt(std::move(batch));
    CHECK(f.pool->free_bytes() == f.pool->pool_bytes() - f.pool->buffer_bytes());

    page.RewindRecorded();
    trainer.Kill();
    CHECK(Eventually([&] { return abandoned.pending() == 0; }));
    CHECK(abandoned.kept_for_good() == 0);
    CHECK(f.pool->withheld_buffers() == 0);
    // Another save can have the buffer.
    CHECK(f.pool->free_bytes() == f.pool->pool_bytes());
    CHECK(Mismatch(std::string(out, kSpan), bytes.substr(0, kSpan)).empty());
  }
}

TEST_CASE("a live trainer whose stream never reaches the save's ready event "
          "loses the save at the copy timeout, and the buffers come back, and its "
          "next ready record is not completed",
          "[gpu][session]") {
  GpuRegionsFixture f(/*copy_timeout=*/absl::Milliseconds(200));
  ChildTrainer trainer;  // lives on
  const uint64_t a = f.Allocate(Pattern(kRegionBytes, 4));
  f.Register(1, a);
  StuckStep stuck_step(f);  // for the whole test
  f.RecordReady();
  ReadyPage page(f);
  StagingLease lease = f.Buffer();
  auto batch = std::make_unique<PeerCopyOut>(/*host=*/nullptr, f.regions.get(),
                                             trainer.pidfd(), trainer.pid(),
                                             /*staged=*/nullptr);
  absl::StatusOr<uint64_t> ticket =
      batch->Enqueue(std::vector<CopySpan>{{a, lease.data(), kSpan}});
  REQUIRE(ticket.ok());
  REQUIRE(batch->AllEnqueued().ok());
  CHECK(absl::IsDeadlineExceeded(batch->Wait(*ticket)));
  CHECK_FALSE(batch->Drain().ok());
  std::vector<StagingLease> buffers;
  buffers.push_back(std::move(lease));
  batch->KeepUntilCopiesEnd(std::move(buffers));
  batch.reset();

  AbandonedCopies& abandoned = f.backend->abandoned();
  CHECK(Eventually([&] { return abandoned.pending() == 0; }));
  CHECK(abandoned.kept_for_good() == 0);
  CHECK(f.pool->withheld_buffers() == 0);
  CHECK(f.pool->free_bytes() == f.pool->pool_bytes());
  CHECK(page.completed() == 1);
  // The trainer's next save records ready again: that record is its own
  // to reach (the daemon completed only the one its lost save waited for).
  f.RecordReady();
  CHECK(page.recorded() == 2);
  absl::SleepFor(absl::Milliseconds(50));
  CHECK(page.completed() == 1);
}

TEST_CASE("a live trainer's ready event is completed again at every look while "
          "the lost save's copies wait, so a stream that writes it back cannot "
          "hold them",
          "[gpu][session]") {
  GpuRegionsFixture f;
  ChildTrainer trainer;  // lives on
  AbandonedCopies abandoned(/*poll=*/absl::Milliseconds(10));
  const std::string bytes = Pattern(kRegionBytes, 6);
  const uint64_t a = f.Allocate(bytes);
  f.Register(1, a);
  StuckStep stuck_step(f);
  f.RecordReady();
  ReadyPage page(f);
  absl::StatusOr<std::shared_ptr<const GpuRegion>> region = f.regions->Find(a, kSpan);
  REQUIRE(region.ok());
  absl::StatusOr<std::unique_ptr<GpuStream>> stream = f.backend->device()->CreateStream(0);
  REQUIRE(stream.ok());
  StagingLease first = f.Buffer();
  StagingLease second = f.Buffer();
  char* out = second.data();
  // The stream reaches its wait only after the daemon first completed the
  // event and the trainer's stream wrote it back.
  static_cast<SimulatedDevice*>(f.backend->device())->StallNextCopy(absl::Milliseconds(300));
  const GpuCopy before{(*region)->Translate(a), first.data(), kSpan};
  REQUIRE((*stream)->CopyToHost({&before, 1}).ok());
  absl::StatusOr<uint64_t> waited = (*stream)->WaitEvent(*(*region)->ready);
  REQUIRE(waited.ok());
  const GpuCopy copy{(*region)->Translate(a), out, kSpan};
  REQUIRE((*stream)->CopyToHost({&copy, 1}).ok());
  AbandonedCopies::Batch batch;
  batch.what = "the test's save";
  batch.trainer_pid = trainer.pid();
  batch.trainer_pidfd = UniqueFd(::dup(trainer.pidfd()));
  batch.ready_waits.push_back({(*region)->ready.get(), *waited});
  batch.ready_deadline = absl::Now();  // the save's copy timeout passed
  batch.streams.push_back(*std::move(stream));
  batch.regions.push_back(*std::move(region));
  batch.buffers.push_back(std::move(first));
  batch.buffers.push_back(std::move(second));
  abandoned.Adopt(std::move(batch));

  REQUIRE(Eventually([&] { return page.completed() == 1; }));
  page.SetCompleted(0);
  CHECK(Eventually([&] { return abandoned.pending() == 0; }));
  CHECK(abandoned.kept_for_good() == 0);
  CHECK(f.pool->free_bytes() == f.pool->pool_bytes());
  CHECK(Mismatch(std::string(out, kSpan), bytes.substr(0, kSpan)).empty());
}

// Enqueues one D2H copy of the trainer's region 1 into a pool buffer on a
// stream of its own, and hands stream, region and buffer to `abandoned`.
void AdoptOneCopy(GpuRegionsFixture& f, const ChildTrainer& trainer,
                  AbandonedCopies& abandoned) {
  const uint64_t a = f.Allocate(Pattern(kRegionBytes, 1));
  f.Register(1, a);
  absl::StatusOr<std::shared_ptr<const GpuRegion>> region = f.regions->Find(a, kSpan);
  REQUIRE(region.ok());
  absl::StatusOr<std::unique_ptr<GpuStream>> stream =
      f.backend->device()->CreateStream(0);
  REQUIRE(stream.ok());
  StagingLease lease = f.Buffer();
  const GpuCopy copy{(*region)->Translate(a), lease.data(), kSpan};
  REQUIRE((*stream)->CopyToHost({&copy, 1}).ok());

  AbandonedCopies::Batch batch;
  batch.what = "the test's save";
  batch.trainer_pid = trainer.pid();
  batch.trainer_pidfd = UniqueFd(::dup(trainer.pidfd()));
  batch.streams.push_back(*std::move(stream));
  batch.regions.push_back(*std::move(region));
  batch.buffers.push_back(std::move(lease));
  abandoned.Adopt(std::move(batch));
}

TEST_CASE("copies that do not end within the grace after the trainer exits "
          "keep their buffers out of the pool for good",
          "[gpu][session]") {
  GpuRegionsFixture f;
  ChildTrainer trainer;
  AbandonedCopies abandoned(/*poll=*/absl::Milliseconds(10),
                            /*grace=*/absl::Milliseconds(100));
  // A copy engine that hangs well past the grace.
  static_cast<SimulatedDevice*>(f.backend->device())->StallNextCopy(absl::Seconds(2));
  AdoptOneCopy(f, trainer, abandoned);
  trainer.Kill();
  CHECK(Eventually([&] { return abandoned.kept_for_good() == 1; }));
  CHECK(abandoned.pending() == 0);
  CHECK(f.pool->withheld_buffers() == 1);
  CHECK(f.pool->free_bytes() == f.pool->pool_bytes() - f.pool->buffer_bytes());
}

TEST_CASE("copies that failed on the device keep their buffers out of the pool "
          "for good, the trainer alive or not",
          "[gpu][session]") {
  GpuRegionsFixture f;
  ChildTrainer trainer;
  AbandonedCopies abandoned(/*poll=*/absl::Milliseconds(10));
  // Whether a failed copy wrote its buffer, or still can, is not known.
  static_cast<SimulatedDevice*>(f.backend->device())
      ->FailNextCopy(absl::InternalError("injected: the copy failed"),
                     CopyFault::kOnCompletion);
  AdoptOneCopy(f, trainer, abandoned);
  CHECK(Eventually([&] { return abandoned.kept_for_good() == 1; }));
  CHECK(abandoned.pending() == 0);
  CHECK(f.pool->withheld_buffers() == 1);
}

}  // namespace
}  // namespace ckpt
