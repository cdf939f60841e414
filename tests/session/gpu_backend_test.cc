// GpuBackend on the simulated device: memory tier images are pinned only
// once a GPU trainer made the backend prepare, and copies are cut where
// their host side crosses a registration chunk of what was pinned, and
// only there.
#include "session/gpu_backend.h"

#include <sys/mman.h>

#include <catch2/catch.hpp>
#include <memory>
#include <vector>

#include "io/staging_pool.h"

namespace ckpt {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

// Address space only (never touched): the simulated device records
// registrations without reading the memory.
class Reservation {
 public:
  explicit Reservation(uint64_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    REQUIRE(p != MAP_FAILED);
    data_ = static_cast<char*>(p);
  }
  ~Reservation() { munmap(data_, bytes_); }
  char* data() const { return data_; }

 private:
  char* data_ = nullptr;
  const uint64_t bytes_;
};

std::vector<uint64_t> Lengths(const std::vector<GpuCopy>& copies) {
  std::vector<uint64_t> lengths;
  for (const GpuCopy& c : copies) lengths.push_back(c.length);
  return lengths;
}

TEST_CASE("a GPU backend pins images only once prepared, and cuts copies at the "
          "chunks of what it pinned",
          "[gpu_backend]") {
  absl::StatusOr<std::unique_ptr<StagingPool>> pool = StagingPool::Create(2 << 20, 1 << 20);
  REQUIRE(pool.ok());
  absl::StatusOr<std::unique_ptr<GpuBackend>> backend =
      GpuBackend::Open("simulated", pool->get());
  REQUIRE(backend.ok());
  REQUIRE(GpuBackend::RegistrationChunk(1 << 20) == kGiB);

  // An image of 3 GiB with address space after it that nothing pinned.
  Reservation space(5 * kGiB);
  char* image = space.data();
  absl::StatusOr<bool> pinned = (*backend)->Pin(image, 3 * kGiB);
  REQUIRE(pinned.ok());
  CHECK_FALSE(*pinned);  // no GPU trainer yet
  REQUIRE((*backend)->Prepare().ok());
  pinned = (*backend)->Pin(image, 3 * kGiB);
  REQUIRE(pinned.ok());
  CHECK(*pinned);

  // Across the first chunk boundary of the image: two pieces, contiguous.
  std::vector<GpuCopy> copies = {{/*device=*/0x10000, image + kGiB - 4096, 3 * 4096}};
  (*backend)->SplitAtChunks(&copies);
  REQUIRE(Lengths(copies) == std::vector<uint64_t>{4096, 2 * 4096});
  CHECK(copies[1].host == image + kGiB);
  CHECK(copies[1].device == 0x10000 + 4096);

  // Past the image's end, where no registration is: left whole (the
  // driver stages it), not cut at chunk offsets of the image below it.
  copies = {{0x10000, image + 4 * kGiB - 4096, 2 * 4096}};
  (*backend)->SplitAtChunks(&copies);
  CHECK(Lengths(copies) == std::vector<uint64_t>{2 * 4096});

  (*backend)->Unpin(image, 3 * kGiB);
  copies = {{0x10000, image + kGiB - 4096, 2 * 4096}};
  (*backend)->SplitAtChunks(&copies);
  CHECK(Lengths(copies) == std::vector<uint64_t>{2 * 4096});
}

}  // namespace
}  // namespace ckpt
