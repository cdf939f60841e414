#include "session/gpu_regions.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"

namespace ckpt {
namespace {

// An event's cache key: its device and the page's fd number in the peer.
std::string EventKey(int device, const v1::CudaEventRef& ref) {
  return absl::StrCat(device, "/fd/", ref.peer_fd());
}

absl::StatusOr<GpuHandleRef> EventHandle(const v1::CudaEventRef& ref) {
  if (ref.handle_case() != v1::CudaEventRef::kPeerFd || ref.peer_fd() < 0) {
    return absl::InvalidArgumentError("CUDA region has no valid event fd");
  }
  GpuHandleRef handle;
  handle.peer_fd = ref.peer_fd();
  return handle;
}

// The copies of one StartCopy: their fences and the regions they use.
class GpuCopiesInFlight final : public CopiesInFlight {
 public:
  GpuCopiesInFlight(absl::Duration timeout, bool to_host)
      : timeout_(timeout), to_host_(to_host) {}
  ~GpuCopiesInFlight() override {
    if (waited_) return;
    const absl::Status status = Wait();
    if (!status.ok()) LogError("GPU copies not waited for: ", status.ToString());
  }

  void Hold(std::shared_ptr<const GpuRegion> region) { held_.push_back(std::move(region)); }
  // The first error is the one reported.
  void Failed(const absl::Status& error) { status_.Update(error); }
  // The fence of a stream that was given copies.
  void Fenced(absl::StatusOr<std::unique_ptr<GpuFence>> fence) {
    if (fence.ok()) {
      fences_.push_back(*std::move(fence));
    } else {
      // Copies of this stream may be queued that nothing tells the end of.
      ended_ = false;
      Failed(fence.status());
    }
  }

  absl::Status Wait() override {
    waited_ = true;
    for (auto& fence : fences_) {
      const absl::Status waited = fence->Wait(timeout_);
      if (!waited.ok()) {
        ended_ = ended_ && !absl::IsDeadlineExceeded(waited);
        Failed(waited);
      }
    }
    fences_.clear();
    if (!ended_) {
      // A copy that did not end must never run against unmapped memory, on
      // either side: the regions stay mapped, and the caller keeps its host
      // memory out of use (a staging buffer withheld, a tier image kept).
      QuarantineRegions(std::move(held_));
      status_ = MarkHostMemoryInUse(status_);
    }
    held_.clear();
    return Annotate(status_, to_host_ ? "copy from GPU" : "copy to GPU");
  }

 private:
  const absl::Duration timeout_;
  const bool to_host_;
  bool waited_ = false;
  bool ended_ = true;  // false once a copy may run on past Wait
  absl::Status status_;
  std::vector<std::unique_ptr<GpuFence>> fences_;
  std::vector<std::shared_ptr<const GpuRegion>> held_;
};

}  // namespace

GpuRegions::GpuRegions(GpuBackend* backend, PeerFdTaker take_fd,
                       absl::Duration copy_timeout)
    : backend_(backend),
      device_(backend != nullptr ? backend->device() : nullptr),
      take_fd_(std::move(take_fd)),
      copy_timeout_(copy_timeout),
      pool_share_(backend != nullptr ? backend->NewSessionShare() : nullptr) {}

GpuRegions::~GpuRegions() { ReleaseAll(); }

absl::StatusOr<std::shared_ptr<GpuEvent>> GpuRegions::OpenEvent(
    int device, const v1::CudaEventRef& ref) {
  const std::string key = EventKey(device, ref);
  auto it = events_.find(key);
  if (it != events_.end()) return it->second;
  if (events_.size() >= kMaxGpuEventsPerSession) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a session may use at most ", kMaxGpuEventsPerSession,
        " GPU events (a trainer needs its ready and staged events of each device)"));
  }
  ASSIGN_OR_RETURN(GpuHandleRef handle, EventHandle(ref));
  ASSIGN_OR_RETURN(std::unique_ptr<GpuEvent> event,
                   device_->OpenEvent(device, handle, take_fd_));
  std::shared_ptr<GpuEvent> shared = std::move(event);
  events_.emplace(key, shared);
  return shared;
}

absl::Status GpuRegions::Add(uint64_t id, const v1::CudaRegion& r) {
  if (backend_ == nullptr) {
    return absl::FailedPreconditionError(
        "this daemon cannot take CUDA regions: it has no GPU backend");
  }
  RETURN_IF_ERROR(backend_->Prepare());
  const uint64_t a = r.address(), n = r.length();
  if (a == 0 || n == 0 || a + n < a) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA region [0x", absl::Hex(a), ", +", n, ") is empty or wraps"));
  }
  if (r.pieces().empty()) {
    return absl::InvalidArgumentError("CUDA region has no allocations");
  }
  std::vector<GpuPiece> pieces;
  uint64_t covered = 0;
  for (const v1::CudaAllocation& p : r.pieces()) {
    GpuPiece piece;
    switch (p.handle_case()) {
      case v1::CudaAllocation::kIpcMemHandle:
        piece.handle.ipc_handle = p.ipc_mem_handle();
        break;
      case v1::CudaAllocation::kPeerFd:
        if (p.peer_fd() < 0) {
          return absl::InvalidArgumentError("negative allocation fd");
        }
        piece.handle.peer_fd = p.peer_fd();
        break;
      default:
        return absl::InvalidArgumentError("CUDA allocation has no handle");
    }
    piece.allocation_bytes = p.allocation_bytes();
    piece.offset = p.offset();
    piece.length = p.length();
    if (piece.length == 0 || piece.offset > piece.allocation_bytes ||
        piece.length > piece.allocation_bytes - piece.offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA allocation piece [", piece.offset, ", +", piece.length,
          ") is empty or outside its allocation of ", piece.allocation_bytes,
          " bytes"));
    }
    if (piece.length > n - covered) {
      covered = n + 1;  // more than the region: refused below
      break;
    }
    covered += piece.length;
    pieces.push_back(std::move(piece));
  }
  if (covered != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA region of ", n, " bytes is not covered exactly by its allocations"));
  }
  ASSIGN_OR_RETURN(const int device, device_->FindDevice(r.device_uuid()));
  auto region = std::make_shared<GpuRegion>();
  region->id = id;
  region->address = a;
  region->length = n;
  region->device = device;
  region->device_uuid = r.device_uuid();
  // Opening can take long (a first use creates the device's context); the
  // table is not locked meanwhile.
  ASSIGN_OR_RETURN(std::unique_ptr<GpuMapping> mapping,
                   device_->Map(device, pieces, take_fd_));
  if (mapping->length() < n) {
    return absl::InternalError("GPU mapping is shorter than its region");
  }
  region->mapping = std::move(mapping);

  std::vector<std::shared_ptr<const GpuRegion>> replaced;  // unmapped unlocked
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(region->ready, OpenEvent(device, r.ready_event()));
  ASSIGN_OR_RETURN(region->staged, OpenEvent(device, r.staged_event()));
  // Release live regions the new one overlaps: the trainer re-allocated.
  auto it = live_.lower_bound(a);
  if (it != live_.begin()) --it;
  while (it != live_.end() && it->first < a + n) {
    const GpuRegion& old = *it->second;
    if (old.address + old.length > a) {
      LogDebug("GPU region ", old.id, " replaced by region ", id);
      released_.Add(old.address, old.address + old.length);
      replaced.push_back(std::move(it->second));
      it = live_.erase(it);
      releases_.fetch_add(1, std::memory_order_release);
    } else {
      ++it;
    }
  }
  live_.emplace(a, std::move(region));
  return absl::OkStatus();
}

void GpuRegions::Release(uint64_t id) {
  std::shared_ptr<const GpuRegion> gone;  // unmapped after unlocking
  absl::MutexLock lock(&mu_);
  for (auto it = live_.begin(); it != live_.end(); ++it) {
    if (it->second->id != id) continue;
    released_.Add(it->first, it->first + it->second->length);
    gone = std::move(it->second);
    live_.erase(it);
    releases_.fetch_add(1, std::memory_order_release);
    break;
  }
}

void GpuRegions::ReleaseAll() {
  std::map<uint64_t, std::shared_ptr<const GpuRegion>> live;
  std::map<std::string, std::shared_ptr<GpuEvent>> events;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [address, region] : live_) {
      released_.Add(address, address + region->length);
    }
    live.swap(live_);
    events.swap(events_);
    releases_.fetch_add(1, std::memory_order_release);
  }
  // Mappings and events are closed here, outside the lock, once no copy in
  // flight holds them.
}

size_t GpuRegions::live_regions() const {
  absl::MutexLock lock(&mu_);
  return live_.size();
}

absl::StatusOr<std::shared_ptr<const GpuRegion>> GpuRegions::Find(
    uint64_t address, uint64_t length) const {
  absl::MutexLock lock(&mu_);
  auto it = live_.upper_bound(address);
  if (it != live_.begin()) {
    const GpuRegion& r = *std::prev(it)->second;
    if (address < r.address + r.length) {
      if (length > r.address + r.length - address) {
        return absl::OutOfRangeError(absl::StrCat(
            "[0x", absl::Hex(address), ", +", length,
            ") runs past the end of GPU region ", r.id));
      }
      return std::prev(it)->second;
    }
  }
  // The end saturates: a span's length comes from the trainer.
  const uint64_t end =
      length > UINT64_MAX - address ? UINT64_MAX : address + length;
  if (released_.Overlaps(address, end)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GPU memory [0x", absl::Hex(address), ", +", length,
        ") belongs to a released region: register the new allocation and "
        "define the layout again"));
  }
  return nullptr;
}

StagedRecords GpuRegions::ReserveStaged() {
  std::vector<StagedRecords::Record> records;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& entry : live_) {
      const GpuRegion& region = *entry.second;
      const bool seen = std::any_of(records.begin(), records.end(), [&](const auto& r) {
        return r.event == region.staged;
      });
      if (!seen) records.push_back({region.staged, region.device_uuid, 0, false});
    }
    // Under the lock, so that two saves of the session reserve each event
    // in the order they reserve the first.
    for (StagedRecords::Record& r : records) r.number = r.event->ReserveRecord();
  }
  if (records.empty()) return StagedRecords();
  return StagedRecords(std::move(records), &backend_->staged_completer());
}

std::unique_ptr<CopiesInFlight> GpuRegions::StartCopy(absl::Span<const CopySpan> spans,
                                                      bool to_host) {
  auto copies = std::make_unique<GpuCopiesInFlight>(copy_timeout_, to_host);
  // Per device, in span order; the regions stay alive until the copies end.
  std::map<int, std::vector<GpuCopy>> by_device;
  for (const CopySpan& s : spans) {
    absl::StatusOr<std::shared_ptr<const GpuRegion>> region = Find(s.remote, s.length);
    if (!region.ok() || *region == nullptr) {
      copies->Failed(region.ok() ? absl::InternalError("GPU copy of a span in no GPU region")
                                 : region.status());
      return copies;
    }
    by_device[(*region)->device].push_back({(*region)->Translate(s.remote), s.local, s.length});
    copies->Hold(*std::move(region));
  }
  // Every stream that was given copies gets a fence, and every fence is
  // waited for, error or not: the host memory is a staging buffer or a tier
  // image that the caller reuses once the copies end. The streams are held
  // only to enqueue (a stream is used by one thread at a time); the fences
  // are waited for after, so that copies of threads restoring parts of a
  // file at once (restore/read_split.h) queue behind each other on the copy
  // engine instead of each waiting for the one before to end.
  absl::MutexLock lock(&copy_mu_);
  for (auto& [device, device_copies] : by_device) {
    // A memory tier image is pinned in chunks; a copy must not span two.
    backend_->SplitAtChunks(&device_copies);
    std::unique_ptr<GpuStream>& stream = copy_streams_[device];
    if (stream == nullptr) {
      absl::StatusOr<std::unique_ptr<GpuStream>> created = device_->CreateStream(device);
      if (!created.ok()) {
        copies->Failed(created.status());
        break;
      }
      stream = *std::move(created);
    }
    const absl::Status enqueued =
        to_host ? stream->CopyToHost(device_copies) : stream->CopyToDevice(device_copies);
    // Some of the copies may be queued even when enqueueing failed.
    copies->Fenced(stream->Fence());
    if (!enqueued.ok()) {
      copies->Failed(enqueued);
      break;
    }
  }
  return copies;
}

}  // namespace ckpt
