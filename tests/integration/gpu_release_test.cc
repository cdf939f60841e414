// GPU memory the trainer's allocator returns to the driver: the client
// releases the daemon's regions over it at once (Client::ReleaseGpuMemory,
// which the Python package's allocator hook calls), or, while another
// thread holds the client, at its next save.
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "client/ckpt_client.h"
#include "integration/daemon_fixture.h"
#include "integration/gpu_daemon_probe.h"
#include "integration/gpu_test_rank.h"
#include "integration/test_gpu.h"

namespace ckpt::testing {
namespace {

// The simulated device's TrainerGpu, whose AllocationIds (which a save
// asks under the client's GPU lock) can be made to block: a save held
// inside the client while the test frees memory.
class BlockableTrainerGpu final : public TrainerGpu {
 public:
  explicit BlockableTrainerGpu(TrainerGpu* inner) : inner_(inner) {}
  // The next AllocationIds call announces itself and waits for Unblock.
  void BlockNext() { blocking_ = true; }
  void AwaitBlocked() { entered_.WaitForNotification(); }
  void Unblock() { release_.Notify(); }

  absl::StatusOr<GpuRegionExport> Export(uint64_t a, uint64_t n) override {
    return inner_->Export(a, n);
  }
  absl::StatusOr<std::vector<uint64_t>> AllocationIds(uint64_t a, uint64_t n) override {
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
  absl::Status SignalStaged(const std::string& uuid) override {
    return inner_->SignalStaged(uuid);
  }

 private:
  TrainerGpu* const inner_;
  std::atomic<bool> blocking_{false};
  absl::Notification entered_, release_;
};

// A TestGpu whose trainer() is a BlockableTrainerGpu over `inner`'s.
class BlockableTestGpu final : public TestGpu {
 public:
  explicit BlockableTestGpu(std::unique_ptr<TestGpu> inner)
      : inner_(std::move(inner)), trainer_(inner_->trainer()) {}
  BlockableTrainerGpu& blockable() { return trainer_; }

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
  BlockableTrainerGpu trainer_;
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
  BlockableTestGpu gpu(MakeSimulatedTestGpu());
  DaemonProcess daemon(GpuFlags("simulated"));
  GpuTestRank rank(&gpu, daemon.socket(), "busy", 2, 4, kTensorBytes);
  rank.Upload(1);
  auto first = rank.client().Save(rank.SaveRequestFor("step-1"), gpu.stream());
  REQUIRE(first.ok());
  REQUIRE((*first)->WaitCommitted().ok());

  // A save on another thread, held inside the client (under its GPU lock).
  gpu.blockable().BlockNext();
  absl::Status second_done = absl::UnknownError("not run");
  std::thread saver([&] {
    auto second = rank.client().Save(rank.SaveRequestFor("step-2"), gpu.stream());
    second_done = second.ok() ? (*second)->WaitCommitted() : second.status();
  });
  gpu.blockable().AwaitBlocked();
  const absl::Status deferred = rank.client().ReleaseGpuMemory(
      rank.address(1), rank.allocation_bytes(), absl::Milliseconds(200));
  gpu.blockable().Unblock();
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

}  // namespace ckpt::testing
