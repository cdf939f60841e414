// GpuRegions::Copy, the restore's synchronous copies, on the simulated
// device: copies that do not end within the copy timeout fail the call
// with an error that says their host memory may still be read, and they
// still run against a mapping that was kept (never unmapped under them).
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/status.h"
#include "gpu/simulated_device.h"
#include "gpu/simulated_test_support.h"
#include "session/gpu_regions_fixture.h"

namespace ckpt {
namespace {

using ::ckpt::testing::At;
using ::ckpt::testing::GpuRegionsFixture;
using ::ckpt::testing::kRegionBytes;
using ::ckpt::testing::kSpan;
using ::ckpt::testing::Pattern;

TEST_CASE("a copy into GPU memory that does not end in time fails saying its "
          "host memory may still be read, and lands later in a mapping kept for it",
          "[gpu][session]") {
  GpuRegionsFixture f(/*copy_timeout=*/absl::Milliseconds(100));
  const uint64_t a = f.Allocate(Pattern(kRegionBytes, 1));
  f.Register(1, a);
  StagingLease lease = f.Buffer();
  const std::string restored = Pattern(kSpan, 3);
  std::memcpy(lease.data(), restored.data(), kSpan);
  const std::vector<CopySpan> spans = {{a, lease.data(), kSpan}};

  auto* device = static_cast<SimulatedDevice*>(f.backend->device());
  device->StallNextCopy(absl::Seconds(1));
  const absl::Status late = f.regions->Copy(spans, /*to_host=*/false);
  INFO(late.ToString());
  CHECK(absl::IsDeadlineExceeded(late));
  CHECK(HostMemoryInUse(late));
  // The region is released (the session ends): its mapping stays for the
  // copy still queued, which lands instead of faulting.
  f.regions->Release(1);
  for (const absl::Time end = absl::Now() + absl::Seconds(10);
       std::memcmp(At(a), restored.data(), kSpan) != 0 && absl::Now() < end;) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  CHECK(std::memcmp(At(a), restored.data(), kSpan) == 0);

  // A copy that ends in time is not marked.
  f.Register(2, a);
  const absl::Status in_time = f.regions->Copy(spans, /*to_host=*/true);
  CHECK(in_time.ok());
  CHECK_FALSE(HostMemoryInUse(in_time));
}

}  // namespace
}  // namespace ckpt
