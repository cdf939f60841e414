// GPU memory the trainer's allocator returns to the driver: the client
// releases the daemon's regions over it at once (Client::ReleaseGpuMemory,
// which the Python package's allocator hook calls), or, while another
// thread holds the client, at its next save. And memory freed and
// allocated again without a word: a save finds it by asking each
// allocation under the regions once, and each region only where its
// allocation changed.
#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/ckpt_client.h"
#include "integration/daemon_fixture.h"
#include "integration/gpu_daemon_probe.h"
#include "integration/gpu_test_rank.h"
#include "integration/test_gpu.h"

namespace ckpt::testing {
namespace {

// Another TestGpu's TrainerGpu, which counts the Export and AllocationIds
// calls (a save asks the latter under the client's GPU lock), and whose
// AllocationIds can be made to block: a save held inside the client while
// the test frees memory.
class ObservedTrainerGpu final : public TrainerGpu {
 public:
  explicit ObservedTrainerGpu(TrainerGpu* inner) : inner_(inner) {}
  // The next AllocationIds call announces itself and waits for Unblock.
  void BlockNext() { blocking_ = true; }
  void AwaitBlocked() { entered_.WaitForNotification(); }
  void Unblock() { release_.Notify(); }
  int exports() const { return exports_.load(); }
  int allocation_asks() const { return allocation_asks_.load(); }

  absl::StatusOr<GpuRegionExport> Export(uint64_t a, uint64_t n) override {
    ++exports_;
    return inner_->Export(a, n);
  }
  absl::StatusOr<std::vector<uint64_t>> AllocationIds(uint64_t a, uint64_t n) override {
    ++allocation_asks_;
    if (blocking_.exchange(false)) {
      entered_.Notify();
      release_.WaitForNotification();
    }
    return inner_->AllocationIds(a, n);
  }
  absl::StatusOr<GpuEventHandles> Events(const std::string& uuid) override {
    return inner_->Events(uuid);
  }
  absl::Status RecordReady(const std::string& uuid, GpuStreamHandle s) override {
    return inner_->RecordReady(uuid, s);
  }
  absl::Status WaitStaged(const std::string& uuid, GpuStreamHandle s) override {
    return inner_->WaitStaged(uuid, s);
  }
  absl::Status WaitStagedRecord(const std::string& uuid, GpuStreamHandle s,
                                uint64_t record) override {
    return inner_->WaitStagedRecord(uuid, s, record);
  }
  absl::Status SignalStaged(const std::string& uuid) override {
    return inner_->SignalStaged(uuid);
  }
  absl::StatusOr<uint64_t> ReserveRelay(const std::string& uuid) override {
    return inner_->ReserveRelay(uuid);
  }
  absl::Status WaitRelay(const std::string& uuid, GpuStreamHandle s, uint64_t record) override {
    return inner_->WaitRelay(uuid, s, record);
  }
  absl::Status Relay(const std::string& uuid, uint64_t record, StagedWait after) override {
    return inner_->Relay(uuid, record, after);
  }
  bool CompleteRelay(const std::string& uuid, uint64_t record) override {
    return inner_->CompleteRelay(uuid, record);
  }

 private:
  TrainerGpu* const inner_;
  std::atomic<bool> blocking_{false};
  std::atomic<int> exports_{0};
  std::atomic<int> allocation_asks_{0};
  absl::Notification entered_, release_;
};

// A TestGpu whose trainer() is an ObservedTrainerGpu over `inner`'s.
class ObservedTestGpu final : public TestGpu {
 public:
  explicit ObservedTestGpu(std::unique_ptr<TestGpu> inner)
      : inner_(std::move(inner)), trainer_(inner_->trainer()) {}
  ObservedTrainerGpu& observed() { return trainer_; }

  std::string kind() const override { return inner_->kind(); }
  TrainerGpu* trainer() override { return &trainer_; }
  GpuStreamHandle stream() override { return inner_->stream(); }
  absl::StatusOr<uint64_t> Allocate(uint64_t bytes) override { return inner_->Allocate(bytes); }
  absl::Status Free(uint64_t address) override { return inner_->Free(address); }
  absl::Status Delay(absl::Duration d) override { return inner_->Delay(d); }
  absl::Status Upload(uint64_t a, const void* data, uint64_t n) override {
    return inner_->Upload(a, data, n);
  }
  absl::Status Fill(uint64_t a, uint8_t v, uint64_t n) override { return inner_->Fill(a, v, n); }
  absl::Status Download(uint64_t a, void* data, uint64_t n) override {
    return inner_->Download(a, data, n);
  }
  absl::Status Synchronize(absl::Duration t) override { return inner_->Synchronize(t); }

 private:
  std::unique_ptr<TestGpu> inner_;
  ObservedTrainerGpu trainer_;
};

}  // namespace

TEST_CASE("memory the trainer's allocator returns is unmapped by the daemon at "
          "once, and a later save maps it again where memory is allocated there "
          "again, and otherwise fails naming the released region",
          "[integration][gpu][cuda]") {
  const std::string kind = GENERATE(as<std::string>{}, "simulated", "cuda");
  std::unique_ptr<TestGpu> gpu = GpuOrSkip(kind);
  if (gpu == nullptr) return;
  DaemonProcess daemon(GpuFlags(kind));
  GpuTestRank rank(gpu.get(), daemon.socket(), "freed", 2, 4, kTensorBytes);
  rank.Upload(1);
  auto first = rank.client().Save(rank.SaveRequestFor("step-1"), gpu->stream());
  REQUIRE(first.ok());
  REQUIRE((*first)->WaitCommitted().ok());
  REQUIRE(AwaitGpuRegions(daemon.socket(), 2) == 2);

  // What the allocator hook does when PyTorch frees allocation 1's segment.
  const absl::Status released = rank.client().ReleaseGpuMemory(
      rank.address(1), rank.allocation_bytes(), absl::Seconds(5));
  INFO(released.ToString());
  REQUIRE(released.ok());
  CHECK(AwaitGpuRegions(daemon.socket(), 1) == 1);
  if (kind == "simulated") CHECK(SimulatedMappings(daemon.pid()) == 1);

  SECTION("allocated again") {
    rank.Reallocate(1);
    rank.Upload(2);
    auto second = rank.client().Save(rank.SaveRequestFor("step-2"), gpu->stream());
    INFO(second.status().ToString());
    REQUIRE(second.ok());
    REQUIRE((*second)->WaitCommitted().ok());
    CHECK(AwaitGpuRegions(daemon.socket(), 2) == 2);
    rank.Zero();
    REQUIRE(rank.client().Load(rank.LoadRequestFor("step-2")).ok());
    CHECK(rank.Holds(2));
  }
  SECTION("not allocated again") {
    REQUIRE(gpu->Synchronize(absl::Minutes(1)).ok());
    REQUIRE(gpu->Free(rank.address(1)).ok());
    auto second = rank.client().Save(rank.SaveRequestFor("step-2"), gpu->stream());
    absl::Status failed = second.ok() ? (*second)->WaitStaged() : second.status();
    INFO(failed.ToString());
    CHECK(!failed.ok());
    CHECK(failed.message().find("released region") != absl::string_view::npos);
  }
}

TEST_CASE("memory freed while a save holds the client is released at the "
          "client's next save",
          "[integration][gpu]") {
  ObservedTestGpu gpu(MakeSimulatedTestGpu());
  DaemonProcess daemon(GpuFlags("simulated"));
  GpuTestRank rank(&gpu, daemon.socket(), "busy", 2, 4, kTensorBytes);
  rank.Upload(1);
  auto first = rank.client().Save(rank.SaveRequestFor("step-1"), gpu.stream());
  REQUIRE(first.ok());
  REQUIRE((*first)->WaitCommitted().ok());

  // A save on another thread, held inside the client (under its GPU lock).
  gpu.observed().BlockNext();
  absl::Status second_done = absl::UnknownError("not run");
  std::thread saver([&] {
    auto second = rank.client().Save(rank.SaveRequestFor("step-2"), gpu.stream());
    second_done = second.ok() ? (*second)->WaitCommitted() : second.status();
  });
  gpu.observed().AwaitBlocked();
  const absl::Status deferred = rank.client().ReleaseGpuMemory(
      rank.address(1), rank.allocation_bytes(), absl::Milliseconds(200));
  gpu.observed().Unblock();
  saver.join();
  INFO(deferred.ToString());
  CHECK(absl::IsDeadlineExceeded(deferred));
  CHECK(deferred.message().find("next save") != absl::string_view::npos);
  INFO(second_done.ToString());
  CHECK(second_done.ok());  // its regions were current when it began
  CHECK(AwaitGpuRegions(daemon.socket(), 2) == 2);

  // The allocator did free it: the next save releases the region first, so
  // the daemon stops mapping it, and the save, whose layout still names
  // it, fails at the daemon naming the released region (without the
  // deferred release it would fail in the client, on memory it cannot find).
  REQUIRE(gpu.Synchronize(absl::Minutes(1)).ok());
  REQUIRE(gpu.Free(rank.address(1)).ok());
  auto third = rank.client().Save(rank.SaveRequestFor("step-3"), gpu.stream());
  absl::Status failed = third.ok() ? (*third)->WaitStaged() : third.status();
  INFO(failed.ToString());
  CHECK(failed.message().find("released region") != absl::string_view::npos);
  CHECK(AwaitGpuRegions(daemon.socket(), 1) == 1);
  CHECK(SimulatedMappings(daemon.pid()) == 1);
}

TEST_CASE("a save asks each allocation under many regions once, and each "
          "region only where its allocation was freed and allocated again",
          "[integration][gpu][cuda]") {
  const std::string kind = GENERATE(as<std::string>{}, "simulated", "cuda");
  std::unique_ptr<TestGpu> inner = GpuOrSkip(kind);
  if (inner == nullptr) return;
  ObservedTestGpu gpu(std::move(inner));
  DaemonProcess daemon(GpuFlags(kind));
  GpuTestRank rank(&gpu, daemon.socket(), "asks", 2, 4, kTensorBytes);
  // Two more allocations of 16 regions each, as a trainer that registers a
  // region per tensor has (regions do not overlap: the daemon takes an
  // overlapping one for memory allocated again). 34 regions over 4
  // allocations.
  constexpr int kSlices = 16;
  const uint64_t bytes = rank.allocation_bytes();
  const uint64_t slice = bytes / kSlices;
  std::vector<uint64_t> sliced;
  for (int a = 0; a < 2; ++a) {
    auto address = gpu.Allocate(bytes);
    REQUIRE(address.ok());
    sliced.push_back(*address);
    for (int i = 0; i < kSlices; ++i) {
      auto region = rank.client().RegisterGpuRegion(*address + i * slice, slice);
      INFO(region.status().ToString());
      REQUIRE(region.ok());
    }
  }
  REQUIRE(AwaitGpuRegions(daemon.socket(), 34) == 34);
  const auto save = [&](uint32_t step) {
    rank.Upload(step);
    auto saved = rank.client().Save(rank.SaveRequestFor(absl::StrCat("step-", step)),
                                    gpu.stream());
    INFO("step " << step << ": " << saved.status().ToString());
    REQUIRE(saved.ok());
    const absl::Status committed = (*saved)->WaitCommitted();
    INFO(committed.ToString());
    REQUIRE(committed.ok());
  };
  save(1);

  int asks = gpu.observed().allocation_asks();
  const int exports = gpu.observed().exports();
  save(2);
  CHECK(gpu.observed().allocation_asks() - asks == 4);  // was one per region: 34
  CHECK(gpu.observed().exports() == exports);

  // Freed and allocated again without telling the client.
  REQUIRE(gpu.Synchronize(absl::Minutes(1)).ok());
  REQUIRE(gpu.Free(sliced[1]).ok());
  auto again = gpu.Allocate(bytes);
  REQUIRE(again.ok());
  if (*again != sliced[1]) {
    // The new memory landed elsewhere: the regions lie over freed memory,
    // which a save rightly refuses; not what this test is about.
    WARN("the allocation moved when allocated again; the rest is not checked");
    return;
  }
  asks = gpu.observed().allocation_asks();
  save(3);
  // All 4 allocations asked; the replaced one answered with a new id, so
  // its 16 regions were asked one by one and exported again, and no other.
  CHECK(gpu.observed().allocation_asks() - asks == 4 + kSlices);
  CHECK(gpu.observed().exports() - exports == kSlices);
  CHECK(AwaitGpuRegions(daemon.socket(), 34) == 34);
  asks = gpu.observed().allocation_asks();
  save(4);
  CHECK(gpu.observed().allocation_asks() - asks == 4);
  rank.Zero();
  REQUIRE(rank.client().Load(rank.LoadRequestFor("step-4")).ok());
  CHECK(rank.Holds(4));
  for (uint64_t address : sliced) CHECK(gpu.Free(address).ok());
}

}  // namespace ckpt::testing
