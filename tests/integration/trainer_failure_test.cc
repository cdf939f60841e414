// Trainer processes that go away: after STAGED the checkpoint is the
// daemon's and must commit; before submitting, the checkpoint can never
// complete and must fail with a reason.
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <thread>

#include "absl/strings/match.h"
#include "integration/daemon_fixture.h"
#include "integration/test_rank.h"

namespace ckpt::testing {

TEST_CASE("a checkpoint whose trainer processes exit right after STAGED still "
          "commits and restores bit-exact",
          "[integration][trainer-failure]") {
  // Slow writes: the ranks are long gone when the last byte is written.
  DaemonProcess daemon({"--write_rate_limit", std::to_string(32 << 20)});
  const std::string bytes = std::to_string(48ull << 20);
  const ProcessResult save = RunProcess(
      {LOADGEN_BINARY, "--socket", daemon.socket(), "--job", "orphan", "--ranks",
       "2", "--tensors", "8", "--bytes-per-rank", bytes, "--exit-after-staged"});
  INFO(save.out);
  REQUIRE(save.exit_code == 0);
  CHECK_FALSE(std::filesystem::exists(daemon.root() +
                                      "/orphan/step-00000001/COMMIT"));
  bool committed = false;
  for (int i = 0; i < 300 && !committed; ++i) {
    committed = std::filesystem::exists(daemon.root() + "/orphan/step-00000001/COMMIT");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  REQUIRE(committed);
  const ProcessResult restore = RunProcess(
      {LOADGEN_BINARY, "--socket", daemon.socket(), "--job", "orphan", "--ranks",
       "2", "--tensors", "8", "--bytes-per-rank", bytes, "--saves", "0",
       "--first-step", "2", "--restore"});
  INFO(restore.out);
  CHECK(restore.exit_code == 0);
  CHECK(JsonField(restore.out, "verified") == "true");
}

TEST_CASE("a rank that disconnects before submitting its part fails the "
          "checkpoint with a reason and leaves nothing behind",
          "[integration][trainer-failure]") {
  DaemonProcess daemon;
  auto rank0 = Client::Connect(
      {.socket = daemon.socket(), .job = "job", .rank = 0, .world_size = 2});
  auto rank1 = Client::Connect(
      {.socket = daemon.socket(), .job = "job", .rank = 1, .world_size = 2});
  REQUIRE(rank0.ok());
  REQUIRE(rank1.ok());
  std::vector<char> state(1 << 20, 'x');
  v1::SaveRequest request;
  request.set_job("job");
  request.set_checkpoint("step-1");
  v1::ByteItem* item = request.add_byte_items();
  item->set_fqn("state");
  item->set_data(std::string(state.begin(), state.end()));
  auto save = (*rank0)->Save(request);
  REQUIRE(save.ok());
  REQUIRE((*save)->WaitStaged().ok());
  rank1->reset();  // rank 1 dies without saving
  const absl::Status result = (*save)->WaitCommitted();
  INFO(result.ToString());
  CHECK(result.code() == absl::StatusCode::kAborted);
  CHECK(absl::StrContains(result.message(), "rank 1 disconnected"));
  for (int i = 0; i < 100 && std::filesystem::exists(daemon.root() + "/job/step-1"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK_FALSE(std::filesystem::exists(daemon.root() + "/job/step-1"));
}

}  // namespace ckpt::testing
