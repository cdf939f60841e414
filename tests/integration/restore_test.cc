// Restore that reshards: a checkpoint saved by N ranks loads into M ranks
// with another sharding, reading each byte once per node, verifying every
// block, and naming what is damaged.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "integration/daemon_fixture.h"
#include "integration/test_rank.h"

namespace ckpt::testing {
namespace {


ProcessResult SaveThenLoad(const std::string& socket, const std::string& job,
                           std::vector<std::string> extra) {
  std::vector<std::string> args = {LOADGEN_BINARY, "--socket", socket, "--job", job,
                                   "--tensors", "12", "--bytes-per-rank",
                                   std::to_string(4 << 20), "--restore"};
  args.insert(args.end(), extra.begin(), extra.end());
  return RunProcess(args);
}

void CheckVerifiedOnce(const ProcessResult& run) {
  INFO(run.out);
  REQUIRE(run.exit_code == 0);
  CHECK(JsonField(run.out, "verified") == "true");
  // Each stored byte is read once, however the ranks slice it.
  CHECK(JsonNumber(run.out, "read_over_unique") <= 1.05);
}

}  // namespace

TEST_CASE("a checkpoint saved by 4 ranks loads bit-exact into 2, 3 and 8 ranks",
          "[integration][restore][reshard]") {
  const std::string m = GENERATE("2", "3", "8");
  INFO("load ranks " << m);
  DaemonProcess daemon;
  CheckVerifiedOnce(SaveThenLoad(daemon.socket(), "job", {"--ranks", "4", "--load-ranks", m}));
}

TEST_CASE("an HSDP 2x2 checkpoint loads into FSDP over 4 ranks",
          "[integration][restore][reshard]") {
  DaemonProcess daemon;
  CheckVerifiedOnce(SaveThenLoad(daemon.socket(), "job",
                                 {"--ranks", "4", "--replicas", "2", "--layout", "llama-8b",
                                  "--load-ranks", "4", "--load-replicas", "1"}));
}

TEST_CASE("bytes that several local ranks need are read from storage once",
          "[integration][restore][dedupe]") {
  DaemonProcess daemon;
  // Saved as FSDP over 4; loaded as 2 replicas x 2 shards: every chunk is
  // wanted by two ranks of this node.
  CheckVerifiedOnce(SaveThenLoad(daemon.socket(), "job",
                                 {"--ranks", "4", "--load-ranks", "4", "--load-replicas", "2"}));
}

TEST_CASE("a checkpoint saved on 2 nodes loads into 6 ranks over the same nodes",
          "[integration][restore][reshard][multi-node]") {
  // Each node reads the checksum blocks its ranks' boxes touch; where a
  // saved chunk is split between the nodes, both read the block at the
  // seam. Chunks of 4 MiB with 64 KiB blocks keep that within 5%.
  Cluster cluster(2, {"--checksum_block_bytes", "65536"});
  CheckVerifiedOnce(SaveThenLoad(cluster.socket_template(), "job",
                                 {"--nodes", "2", "--ranks-per-node", "2", "--replicas",
                                  "2", "--load-ranks", "6", "--tensors", "2",
                                  "--bytes-per-rank", std::to_string(8 << 20)}));
}

TEST_CASE("a missing item fails the load naming it, unless missing items are "
          "allowed",
          "[integration][restore]") {
  DaemonProcess daemon;
  TestRank rank(daemon.socket(), "job", 2, 1 << 20);
  rank.Fill(1);
  auto save = rank.client().Save(rank.SaveRequestFor("step-1"));
  REQUIRE(save.ok());
  REQUIRE((*save)->WaitCommitted().ok());
  v1::LoadRequest request = rank.LoadRequestFor("step-1");
  v1::TensorItem extra = rank.Item(1);
  extra.set_fqn("model.not.saved");
  *request.add_tensors() = extra;
  request.add_byte_items("no.such.state");
  auto strict = rank.client().Load(request);
  CHECK(strict.status().code() == absl::StatusCode::kNotFound);
  CHECK(absl::StrContains(strict.status().message(), "model.not.saved"));

  request.set_allow_missing(true);
  rank.Zero();
  auto lenient = rank.client().Load(request);
  REQUIRE(lenient.ok());
  CHECK(std::vector<std::string>(lenient->missing().begin(), lenient->missing().end()) ==
        std::vector<std::string>{"model.not.saved", "no.such.state"});
  CHECK(rank.Holds(1));
}

TEST_CASE("a flipped bit and a truncated file are detected and named by restore "
          "and by ckptctl verify",
          "[integration][restore][verify]") {
  DaemonProcess daemon;
  TestRank rank(daemon.socket(), "job", 4, 1 << 20);
  rank.Fill(1);
  auto save = rank.client().Save(rank.SaveRequestFor("step-1"));
  REQUIRE(save.ok());
  REQUIRE((*save)->WaitCommitted().ok());
  auto verify = [&] {
    return RunProcess({CKPTCTL_BINARY, "--socket", daemon.socket(), "verify", "job"});
  };
  const ProcessResult healthy = verify();
  INFO(healthy.out);
  CHECK(healthy.exit_code == 0);
  CHECK(absl::StrContains(healthy.out, "0 problem(s)"));

  const std::string file = daemon.root() +
                           "/job/step-1/shard-00001-model-00001-of-00001.safetensors";
  // Item 2's bytes start 2 MiB after the 4 KiB header (items are in fqn order).
  const off_t victim = 4096 + (2 << 20) + 12345;
  {
    const int fd = open(file.c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    char byte = 0;
    REQUIRE(pread(fd, &byte, 1, victim) == 1);
    byte ^= 0x10;
    REQUIRE(pwrite(fd, &byte, 1, victim) == 1);
    close(fd);
  }
  auto load = rank.client().Load(rank.LoadRequestFor("step-1"));
  INFO(load.status().ToString());
  CHECK(load.status().code() == absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(load.status().message(), "model.layers.2.weight"));
  CHECK(absl::StrContains(load.status().message(), file));
  const ProcessResult flipped = verify();
  INFO(flipped.out);
  CHECK(flipped.exit_code == 3);  // damage found (client/ckptctl_help.h)
  CHECK(absl::StrContains(flipped.out, "DAMAGED"));
  CHECK(absl::StrContains(flipped.out, "model.layers.2.weight"));

  std::filesystem::resize_file(file, 4096 + (3 << 20) + 100);
  const ProcessResult truncated = verify();
  INFO(truncated.out);
  CHECK(truncated.exit_code == 3);
  CHECK(absl::StrContains(truncated.out, "size"));
  CHECK(absl::StrContains(truncated.out, "model.layers.3.weight"));
}

}  // namespace ckpt::testing

namespace ckpt::testing {

TEST_CASE("retention keeps the newest checkpoints while saves and loads of "
          "'latest' run concurrently, and every load gets a whole checkpoint",
          "[integration][retention]") {
  DaemonProcess daemon({"--keep_last", "2"});
  TestRank saver(daemon.socket(), "job", 4, 1 << 20);
  TestRank reader(daemon.socket(), "job", 4, 1 << 20);
  saver.Fill(1);
  auto first = saver.client().Save(saver.SaveRequestFor("step-1"));
  REQUIRE(first.ok());
  REQUIRE((*first)->WaitCommitted().ok());

  std::atomic<bool> done{false};
  std::atomic<int> loads{0}, bad{0};
  std::thread loader([&] {
    while (!done) {
      auto load = reader.client().Load(reader.LoadRequestFor("latest"));
      // A load may lose the race with retention only as NotFound, never
      // with torn or mixed data.
      if (!load.ok()) {
        if (!absl::IsNotFound(load.status())) ++bad;
        continue;
      }
      const uint32_t step = std::stoi(load->checkpoint().substr(5));
      if (!reader.Holds(step)) ++bad;
      ++loads;
    }
  });
  for (uint32_t step = 2; step <= 6; ++step) {
    saver.Fill(step);
    auto save = saver.client().Save(saver.SaveRequestFor("step-" + std::to_string(step)));
    REQUIRE(save.ok());
    REQUIRE((*save)->WaitCommitted().ok());
  }
  done = true;
  loader.join();
  CHECK(bad == 0);
  CHECK(loads > 0);

  auto list = saver.client().List("job");
  REQUIRE(list.ok());
  std::vector<std::string> committed;
  for (const auto& info : *list) {
    if (info.committed()) committed.push_back(info.checkpoint());
  }
  // Step 6 committed last; a load may have kept one older checkpoint alive
  // past its pass, but never more than that one extra.
  CHECK(std::find(committed.begin(), committed.end(), "step-6") != committed.end());
  CHECK(std::find(committed.begin(), committed.end(), "step-5") != committed.end());
  CHECK(committed.size() <= 3);
  CHECK(std::find(committed.begin(), committed.end(), "step-1") == committed.end());
}

}  // namespace ckpt::testing

namespace ckpt::testing {

TEST_CASE("a trainer restarted on the same node restores from the daemon's "
          "memory tier, and from storage once the daemon restarted",
          "[integration][restore][memory-tier]") {
  // 4 MiB; and 72 MiB in one file, which the daemon's 8 I/O workers verify
  // in parts (restore/read_split.h: parts of at least 32 MiB).
  const auto [tensors, tensor_bytes] =
      GENERATE(std::pair<uint32_t, uint64_t>{4, 1 << 20}, std::pair<uint32_t, uint64_t>{3, 24 << 20});
  INFO(tensors << " tensors of " << tensor_bytes << " bytes");
  // Spelled with dashes, as flags may be.
  DaemonProcess daemon({"--keep-in-memory-bytes=" + std::to_string(256 << 20)});
  {
    TestRank trainer(daemon.socket(), "job", tensors, tensor_bytes);
    trainer.Fill(1);
    auto save = trainer.client().Save(trainer.SaveRequestFor("step-1"));
    REQUIRE(save.ok());
    REQUIRE((*save)->WaitCommitted().ok());
  }  // the trainer process goes away
  {
    TestRank restarted(daemon.socket(), "job", tensors, tensor_bytes);
    auto load = restarted.client().Load(restarted.LoadRequestFor("latest"));
    REQUIRE(load.ok());
    CHECK(load->source() == "memory");
    CHECK(load->bytes_read() == 0);
    CHECK(restarted.Holds(1));
  }
  daemon.Kill();
  daemon.Restart();
  TestRank after(daemon.socket(), "job", tensors, tensor_bytes);
  auto load = after.client().Load(after.LoadRequestFor("latest"));
  REQUIRE(load.ok());
  CHECK(load->source() == "storage");
  CHECK(load->bytes_read() >= tensors * tensor_bytes);
  CHECK(after.Holds(1));
}

}  // namespace ckpt::testing

namespace ckpt::testing {

TEST_CASE("trainer processes that die after STAGED and start again restore "
          "from the memory tier",
          "[integration][restore][memory-tier]") {
  // Spelled with dashes, as flags may be.
  DaemonProcess daemon({"--keep-in-memory-bytes=" + std::to_string(64 << 20)});
  const std::vector<std::string> base = {LOADGEN_BINARY, "--socket", daemon.socket(),
                                         "--job", "job", "--ranks", "2", "--tensors", "8",
                                         "--bytes-per-rank", std::to_string(8 << 20)};
  std::vector<std::string> crash = base;
  crash.push_back("--exit-after-staged");
  const ProcessResult saved = RunProcess(crash);
  INFO(saved.out);
  REQUIRE(saved.exit_code == 0);
  for (int i = 0; i < 200 && !std::filesystem::exists(daemon.root() +
                                                     "/job/step-00000001/COMMIT");
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::vector<std::string> restart = base;
  for (const char* a : {"--saves", "0", "--first-step", "2", "--restore"}) restart.push_back(a);
  const ProcessResult restored = RunProcess(restart);
  INFO(restored.out);
  REQUIRE(restored.exit_code == 0);
  CHECK(JsonField(restored.out, "verified") == "true");
  CHECK(JsonField(restored.out, "restore_source") == "memory");
  CHECK(JsonNumber(restored.out, "bytes_read") == 0);
}

}  // namespace ckpt::testing
