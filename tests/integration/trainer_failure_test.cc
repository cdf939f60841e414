// Trainer processes that go away: after STAGED the checkpoint is the
// daemon's and must commit; before submitting, the checkpoint can never
// complete and must fail with a reason.
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <optional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
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

namespace {

// One rank of a job of two ranks, both on this one node, with a 1 MiB
// tensor of its own registered.
class PairRank {
 public:
  PairRank(const std::string& socket, uint32_t rank,
           std::optional<uint32_t> local_rank = std::nullopt)
      : rank_(rank), memory_(1 << 20, static_cast<char>('a' + rank)) {
    auto client = Client::Connect({.socket = socket,
                                   .job = "job",
                                   .rank = rank,
                                   .world_size = 2,
                                   .local_rank = local_rank});
    INFO("rank " << rank << ": " << client.status());
    REQUIRE(client.ok());
    client_ = *std::move(client);
    auto region = client_->RegisterRegion(memory_.data(), memory_.size());
    INFO(region.status());
    REQUIRE(region.ok());
    region_ = *region;
  }

  absl::StatusOr<std::unique_ptr<SaveHandle>> Save(const std::string& checkpoint) {
    v1::SaveRequest request;
    request.set_job("job");
    request.set_checkpoint(checkpoint);
    *request.add_tensors() = MatrixItem(absl::StrCat("rank", rank_, ".weight"),
                                        memory_.size(), region_, 0);
    return client_->Save(request);
  }

 private:
  const uint32_t rank_;
  std::vector<char> memory_;
  uint64_t region_ = 0;
  std::unique_ptr<Client> client_;
};

size_t SavesInFlight(const std::string& socket) {
  auto stub = v1::Ckptd::NewStub(DaemonChannel(socket));
  grpc::ClientContext context;
  v1::DaemonStatusResponse response;
  REQUIRE(stub->DaemonStatus(&context, v1::DaemonStatusRequest(), &response).ok());
  return response.saves_size();
}

}  // namespace

TEST_CASE("a checkpoint whose second local rank never submits fails after "
          "--local_ranks_timeout_ms naming that rank, leaves nothing behind, "
          "and its name can be saved again",
          "[integration][trainer-failure]") {
  const bool rank1_connects = GENERATE(true, false);
  // With their LOCAL_RANK, the ranks that did connect let the daemon name
  // one that never did by its own.
  const bool with_local_ranks = GENERATE(true, false);
  INFO((rank1_connects ? "rank 1 connects and never saves"
                       : "rank 1 never connects")
       << (with_local_ranks ? ", local ranks given" : ""));
  DaemonProcess daemon({"--local_ranks_timeout_ms", "1000"});
  const auto local = [&](uint32_t rank) {
    return with_local_ranks ? std::optional<uint32_t>(rank) : std::nullopt;
  };
  PairRank rank0(daemon.socket(), 0, local(0));
  std::unique_ptr<PairRank> rank1;
  if (rank1_connects) rank1 = std::make_unique<PairRank>(daemon.socket(), 1, local(1));

  const auto first_part = std::chrono::steady_clock::now();
  auto save = rank0.Save("step-1");
  INFO(save.status());
  REQUIRE(save.ok());
  REQUIRE((*save)->WaitStaged().ok());  // rank 0's file is written
  const absl::Status result = (*save)->WaitCommitted();
  const auto waited = std::chrono::steady_clock::now() - first_part;
  INFO(result.ToString());
  CHECK(result.code() == absl::StatusCode::kAborted);
  const std::string missing =
      rank1_connects     ? "rank 1 (connected)"
      : with_local_ranks ? "local rank 1 of node 0 (never connected)"
                         : "rank 1 (never connected)";
  CHECK(absl::StrContains(
      result.message(),
      absl::StrCat(missing,
                   " did not submit within 1000 ms of the first part (1 of 2 "
                   "local ranks submitted: 0)")));
  CHECK(waited >= std::chrono::milliseconds(1000));
  CHECK(SavesInFlight(daemon.socket()) == 0);
  const std::string dir = daemon.root() + "/job/step-1";
  for (int i = 0; i < 250 && std::filesystem::exists(dir); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK_FALSE(std::filesystem::exists(dir));

  // The name is free: both ranks save it now, and it commits.
  if (!rank1_connects) rank1 = std::make_unique<PairRank>(daemon.socket(), 1, local(1));
  // Refused (Unavailable) only until the failed attempt has let go of it,
  // a moment after its directory is gone.
  absl::StatusOr<std::unique_ptr<SaveHandle>> again0 = rank0.Save("step-1");
  for (int i = 0; i < 250 && absl::IsUnavailable(again0.status()); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    again0 = rank0.Save("step-1");
  }
  auto again1 = rank1->Save("step-1");
  INFO(again0.status() << " / " << again1.status());
  REQUIRE(again0.ok());
  REQUIRE(again1.ok());
  const absl::Status committed0 = (*again0)->WaitCommitted();
  const absl::Status committed1 = (*again1)->WaitCommitted();
  INFO(committed0.ToString() << " / " << committed1.ToString());
  CHECK(committed0.ok());
  CHECK(committed1.ok());
  CHECK(std::filesystem::exists(dir + "/COMMIT"));
}

}  // namespace ckpt::testing
