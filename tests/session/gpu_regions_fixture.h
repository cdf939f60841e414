// A trainer's simulated GPU memory and the daemon's GpuRegions over it, in
// one process, for the session tests (peer_copy_out_test.cc,
// gpu_regions_copy_test.cc).
#pragma once

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "gpu/simulated_runtime.h"
#include "gpu/simulated_test_support.h"
#include "gpu/simulated_trainer_gpu.h"
#include "io/staging_pool.h"
#include "session/gpu_backend.h"
#include "session/gpu_regions.h"

namespace ckpt::testing {

constexpr uint64_t kRegionBytes = 16 * 4096;
constexpr uint64_t kSpan = 4096;

// The trainer (SimulatedTrainerGpu) and the daemon's regions, in one
// process: the daemon takes the trainer's fds with dup.
struct GpuRegionsFixture {
  SimulatedTrainerGpu trainer;
  SimulatedStream trainer_stream;
  std::unique_ptr<StagingPool> pool;
  std::unique_ptr<GpuBackend> backend;
  std::unique_ptr<GpuRegions> regions;

  explicit GpuRegionsFixture(absl::Duration copy_timeout = absl::Seconds(20)) {
    absl::StatusOr<std::unique_ptr<StagingPool>> p = StagingPool::Create(2 << 20, 1 << 20);
    REQUIRE(p.ok());
    pool = *std::move(p);
    absl::StatusOr<std::unique_ptr<GpuBackend>> b = GpuBackend::Open("simulated", pool.get());
    REQUIRE(b.ok());
    backend = *std::move(b);
    regions = std::make_unique<GpuRegions>(backend.get(), TakeOwnFd, copy_timeout);
  }

  // Allocates kRegionBytes filled with `bytes`; its address.
  uint64_t Allocate(const std::string& bytes) {
    absl::StatusOr<uint64_t> address = trainer.Allocate(kRegionBytes, 0);
    INFO(address.status().ToString());
    REQUIRE(address.ok());
    std::memcpy(At(*address), bytes.data(), kRegionBytes);
    return *address;
  }

  // Registers [address, address + kRegionBytes) as region `id`, as
  // Client::RegisterGpu does.
  void Register(uint64_t id, uint64_t address) {
    const absl::Status added = TryRegister(id, address);
    INFO(added.ToString());
    REQUIRE(added.ok());
  }

  // The same with the events `events` (the trainer's own by default);
  // GpuRegions::Add's answer.
  absl::Status TryRegister(uint64_t id, uint64_t address,
                           std::optional<GpuEventHandles> events = std::nullopt) {
    absl::StatusOr<GpuRegionExport> exported = trainer.Export(address, kRegionBytes);
    REQUIRE(exported.ok());
    if (!events.has_value()) {
      absl::StatusOr<GpuEventHandles> own = trainer.Events(exported->device_uuid);
      REQUIRE(own.ok());
      events = *own;
    }
    v1::CudaRegion cuda;
    cuda.set_address(address);
    cuda.set_length(kRegionBytes);
    cuda.set_device_uuid(exported->device_uuid);
    for (const GpuPiece& piece : exported->pieces) {
      v1::CudaAllocation* a = cuda.add_pieces();
      a->set_peer_fd(piece.handle.peer_fd);
      a->set_allocation_bytes(piece.allocation_bytes);
      a->set_offset(piece.offset);
      a->set_length(piece.length);
    }
    cuda.mutable_ready_event()->set_peer_fd(events->ready.peer_fd);
    cuda.mutable_staged_event()->set_peer_fd(events->staged.peer_fd);
    return regions->Add(id, cuda);
  }

  // The trainer's last write is done: its ready event, on its stream.
  void RecordReady() {
    REQUIRE(trainer.RecordReady(SimulatedDeviceUuid(0), &trainer_stream).ok());
  }

  // Copies land in the staging pool, which the backend registered with the
  // device (the simulated device refuses unregistered host memory too).
  StagingLease Buffer() {
    StagingLease lease = pool->TryAcquire();
    REQUIRE(lease);
    return lease;
  }
};

}  // namespace ckpt::testing
