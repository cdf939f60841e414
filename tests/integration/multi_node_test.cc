// Several ckptd daemons on one machine, each a node of one job, sharing one
// storage root: replica dedupe without communication, the commit through
// storage, and a node dying mid-save.
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "client/ckpt_client.h"
#include "integration/daemon_fixture.h"
#include "integration/file_checks.h"

namespace ckpt::testing {
namespace {


struct Scenario {
  const char* name;
  uint32_t nodes, ranks_per_node, replicas;
  const char* layout;
  uint64_t bytes_per_rank;
};

ProcessResult Loadgen(const Cluster& cluster, const std::string& job,
                      const Scenario& s, std::vector<std::string> extra) {
  std::vector<std::string> args = {
      LOADGEN_BINARY, "--socket", cluster.socket_template(), "--job", job,
      "--nodes", std::to_string(s.nodes), "--ranks-per-node",
      std::to_string(s.ranks_per_node), "--replicas", std::to_string(s.replicas),
      "--layout", s.layout, "--tensors", "24", "--bytes-per-rank",
      std::to_string(s.bytes_per_rank)};
  args.insert(args.end(), extra.begin(), extra.end());
  return RunProcess(args);
}

// Rank `node` of a job of two ranks, alone on node `node` of `cluster`.
std::unique_ptr<Client> ConnectRank(Cluster& cluster, uint32_t node) {
  auto client = Client::Connect({.socket = cluster.node(node).socket(),
                                 .job = "job",
                                 .rank = node,
                                 .world_size = 2,
                                 .node = node,
                                 .local_world_size = 1});
  REQUIRE(client.ok());
  return *std::move(client);
}

// A save of checkpoint `name` holding only a byte item of this rank.
v1::SaveRequest ByteSave(const std::string& name, uint32_t rank) {
  v1::SaveRequest request;
  request.set_job("job");
  request.set_checkpoint(name);
  v1::ByteItem* item = request.add_byte_items();
  item->set_fqn("trainer.state.rank" + std::to_string(rank));
  item->set_data(std::string(4096, static_cast<char>('a' + rank)));
  return request;
}

}  // namespace

TEST_CASE("every unique chunk is written exactly once and restores bit-exact "
          "in HSDP, DDP and FSDP jobs over several nodes",
          "[integration][multi-node]") {
  const Scenario scenario = GENERATE(
      Scenario{"HSDP 2 replicas x 8-way sharding over 4 nodes", 4, 4, 2, "llama-8b",
               2 << 20},
      Scenario{"pure DDP, every tensor on every rank", 4, 2, 8, "uniform", 1 << 20},
      Scenario{"pure FSDP, no replicas", 4, 2, 1, "uniform", 1 << 20});
  INFO(scenario.name);
  Cluster cluster(scenario.nodes);
  const ProcessResult run = Loadgen(cluster, "job", scenario, {"--saves", "2", "--restore"});
  INFO(run.out);
  REQUIRE(run.exit_code == 0);
  CHECK(JsonField(run.out, "verified") == "true");
  // Every layout includes a scalar that every rank holds: stored once too.
  CHECK(JsonNumber(run.out, "bytes_written") == JsonNumber(run.out, "unique_bytes"));
  const std::string dir = cluster.root() + "/job/step-00000002";
  CHECK(std::filesystem::exists(dir + "/COMMIT"));
  for (uint32_t n = 0; n < scenario.nodes; ++n) {
    CHECK(std::filesystem::exists(dir + "/node-000" + std::to_string(n) + ".manifest"));
  }
  // The nodes met in the checkpoint's directory (storage/tree_local_commit.h):
  // COMMIT is the meeting's, byte for byte.
  CHECK(ReadAll(dir + "/local-commit/COMMIT") == ReadAll(dir + "/COMMIT"));
  CHECK(std::filesystem::exists(dir + "/local-commit/g-0000000/COMMITTED"));
}

TEST_CASE("stock torch.distributed.checkpoint loads an HSDP checkpoint that "
          "several nodes wrote, with its HuggingFaceStorageReader",
          "[integration][multi-node][format][dcp]") {
  const Scenario scenario{"HSDP 2 replicas x 2-way sharding over 2 nodes", 2, 2, 2,
                          "llama-8b", 2 << 20};
  Cluster cluster(scenario.nodes);
  const ProcessResult run = Loadgen(cluster, "job", scenario, {"--saves", "1"});
  INFO(run.out);
  REQUIRE(run.exit_code == 0);
  // Loads every tensor into a full tensor with dcp.load and checks each
  // stored chunk's box against the bytes the ranks saved.
  const ProcessResult load = RunProcess(
      {PROJECT_VENV_PYTHON, LOAD_WITH_DCP_PY, cluster.root() + "/job/step-00000001", "1"});
  INFO(load.out);
  CHECK(load.exit_code == 0);
  // Llama-3-8B's 291 tensors and the step scalar every rank holds.
  CHECK(absl::StrContains(load.out, "292 tensors loaded with torch"));
  CHECK(absl::StrContains(load.out, "HuggingFaceStorageReader, 0 bad"));
}

TEST_CASE("no node writes more than 1.10x its ideal share of a Llama-style "
          "HSDP checkpoint",
          "[integration][multi-node]") {
  const Scenario scenario = GENERATE(
      Scenario{"Llama-3-8B layout, 291 tensors", 4, 4, 2, "llama-8b", 2 << 20},
      Scenario{"Llama-3-70B layout, 723 tensors", 4, 4, 2, "llama-70b", 4 << 20});
  INFO(scenario.name);
  Cluster cluster(scenario.nodes);
  const ProcessResult run = Loadgen(cluster, "llama", scenario, {});
  INFO(run.out);
  REQUIRE(run.exit_code == 0);
  CHECK(JsonNumber(run.out, "bytes_written") == JsonNumber(run.out, "unique_bytes"));
  CHECK(JsonNumber(run.out, "max_node_share_over_ideal") <= 1.10);
}

TEST_CASE("a node killed mid-save leaves the checkpoint uncommitted and the "
          "previous one intact, and gc removes the leftover once a newer one commits",
          "[integration][multi-node][crash]") {
  // Node 3 writes slowly, so it is mid-save when it is killed; the others
  // give up waiting for it after two seconds.
  Cluster cluster(4, {"--commit_timeout_ms", "2000", "--write_rate_limit",
                      std::to_string(8 << 20)});
  const Scenario s{"HSDP", 4, 2, 2, "uniform", 4 << 20};
  const ProcessResult first = Loadgen(cluster, "job", s, {});
  INFO(first.out);
  REQUIRE(first.exit_code == 0);

  std::vector<std::string> args = {
      LOADGEN_BINARY, "--socket", cluster.socket_template(), "--job", "job",
      "--nodes", "4", "--ranks-per-node", "2", "--replicas", "2", "--tensors", "24",
      "--bytes-per-rank", std::to_string(16 << 20), "--first-step", "2"};
  BackgroundProcess second(args);
  const std::string dir2 = cluster.root() + "/job/step-00000002";
  bool writing = false;
  for (int i = 0; i < 500 && !writing; ++i) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir2, ec)) {
      writing = writing || absl::StartsWith(e.path().filename().string(), "shard-");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(writing);
  cluster.node(3).Kill();
  const ProcessResult failed = second.Wait();
  INFO(failed.out);
  CHECK(failed.exit_code != 0);
  CHECK_FALSE(std::filesystem::exists(dir2 + "/COMMIT"));
  CHECK(std::filesystem::exists(cluster.root() + "/job/step-00000001/COMMIT"));

  cluster.node(3).Restart();
  const ProcessResult restore =
      Loadgen(cluster, "job", s, {"--saves", "0", "--first-step", "2", "--restore"});
  INFO(restore.out);
  CHECK(restore.exit_code == 0);
  CHECK(JsonField(restore.out, "verified") == "true");

  const ProcessResult third = Loadgen(cluster, "job", s, {"--first-step", "3"});
  REQUIRE(third.exit_code == 0);
  const ProcessResult gc =
      RunProcess({CKPTCTL_BINARY, "--socket", cluster.node(0).socket(), "gc", "job"});
  INFO(gc.out);
  CHECK(gc.exit_code == 0);
  CHECK(absl::StrContains(gc.out, "removed job/step-00000002"));
  CHECK_FALSE(std::filesystem::exists(dir2));
  CHECK(std::filesystem::exists(cluster.root() + "/job/step-00000001/COMMIT"));
  CHECK(std::filesystem::exists(cluster.root() + "/job/step-00000003/COMMIT"));
}

TEST_CASE("a node whose manifest is written refuses a cancel of the checkpoint, "
          "and the other node still completes and commits it",
          "[integration][multi-node][cancel]") {
  Cluster cluster(2);
  std::unique_ptr<Client> rank0 = ConnectRank(cluster, 0);
  std::unique_ptr<Client> rank1 = ConnectRank(cluster, 1);
  auto save0 = rank0->Save(ByteSave("step-1", 0));
  REQUIRE(save0.ok());
  // Node 0 is DURABLE (its manifest is out) and waits for node 1.
  for (int i = 0; i < 500 && (*save0)->progress().phase() != v1::PHASE_DURABLE; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE((*save0)->progress().phase() == v1::PHASE_DURABLE);
  const std::string dir = cluster.root() + "/job/step-1";
  REQUIRE(std::filesystem::exists(dir + "/node-0000.manifest"));

  // Node 1 would commit with node 0's files as soon as it is durable, so
  // neither the operator nor the trainer may cancel on node 0 any more.
  const ProcessResult cancel = RunProcess({CKPTCTL_BINARY, "--socket",
                                           cluster.node(0).socket(), "cancel",
                                           "job", "step-1"});
  INFO(cancel.out);
  CHECK(cancel.exit_code == 1);
  CHECK(absl::StrContains(cancel.out, "job/step-1 can no longer be cancelled"));
  const absl::Status by_rank = (*save0)->Cancel();
  INFO(by_rank.ToString());
  CHECK(by_rank.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(by_rank.message(), "node manifest is written"));
  CHECK((*save0)->progress().phase() == v1::PHASE_DURABLE);

  auto save1 = rank1->Save(ByteSave("step-1", 1));
  REQUIRE(save1.ok());
  CHECK((*save1)->WaitCommitted().ok());
  CHECK((*save0)->WaitCommitted().ok());
  CHECK(std::filesystem::exists(dir + "/COMMIT"));
  CHECK(std::filesystem::exists(dir + "/node-0000.manifest"));
  CHECK(std::filesystem::exists(dir + "/node-0001.manifest"));
}

}  // namespace ckpt::testing
