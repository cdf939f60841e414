// Test support for the GPU-path integration tests: what the daemon maps,
// asked over its status RPC and read from /proc, and the choice of device.
#pragma once

#include <sys/types.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/ckpt_client.h"
#include "integration/test_gpu.h"
#include "support/skip.h"

namespace ckpt::testing {

inline constexpr uint64_t kTensorBytes = 1 << 20;

inline v1::DaemonStatusResponse Status(const std::string& socket) {
  auto stub = v1::Ckptd::NewStub(DaemonChannel(socket));
  grpc::ClientContext context;
  v1::DaemonStatusResponse response;
  REQUIRE(stub->DaemonStatus(&context, v1::DaemonStatusRequest(), &response).ok());
  return response;
}

// Polls until the daemon maps `regions` GPU regions (or 10 s pass).
inline uint32_t AwaitGpuRegions(const std::string& socket, uint32_t regions) {
  uint32_t now = 0;
  for (int i = 0; i < 500; ++i) {
    now = Status(socket).gpu_regions();
    if (now == regions) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return now;
}

// Mappings of simulated device memory in process `pid` (its memfds are
// named "ckpt-sim-"); -1 where /proc cannot tell.
inline int SimulatedMappings(pid_t pid) {
  std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
  if (!maps) return -1;
  int n = 0;
  for (std::string line; std::getline(maps, line);) {
    if (absl::StrContains(line, "ckpt-sim-alloc")) ++n;
  }
  return n;
}

inline std::unique_ptr<TestGpu> GpuOrSkip(const std::string& kind) {
  auto gpu = MakeTestGpu(kind);
  if (!gpu.ok()) {
    WARN("skipped: the " << kind << " device: " << gpu.status().ToString());
    ::ckpt::testing::SkipRequested() = true;
    return nullptr;
  }
  return *std::move(gpu);
}

inline std::vector<std::string> GpuFlags(const std::string& kind,
                                  std::vector<std::string> more = {}) {
  more.push_back(absl::StrCat("--gpu=", kind));
  return more;
}

}  // namespace ckpt::testing
