// ckpt-gpu-trainer: a trainer process for the GPU-path tests that must kill
// their trainer. It connects as rank 0 of a one-rank job, puts `bytes` of
// pattern into device memory (simulated or CUDA), holds its stream busy for
// `delay_ms`, calls Save (so the daemon's copies wait on the GPU for the
// stream), prints "saved", and waits to be killed.
//
//   ckpt-gpu-trainer SOCKET KIND JOB CHECKPOINT BYTES DELAY_MS
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "bench/pattern.h"
#include "client/ckpt_client.h"
#include "integration/test_gpu.h"

namespace {

int Fail(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "ckpt-gpu-trainer: %s: %s\n", what.c_str(),
               status.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t bytes = 0, delay_ms = 0;
  if (argc != 7 || !absl::SimpleAtoi(argv[5], &bytes) ||
      !absl::SimpleAtoi(argv[6], &delay_ms) || bytes % 8 != 0) {
    std::fprintf(stderr, "usage: ckpt-gpu-trainer SOCKET KIND JOB CHECKPOINT BYTES DELAY_MS\n");
    return 2;
  }
  auto gpu = ckpt::testing::MakeTestGpu(argv[2]);
  if (!gpu.ok()) return Fail("device", gpu.status());
  auto client = ckpt::Client::Connect({.socket = argv[1], .job = argv[3], .rank = 0,
                                       .world_size = 1, .gpu = (*gpu)->trainer()});
  if (!client.ok()) return Fail("connect", client.status());
  auto device = (*gpu)->Allocate(bytes);
  if (!device.ok()) return Fail("allocate", device.status());
  std::vector<uint64_t> host(bytes / 8);
  ckpt::FillPattern(host.data(), host.size(), ckpt::PatternSeed(0, 1));
  if (auto s = (*gpu)->Upload(*device, host.data(), bytes); !s.ok()) return Fail("upload", s);
  if (auto s = (*gpu)->Synchronize(absl::Minutes(1)); !s.ok()) return Fail("sync", s);
  auto region = (*client)->RegisterGpuRegion(*device, bytes);
  if (!region.ok()) return Fail("register", region.status());
  ckpt::v1::SaveRequest request;
  request.set_job(argv[3]);
  request.set_checkpoint(argv[4]);
  ckpt::v1::TensorItem* item = request.add_tensors();
  item->set_fqn("weights");
  item->set_dtype(ckpt::v1::DTYPE_U8);
  item->add_global_shape(bytes);
  item->add_offsets(0);
  item->add_local_shape(bytes);
  item->mutable_memory()->set_region_id(*region);
  item->mutable_memory()->set_length(bytes);
  if (auto s = (*gpu)->Delay(absl::Milliseconds(delay_ms)); !s.ok()) return Fail("delay", s);
  auto save = (*client)->Save(request, (*gpu)->stream());
  if (!save.ok()) return Fail("save", save.status());
  std::printf("saved\n");
  std::fflush(stdout);
  ::pause();
  return 0;
}
