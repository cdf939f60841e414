// End-to-end save and restore through a real ckptd with real client
// processes (ckpt-loadgen forks one process per rank).
#include <unistd.h>

#include <catch2/catch.hpp>

#include "support/skip.h"
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "integration/daemon_fixture.h"
#include "integration/test_rank.h"
#include "storage/checkpoint_store.h"

namespace ckpt::testing {
namespace {


}  // namespace

TEST_CASE("four client processes save and restore 1 GiB bit-exact through a "
          "pool 16 times smaller",
          "[integration][save][restore]") {
  DaemonProcess daemon;  // 64 MiB pool
  const ProcessResult run = RunProcess(
      {LOADGEN_BINARY, "--socket", daemon.socket(), "--job", "big", "--ranks", "4",
       "--tensors", "64", "--bytes-per-rank", std::to_string(256ull << 20),
       "--restore"});
  INFO(run.out);
  REQUIRE(run.exit_code == 0);
  CHECK(JsonField(run.out, "verified") == "true");
  // 1 GiB of sharded tensors plus the 8-byte scalar every rank holds, which
  // is stored once.
  CHECK(JsonNumber(run.out, "unique_bytes") == 4 * (256ull << 20) + 8);
  CHECK(JsonNumber(run.out, "bytes_written") == JsonNumber(run.out, "unique_bytes"));
  // Invariant 5: memory stays bounded by the pool while 16x the pool streams.
  const uint64_t pool = JsonNumber(run.out, "staging_pool_bytes");
  CHECK(JsonNumber(run.out, "daemon_peak_rss_bytes") <= pool + (64ull << 20));

  const std::string dir = daemon.root() + "/big/step-00000001";
  CHECK(std::filesystem::exists(dir + "/COMMIT"));
  CHECK(std::filesystem::exists(dir + "/node-0000.manifest"));
  for (int r = 1; r <= 4; ++r) {
    const std::string file =
        dir + "/shard-0000" + std::to_string(r) + "-model-00001-of-00001.safetensors";
    REQUIRE(std::filesystem::exists(file));
  }
}

TEST_CASE("data files open with the safetensors package and follow format v1",
          "[integration][format]") {
  if (access(PROJECT_VENV_PYTHON, X_OK) != 0) {
    CKPT_SKIP(PROJECT_VENV_PYTHON
         " missing (scripts/setup-debian.sh installs safetensors there)");
  }
  DaemonProcess daemon;
  const ProcessResult run = RunProcess(
      {LOADGEN_BINARY, "--socket", daemon.socket(), "--job", "fmt", "--ranks", "2",
       "--tensors", "5", "--bytes-per-rank", std::to_string(3ull << 20)});
  INFO(run.out);
  REQUIRE(run.exit_code == 0);
  std::vector<std::string> args = {PROJECT_VENV_PYTHON, CHECK_SAFETENSORS_PY};
  for (const auto& e :
       std::filesystem::directory_iterator(daemon.root() + "/fmt/step-00000001")) {
    if (e.path().extension() == ".safetensors") args.push_back(e.path());
  }
  // One file per rank, and one for the replicated scalar (its owner's).
  REQUIRE(args.size() == 2 + 3);
  const ProcessResult check = RunProcess(args);
  INFO(check.out);
  CHECK(check.exit_code == 0);
}

TEST_CASE("consecutive saves advance LATEST and each restores its own data",
          "[integration][save][restore]") {
  DaemonProcess daemon;
  TestRank rank(daemon.socket(), "job", 4, 1 << 20);
  for (uint32_t step = 1; step <= 3; ++step) {
    rank.Fill(step);
    auto save = rank.client().Save(rank.SaveRequestFor("step-" + std::to_string(step)));
    REQUIRE(save.ok());
    REQUIRE((*save)->WaitStaged().ok());
    REQUIRE((*save)->WaitCommitted().ok());
  }
  rank.Zero();
  auto latest = rank.client().Load(rank.LoadRequestFor("latest"));
  REQUIRE(latest.ok());
  CHECK(latest->checkpoint() == "step-3");
  CHECK(rank.Holds(3));
  REQUIRE(latest->byte_items_size() == 1);
  CHECK(latest->byte_items(0).data() == "state of step-3");
  auto second = rank.client().Load(rank.LoadRequestFor("step-2"));
  REQUIRE(second.ok());
  CHECK(rank.Holds(2));
  CHECK(second->bytes_read() >= 4u << 20);
}

TEST_CASE("ckptctl shows live progress of an in-flight save and lists "
          "committed checkpoints",
          "[integration][ckptctl]") {
  DaemonProcess daemon({"--write_rate_limit", std::to_string(16 << 20)});
  TestRank rank(daemon.socket(), "watched", 8, 4 << 20);
  rank.Fill(1);
  auto save = rank.client().Save(rank.SaveRequestFor("step-1"));
  REQUIRE(save.ok());
  bool saw_progress = false;
  for (int i = 0; i < 100 && !saw_progress; ++i) {
    const ProcessResult status =
        RunProcess({CKPTCTL_BINARY, "--socket", daemon.socket(), "status"});
    REQUIRE(status.exit_code == 0);
    saw_progress = absl::StrContains(status.out, "watched/step-1 rank 0/1") &&
                   absl::StrContains(status.out, "ETA");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(saw_progress);
  REQUIRE((*save)->WaitCommitted().ok());
  const ProcessResult list =
      RunProcess({CKPTCTL_BINARY, "--socket", daemon.socket(), "list", "watched"});
  INFO(list.out);
  CHECK(list.exit_code == 0);
  CHECK(absl::StrContains(list.out, "step-1"));
  CHECK(absl::StrContains(list.out, "committed"));
  CHECK(absl::StrContains(list.out, "(latest)"));
  const ProcessResult idle =
      RunProcess({CKPTCTL_BINARY, "--socket", daemon.socket(), "status"});
  CHECK(absl::StrContains(idle.out, "no saves in flight"));
}

TEST_CASE("ckptctl inspect shows a committed checkpoint's files, chunks and byte "
          "items, and --json its whole COMMIT record",
          "[integration][ckptctl]") {
  DaemonProcess daemon;
  TestRank rank(daemon.socket(), "inspected", 3, 1 << 20);
  rank.Fill(1);
  for (const char* name : {"step-1", "step-2"}) {
    auto save = rank.client().Save(rank.SaveRequestFor(name));
    REQUIRE(save.ok());
    REQUIRE((*save)->WaitCommitted().ok());
  }

  const ProcessResult table =
      RunProcess({CKPTCTL_BINARY, "--socket", daemon.socket(), "inspect", "inspected"});
  INFO(table.out);
  CHECK(table.exit_code == 0);
  CHECK(absl::StrContains(table.out, "inspected/step-2"));  // latest by default
  CHECK(absl::StrContains(table.out, "shard-00001-model-00001-of-00001.safetensors"));
  for (const char* fqn : {"model.layers.0.weight", "model.layers.2.weight"}) {
    CHECK(absl::StrContains(table.out, fqn));
  }
  CHECK(absl::StrContains(table.out, "F32"));
  CHECK(absl::StrContains(table.out, "[256,1024]"));
  CHECK(absl::StrContains(table.out, "trainer.state"));

  const ProcessResult json = RunProcess(
      {CKPTCTL_BINARY, "--socket", daemon.socket(), "inspect", "--json", "inspected", "step-1"});
  REQUIRE(json.exit_code == 0);
  v1::CommitRecord parsed;
  REQUIRE(google::protobuf::util::JsonStringToMessage(json.out, &parsed).ok());
  auto stored = CheckpointStore(daemon.root()).ReadCommit("inspected", "step-1");
  REQUIRE(stored.ok());
  CHECK(google::protobuf::util::MessageDifferencer::Equals(parsed, *stored));

  const ProcessResult missing = RunProcess(
      {CKPTCTL_BINARY, "--socket", daemon.socket(), "inspect", "inspected", "step-9"});
  CHECK(missing.exit_code == 1);
  CHECK(absl::StrContains(missing.out, "inspected/step-9 does not exist or is not committed"));
}

TEST_CASE("clients that hand-shake at once are never refused as "
          "unauthenticated in the calls right after it",
          "[integration][session]") {
  DaemonProcess daemon;
  // Client::Connect makes OpenSession its first call, the moment it read
  // the handshake frame; RegisterRegion follows at once.
  constexpr int kThreads = 4;
  constexpr int kConnectsPerThread = 25;
  struct Outcome {
    absl::Mutex mu;
    std::vector<std::string> failures ABSL_GUARDED_BY(mu);
  } outcome;
  std::vector<std::thread> clients;
  for (int t = 0; t < kThreads; ++t) {
    clients.emplace_back([&, t] {
      std::vector<char> memory(4096);
      for (int i = 0; i < kConnectsPerThread; ++i) {
        absl::Status status;
        auto client = Client::Connect({.socket = daemon.socket(),
                                       .job = absl::StrCat("hammer", t),
                                       .rank = 0,
                                       .world_size = 1});
        status = client.status();
        if (client.ok()) {
          status = (*client)->RegisterRegion(memory.data(), memory.size()).status();
        }
        if (!status.ok()) {
          absl::MutexLock lock(&outcome.mu);
          outcome.failures.push_back(
              absl::StrCat("client ", t, " connect ", i, ": ", status.ToString()));
        }
      }
    });
  }
  for (std::thread& client : clients) client.join();
  absl::MutexLock lock(&outcome.mu);
  INFO((outcome.failures.empty() ? std::string() : outcome.failures.front()));
  CHECK(outcome.failures.empty());
}

}  // namespace ckpt::testing
