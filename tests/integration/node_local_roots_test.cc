// Nodes with a root each (--node_local_root: each node's own NVMe, which no
// other node sees): the nodes commit by meeting in the remote tier
// (storage/tree_local_commit.h), each writes the same COMMIT into its own
// root, its files stay on its own disk, and the remote commit follows.
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "integration/daemon_fixture.h"
#include "integration/file_checks.h"
#include "support/temp_dir.h"

namespace ckpt::testing {
namespace {

namespace fs = std::filesystem;

std::set<std::string> DataFiles(const fs::path& dir) {
  std::set<std::string> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() == ".safetensors") files.insert(entry.path().filename());
  }
  return files;
}

// Two nodes, two ranks each, every chunk held by two replicas: each node
// stores some of them, so a node's ranks need the other node's files.
const std::vector<std::string> kJob = {"--job", "job", "--nodes", "2", "--ranks-per-node", "2",
                                       "--replicas", "2", "--layout", "uniform", "--tensors",
                                       "8", "--bytes-per-rank", std::to_string(1 << 20)};

ProcessResult Loadgen(const Cluster& cluster, std::vector<std::string> extra) {
  std::vector<std::string> args = {LOADGEN_BINARY, "--socket", cluster.socket_template()};
  args.insert(args.end(), kJob.begin(), kJob.end());
  args.insert(args.end(), extra.begin(), extra.end());
  return RunProcess(args);
}

}  // namespace

TEST_CASE("nodes with a root each commit by meeting in the remote tier: every root gets the same "
          "COMMIT and keeps only its own files, the remote commit follows, and a load reads the "
          "other node's files from the remote tier, resharded",
          "[integration][remote]") {
  TempDir remote;
  Cluster cluster(2, {"--remote", remote.path(), "--node_local_root"},
                  ClusterLayout{.root_per_node = true, .environment = {}});
  const ProcessResult saved = Loadgen(cluster, {"--saves", "2"});
  INFO(saved.out);
  REQUIRE(saved.exit_code == 0);
  for (const char* step : {"step-00000001", "step-00000002"}) {
    INFO(step);
    const fs::path at0 = fs::path(cluster.node(0).root()) / "job" / step;
    const fs::path at1 = fs::path(cluster.node(1).root()) / "job" / step;
    const fs::path there = fs::path(remote.path()) / "job" / step;
    // Committed in both roots (the save returned COMMITTED on every rank),
    // with the bytes the meeting wrote.
    REQUIRE(fs::exists(at0 / "COMMIT"));
    REQUIRE(fs::exists(at1 / "COMMIT"));
    CHECK(ReadAll(at0 / "COMMIT") == ReadAll(at1 / "COMMIT"));
    CHECK(ReadAll(at0 / "COMMIT") == ReadAll(there / "local-commit" / "COMMIT"));
    CHECK(ReadAll(fs::path(cluster.node(1).root()) / "job" / "LATEST").size() > 0);
    // Each root holds its own node's files and manifest only.
    const std::set<std::string> files0 = DataFiles(at0), files1 = DataFiles(at1);
    CHECK(!files0.empty());
    CHECK(!files1.empty());
    for (const std::string& f : files0) CHECK(!files1.contains(f));
    CHECK(fs::exists(at0 / "node-0000.manifest"));
    CHECK(!fs::exists(at0 / "node-0001.manifest"));
    CHECK(fs::exists(at1 / "node-0001.manifest"));
    // The remote commit: the same COMMIT, every node's files.
    REQUIRE(Appears(there / "COMMIT", std::chrono::seconds(60)));
    CHECK(ReadAll(there / "COMMIT") == ReadAll(at0 / "COMMIT"));
    for (const auto& [files, dir] : {std::pair{files0, at0}, std::pair{files1, at1}}) {
      for (const std::string& f : files) {
        INFO(f);
        CHECK(ReadAll(there / f) == ReadAll(dir / f));
      }
    }
  }
  // The same nodes, with their memory tiers gone: each node reads its own
  // files from its disk and the other's from the remote tier.
  cluster.node(0).Kill();
  cluster.node(1).Kill();
  cluster.node(0).Restart();
  cluster.node(1).Restart();
  const ProcessResult restored =
      Loadgen(cluster, {"--saves", "0", "--first-step", "3", "--restore", "--load-ranks", "6"});
  INFO(restored.out);
  REQUIRE(restored.exit_code == 0);
  CHECK(JsonField(restored.out, "verified") == "true");
  CHECK(JsonField(restored.out, "restore_source") == "storage+remote");
}

TEST_CASE("with a root per node, a load right after the save, before the remote commit, waits "
          "for it and then reads the other node's files from the remote tier",
          "[integration][remote]") {
  TempDir remote;
  // 256 KiB/s: each node's upload takes seconds, the local commit
  // milliseconds.
  Cluster cluster(2,
                  {"--remote", remote.path(), "--node_local_root", "--remote_max_bytes_per_second",
                   std::to_string(256 << 10)},
                  ClusterLayout{.root_per_node = true, .environment = {}});
  const ProcessResult saved = Loadgen(cluster, {"--saves", "1"});
  INFO(saved.out);
  REQUIRE(saved.exit_code == 0);
  const fs::path there = fs::path(remote.path()) / "job" / "step-00000001";
  REQUIRE(!fs::exists(there / "COMMIT"));
  const ProcessResult restored =
      Loadgen(cluster, {"--saves", "0", "--first-step", "2", "--restore"});
  INFO(restored.out);
  REQUIRE(restored.exit_code == 0);
  CHECK(JsonField(restored.out, "verified") == "true");
  CHECK(JsonField(restored.out, "restore_source") == "storage+remote");
  CHECK(fs::exists(there / "COMMIT"));
}

TEST_CASE("a node killed after the nodes met, before its own COMMIT, commits at its next start "
          "and its upload then completes the remote commit",
          "[integration][remote]") {
  TempDir remote;
  Cluster cluster(2, {"--remote", remote.path(), "--node_local_root"},
                  ClusterLayout{.root_per_node = true,
                                .environment = {{}, {"CKPTD_CRASH_AT=LOCAL_COMMIT.met"}}});
  const ProcessResult saved = Loadgen(cluster, {"--saves", "1"});
  INFO(saved.out);
  CHECK(saved.exit_code != 0);  // node 1's ranks lost their daemon
  REQUIRE(cluster.node(1).WaitForExit(30'000).has_value());
  const fs::path at0 = fs::path(cluster.node(0).root()) / "job" / "step-00000001";
  const fs::path at1 = fs::path(cluster.node(1).root()) / "job" / "step-00000001";
  const fs::path there = fs::path(remote.path()) / "job" / "step-00000001";
  REQUIRE(Appears(at0 / "COMMIT", std::chrono::seconds(30)));
  REQUIRE(fs::exists(there / "local-commit" / "COMMIT"));
  CHECK(!fs::exists(at1 / "COMMIT"));
  // Node 0's upload waits in the remote commit for node 1's part.
  CHECK(!fs::exists(there / "COMMIT"));
  cluster.node(1).SetEnvironment({});
  cluster.node(1).Restart();
  REQUIRE(fs::exists(at1 / "COMMIT"));  // before it answered
  CHECK(ReadAll(at1 / "COMMIT") == ReadAll(at0 / "COMMIT"));
  REQUIRE(Appears(there / "COMMIT", std::chrono::seconds(60)));
  CHECK(ReadAll(there / "COMMIT") == ReadAll(at0 / "COMMIT"));
}

TEST_CASE("a daemon given --node_local_root with several nodes and no --remote is refused at "
          "start, naming --remote",
          "[integration][remote]") {
  TempDir dir;
  const ProcessResult run =
      RunProcess({CKPTD_BINARY, "--socket", dir.path() + "/ckptd.sock", "--root",
                  dir.path() + "/root", "--node_local_root", "--node_id", "0", "--nodes", "2"});
  INFO(run.out);
  CHECK(run.exit_code != 0);
  CHECK(run.out.find("--node_local_root with --nodes 2 needs --remote") != std::string::npos);
}

}  // namespace ckpt::testing
