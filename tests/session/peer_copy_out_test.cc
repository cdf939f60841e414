// PeerCopyOut's region lookups on the simulated device, in this process: a
// save's spans mostly lie in the region of the span before, which the batch
// reuses without asking GpuRegions again, but never once that region was
// released or replaced (invariant 13: a save never reads an allocation the
// trainer freed or replaced).
#include "session/peer_copy_out.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "gpu/simulated_test_support.h"
#include "session/gpu_regions_fixture.h"

namespace ckpt {
namespace {

using ::ckpt::testing::Bytes;
using ::ckpt::testing::Mismatch;
using ::ckpt::testing::Pattern;
using ::ckpt::testing::GpuRegionsFixture;
using ::ckpt::testing::kRegionBytes;
using ::ckpt::testing::kSpan;

// This process stands for the trainer.
struct Fixture : GpuRegionsFixture {
  UniqueFd self{static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0))};
  std::unique_ptr<PeerCopyOut> Batch() {
    REQUIRE(self.valid());
    return std::make_unique<PeerCopyOut>(/*host=*/nullptr, regions.get(), self.get(),
                                         ::getpid(), /*staged=*/nullptr);
  }
};

// Enqueues `spans`, records the staged events and waits for the copies.
void CopyAll(PeerCopyOut& batch, const std::vector<CopySpan>& spans) {
  absl::StatusOr<uint64_t> ticket = batch.Enqueue(spans);
  INFO(ticket.status().ToString());
  REQUIRE(ticket.ok());
  const absl::Status enqueued = batch.AllEnqueued();
  INFO(enqueued.ToString());
  REQUIRE(enqueued.ok());
  const absl::Status waited = batch.Wait(*ticket);
  INFO(waited.ToString());
  REQUIRE(waited.ok());
}

TEST_CASE("spans alternating between two regions are each copied from their own",
          "[gpu][session]") {
  Fixture f;
  const std::string a_bytes = Pattern(kRegionBytes, 1);
  const std::string b_bytes = Pattern(kRegionBytes, 2);
  const uint64_t a = f.Allocate(a_bytes);
  const uint64_t b = f.Allocate(b_bytes);
  f.Register(1, a);
  f.Register(2, b);
  f.RecordReady();
  StagingLease lease = f.Buffer();
  char* out = lease.data();
  // a, a (the region of the span before), b, a again.
  const std::vector<CopySpan> spans = {{a, out, kSpan},
                                       {a + 5 * kSpan, out + kSpan, kSpan},
                                       {b + 2 * kSpan, out + 2 * kSpan, kSpan},
                                       {a + 9 * kSpan, out + 3 * kSpan, kSpan}};
  std::unique_ptr<PeerCopyOut> batch = f.Batch();
  CopyAll(*batch, spans);
  const std::string expected = a_bytes.substr(0, kSpan) + a_bytes.substr(5 * kSpan, kSpan) +
                               b_bytes.substr(2 * kSpan, kSpan) +
                               a_bytes.substr(9 * kSpan, kSpan);
  CHECK(Mismatch(std::string(out, 4 * kSpan), expected).empty());
}

TEST_CASE("a save's later span is refused when it runs past the end of the region "
          "of the span before, or when that region was released meanwhile",
          "[gpu][session]") {
  Fixture f;
  const uint64_t a = f.Allocate(Pattern(kRegionBytes, 1));
  f.Register(1, a);
  f.RecordReady();
  StagingLease lease = f.Buffer();
  char* out = lease.data();
  std::unique_ptr<PeerCopyOut> batch = f.Batch();
  REQUIRE(batch->Enqueue(std::vector<CopySpan>{{a, out, kSpan}}).ok());
  SECTION("past the end") {
    absl::StatusOr<uint64_t> past = batch->Enqueue(
        std::vector<CopySpan>{{a + kRegionBytes - kSpan, out, 2 * kSpan}});
    CHECK(past.status().code() == absl::StatusCode::kOutOfRange);
  }
  SECTION("released") {
    f.regions->Release(1);
    absl::StatusOr<uint64_t> after = batch->Enqueue(
        std::vector<CopySpan>{{a + kSpan, out + kSpan, kSpan}});
    CHECK(after.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(after.status().message().find("released region") != absl::string_view::npos);
  }
  CHECK(batch->Drain().ok());
}

TEST_CASE("after the trainer re-allocates a region's memory at the same address and "
          "registers it again, a save's later spans read the new allocation",
          "[gpu][session]") {
  Fixture f;
  const std::string old_bytes = Pattern(kRegionBytes, 1);
  const std::string new_bytes = Pattern(kRegionBytes, 2);
  const uint64_t a = f.Allocate(old_bytes);
  f.Register(1, a);
  f.RecordReady();
  StagingLease lease = f.Buffer();
  char* out = lease.data();
  std::unique_ptr<PeerCopyOut> batch = f.Batch();
  absl::StatusOr<uint64_t> first =
      batch->Enqueue(std::vector<CopySpan>{{a, out, kSpan}});
  REQUIRE(first.ok());
  // Freed and allocated again at the same address; the new registration
  // replaces region 1 (GpuRegions::Add releases what it overlaps).
  const absl::Status reallocated = f.trainer.Reallocate(a);
  INFO(reallocated.ToString());
  REQUIRE(reallocated.ok());
  std::memcpy(ckpt::testing::At(a), new_bytes.data(), kRegionBytes);
  f.Register(2, a);
  f.RecordReady();
  CopyAll(*batch, {{a + kSpan, out + kSpan, kSpan}});
  // The first span came from the old allocation, which the batch kept
  // mapped until its copy ran; the second from the new one.
  CHECK(Mismatch(std::string(out, kSpan), old_bytes.substr(0, kSpan)).empty());
  CHECK(Mismatch(std::string(out + kSpan, kSpan), new_bytes.substr(kSpan, kSpan)).empty());
}

}  // namespace
}  // namespace ckpt
