// Client's GPU regions: registering device memory, keeping the daemon's
// mappings current as the trainer frees and re-allocates it, and watching
// the daemon so no trainer stream waits for one that is gone.
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/ckpt_client.h"
#include "common/status.h"
#include "grpcpp/grpcpp.h"
#ifdef CKPT_HAVE_CUDA
#include "cuda/cuda_trainer_gpu.h"
#endif

namespace ckpt {
namespace {

// How long a save waits for the daemon to release the regions that
// ReleaseGpuMemory left to it.
constexpr absl::Duration kDeferredReleaseTimeout = absl::Seconds(10);

}  // namespace

absl::StatusOr<TrainerGpu*> Client::Gpu() {
  if (options_.gpu != nullptr) return options_.gpu;
#ifdef CKPT_HAVE_CUDA
  if (own_gpu_ == nullptr) {
    ASSIGN_OR_RETURN(own_gpu_, CudaTrainerGpu::Create());
  }
  return own_gpu_.get();
#else
  return absl::FailedPreconditionError(
      "libckpt was built without CUDA: GPU regions need ConnectOptions.gpu");
#endif
}

absl::StatusOr<GpuRegistration> Client::RegisterGpu(uint64_t address,
                                                    uint64_t length,
                                                    CallCanceller* canceller) {
  ASSIGN_OR_RETURN(TrainerGpu * gpu, Gpu());
  ASSIGN_OR_RETURN(GpuRegionExport exported, gpu->Export(address, length));
  ASSIGN_OR_RETURN(GpuEventHandles events, gpu->Events(exported.device_uuid));
  v1::RegisterRegionsRequest request;
  request.set_session_token(token_);
  v1::CudaRegion* cuda = request.add_regions()->mutable_cuda();
  cuda->set_address(address);
  cuda->set_length(length);
  cuda->set_device_uuid(exported.device_uuid);
  for (const GpuPiece& piece : exported.pieces) {
    v1::CudaAllocation* a = cuda->add_pieces();
    if (piece.handle.ipc_handle.empty()) {
      a->set_peer_fd(piece.handle.peer_fd);
    } else {
      a->set_ipc_mem_handle(piece.handle.ipc_handle);
    }
    a->set_allocation_bytes(piece.allocation_bytes);
    a->set_offset(piece.offset);
    a->set_length(piece.length);
  }
  cuda->mutable_ready_event()->set_peer_fd(events.ready.peer_fd);
  cuda->mutable_staged_event()->set_peer_fd(events.staged.peer_fd);
  // The exported fds stay open until the daemon has taken its copies.
  GpuRegistration r;
  ASSIGN_OR_RETURN(r.daemon_id, RegisterOne(request, canceller));
  r.address = address;
  r.length = length;
  r.device_uuid = exported.device_uuid;
  r.allocation_ids = std::move(exported.allocation_ids);
  uint64_t piece_address = address;
  for (size_t i = 0; i < exported.pieces.size() && i < r.allocation_ids.size(); ++i) {
    const GpuPiece& piece = exported.pieces[i];
    r.allocations.push_back(
        {piece_address - piece.offset, piece.allocation_bytes, r.allocation_ids[i]});
    piece_address += piece.length;
  }
  return r;
}

absl::StatusOr<uint64_t> Client::RegisterGpuRegion(uint64_t address,
                                                   uint64_t length) {
  absl::MutexLock lock(&gpu_mu_);
  ASSIGN_OR_RETURN(GpuRegistration r, RegisterGpu(address, length));
  const uint64_t id = r.daemon_id;
  if (std::find(gpu_devices_.begin(), gpu_devices_.end(), r.device_uuid) ==
      gpu_devices_.end()) {
    gpu_devices_.push_back(r.device_uuid);
  }
  gpu_regions_[id] = std::move(r);
  if (!daemon_watch_.joinable()) {
    ASSIGN_OR_RETURN(watched_gpu_, Gpu());
    watch_stop_.reset(::eventfd(0, EFD_CLOEXEC));
    if (!watch_stop_.valid()) return ErrnoToStatus(errno, "eventfd");
    daemon_watch_ = std::thread(
        [this, stop_fd = watch_stop_.get()] { WatchDaemon(stop_fd); });
  }
  return id;
}

absl::Status Client::RecordReady(GpuStreamHandle stream) {
  absl::MutexLock lock(&gpu_mu_);
  if (gpu_regions_.empty()) {
    return absl::FailedPreconditionError(
        "RecordReady: no GPU region is registered, so no save waits for a ready event");
  }
  TrainerGpu* gpu = options_.gpu != nullptr ? options_.gpu : own_gpu_.get();
  recorded_ready_.clear();
  for (const std::string& uuid : gpu_devices_) {
    RETURN_IF_ERROR(gpu->RecordReady(uuid, stream));
    recorded_ready_.push_back(uuid);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<StagedRelay>> Client::ReserveRelay() {
  absl::MutexLock lock(&gpu_mu_);
  if (recorded_ready_.empty()) {
    return absl::FailedPreconditionError(
        "ReserveRelay: no ready event was recorded for the next save (RecordReady first)");
  }
  TrainerGpu* gpu = options_.gpu != nullptr ? options_.gpu : own_gpu_.get();
  // Built record by record: on an error, the destructor makes those
  // reserved so far.
  std::unique_ptr<StagedRelay> relay(new StagedRelay(gpu));
  for (const std::string& uuid : recorded_ready_) {
    ASSIGN_OR_RETURN(const uint64_t record, gpu->ReserveRelay(uuid));
    relay->devices_.push_back(uuid);
    relay->records_.push_back(record);
  }
  return relay;
}

absl::Status Client::TakeRecordedReady(const std::vector<std::string>& devices) {
  std::vector<std::string> recorded;
  {
    absl::MutexLock lock(&gpu_mu_);
    recorded.swap(recorded_ready_);
  }
  for (const std::string& uuid : devices) {
    if (std::find(recorded.begin(), recorded.end(), uuid) == recorded.end()) {
      // Without it the copies would wait for an older record of the event,
      // and could read bytes the trainer had not written yet.
      return absl::FailedPreconditionError(absl::StrCat(
          "the save reads GPU memory of device ", absl::BytesToHexString(uuid),
          " but no ready event was recorded there for it (RecordReady before a save made "
          "with GpuReady::kRecordedBefore)"));
    }
  }
  return absl::OkStatus();
}

void Client::WatchDaemon(int stop_fd) {
  pollfd fds[2] = {{handshake_.get(), POLLRDHUP, 0}, {stop_fd, POLLIN, 0}};
  for (;;) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      std::fprintf(stderr, "libckpt: cannot watch the daemon: %s\n", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;  // the client is closing
    if ((fds[0].revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) break;
  }
  absl::MutexLock lock(&gpu_mu_);
  for (const std::string& uuid : gpu_devices_) {
    absl::Status s = watched_gpu_->SignalStaged(uuid);
    if (!s.ok()) {
      std::fprintf(stderr, "libckpt: the daemon exited; cannot release a staged wait: %s\n",
                   s.ToString().c_str());
    }
  }
}

void Client::RemapRegionIds(
    google::protobuf::RepeatedPtrField<v1::TensorItem>* tensors) {
  absl::MutexLock lock(&gpu_mu_);
  if (gpu_regions_.empty()) return;
  for (v1::TensorItem& item : *tensors) {
    auto it = gpu_regions_.find(item.memory().region_id());
    if (it != gpu_regions_.end()) {
      item.mutable_memory()->set_region_id(it->second.daemon_id);
    }
  }
}

absl::Status Client::RefreshGpuRegions(CallCanceller* canceller, TrainerGpu** gpu,
                                       std::vector<std::string>* devices) {
  absl::MutexLock lock(&gpu_mu_);
  std::vector<MemoryRange> freed;
  {
    absl::MutexLock freed_lock(&freed_mu_);
    freed.swap(freed_);
  }
  if (gpu_regions_.empty()) return absl::OkStatus();
  if (!freed.empty()) {
    // Releases ReleaseGpuMemory could not make while this client was busy.
    const absl::Status released =
        ReleaseOverlapping(freed, absl::Now() + kDeferredReleaseTimeout);
    if (!released.ok()) {
      std::fprintf(stderr, "libckpt: %s\n", released.ToString().c_str());
    }
  }
  *gpu = options_.gpu != nullptr ? options_.gpu : own_gpu_.get();
  // Each whole allocation under the mapped regions, asked once: a region
  // whose allocations all still hold their ids is unchanged, without asking
  // for it (each ask costs several driver calls, and 1,000 tensors may lie
  // in a few segments). An allocation freed, or replaced by one that does
  // not cover the same range, answers otherwise, and its regions are asked
  // one by one below.
  std::map<GpuAllocation, bool> unchanged;
  for (const auto& [id, r] : gpu_regions_) {
    if (r.released) continue;
    for (const GpuAllocation& a : r.allocations) {
      if (unchanged.count(a) != 0) continue;
      absl::StatusOr<std::vector<uint64_t>> now = (*gpu)->AllocationIds(a.base, a.bytes);
      unchanged[a] = now.ok() && *now == std::vector<uint64_t>{a.id};
    }
  }
  const auto is_unchanged = [&](const GpuRegistration& r) {
    if (r.released || r.allocations.empty()) return false;
    for (const GpuAllocation& a : r.allocations) {
      const auto it = unchanged.find(a);
      if (it == unchanged.end() || !it->second) return false;
    }
    return true;
  };
  for (auto& [id, r] : gpu_regions_) {
    if (!is_unchanged(r)) RETURN_IF_ERROR(RefreshGpuRegion(canceller, *gpu, r));
    if (r.released) continue;  // still released: not in this save
    if (std::find(devices->begin(), devices->end(), r.device_uuid) == devices->end()) {
      devices->push_back(r.device_uuid);
    }
  }
  return absl::OkStatus();
}

absl::Status Client::RefreshGpuRegion(CallCanceller* canceller, TrainerGpu* gpu,
                                      GpuRegistration& r) {
  absl::StatusOr<std::vector<uint64_t>> now = gpu->AllocationIds(r.address, r.length);
  if (r.released) {
    // Memory the allocator returned (ReleaseGpuMemory): mapped again once
    // memory is allocated there again, else left out (a save that names it
    // fails at the daemon, which knows it as released).
    if (!now.ok()) return absl::OkStatus();
    ASSIGN_OR_RETURN(r, RegisterGpu(r.address, r.length, canceller));
    return absl::OkStatus();
  }
  // Memory freed and allocated again under the region (even at the same
  // address) has new allocation ids: map the new allocation in place of the
  // old one, which the daemon then releases.
  if (!now.ok()) return now.status();
  if (*now != r.allocation_ids) {
    ASSIGN_OR_RETURN(r, RegisterGpu(r.address, r.length, canceller));
  }
  return absl::OkStatus();
}

absl::Status Client::ReleaseGpuMemory(uint64_t address, uint64_t length,
                                      absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  // Bounded: the thread that holds gpu_mu_ may be waiting for something the
  // freeing thread holds (a Python caller's canceller polls under the GIL,
  // which the thread that frees may hold).
  if (!TryLockGpuUntil(deadline)) {
    absl::MutexLock lock(&freed_mu_);
    freed_.push_back({address, length});
    return absl::DeadlineExceededError(absl::StrCat(
        "the client was busy for ", absl::FormatDuration(timeout),
        ": its GPU regions over freed memory [0x", absl::Hex(address), ", +", length,
        ") are released at its next save"));
  }
  const absl::Status released = ReleaseOverlapping({{address, length}}, deadline);
  gpu_mu_.Unlock();
  return released;
}

bool Client::TryLockGpuUntil(absl::Time deadline) {
  // absl::Mutex has no timed lock (LockWhenWithDeadline takes the lock in
  // the end whatever the deadline): try, and back off up to 1 ms.
  absl::Duration pause = absl::Microseconds(20);
  while (!gpu_mu_.TryLock()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(pause);
    pause = std::min(2 * pause, absl::Milliseconds(1));
  }
  return true;
}

absl::Status Client::ReleaseOverlapping(const std::vector<MemoryRange>& ranges,
                                        absl::Time deadline) {
  v1::ReleaseRegionsRequest request;
  request.set_session_token(token_);
  std::vector<GpuRegistration*> freed;
  for (auto& [id, r] : gpu_regions_) {
    for (const MemoryRange& m : ranges) {
      if (!r.released && r.address < m.address + m.length && m.address < r.address + r.length) {
        request.add_region_ids(r.daemon_id);
        freed.push_back(&r);
        break;
      }
    }
  }
  if (freed.empty()) return absl::OkStatus();
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  v1::ReleaseRegionsResponse response;
  const absl::Status released =
      FromGrpc(stub_->ReleaseRegions(&context, request, &response), "ReleaseRegions");
  // Marked either way: the memory is gone. A daemon that did not hear of it
  // unmaps the region when another is registered over it, or when the
  // session ends.
  for (GpuRegistration* r : freed) {
    r->released = true;
    r->allocation_ids.clear();
  }
  return Annotate(released, absl::StrCat("release ", freed.size(),
                                         " GPU regions over memory the allocator freed"));
}

}  // namespace ckpt
