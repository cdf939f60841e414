#include "gpu/simulated_trainer_gpu.h"

#include <fcntl.h>
#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"

namespace ckpt {
namespace {

// Process-wide, so ids never repeat even across SimulatedTrainerGpu objects.
std::atomic<uint64_t> next_allocation_id{1};

std::string RangeText(uint64_t address, uint64_t length) {
  return absl::StrCat("[0x", absl::Hex(address), ", +", length, ")");
}

SimulatedStream* StreamOf(GpuStreamHandle stream) {
  return static_cast<SimulatedStream*>(stream);
}

}  // namespace

SimulatedTrainerGpu::SimulatedTrainerGpu(int device_count)
    : device_count_(device_count) {}

SimulatedTrainerGpu::~SimulatedTrainerGpu() {
  absl::MutexLock lock(&mu_);
  for (const auto& [address, allocation] : allocations_) {
    if (::munmap(reinterpret_cast<void*>(address), allocation.bytes) != 0) {
      LogError(
          ErrnoToStatus(errno, "munmap of a simulated allocation").message());
    }
  }
}

absl::StatusOr<uint64_t> SimulatedTrainerGpu::Allocate(uint64_t bytes, int device) {
  return MapNew(1, bytes, device);
}

absl::StatusOr<uint64_t> SimulatedTrainerGpu::AllocateSegments(
    int count, uint64_t bytes_each, int device) {
  if (count <= 0) {
    return absl::InvalidArgumentError("AllocateSegments: no segments");
  }
  return MapNew(count, bytes_each, device);
}

absl::StatusOr<uint64_t> SimulatedTrainerGpu::MapNew(int count,
                                                     uint64_t bytes_each,
                                                     int device) {
  const uint64_t page = SimulatedPageSize();
  if (device < 0 || device >= device_count_) {
    return absl::InvalidArgumentError(
        absl::StrCat("Allocate: no simulated device ", device, " (",
                     device_count_, " devices)"));
  }
  if (bytes_each == 0 ||
      bytes_each > std::numeric_limits<uint64_t>::max() / 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("Allocate: cannot allocate ", bytes_each, " bytes"));
  }
  const uint64_t bytes = (bytes_each + page - 1) / page * page;
  std::vector<Allocation> made;
  std::vector<int> fds;
  for (int i = 0; i < count; ++i) {
    absl::StatusOr<UniqueFd> fd = CreateSimulatedAllocation(
        bytes, absl::StrCat("ckpt-sim-alloc-gpu", device).c_str());
    if (!fd.ok()) return Annotate(fd.status(), "Allocate");
    fds.push_back(fd->get());
    made.push_back(
        {next_allocation_id.fetch_add(1), device, bytes, *std::move(fd)});
  }
  const std::vector<uint64_t> sizes(fds.size(), bytes);
  absl::StatusOr<char*> base = MapBackToBack(fds, sizes);
  if (!base.ok()) return Annotate(base.status(), "Allocate");
  const uint64_t first = reinterpret_cast<uint64_t>(*base);
  absl::MutexLock lock(&mu_);
  for (int i = 0; i < count; ++i) {
    allocations_.emplace(first + i * bytes, std::move(made[i]));
  }
  return first;
}

absl::Status SimulatedTrainerGpu::Free(uint64_t address) {
  absl::MutexLock lock(&mu_);
  auto it = allocations_.find(address);
  if (it == allocations_.end()) {
    return absl::NotFoundError(absl::StrCat("Free: 0x", absl::Hex(address),
                                            " is not the start of a simulated "
                                            "allocation"));
  }
  if (::munmap(reinterpret_cast<void*>(address), it->second.bytes) != 0) {
    return ErrnoToStatus(
        errno,
        absl::StrCat("Free: munmap ", RangeText(address, it->second.bytes)));
  }
  allocations_.erase(it);  // closes the memfd
  return absl::OkStatus();
}

absl::Status SimulatedTrainerGpu::Reallocate(uint64_t address) {
  absl::MutexLock lock(&mu_);
  auto it = allocations_.find(address);
  if (it == allocations_.end()) {
    return absl::NotFoundError(absl::StrCat("Reallocate: 0x", absl::Hex(address),
                                            " is not the start of a simulated "
                                            "allocation"));
  }
  const uint64_t bytes = it->second.bytes;
  const int device = it->second.device;
  absl::StatusOr<UniqueFd> fd = CreateSimulatedAllocation(
      bytes, absl::StrCat("ckpt-sim-alloc-gpu", device).c_str());
  if (!fd.ok()) return Annotate(fd.status(), "Reallocate");
  // MAP_FIXED replaces the old pages in one step: the address is never free.
  if (::mmap(reinterpret_cast<void*>(address), bytes, PROT_READ | PROT_WRITE,
             MAP_SHARED | MAP_FIXED, fd->get(), 0) == MAP_FAILED) {
    return ErrnoToStatus(errno,
                         absl::StrCat("Reallocate: mapping ", RangeText(address, bytes)));
  }
  // Closes the old memfd; mappings of it elsewhere keep its pages.
  it->second = Allocation{next_allocation_id.fetch_add(1), device, bytes, *std::move(fd)};
  return absl::OkStatus();
}

absl::StatusOr<
    std::vector<std::pair<uint64_t, const SimulatedTrainerGpu::Allocation*>>>
SimulatedTrainerGpu::Cover(uint64_t address, uint64_t length) const {
  if (length == 0 || length > std::numeric_limits<uint64_t>::max() - address) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad range ", RangeText(address, length)));
  }
  const uint64_t end = address + length;
  std::vector<std::pair<uint64_t, const Allocation*>> covering;
  auto it = allocations_.upper_bound(address);
  if (it == allocations_.begin())
    it = allocations_.end();
  else
    --it;
  uint64_t at = address;
  while (at < end) {
    if (it == allocations_.end() || it->first > at ||
        at - it->first >= it->second.bytes) {
      return absl::NotFoundError(absl::StrCat(
          RangeText(address, length), " is not simulated device memory (0x",
          absl::Hex(at), " is in no allocation)"));
    }
    covering.emplace_back(it->first, &it->second);
    at = it->first + it->second.bytes;
    ++it;
  }
  return covering;
}

absl::StatusOr<GpuRegionExport> SimulatedTrainerGpu::Export(uint64_t address,
                                                            uint64_t length) {
  absl::ReaderMutexLock lock(&mu_);
  absl::StatusOr<std::vector<std::pair<uint64_t, const Allocation*>>> covering =
      Cover(address, length);
  if (!covering.ok()) return Annotate(covering.status(), "Export");
  GpuRegionExport out;
  const int device = covering->front().second->device;
  out.device_uuid = SimulatedDeviceUuid(device);
  for (const auto& [start, allocation] : *covering) {
    if (allocation->device != device) {
      return absl::InvalidArgumentError(
          absl::StrCat("Export: ", RangeText(address, length),
                       " spans devices ", device, " and ", allocation->device));
    }
    UniqueFd dup(::fcntl(allocation->fd.get(), F_DUPFD_CLOEXEC, 0));
    if (!dup.valid()) return ErrnoToStatus(errno, "Export: dup of a memfd");
    const uint64_t from = std::max(address, start);
    const uint64_t to = std::min(address + length, start + allocation->bytes);
    GpuPiece piece;
    piece.handle.peer_fd = dup.get();
    piece.allocation_bytes = allocation->bytes;
    piece.offset = from - start;
    piece.length = to - from;
    out.pieces.push_back(piece);
    out.allocation_ids.push_back(allocation->id);
    out.fds.push_back(std::move(dup));
  }
  return out;
}

absl::StatusOr<std::vector<uint64_t>> SimulatedTrainerGpu::AllocationIds(
    uint64_t address, uint64_t length) {
  absl::ReaderMutexLock lock(&mu_);
  absl::StatusOr<std::vector<std::pair<uint64_t, const Allocation*>>> covering =
      Cover(address, length);
  if (!covering.ok()) return Annotate(covering.status(), "AllocationIds");
  std::vector<uint64_t> ids;
  for (const auto& [start, allocation] : *covering)
    ids.push_back(allocation->id);
  return ids;
}

absl::StatusOr<SimulatedTrainerGpu::DeviceEvents> SimulatedTrainerGpu::EventsOf(
    const std::string& device_uuid) {
  ASSIGN_OR_RETURN(const int device,
                   SimulatedDeviceOrdinal(device_uuid, device_count_));
  absl::MutexLock lock(&mu_);
  auto it = events_.find(device);
  if (it != events_.end()) return it->second;
  DeviceEvents events;
  absl::StatusOr<std::shared_ptr<SimulatedEvent>> ready =
      SimulatedEvent::Create();
  if (!ready.ok()) return Annotate(ready.status(), "creating the ready event");
  absl::StatusOr<std::shared_ptr<SimulatedEvent>> staged =
      SimulatedEvent::Create();
  if (!staged.ok())
    return Annotate(staged.status(), "creating the staged event");
  absl::StatusOr<std::shared_ptr<SimulatedEvent>> relay = SimulatedEvent::Create();
  if (!relay.ok()) return Annotate(relay.status(), "creating the relay event");
  events.ready = *std::move(ready);
  events.staged = *std::move(staged);
  events.relay = *std::move(relay);
  events.relay_stream = std::make_shared<SimulatedStream>();
  events_.emplace(device, events);
  return events;
}

absl::StatusOr<GpuEventHandles> SimulatedTrainerGpu::Events(
    const std::string& device_uuid) {
  ASSIGN_OR_RETURN(const DeviceEvents events, EventsOf(device_uuid));
  GpuEventHandles handles;
  handles.ready.peer_fd = events.ready->fd();
  handles.staged.peer_fd = events.staged->fd();
  return handles;
}

absl::Status SimulatedTrainerGpu::RecordReady(const std::string& device_uuid,
                                              GpuStreamHandle stream) {
  if (stream == nullptr) {
    return absl::InvalidArgumentError(
        "RecordReady: the simulated GPU has no default stream; pass a "
        "SimulatedStream*");
  }
  ASSIGN_OR_RETURN(const DeviceEvents events, EventsOf(device_uuid));
  StreamOf(stream)->RecordEvent(events.ready);
  return absl::OkStatus();
}

absl::Status SimulatedTrainerGpu::WaitStaged(const std::string& device_uuid,
                                             GpuStreamHandle stream) {
  if (stream == nullptr) {
    return absl::InvalidArgumentError(
        "WaitStaged: the simulated GPU has no default stream; pass a "
        "SimulatedStream*");
  }
  ASSIGN_OR_RETURN(const DeviceEvents events, EventsOf(device_uuid));
  StreamOf(stream)->WaitEvent(events.staged);
  return absl::OkStatus();
}

absl::Status SimulatedTrainerGpu::WaitStagedRecord(const std::string& device_uuid,
                                                   GpuStreamHandle stream, uint64_t record) {
  if (stream == nullptr) {
    return absl::InvalidArgumentError(
        "WaitStagedRecord: the simulated GPU has no default stream; pass a "
        "SimulatedStream*");
  }
  ASSIGN_OR_RETURN(const DeviceEvents events, EventsOf(device_uuid));
  StreamOf(stream)->WaitFor(events.staged, record);
  return absl::OkStatus();
}

absl::Status SimulatedTrainerGpu::SignalStaged(const std::string& device_uuid) {
  ASSIGN_OR_RETURN(const DeviceEvents events, EventsOf(device_uuid));
  events.staged->RecordCompleted();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> SimulatedTrainerGpu::ReserveRelay(const std::string& device_uuid) {
  ASSIGN_OR_RETURN(const DeviceEvents events, EventsOf(device_uuid));
  return events.relay->EnqueueRecord();
}

absl::Status SimulatedTrainerGpu::WaitRelay(const std::string& device_uuid,
                                            GpuStreamHandle stream, uint64_t record) {
  if (stream == nullptr) {
    return absl::InvalidArgumentError(
        "WaitRelay: the simulated GPU has no default stream; pass a SimulatedStream*");
  }
  ASSIGN_OR_RETURN(const DeviceEvents events, EventsOf(device_uuid));
  StreamOf(stream)->WaitFor(events.relay, record);
  return absl::OkStatus();
}

absl::Status SimulatedTrainerGpu::Relay(const std::string& device_uuid, uint64_t record,
                                        StagedWait after) {
  ASSIGN_OR_RETURN(const DeviceEvents events, EventsOf(device_uuid));
  return relay_order_.InOrder(device_uuid, record, [&] {
    switch (after.kind) {
      case StagedWait::Kind::kRecord:
        events.relay_stream->WaitFor(events.staged, after.staged_record);
        break;
      case StagedWait::Kind::kLatest:
        events.relay_stream->WaitEvent(events.staged);
        break;
      case StagedWait::Kind::kNone:
        break;
    }
    events.relay_stream->RecordReserved(events.relay, record);
    return absl::OkStatus();
  });
}

bool SimulatedTrainerGpu::CompleteRelay(const std::string& device_uuid, uint64_t record) {
  absl::StatusOr<DeviceEvents> events = EventsOf(device_uuid);
  // No events: none was reserved, so none is owed.
  return !events.ok() || events->relay->CompleteReserved(record);
}

}  // namespace ckpt
