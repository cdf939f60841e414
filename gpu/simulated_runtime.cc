#include "gpu/simulated_runtime.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <limits>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/log.h"
#include "common/sealed_memfd.h"
#include "common/status.h"

namespace ckpt {

namespace {
constexpr char kUuidPrefix[] = "ckpt-sim-gpu";  // 12 bytes + 4-byte ordinal
static_assert(sizeof(kUuidPrefix) - 1 + 4 == 16);
}  // namespace

std::string SimulatedDeviceUuid(int ordinal) {
  std::string uuid(kUuidPrefix);
  const uint32_t value = static_cast<uint32_t>(ordinal);
  for (int shift = 24; shift >= 0; shift -= 8) {
    uuid.push_back(static_cast<char>((value >> shift) & 0xff));
  }
  return uuid;
}

absl::StatusOr<int> SimulatedDeviceOrdinal(absl::string_view uuid,
                                           int device_count) {
  for (int i = 0; i < device_count; ++i) {
    if (uuid == SimulatedDeviceUuid(i)) return i;
  }
  return absl::NotFoundError(
      absl::StrCat("no simulated device has uuid of ", uuid.size(), " bytes '",
                   absl::CHexEscape(uuid), "' (", device_count, " devices)"));
}

uint64_t SimulatedPageSize() {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

absl::StatusOr<UniqueFd> CreateSimulatedAllocation(uint64_t bytes,
                                                   const char* name) {
  if (bytes == 0 || bytes % SimulatedPageSize() != 0 ||
      bytes > static_cast<uint64_t>(std::numeric_limits<off_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("a simulated allocation of ", bytes,
                     " bytes: the size must be a positive multiple of ",
                     SimulatedPageSize()));
  }
  return CreateSealedMemfd(name, bytes);
}

absl::Status CheckSimulatedAllocation(int fd, uint64_t bytes) {
  return CheckSealedMemfd(fd, bytes, "simulated device memory");
}

absl::StatusOr<char*> MapBackToBack(absl::Span<const int> fds,
                                    absl::Span<const uint64_t> sizes,
                                    uint64_t at) {
  if (fds.empty() || fds.size() != sizes.size()) {
    return absl::InvalidArgumentError("MapBackToBack: one size per fd");
  }
  uint64_t total = 0;
  for (uint64_t size : sizes) {
    if (size == 0 || size % SimulatedPageSize() != 0 ||
        size > std::numeric_limits<uint64_t>::max() / 2 - total) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot map an allocation of ", size, " bytes"));
    }
    total += size;
  }
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  if (at != 0) flags |= MAP_FIXED_NOREPLACE;
  void* want = reinterpret_cast<void*>(at);
  void* base = ::mmap(want, total, PROT_NONE, flags, -1, 0);
  if (base == MAP_FAILED) {
    return ErrnoToStatus(
        errno, absl::StrCat("reserving ", total, " bytes of address space"));
  }
  if (at != 0 && base != want) {  // a kernel without MAP_FIXED_NOREPLACE
    ::munmap(base, total);
    return absl::AlreadyExistsError(
        absl::StrCat("address 0x", absl::Hex(at), " is taken"));
  }
  char* cursor = static_cast<char*>(base);
  for (size_t i = 0; i < fds.size(); ++i) {
    if (::mmap(cursor, sizes[i], PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
               fds[i], 0) == MAP_FAILED) {
      const int err = errno;
      if (::munmap(base, total) != 0) {
        LogError(ErrnoToStatus(errno, "munmap after a failed map").message());
      }
      return ErrnoToStatus(
          err, absl::StrCat("mapping allocation ", i, " (fd ", fds[i], ")"));
    }
    cursor += sizes[i];
  }
  return static_cast<char*>(base);
}

namespace {

// The counters live in memory another process maps: they must be atomic
// without a lock (a lock would live in one process's memory only).
static_assert(std::atomic_ref<uint64_t>::is_always_lock_free,
              "interprocess events need lock-free 64-bit atomics");

absl::StatusOr<uint64_t*> MapEventPage(int fd) {
  const int fds[] = {fd};
  const uint64_t sizes[] = {SimulatedPageSize()};
  ASSIGN_OR_RETURN(char* page, MapBackToBack(fds, sizes));
  return reinterpret_cast<uint64_t*>(page);
}

}  // namespace

absl::StatusOr<std::shared_ptr<SimulatedEvent>> SimulatedEvent::Create() {
  absl::StatusOr<UniqueFd> fd =
      CreateSimulatedAllocation(SimulatedPageSize(), "ckpt-sim-event");
  if (!fd.ok()) return Annotate(fd.status(), "creating an event page");
  absl::StatusOr<uint64_t*> page = MapEventPage(fd->get());
  if (!page.ok()) return Annotate(page.status(), "mapping a new event page");
  // A new memfd reads as zeros: never recorded, nothing completed.
  return std::shared_ptr<SimulatedEvent>(
      new SimulatedEvent(*std::move(fd), *page));
}

absl::StatusOr<std::shared_ptr<SimulatedEvent>> SimulatedEvent::Open(
    UniqueFd fd) {
  absl::Status checked =
      CheckSimulatedAllocation(fd.get(), SimulatedPageSize());
  if (!checked.ok()) return Annotate(checked, "opening an event page");
  absl::StatusOr<uint64_t*> page = MapEventPage(fd.get());
  if (!page.ok()) return Annotate(page.status(), "mapping an event page");
  return std::shared_ptr<SimulatedEvent>(
      new SimulatedEvent(std::move(fd), *page));
}

SimulatedEvent::SimulatedEvent(UniqueFd fd, uint64_t* page)
    : fd_(std::move(fd)), page_(page) {}

SimulatedEvent::~SimulatedEvent() {
  if (::munmap(page_, SimulatedPageSize()) != 0) {
    LogError(ErrnoToStatus(errno, "munmap of an event page").message());
  }
}

uint64_t SimulatedEvent::recorded() const {
  return std::atomic_ref<uint64_t>(page_[0]).load(std::memory_order_acquire);
}

uint64_t SimulatedEvent::completed() const {
  return std::atomic_ref<uint64_t>(page_[1]).load(std::memory_order_acquire);
}

uint64_t SimulatedEvent::EnqueueRecord() {
  return std::atomic_ref<uint64_t>(page_[0]).fetch_add(
             1, std::memory_order_acq_rel) +
         1;
}

void SimulatedEvent::RecordCompleted() { Complete(EnqueueRecord()); }

bool SimulatedEvent::CompleteReserved(uint64_t target) {
  std::atomic_ref<uint64_t> completed(page_[1]);
  uint64_t now = completed.load(std::memory_order_acquire);
  for (;;) {
    if (now >= target) return true;
    if (now + 1 < target) return false;  // the record before is not reached
    if (completed.compare_exchange_weak(now, target, std::memory_order_release,
                                        std::memory_order_acquire)) {
      return true;
    }
  }
}

void SimulatedEvent::Complete(uint64_t target) {
  // A maximum, not a plain store: records on two streams may be reached out
  // of order, and `completed` must never go back.
  std::atomic_ref<uint64_t> completed(page_[1]);
  uint64_t now = completed.load(std::memory_order_acquire);
  while (now < target && !completed.compare_exchange_weak(
                             now, target, std::memory_order_release,
                             std::memory_order_acquire)) {
  }
}

SimulatedStream::SimulatedStream(std::function<bool()> halted)
    : halted_(std::move(halted)), worker_([this] { Run(); }) {}

SimulatedStream::~SimulatedStream() {
  {
    absl::MutexLock lock(&mu_);
    stopping_.store(true, std::memory_order_release);
  }
  worker_.join();
}

void SimulatedStream::Enqueue(std::function<void()> work) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(work));
}

void SimulatedStream::Synchronize() {
  absl::Notification done;
  Enqueue([&done] { done.Notify(); });
  done.WaitForNotification();
}

void SimulatedStream::RecordEvent(std::shared_ptr<SimulatedEvent> event,
                                  bool after_previous) {
  const uint64_t target = event->EnqueueRecord();
  Record(std::move(event), target, after_previous);
}

void SimulatedStream::RecordReserved(std::shared_ptr<SimulatedEvent> event,
                                     uint64_t target) {
  Record(std::move(event), target, /*after_previous=*/true);
}

void SimulatedStream::Record(std::shared_ptr<SimulatedEvent> event, uint64_t target,
                             bool after_previous) {
  Enqueue([this, event = std::move(event), target, after_previous] {
    while (after_previous && !event->Covers(target - 1)) {
      if (GivesUp()) return;
      absl::SleepFor(kSimulatedEventPollInterval);
    }
    event->Complete(target);
  });
}

void SimulatedStream::WaitEvent(std::shared_ptr<SimulatedEvent> event) {
  const uint64_t target = event->recorded();
  WaitFor(std::move(event), target);
}

void SimulatedStream::WaitFor(std::shared_ptr<SimulatedEvent> event, uint64_t target) {
  Enqueue([this, event = std::move(event), target] {
    while (!event->Covers(target)) {
      if (GivesUp()) return;
      absl::SleepFor(kSimulatedEventPollInterval);
    }
  });
}

bool SimulatedStream::GivesUp() {
  if (stopping_.load(std::memory_order_acquire) || (halted_ && halted_())) {
    abandoned_ = true;
  }
  return abandoned_;
}

bool SimulatedStream::HasWorkOrStopping() const {
  return !queue_.empty() || stopping_.load(std::memory_order_acquire);
}

void SimulatedStream::Run() {
  for (;;) {
    std::function<void()> work;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &SimulatedStream::HasWorkOrStopping));
      if (queue_.empty()) return;  // stopping, and nothing left
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    // Dropped work is destroyed here, outside mu_: its captures may signal
    // others (a fence that will never be reached reports Aborted).
    if (!abandoned_ && halted_ && halted_()) abandoned_ = true;
    if (!abandoned_) work();
  }
}

}  // namespace ckpt
