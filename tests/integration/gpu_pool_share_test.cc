// A trainer whose stream does not get to its save's ready event (a step
// hung in a collective, or a client that never completes its event) holds
// at most its session's share of the staging pool (--gpu_pool_share_percent,
// 50% by default): another job's save stages and commits meanwhile, and
// `ckptctl status` names the session holding the buffers. (At the copy
// timeout the stuck trainer loses its save and the pool gets the buffers
// back: gpu_path_test.cc.)
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/ckpt_client.h"
#include "integration/daemon_fixture.h"
#include "integration/gpu_daemon_probe.h"
#include "integration/gpu_test_rank.h"
#include "integration/test_gpu.h"

namespace ckpt::testing {
namespace {

// Kills a trainer that waits to be killed, on every path out of a test (a
// failed REQUIRE included), before its BackgroundProcess waits for it.
class KillAtEnd {
 public:
  explicit KillAtEnd(const BackgroundProcess& process) : pid_(process.pid()) {}
  ~KillAtEnd() { ::kill(pid_, SIGKILL); }
  KillAtEnd(const KillAtEnd&) = delete;
  KillAtEnd& operator=(const KillAtEnd&) = delete;

 private:
  const pid_t pid_;
};

// The fixture's pool: 16 buffers of 4 MiB.
constexpr uint64_t kPoolBytes = 64 << 20;
constexpr uint64_t kBufferBytes = 4 << 20;

TEST_CASE("a trainer whose stream never reaches its ready event holds at most "
          "its share of the staging pool, another job saves meanwhile, and "
          "ckptctl status names the holder",
          "[integration][gpu][cuda][pool_share]") {
  const std::string kind = GENERATE(as<std::string>{}, "simulated", "cuda");
  std::unique_ptr<TestGpu> probe = GpuOrSkip(kind);
  if (probe == nullptr) return;
  probe.reset();
  DaemonProcess daemon(GpuFlags(kind, {"--gpu_copy_timeout_ms=30000"}));
  REQUIRE(Status(daemon.socket()).staging_pool_bytes() == kPoolBytes);
  // 96 MiB, more than the whole pool, behind a stream busy for a minute.
  BackgroundProcess hog({GPU_TRAINER_BINARY, daemon.socket(), kind, "hog", "step-1",
                         std::to_string(96 << 20), "60000"});
  KillAtEnd kill_hog(hog);
  v1::DaemonStatusResponse held;
  for (int i = 0; i < 500; ++i) {
    held = Status(daemon.socket());
    if (held.staging_pool_holders_size() == 1 &&
        held.staging_pool_holders(0).buffers() == held.staging_pool_holders(0).limit_buffers()) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE(held.staging_pool_holders_size() == 1);
  const v1::StagingPoolHolder& holder = held.staging_pool_holders(0);
  CHECK(holder.job() == "hog");
  CHECK(holder.pid() == static_cast<uint32_t>(hog.pid()));
  CHECK(holder.limit_buffers() == kPoolBytes / kBufferBytes / 2);
  CHECK(holder.buffers() == holder.limit_buffers());
  // Never more than the share, however long the stream stays stuck.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  held = Status(daemon.socket());
  CHECK(held.staging_pool_free_bytes() >= kPoolBytes / 2);
  const ProcessResult status = RunProcess({CKPTCTL_BINARY, "--socket", daemon.socket(), "status"});
  INFO(status.out);
  CHECK(status.out.find(absl::StrCat("(job hog rank 0 pid ", hog.pid(), "): 8 staging buffers")) !=
        std::string::npos);

  // Another job's save stages from the rest of the pool and commits while
  // the hog still waits.
  std::unique_ptr<TestGpu> gpu = GpuOrSkip(kind);
  REQUIRE(gpu != nullptr);
  {
    GpuTestRank rank(gpu.get(), daemon.socket(), "other", 1, 8, kTensorBytes);
    rank.Upload(1);
    const auto start = std::chrono::steady_clock::now();
    auto save = rank.client().Save(rank.SaveRequestFor("step-1"), gpu->stream());
    REQUIRE(save.ok());
    CHECK((*save)->WaitCommitted().ok());
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  }
  CHECK(Status(daemon.socket()).saves_size() == 1);  // the hog's, still waiting
}

}  // namespace
}  // namespace ckpt::testing
