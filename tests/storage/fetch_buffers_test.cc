// The remote tier's fetch memory (storage/fetch_buffers.h): one budget for
// the images in use and the spare mappings kept for reuse; a dropped
// image's mapping (and its pages) is what the next fetch that fits gets.
#include "storage/fetch_buffers.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "absl/time/clock.h"

namespace ckpt {
namespace {

constexpr uint64_t kMiB = 1 << 20;

std::shared_ptr<FileImage> MustTake(FetchBuffers& buffers, uint64_t size) {
  absl::StatusOr<std::shared_ptr<FileImage>> image =
      buffers.Take(size, /*wait=*/false, absl::InfiniteFuture());
  REQUIRE(image.ok());
  REQUIRE(*image != nullptr);
  REQUIRE((*image)->size() == size);
  return *std::move(image);
}

// Whether every page of [data, data + size) is in memory (mincore).
bool AllResident(const char* data, uint64_t size) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in_core((size + page - 1) / page);
  REQUIRE(::mincore(const_cast<char*>(data), size, in_core.data()) == 0);
  for (unsigned char c : in_core) {
    if ((c & 1) == 0) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("resident fetch windows are faulted in before a fetch gets one, stay through Trim, "
          "and stop at the budget or when told",
          "[fetch_buffers]") {
  auto buffers = std::make_shared<FetchBuffers>(8 * kMiB);
  std::atomic<bool> stop{false};
  // 10 MiB asked in 3 MiB windows, within an 8 MiB budget: two windows.
  CHECK(buffers->MakeResident(10 * kMiB, 3 * kMiB, stop) == 6 * kMiB);
  CHECK(buffers->HeldAndSpare() == std::pair<uint64_t, uint64_t>(0, 6 * kMiB));
  std::shared_ptr<FileImage> window = MustTake(*buffers, 3 * kMiB);
  CHECK(window->capacity() == 3 * kMiB);
  CHECK(AllResident(window->data(), window->capacity()));
  // A window larger than the budget's rest: the other resident spare goes
  // to make room, as any spare does.
  std::shared_ptr<FileImage> large = MustTake(*buffers, 5 * kMiB);
  CHECK(buffers->HeldAndSpare() == std::pair<uint64_t, uint64_t>(8 * kMiB, 0));
  window.reset();
  large.reset();
  // Trim keeps the resident bytes' worth of spares (the smaller ones),
  // and unmaps the rest.
  buffers->Trim();
  CHECK(buffers->HeldAndSpare() == std::pair<uint64_t, uint64_t>(0, 3 * kMiB));
  // Told to stop: no more windows.
  auto stopped = std::make_shared<FetchBuffers>(8 * kMiB);
  stop = true;
  CHECK(stopped->MakeResident(8 * kMiB, 2 * kMiB, stop) == 0);
  CHECK(stopped->HeldAndSpare() == std::pair<uint64_t, uint64_t>(0, 0));
}

TEST_CASE("a dropped fetch image's mapping, pages and all, is the next fetch's that it holds",
          "[fetch_buffers]") {
  auto buffers = std::make_shared<FetchBuffers>(8 * kMiB);
  std::shared_ptr<FileImage> first = MustTake(*buffers, 4 * kMiB);
  char* const mapping = first->data();
  std::memset(mapping, 0x5a, 4 * kMiB);
  first.reset();
  CHECK(buffers->HeldAndSpare() == std::pair<uint64_t, uint64_t>(0, 4 * kMiB));
  // A smaller window gets the same mapping; its bytes are still there (no
  // zeroing by the kernel: the point of keeping it).
  std::shared_ptr<FileImage> second = MustTake(*buffers, 3 * kMiB);
  CHECK(second->data() == mapping);
  CHECK(second->size() == 3 * kMiB);
  CHECK(second->capacity() == 4 * kMiB);
  CHECK(second->data()[4 * kMiB - 1] == 0x5a);
  CHECK(buffers->HeldAndSpare() == std::pair<uint64_t, uint64_t>(4 * kMiB, 0));
  // A larger one than any spare is a new mapping.
  std::shared_ptr<FileImage> third = MustTake(*buffers, 4 * kMiB);
  CHECK(third->data() != mapping);
  // A window a little larger than the only spare gets the spare grown: its
  // pages (and bytes) kept, the new tail fresh.
  second.reset();
  third.reset();
  buffers->Trim();
  std::shared_ptr<FileImage> small = MustTake(*buffers, 2 * kMiB);
  std::memset(small->data(), 0x33, 2 * kMiB);
  small.reset();
  std::shared_ptr<FileImage> grown = MustTake(*buffers, 2 * kMiB + 4096);
  CHECK(grown->capacity() == 2 * kMiB + 4096);
  CHECK(grown->data()[0] == 0x33);
  CHECK(grown->data()[2 * kMiB - 1] == 0x33);
  CHECK(grown->data()[2 * kMiB] == 0);
  CHECK(buffers->HeldAndSpare() == std::pair<uint64_t, uint64_t>(2 * kMiB + 4096, 0));
}

TEST_CASE("fetch images and spares share one budget: a fetch no spare holds unmaps spares to fit, "
          "and one with no room waits or is refused at once",
          "[fetch_buffers]") {
  auto buffers = std::make_shared<FetchBuffers>(8 * kMiB);
  std::shared_ptr<FileImage> a = MustTake(*buffers, 3 * kMiB);
  std::shared_ptr<FileImage> b = MustTake(*buffers, 5 * kMiB);
  a.reset();
  b.reset();
  CHECK(buffers->HeldAndSpare() == std::pair<uint64_t, uint64_t>(0, 8 * kMiB));
  // 6 MiB: no spare holds it; the larger one is grown to 6 MiB, and the
  // other goes: 6 + 3 > 8.
  std::shared_ptr<FileImage> big = MustTake(*buffers, 6 * kMiB);
  CHECK(buffers->HeldAndSpare() == std::pair<uint64_t, uint64_t>(6 * kMiB, 0));
  // No room for 4 MiB now: refused at once without waiting, or waited
  // for until the deadline.
  absl::StatusOr<std::shared_ptr<FileImage>> now = buffers->Take(4 * kMiB, false,
                                                                 absl::InfiniteFuture());
  REQUIRE(now.ok());
  CHECK(*now == nullptr);
  absl::StatusOr<std::shared_ptr<FileImage>> late =
      buffers->Take(4 * kMiB, true, absl::Now() + absl::Milliseconds(50));
  CHECK(absl::IsDeadlineExceeded(late.status()));
  // A waiter gets its memory once the holder drops it.
  std::thread dropper([&] {
    absl::SleepFor(absl::Milliseconds(50));
    big.reset();
  });
  absl::StatusOr<std::shared_ptr<FileImage>> waited =
      buffers->Take(4 * kMiB, true, absl::Now() + absl::Seconds(10));
  dropper.join();
  REQUIRE(waited.ok());
  CHECK(*waited != nullptr);
  CHECK(absl::IsResourceExhausted(buffers->Take(9 * kMiB, true, absl::Now()).status()));
}

TEST_CASE("Trim unmaps the spares once no fetch holds memory, and an image outlives its "
          "buffers' owner",
          "[fetch_buffers]") {
  auto buffers = std::make_shared<FetchBuffers>(8 * kMiB);
  std::shared_ptr<FileImage> held = MustTake(*buffers, 2 * kMiB);
  MustTake(*buffers, 2 * kMiB).reset();
  buffers->Trim();  // one image still in use: the spare stays
  CHECK(buffers->HeldAndSpare() == std::pair<uint64_t, uint64_t>(2 * kMiB, 2 * kMiB));
  held.reset();
  buffers->Trim();
  CHECK(buffers->HeldAndSpare() == std::pair<uint64_t, uint64_t>(0, 0));
  std::shared_ptr<FileImage> last = MustTake(*buffers, kMiB);
  buffers.reset();  // the image keeps them alive until it is dropped
  last->data()[0] = 1;
  last.reset();
}

}  // namespace ckpt
