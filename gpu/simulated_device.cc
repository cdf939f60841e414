#include "gpu/simulated_device.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "common/status.h"
#include "gpu/simulated_runtime.h"

namespace ckpt {

// What the device's mappings and streams share: registered host chunks,
// live mappings (to check both sides of every copy), the fault hooks and
// the devices whose context failed.
struct SimulatedDeviceState {
  // The sticky error of `device` (SimulatedDevice::FailDevice), OK while
  // it works.
  absl::Status Failure(int device) {
    if (!Failed(device)) return absl::OkStatus();
    absl::MutexLock lock(&mu);
    return failures[device];
  }
  bool Failed(int device) const {
    return device >= 0 && device < 64 &&
           (failed_mask.load(std::memory_order_acquire) & (uint64_t{1} << device)) != 0;
  }

  // Bit i: device i failed (read without mu by the streams' halt test;
  // FailDevice takes only the first 64 devices).
  std::atomic<uint64_t> failed_mask{0};
  absl::Mutex mu;
  std::map<int, absl::Status> failures ABSL_GUARDED_BY(mu);
  // Registered host chunks and live mapped regions: start -> length.
  std::map<uint64_t, uint64_t> host_chunks ABSL_GUARDED_BY(mu);
  std::map<uint64_t, uint64_t> mappings ABSL_GUARDED_BY(mu);
  absl::Status next_copy_fault ABSL_GUARDED_BY(mu);
  CopyFault next_copy_fault_when ABSL_GUARDED_BY(mu) = CopyFault::kOnEnqueue;
  absl::Duration next_copy_stall ABSL_GUARDED_BY(mu) = absl::ZeroDuration();
};

namespace {

// Whether [start, start + length) lies inside one entry of `ranges`.
bool InsideOne(const std::map<uint64_t, uint64_t>& ranges, uint64_t start,
               uint64_t length) {
  auto it = ranges.upper_bound(start);
  if (it == ranges.begin()) return false;
  --it;
  return start - it->first <= it->second &&
         length <= it->second - (start - it->first);
}

absl::Status CheckCopies(const SimulatedDeviceState& state,
                         absl::Span<const GpuCopy> copies)
    ABSL_SHARED_LOCKS_REQUIRED(state.mu) {
  for (size_t i = 0; i < copies.size(); ++i) {
    const GpuCopy& c = copies[i];
    if (c.length == 0) continue;
    if (!InsideOne(state.host_chunks, reinterpret_cast<uint64_t>(c.host),
                   c.length)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "copy ", i, ": host memory [0x", absl::Hex(c.host), ", +", c.length,
          ") is not inside one registered chunk (RegisterHostMemory)"));
    }
    if (!InsideOne(state.mappings, c.device, c.length)) {
      return absl::InvalidArgumentError(
          absl::StrCat("copy ", i, ": device memory [0x", absl::Hex(c.device),
                       ", +", c.length, ") is not inside one live mapping"));
    }
  }
  return absl::OkStatus();
}

class SimulatedMapping final : public GpuMapping {
 public:
  SimulatedMapping(std::shared_ptr<SimulatedDeviceState> state, char* base,
                   uint64_t reserved, uint64_t address, uint64_t length)
      : state_(std::move(state)),
        base_(base),
        reserved_(reserved),
        address_(address),
        length_(length) {
    absl::MutexLock lock(&state_->mu);
    state_->mappings[address_] = length_;
  }
  ~SimulatedMapping() override {
    {
      // Waits for copies running now; later ones find no mapping.
      absl::MutexLock lock(&state_->mu);
      state_->mappings.erase(address_);
    }
    if (::munmap(base_, reserved_) != 0) {
      LogError(ErrnoToStatus(errno, "munmap of a simulated mapping").message());
    }
  }
  uint64_t address() const override { return address_; }
  uint64_t length() const override { return length_; }

 private:
  const std::shared_ptr<SimulatedDeviceState> state_;
  char* const base_;
  const uint64_t reserved_;
  const uint64_t address_;
  const uint64_t length_;
};

class SimulatedGpuEvent final : public GpuEvent {
 public:
  // `event` is opened on device `ordinal` of `device`.
  SimulatedGpuEvent(std::shared_ptr<SimulatedEvent> event,
                    std::shared_ptr<SimulatedDeviceState> device, int ordinal)
      : event_(std::move(event)), device_(std::move(device)), ordinal_(ordinal) {}
  const std::shared_ptr<SimulatedEvent>& event() const { return event_; }
  absl::Status CompleteThrough(uint64_t record) override {
    event_->Complete(record);
    return absl::OkStatus();
  }
  uint64_t ReserveRecord() override { return event_->EnqueueRecord(); }
  bool CompleteReserved(uint64_t record) override {
    return CompleteIfDeviceFailed(record) || event_->CompleteReserved(record);
  }
  bool CompleteIfDeviceFailed(uint64_t record) override {
    if (event_->Covers(record)) return true;
    if (!device_->Failed(ordinal_)) return false;
    event_->Complete(record);
    return true;
  }

 private:
  const std::shared_ptr<SimulatedEvent> event_;
  const std::shared_ptr<SimulatedDeviceState> device_;
  const int ordinal_;
};

absl::StatusOr<std::shared_ptr<SimulatedEvent>> EventOf(GpuEvent& event) {
  auto* simulated = dynamic_cast<SimulatedGpuEvent*>(&event);
  if (simulated == nullptr) {
    return absl::InvalidArgumentError("the event is not a simulated event");
  }
  return simulated->event();
}

// Checks the shape of the pieces, before any fd is taken: lengths, offsets
// and the contiguity rule.
absl::Status CheckPieces(absl::Span<const GpuPiece> pieces) {
  if (pieces.empty()) return absl::InvalidArgumentError("no pieces to map");
  uint64_t reserved = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const GpuPiece& p = pieces[i];
    const std::string which = absl::StrCat("piece ", i, ": ");
    if (!p.handle.ipc_handle.empty()) {
      return absl::UnimplementedError(
          which + "the simulated device has no legacy IPC handles");
    }
    if (p.handle.peer_fd < 0) {
      return absl::InvalidArgumentError(which + "no fd");
    }
    if (p.length == 0) return absl::InvalidArgumentError(which + "zero length");
    if (p.allocation_bytes == 0 || p.allocation_bytes % SimulatedPageSize()) {
      return absl::InvalidArgumentError(
          absl::StrCat(which, "allocation_bytes ", p.allocation_bytes,
                       " is not a positive multiple of ", SimulatedPageSize()));
    }
    if (p.offset > p.allocation_bytes ||
        p.length > p.allocation_bytes - p.offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          which, "[", p.offset, ", +", p.length,
          ") is beyond its allocation of ", p.allocation_bytes, " bytes"));
    }
    if (i > 0 && p.offset != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(which, "not contiguous: starts at offset ", p.offset,
                       " of its allocation, not 0"));
    }
    if (i + 1 < pieces.size() && p.offset + p.length != p.allocation_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          which, "not contiguous: ends before its allocation's end"));
    }
    if (p.allocation_bytes >
        std::numeric_limits<uint64_t>::max() / 2 - reserved) {
      return absl::InvalidArgumentError(which + "the region is too large");
    }
    reserved += p.allocation_bytes;
  }
  return absl::OkStatus();
}

// The completion of a fence: set once, by the stream or, when the stream
// drops the fence's work unrun, by FenceSignal's destructor.
struct FenceState {
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);

  void Finish(absl::Status result) {
    absl::MutexLock lock(&mu);
    if (done) return;
    done = true;
    status = std::move(result);
  }
};

class FenceSignal {
 public:
  explicit FenceSignal(std::shared_ptr<FenceState> state)
      : state_(std::move(state)) {}
  ~FenceSignal() {
    state_->Finish(absl::AbortedError(
        "the stream was destroyed before it reached the fence"));
  }
  void Fire(absl::Status result) { state_->Finish(std::move(result)); }

 private:
  const std::shared_ptr<FenceState> state_;
};

class SimulatedFence final : public GpuFence {
 public:
  SimulatedFence(std::shared_ptr<FenceState> state,
                 std::shared_ptr<SimulatedDeviceState> device, int ordinal)
      : state_(std::move(state)), device_(std::move(device)), ordinal_(ordinal) {}
  absl::StatusOr<bool> Ready() override {
    // As cudaEventQuery: a failed context reports its sticky error.
    RETURN_IF_ERROR(device_->Failure(ordinal_));
    absl::MutexLock lock(&state_->mu);
    if (!state_->done) return false;
    RETURN_IF_ERROR(state_->status);
    return true;
  }
  absl::Status Wait(absl::Duration timeout) override {
    absl::Status status;
    {
      absl::MutexLock lock(&state_->mu);
      if (!state_->mu.AwaitWithTimeout(absl::Condition(&state_->done), timeout)) {
        return absl::DeadlineExceededError(
            absl::StrCat("the simulated stream did not reach the fence within ",
                         absl::FormatDuration(timeout)));
      }
      status = state_->status;
    }
    // A failed context's stream dropped the fence unrun: say why.
    RETURN_IF_ERROR(device_->Failure(ordinal_));
    return status;
  }

 private:
  const std::shared_ptr<FenceState> state_;
  const std::shared_ptr<SimulatedDeviceState> device_;
  const int ordinal_;
};

// The daemon's copy stream: GpuStream on a SimulatedStream. Copies are
// checked when enqueued and again, under the device's lock, when they run;
// the first failure is the stream's sticky error.
class SimulatedCopyStream final : public GpuStream {
 public:
  // A stream of device `ordinal`: it stops for good once that device fails.
  SimulatedCopyStream(std::shared_ptr<SimulatedDeviceState> device, int ordinal)
      : device_(std::move(device)),
        ordinal_(ordinal),
        stream_([device = device_, ordinal] { return device->Failed(ordinal); }) {}

  absl::StatusOr<uint64_t> WaitEvent(GpuEvent& event) override {
    RETURN_IF_ERROR(device_->Failure(ordinal_));
    ASSIGN_OR_RETURN(std::shared_ptr<SimulatedEvent> e, EventOf(event));
    // Read once: the number waited for is the one returned, whatever the
    // peer writes to its page afterwards.
    const uint64_t target = e->recorded();
    stream_.WaitFor(std::move(e), target);
    return target;
  }
  absl::Status RecordEvent(GpuEvent& event) override {
    RETURN_IF_ERROR(device_->Failure(ordinal_));
    ASSIGN_OR_RETURN(std::shared_ptr<SimulatedEvent> e, EventOf(event));
    stream_.RecordEvent(std::move(e), /*after_previous=*/true);
    return absl::OkStatus();
  }
  absl::Status RecordReserved(GpuEvent& event, uint64_t record) override {
    RETURN_IF_ERROR(device_->Failure(ordinal_));
    ASSIGN_OR_RETURN(std::shared_ptr<SimulatedEvent> e, EventOf(event));
    stream_.RecordReserved(std::move(e), record);
    return absl::OkStatus();
  }
  absl::Status CopyToHost(absl::Span<const GpuCopy> copies) override {
    return Annotate(EnqueueCopies(copies, /*to_host=*/true), "CopyToHost");
  }
  absl::Status CopyToDevice(absl::Span<const GpuCopy> copies) override {
    return Annotate(EnqueueCopies(copies, /*to_host=*/false), "CopyToDevice");
  }
  absl::StatusOr<std::unique_ptr<GpuFence>> Fence() override {
    RETURN_IF_ERROR(device_->Failure(ordinal_));
    auto state = std::make_shared<FenceState>();
    stream_.Enqueue([this, signal = std::make_shared<FenceSignal>(state)] {
      signal->Fire(sticky_error());
    });
    return std::make_unique<SimulatedFence>(std::move(state), device_, ordinal_);
  }

 private:
  absl::Status EnqueueCopies(absl::Span<const GpuCopy> copies, bool to_host) {
    RETURN_IF_ERROR(device_->Failure(ordinal_));
    RETURN_IF_ERROR(sticky_error());
    absl::Status fault_on_completion;
    absl::Duration stall;
    {
      absl::MutexLock lock(&device_->mu);
      RETURN_IF_ERROR(CheckCopies(*device_, copies));
      stall = std::exchange(device_->next_copy_stall, absl::ZeroDuration());
      if (!device_->next_copy_fault.ok()) {
        absl::Status fault = std::exchange(device_->next_copy_fault, {});
        if (device_->next_copy_fault_when == CopyFault::kOnEnqueue) {
          return fault;
        }
        fault_on_completion = std::move(fault);
      }
    }
    stream_.Enqueue([this, fault = std::move(fault_on_completion),
                     batch = std::vector<GpuCopy>(copies.begin(), copies.end()),
                     to_host, stall] {
      absl::SleepFor(stall);
      if (!sticky_error().ok()) return;
      absl::Status result = fault.ok() ? RunCopies(batch, to_host) : fault;
      if (!result.ok()) {
        absl::MutexLock lock(&mu_);
        sticky_error_ = Annotate(result, "a copy on the stream failed");
      }
    });
    return absl::OkStatus();
  }

  absl::Status RunCopies(absl::Span<const GpuCopy> batch, bool to_host) {
    // Shared: copies on several streams run at once; a mapping being
    // destroyed waits for them.
    absl::ReaderMutexLock lock(&device_->mu);
    RETURN_IF_ERROR(CheckCopies(*device_, batch));
    for (const GpuCopy& c : batch) {
      if (c.length == 0) continue;
      char* device = reinterpret_cast<char*>(c.device);
      if (to_host) {
        std::memcpy(c.host, device, c.length);
      } else {
        std::memcpy(device, c.host, c.length);
      }
    }
    return absl::OkStatus();
  }

  absl::Status sticky_error() {
    absl::MutexLock lock(&mu_);
    return sticky_error_;
  }

  const std::shared_ptr<SimulatedDeviceState> device_;
  const int ordinal_;
  absl::Mutex mu_;
  absl::Status sticky_error_ ABSL_GUARDED_BY(mu_);
  // Last: destroyed (its thread joined) before the fields its work uses.
  SimulatedStream stream_;
};

// The chunks of [0, length) that the seam documents, as (offset, size):
// `chunk_bytes` each, the last one shorter.
std::vector<std::pair<uint64_t, uint64_t>> Chunks(uint64_t length,
                                                  uint64_t chunk_bytes) {
  std::vector<std::pair<uint64_t, uint64_t>> chunks;
  for (uint64_t at = 0; at < length;) {
    const uint64_t size = std::min(chunk_bytes, length - at);
    chunks.emplace_back(at, size);
    at += size;
  }
  return chunks;
}

}  // namespace

SimulatedDevice::SimulatedDevice(int device_count)
    : device_count_(device_count),
      state_(std::make_shared<SimulatedDeviceState>()) {}

SimulatedDevice::~SimulatedDevice() = default;

absl::Status SimulatedDevice::CheckOrdinal(int device) const {
  if (device < 0 || device >= device_count_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no simulated device ", device, " (", device_count_, " devices)"));
  }
  return state_->Failure(device);
}

absl::StatusOr<int> SimulatedDevice::FindDevice(const std::string& uuid) {
  return SimulatedDeviceOrdinal(uuid, device_count_);
}

absl::StatusOr<std::unique_ptr<GpuMapping>> SimulatedDevice::Map(
    int device, absl::Span<const GpuPiece> pieces, const PeerFdTaker& take_fd) {
  RETURN_IF_ERROR(CheckOrdinal(device));
  RETURN_IF_ERROR(Annotate(CheckPieces(pieces), "Map"));
  std::vector<UniqueFd> taken;  // closed on return: the mapping holds the files
  std::vector<int> fds;
  std::vector<uint64_t> sizes;
  uint64_t length = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const GpuPiece& p = pieces[i];
    absl::StatusOr<UniqueFd> fd = take_fd(p.handle.peer_fd);
    if (!fd.ok()) {
      return Annotate(fd.status(),
                      absl::StrCat("Map: taking the fd of piece ", i));
    }
    RETURN_IF_ERROR(
        Annotate(CheckSimulatedAllocation(fd->get(), p.allocation_bytes),
                 absl::StrCat("Map: piece ", i)));
    fds.push_back(fd->get());
    sizes.push_back(p.allocation_bytes);
    taken.push_back(*std::move(fd));
    length += p.length;
  }
  absl::StatusOr<char*> base = MapBackToBack(fds, sizes);
  if (!base.ok()) return Annotate(base.status(), "Map");
  uint64_t reserved = 0;
  for (uint64_t size : sizes) reserved += size;
  const uint64_t address = reinterpret_cast<uint64_t>(*base) + pieces[0].offset;
  return std::make_unique<SimulatedMapping>(state_, *base, reserved, address,
                                            length);
}

absl::StatusOr<std::unique_ptr<GpuEvent>> SimulatedDevice::OpenEvent(
    int device, const GpuHandleRef& handle, const PeerFdTaker& take_fd) {
  RETURN_IF_ERROR(CheckOrdinal(device));
  if (!handle.ipc_handle.empty()) {
    return absl::UnimplementedError(
        "OpenEvent: the simulated device has no legacy IPC handles");
  }
  if (handle.peer_fd < 0) return absl::InvalidArgumentError("OpenEvent: no fd");
  absl::StatusOr<UniqueFd> fd = take_fd(handle.peer_fd);
  if (!fd.ok()) return Annotate(fd.status(), "OpenEvent: taking the fd");
  ASSIGN_OR_RETURN(std::shared_ptr<SimulatedEvent> event,
                   SimulatedEvent::Open(*std::move(fd)));
  return std::make_unique<SimulatedGpuEvent>(std::move(event), state_, device);
}

absl::StatusOr<std::unique_ptr<GpuStream>> SimulatedDevice::CreateStream(
    int device) {
  RETURN_IF_ERROR(CheckOrdinal(device));
  return std::make_unique<SimulatedCopyStream>(state_, device);
}

absl::Status SimulatedDevice::RegisterHostMemory(char* data, uint64_t length,
                                                 uint64_t chunk_bytes) {
  const uint64_t start = reinterpret_cast<uint64_t>(data);
  if (data == nullptr || length == 0 || chunk_bytes == 0 ||
      length > std::numeric_limits<uint64_t>::max() - start) {
    return absl::InvalidArgumentError(
        absl::StrCat("RegisterHostMemory: bad range 0x", absl::Hex(start), " +",
                     length, " in chunks of ", chunk_bytes));
  }
  absl::MutexLock lock(&state_->mu);
  auto& chunks = state_->host_chunks;
  // The new chunks tile [start, start + length): it must overlap no chunk.
  auto next = chunks.lower_bound(start);
  const bool overlaps_next =
      next != chunks.end() && next->first - start < length;
  const bool overlaps_previous =
      next != chunks.begin() &&
      std::prev(next)->first + std::prev(next)->second > start;
  if (overlaps_next || overlaps_previous) {
    return absl::AlreadyExistsError(
        absl::StrCat("RegisterHostMemory: [0x", absl::Hex(start), ", +", length,
                     ") overlaps registered host memory"));
  }
  for (const auto& [at, size] : Chunks(length, chunk_bytes)) {
    chunks[start + at] = size;
  }
  return absl::OkStatus();
}

absl::Status SimulatedDevice::UnregisterHostMemory(char* data, uint64_t length,
                                                   uint64_t chunk_bytes) {
  const uint64_t start = reinterpret_cast<uint64_t>(data);
  if (data == nullptr || length == 0 || chunk_bytes == 0) {
    return absl::InvalidArgumentError("UnregisterHostMemory: empty range");
  }
  absl::MutexLock lock(&state_->mu);
  auto& chunks = state_->host_chunks;
  // All or nothing: every chunk must be registered exactly so.
  const std::vector<std::pair<uint64_t, uint64_t>> unregistering =
      Chunks(length, chunk_bytes);
  for (const auto& [at, size] : unregistering) {
    auto it = chunks.find(start + at);
    if (it == chunks.end() || it->second != size) {
      return absl::FailedPreconditionError(
          absl::StrCat("UnregisterHostMemory: chunk [0x", absl::Hex(start + at),
                       ", +", size, ") is not registered"));
    }
  }
  for (const auto& [at, size] : unregistering) chunks.erase(start + at);
  return absl::OkStatus();
}

void SimulatedDevice::StallNextCopy(absl::Duration stall) {
  absl::MutexLock lock(&state_->mu);
  state_->next_copy_stall = stall;
}

void SimulatedDevice::FailDevice(int device, absl::Status status) {
  if (device < 0 || device >= device_count_ || device >= 64 || status.ok()) {
    LogError("FailDevice: no simulated device ", device, " or no error");
    return;
  }
  absl::MutexLock lock(&state_->mu);
  state_->failures[device] = absl::FailedPreconditionError(absl::StrCat(
      "simulated device ", device, " hit a sticky error (", status.message(),
      "); its context cannot be used again"));
  state_->failed_mask.fetch_or(uint64_t{1} << device, std::memory_order_acq_rel);
}

void SimulatedDevice::FailNextCopy(absl::Status status, CopyFault when) {
  absl::MutexLock lock(&state_->mu);
  state_->next_copy_fault = std::move(status);
  state_->next_copy_fault_when = when;
}

}  // namespace ckpt
