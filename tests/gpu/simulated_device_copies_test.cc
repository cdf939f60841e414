// Tests of the simulated GPU's copies (SimulatedDevice's CopyToHost and
// CopyToDevice): host memory must lie inside one registered chunk, host
// registration refuses overlaps and unknown memory, device memory must lie
// inside a live mapping, and injected copy faults come back from the
// enqueue or, sticky, from later fences. The trainer runs in this process
// and the daemon takes its fds with dup.
#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gpu/simulated_device.h"
#include "gpu/simulated_device_fixtures.h"
#include "gpu/simulated_test_support.h"

namespace ckpt {
namespace {

using ::ckpt::testing::CopyOut;
using ::ckpt::testing::InProcess;
using ::ckpt::testing::kPatience;
using ::ckpt::testing::RegisteredBuffer;

TEST_CASE(
    "Copies whose host memory is not inside one registered chunk fail with "
    "FailedPrecondition",
    "[gpu]") {
  InProcess gpu;
  auto mapping = gpu.Map(gpu.region.pieces);
  REQUIRE(mapping.ok());
  auto stream = gpu.device.CreateStream(0);
  REQUIRE(stream.ok());
  const uint64_t device = (*mapping)->address();
  std::vector<char> host(8192);

  const GpuCopy unregistered{device, host.data(), 4096};
  CHECK((*stream)->CopyToHost({&unregistered, 1}).code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK((*stream)->CopyToDevice({&unregistered, 1}).code() ==
        absl::StatusCode::kFailedPrecondition);

  REQUIRE(gpu.device.RegisterHostMemory(host.data(), 8192, 4096).ok());
  const GpuCopy inside{device, host.data() + 4096, 4096};
  CHECK((*stream)->CopyToHost({&inside, 1}).ok());
  const GpuCopy straddling{device, host.data() + 100, 4096};  // two chunks
  CHECK((*stream)->CopyToHost({&straddling, 1}).code() ==
        absl::StatusCode::kFailedPrecondition);
  auto fence = (*stream)->Fence();
  REQUIRE(fence.ok());
  CHECK((*fence)->Wait(kPatience).ok());  // refused copies leave no error

  REQUIRE(gpu.device.UnregisterHostMemory(host.data(), 8192, 4096).ok());
  CHECK((*stream)->CopyToHost({&inside, 1}).code() ==
        absl::StatusCode::kFailedPrecondition);
}

TEST_CASE(
    "Registering host memory twice or unregistering unknown memory is "
    "refused",
    "[gpu]") {
  SimulatedDevice device;
  std::vector<char> host(8192);
  REQUIRE(device.RegisterHostMemory(host.data(), 8192, 4096).ok());
  CHECK(device.RegisterHostMemory(host.data() + 4000, 100, 4096).code() ==
        absl::StatusCode::kAlreadyExists);
  CHECK(device.UnregisterHostMemory(host.data(), 8192, 8192).code() ==
        absl::StatusCode::kFailedPrecondition);  // not the chunks registered
  REQUIRE(device.UnregisterHostMemory(host.data(), 8192, 4096).ok());
  CHECK(device.UnregisterHostMemory(host.data(), 8192, 4096).code() ==
        absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("A copy of device memory outside every live mapping is refused",
          "[gpu]") {
  InProcess gpu;
  auto mapping = gpu.Map(gpu.region.pieces);
  REQUIRE(mapping.ok());
  auto stream = gpu.device.CreateStream(0);
  REQUIRE(stream.ok());
  RegisteredBuffer host(gpu.device, 4096);
  const uint64_t end = (*mapping)->address() + (*mapping)->length();
  const GpuCopy past_end{end - 100, host.data(), 200};
  CHECK((*stream)->CopyToHost({&past_end, 1}).code() ==
        absl::StatusCode::kInvalidArgument);
  const uint64_t address = (*mapping)->address();
  mapping->reset();
  const GpuCopy unmapped{address, host.data(), 100};
  CHECK((*stream)->CopyToHost({&unmapped, 1}).code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE(
    "A copy fault injected on enqueue is returned, one injected on "
    "completion is reported by later fences",
    "[gpu]") {
  InProcess gpu;
  auto mapping = gpu.Map(gpu.region.pieces);
  REQUIRE(mapping.ok());
  auto stream = gpu.device.CreateStream(0);
  REQUIRE(stream.ok());
  RegisteredBuffer host(gpu.device, 4096);
  const GpuCopy copy{(*mapping)->address(), host.data(), 4096};

  gpu.device.FailNextCopy(absl::DataLossError("injected on enqueue"));
  CHECK((*stream)->CopyToHost({&copy, 1}).code() ==
        absl::StatusCode::kDataLoss);
  CHECK(CopyOut(**stream, copy.device, copy.host, copy.length).ok());

  gpu.device.FailNextCopy(absl::DataLossError("injected on completion"),
                          CopyFault::kOnCompletion);
  REQUIRE((*stream)->CopyToDevice({&copy, 1}).ok());
  auto fence = (*stream)->Fence();
  REQUIRE(fence.ok());
  const absl::Status failed = (*fence)->Wait(kPatience);
  CHECK(failed.code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(failed.message()),
             Catch::Contains("injected on completion"));
  CHECK(CopyOut(**stream, copy.device, copy.host, copy.length).code() ==
        absl::StatusCode::kDataLoss);  // sticky
}

}  // namespace
}  // namespace ckpt
