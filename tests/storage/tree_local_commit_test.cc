// The local commit of several nodes through the tree commit
// (storage/tree_local_commit.h). Nodes with a root each meet in the remote
// store, and each writes the meeting's COMMIT into its own root; nodes
// sharing a root meet in it, and the first to learn of the meeting's end
// writes COMMIT. A node that crashed after the meeting finishes at start,
// unless the meeting merged a manifest of it other than the one it has.
#include "storage/tree_local_commit.h"

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bench/commit_scale_sim.h"
#include "storage/commit_protocol.h"
#include "storage/in_memory_object_store.h"
#include "storage/posix_object_store.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

using ::ckpt::testing::TempDir;

constexpr char kJob[] = "sim";  // SimulatedNodeManifest's names
constexpr char kCheckpoint[] = "step-1";

TreeCommitOptions Quick() {
  TreeCommitOptions options;
  options.poll_interval = absl::Milliseconds(10);
  options.fallback_interval = absl::Seconds(1);
  options.timeout = absl::Seconds(20);
  return options;
}

// A node with a root of its own, durable: its node manifest written.
struct Node {
  Node(uint32_t id, uint32_t nodes, const TreeCommitOptions& options,
       std::shared_ptr<ObjectStore> remote)
      : commit(&store, std::move(remote), TreeLocalCommit::Root::kPerNode, id, options) {
    REQUIRE(store.PrepareForSave(kJob, kCheckpoint, id).ok());
    REQUIRE(store.WriteNodeManifest(SimulatedNodeManifest(id, nodes)).ok());
  }
  TempDir tmp;
  CheckpointStore store{tmp.path()};
  TreeLocalCommit commit;
};

// Calls every node's TryCommit until each is committed or failed; their
// outcomes.
template <typename N>
std::vector<absl::Status> MeetAll(std::vector<std::unique_ptr<N>>& nodes) {
  std::vector<std::optional<absl::Status>> outcome(nodes.size());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    bool all = true;
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (outcome[i].has_value()) continue;
      absl::StatusOr<bool> r =
          nodes[i]->commit.TryCommit(kJob, kCheckpoint, static_cast<uint32_t>(nodes.size()));
      if (!r.ok()) {
        outcome[i] = r.status();
      } else if (*r) {
        outcome[i] = absl::OkStatus();
      } else {
        all = false;
      }
    }
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::vector<absl::Status> out;
  for (auto& o : outcome) out.push_back(o.value_or(absl::DeadlineExceededError("test: no end")));
  return out;
}

// `count` durable nodes of one job, meeting in `remote`.
std::vector<std::unique_ptr<Node>> DurableNodes(uint32_t count,
                                                const std::shared_ptr<ObjectStore>& remote) {
  std::vector<std::unique_ptr<Node>> nodes;
  for (uint32_t n = 0; n < count; ++n) {
    nodes.push_back(std::make_unique<Node>(n, count, Quick(), remote));
  }
  return nodes;
}

// Counts the renames onto COMMIT: how often a node wrote it.
struct CountingOps : FileOps {
  absl::Status Rename(const StorageDir& dir, const std::string& from,
                      const std::string& to) override {
    if (to == "COMMIT") ++commits;
    return FileOps::Rename(dir, from, to);
  }
  std::atomic<int> commits{0};
};

// Nodes sharing one root, each with its own daemon's view of it (a
// CheckpointStore and the directory driver over the same directory).
struct SharedRoot {
  TempDir tmp;
  CountingOps ops;
};
struct SharedNode {
  SharedNode(SharedRoot& root, uint32_t id, uint32_t nodes)
      : store(root.tmp.path()),
        commit(&store, Meeting(root.tmp.path()), TreeLocalCommit::Root::kShared, id, Quick(),
               root.ops) {
    REQUIRE(store.PrepareForSave(kJob, kCheckpoint, id).ok());
    REQUIRE(store.WriteNodeManifest(SimulatedNodeManifest(id, nodes)).ok());
  }
  static std::shared_ptr<ObjectStore> Meeting(const std::string& root) {
    absl::StatusOr<std::unique_ptr<PosixObjectStore>> store = PosixObjectStore::Open(root);
    REQUIRE(store.ok());
    return std::move(*store);
  }
  CheckpointStore store;
  TreeLocalCommit commit;
};

std::string CommitBytes(const Node& node) {
  std::ifstream in(absl::StrCat(node.store.CheckpointDir(kJob, kCheckpoint), "/COMMIT"),
                   std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("nodes with a root each commit by meeting in the remote store: every root gets the "
          "meeting's COMMIT and LATEST",
          "[tree_local_commit]") {
  auto remote = std::make_shared<InMemoryObjectStore>();
  std::vector<std::unique_ptr<Node>> nodes = DurableNodes(3, remote);
  for (const absl::Status& s : MeetAll(nodes)) CHECK(s.ok());
  const std::string prefix = TreeLocalCommit::MeetingPrefix(kJob, kCheckpoint);
  CHECK(prefix == "sim/step-1/local-commit/");
  absl::StatusOr<std::string> met = GetSmallObject(*remote, prefix + "COMMIT", 1 << 20);
  REQUIRE(met.ok());
  for (const auto& node : nodes) {
    CHECK(node->store.IsCommitted(kJob, kCheckpoint));
    CHECK(CommitBytes(*node) == *met);
    absl::StatusOr<std::string> latest = node->store.ResolveLatest(kJob);
    REQUIRE(latest.ok());
    CHECK(*latest == kCheckpoint);
  }
  // Nothing of the meeting is outside its prefix: the remote commit's own
  // keys are still free.
  absl::StatusOr<ObjectListing> all = remote->List("");
  REQUIRE(all.ok());
  for (const ObjectInfo& object : all->objects) CHECK(absl::StartsWith(object.key, prefix));
}

TEST_CASE("nodes sharing a root commit by meeting inside the checkpoint's directory: the first "
          "to learn of the meeting's end writes COMMIT, the others find it, LATEST names it",
          "[tree_local_commit]") {
  SharedRoot root;
  std::vector<std::unique_ptr<SharedNode>> nodes;
  for (uint32_t n = 0; n < 4; ++n) nodes.push_back(std::make_unique<SharedNode>(root, n, 4));
  for (const absl::Status& s : MeetAll(nodes)) CHECK(s.ok());
  CheckpointStore& store = nodes[0]->store;
  CHECK(store.IsCommitted(kJob, kCheckpoint));
  CHECK(root.ops.commits == 1);  // one node wrote it; three found it
  absl::StatusOr<std::string> latest = store.ResolveLatest(kJob);
  REQUIRE(latest.ok());
  CHECK(*latest == kCheckpoint);
  // The meeting's COMMIT is the one written, and lies in the checkpoint's
  // directory, which retention removes as a whole.
  const std::filesystem::path dir = store.CheckpointDir(kJob, kCheckpoint);
  std::ifstream met(dir / "local-commit" / "COMMIT", std::ios::binary);
  REQUIRE(met.good());
  std::ifstream written(dir / "COMMIT", std::ios::binary);
  CHECK(std::string(std::istreambuf_iterator<char>(met), {}) ==
        std::string(std::istreambuf_iterator<char>(written), {}));
  absl::StatusOr<v1::CommitRecord> record = store.ReadCommit(kJob, kCheckpoint);
  REQUIRE(record.ok());
  CHECK(record->index().nodes() == 4);

  SECTION("a node that crashed after the meeting, before COMMIT, finishes it at start") {
    REQUIRE(std::filesystem::remove(dir / "COMMIT"));
    CHECK(nodes[2]->commit.RollForward() == std::vector<std::string>{"sim/step-1"});
    CHECK(store.IsCommitted(kJob, kCheckpoint));
  }
  SECTION("retention removes the meeting with the checkpoint") {
    REQUIRE(store.DeleteCommitted(kJob, kCheckpoint).ok());
    CHECK(!std::filesystem::exists(dir));
  }
}

TEST_CASE("on a shared root, a COMMIT that a node of an older version wrote by listing the "
          "directory ends the meeting within a fallback interval, not at the commit timeout",
          "[tree_local_commit]") {
  SharedRoot root;
  SharedNode upgraded(root, 0, 2);
  SharedNode older(root, 1, 2);  // durable, but never joins the meeting
  REQUIRE(upgraded.commit.TryCommit(kJob, kCheckpoint, 2).value() == false);
  CommitProtocol listing(&older.store);
  REQUIRE(listing.TryCommit(kJob, kCheckpoint, 2).value());
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<bool> committed = false;
  while (committed.ok() && !*committed &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    committed = upgraded.commit.TryCommit(kJob, kCheckpoint, 2);
  }
  REQUIRE(committed.ok());
  CHECK(*committed);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));  // fallback: 1 s
  absl::StatusOr<std::string> latest = upgraded.store.ResolveLatest(kJob);
  REQUIRE(latest.ok());
  CHECK(*latest == kCheckpoint);
}

TEST_CASE("the meeting polls every 10 ms for a few nodes, as the remote commit does (0.4 s) "
          "from 1,000 nodes on, in proportion between",
          "[tree_local_commit]") {
  CHECK(MeetingPollInterval(2) == absl::Milliseconds(10));
  CHECK(MeetingPollInterval(25) == absl::Milliseconds(10));
  CHECK(MeetingPollInterval(125) == absl::Milliseconds(50));
  CHECK(MeetingPollInterval(500) == absl::Milliseconds(200));
  CHECK(MeetingPollInterval(1000) == absl::Milliseconds(400));
  CHECK(MeetingPollInterval(10000) == absl::Milliseconds(400));
}

TEST_CASE("a node that never publishes ends the others' meeting at its timeout, naming what they "
          "waited for",
          "[tree_local_commit]") {
  auto remote = std::make_shared<InMemoryObjectStore>();
  TreeCommitOptions options = Quick();
  options.timeout = absl::Milliseconds(300);
  std::vector<std::unique_ptr<Node>> nodes;
  nodes.push_back(std::make_unique<Node>(0, 2, options, remote));
  // Node 1 of 2 never becomes durable.
  absl::Status outcome;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    absl::StatusOr<bool> r = nodes[0]->commit.TryCommit(kJob, kCheckpoint, 2);
    REQUIRE((!r.ok() || !*r));
    if (!r.ok()) {
      outcome = r.status();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  INFO(outcome.ToString());
  REQUIRE(!outcome.ok());
  CHECK(absl::StrContains(outcome.message(), "nodes' meeting"));
  CHECK(absl::StrContains(outcome.message(), "local-commit"));
  CHECK(!nodes[0]->store.IsCommitted(kJob, kCheckpoint));
}

TEST_CASE("a node that crashed after the meeting commits at start, unless the meeting merged "
          "another manifest of it than the one it has",
          "[tree_local_commit]") {
  auto remote = std::make_shared<InMemoryObjectStore>();
  std::vector<std::unique_ptr<Node>> nodes = DurableNodes(2, remote);
  for (const absl::Status& s : MeetAll(nodes)) REQUIRE(s.ok());
  Node& crashed = *nodes[1];
  const std::string commit = CommitBytes(crashed);
  // Its COMMIT never written: the crash came between the meeting and it.
  const std::filesystem::path dir = crashed.store.CheckpointDir(kJob, kCheckpoint);
  REQUIRE(std::filesystem::remove(dir / "COMMIT"));
  REQUIRE(!crashed.store.IsCommitted(kJob, kCheckpoint));

  SECTION("its manifest is the one merged: committed, the same bytes") {
    CHECK(crashed.commit.RollForward() == std::vector<std::string>{"sim/step-1"});
    CHECK(crashed.store.IsCommitted(kJob, kCheckpoint));
    CHECK(CommitBytes(crashed) == commit);
  }
  SECTION("a later attempt's manifest (other chunks) is not what was merged: left uncommitted") {
    v1::Manifest other = SimulatedNodeManifest(1, 2);
    REQUIRE(other.tensors_size() > 0);
    other.mutable_tensors(0)->set_block_xxh3(0, other.tensors(0).block_xxh3(0) ^ 1);
    REQUIRE(crashed.store.WriteNodeManifest(other).ok());
    CHECK(crashed.commit.RollForward().empty());
    CHECK(!crashed.store.IsCommitted(kJob, kCheckpoint));
  }
  SECTION("a node that was never durable is not committed by others' meeting") {
    REQUIRE(std::filesystem::remove(dir / "node-0001.manifest"));
    CHECK(crashed.commit.RollForward().empty());
    CHECK(!crashed.store.IsCommitted(kJob, kCheckpoint));
  }
}

}  // namespace ckpt
