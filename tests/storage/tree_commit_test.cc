// The remote tier's commit (storage/tree_commit.h): its keys, its result
// (the same COMMIT as merging every manifest), its scale (requests linear
// in the nodes, per-prefix rates under S3's limits, every node told within
// a second), and its failures (a node that never comes, a leader or the
// root dying, damaged manifests, failing requests).
#include "storage/tree_commit.h"

#include <memory>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bench/commit_scale_sim.h"
#include "format/manifest_check.h"
#include "format/manifest_file.h"
#include "storage/commit_protocol.h"
#include "storage/in_memory_object_store.h"

namespace ckpt {
namespace {

constexpr char kPrefix[] = "sim/step-1/";

// Fails one request in `period` (at random, seeded) with Unavailable: a
// server's 503 that the driver's own retries did not get past.
class FlakyStore : public ObjectStore {
 public:
  FlakyStore(ObjectStore& inner, int period) : inner_(inner), period_(period) {}
  std::string Describe(absl::string_view key) const override { return inner_.Describe(key); }
  absl::Status Put(absl::string_view key, absl::string_view body) override {
    if (Fail()) return absl::UnavailableError("503 SlowDown");
    return inner_.Put(key, body);
  }
  absl::StatusOr<size_t> Get(absl::string_view key, absl::Span<char> into,
                             std::optional<ObjectRange> range) override {
    if (Fail()) return absl::UnavailableError("503 SlowDown");
    return inner_.Get(key, into, range);
  }
  absl::StatusOr<ObjectInfo> Head(absl::string_view key) override {
    if (Fail()) return absl::UnavailableError("503 SlowDown");
    return inner_.Head(key);
  }
  absl::StatusOr<ObjectListing> List(absl::string_view prefix,
                                     absl::string_view delimiter) override {
    if (Fail()) return absl::UnavailableError("503 SlowDown");
    return inner_.List(prefix, delimiter);
  }
  absl::Status Delete(absl::string_view key) override { return inner_.Delete(key); }
  absl::StatusOr<int> AbortUnfinished(absl::string_view prefix, absl::Time before) override {
    return inner_.AbortUnfinished(prefix, before);
  }
  int failures() const { return failures_; }

 private:
  bool Fail() {
    if (period_ > 1 && random_() % period_ != 0) return false;
    ++failures_;
    return true;
  }
  ObjectStore& inner_;
  const int period_;
  std::mt19937 random_{42};
  int failures_ = 0;
};

// Advances every node on a virtual clock, 10 ms a tick, until all are done
// or `limit` has passed.
void RunOnVirtualClock(std::vector<std::unique_ptr<TreeCommitNode>>& nodes,
                       absl::Duration limit) {
  const absl::Time start = absl::UnixEpoch();
  std::vector<absl::Time> next(nodes.size(), start);
  for (absl::Time now = start; now - start <= limit; now += absl::Milliseconds(10)) {
    bool all_done = true;
    for (size_t n = 0; n < nodes.size(); ++n) {
      if (nodes[n]->done()) continue;
      all_done = false;
      if (next[n] > now) continue;
      if (std::optional<absl::Time> t = nodes[n]->Advance(now)) next[n] = *t;
    }
    if (all_done) return;
  }
}

std::vector<std::unique_ptr<TreeCommitNode>> MakeNodes(ObjectStore& store, uint32_t count,
                                                       const TreeCommitOptions& options) {
  std::vector<std::unique_ptr<TreeCommitNode>> nodes;
  for (uint32_t n = 0; n < count; ++n) {
    nodes.push_back(std::make_unique<TreeCommitNode>(
        store, kPrefix, SimulatedNodeManifest(n, count), options, absl::UnixEpoch()));
  }
  return nodes;
}

TEST_CASE("the tree commit's keys: groups of about the square root of the nodes, and ids "
          "read back only from keys it made",
          "[tree_commit]") {
  CHECK(DefaultGroupSize(1) == 1);
  CHECK(DefaultGroupSize(10'000) == 100);
  CHECK(DefaultGroupSize(10'001) == 101);
  const TreeCommitLayout layout(kPrefix, 10, 4);
  CHECK(layout.groups() == 3);
  CHECK(layout.MembersOf(2) == 2);
  CHECK(layout.LeaderOf(2) == 8);
  CHECK(layout.NodeManifestKey(9) == "sim/step-1/g-0000002/node-0000009.manifest");
  CHECK(layout.GroupRecordKey(1) == "sim/step-1/groups/g-0000001.manifests");
  CHECK(layout.NoticeKey(1) == "sim/step-1/g-0000001/COMMITTED");
  CHECK(layout.CommitKey() == "sim/step-1/COMMIT");
  for (uint32_t n = 0; n < 10; ++n) CHECK(layout.NodeOfManifestKey(layout.NodeManifestKey(n)) == n);
  CHECK(layout.GroupOfRecordKey(layout.GroupRecordKey(2)) == 2u);
  // A node outside its group's prefix, past the node count, or a planted
  // name is not a manifest of this commit.
  CHECK(!layout.NodeOfManifestKey("sim/step-1/g-0000000/node-0000009.manifest"));
  CHECK(!layout.NodeOfManifestKey("sim/step-1/g-0000002/node-0000010.manifest"));
  CHECK(!layout.NodeOfManifestKey("sim/step-1/g-0000002/node-0000009.manifest.tmp"));
  CHECK(!layout.NodeOfManifestKey("other/g-0000002/node-0000009.manifest"));
  CHECK(!layout.GroupOfRecordKey("sim/step-1/groups/g-0000003.manifests"));
  CHECK(!layout.GroupOfRecordKey("sim/step-1/groups/g-000001.manifests"));
  for (uint32_t n = 0; n < 10; ++n) CHECK(ValidateObjectKey(layout.NodeManifestKey(n)).ok());
}

TEST_CASE("the tree commit writes the COMMIT that merging every node's manifest gives, and "
          "every node learns of it",
          "[tree_commit]") {
  InMemoryObjectStore store;
  TreeCommitOptions options;
  options.group_size = 3;
  auto nodes = MakeNodes(store, 10, options);
  RunOnVirtualClock(nodes, absl::Minutes(1));
  int writers = 0;
  for (const auto& node : nodes) {
    REQUIRE(node->done());
    INFO(node->outcome().ToString());
    CHECK(node->outcome().ok());
    writers += node->wrote_commit();
  }
  CHECK(writers == 1);
  absl::StatusOr<std::string> bytes =
      GetSmallObject(store, nodes[0]->layout().CommitKey(), kMaxFramedFileBytes);
  REQUIRE(bytes.ok());
  absl::StatusOr<v1::CommitRecord> commit = ParseCommitFile(*bytes, "COMMIT");
  REQUIRE(commit.ok());
  std::vector<v1::Manifest> manifests;
  for (uint32_t n = 0; n < 10; ++n) manifests.push_back(SimulatedNodeManifest(n, 10));
  absl::StatusOr<v1::CommitRecord> merged = MergeNodeManifests(std::move(manifests));
  REQUIRE(merged.ok());
  CHECK(commit->SerializeAsString() == merged->SerializeAsString());
  for (uint32_t g = 0; g < 4; ++g) {
    CHECK(store.Head(nodes[0]->layout().NoticeKey(g)).ok());
  }
}

TEST_CASE("at 2,000 nodes every node learns of the commit within a second, in requests "
          "linear in the nodes, each prefix under S3's request rates",
          "[tree_commit]") {
  CommitSimulationOptions options;
  options.publish_spread = absl::Seconds(10);
  options.nodes = 1'000;
  absl::StatusOr<CommitSimulationResult> small = SimulateTreeCommit(options);
  options.nodes = 2'000;
  absl::StatusOr<CommitSimulationResult> large = SimulateTreeCommit(options);
  REQUIRE(small.ok());
  REQUIRE(large.ok());
  for (const CommitSimulationResult* r : {&*small, &*large}) {
    INFO(r->first_failure.ToString());
    REQUIRE(r->commit_at.has_value());
    CHECK(r->failed == 0);
    CHECK(r->commits_written == 1);
    REQUIRE(!r->learn_delays.empty());
    CHECK(r->learn_delays.front() >= absl::ZeroDuration());
    CHECK(r->learn_delays.back() < absl::Seconds(1));
    CHECK(r->counts.peak_reads_per_second < 5'500);
    CHECK(r->counts.peak_writes_per_second < 3'500);
  }
  CHECK(small->learn_delays.size() == 1'000);
  CHECK(large->learn_delays.size() == 2'000);
  // Twice the nodes over the same wait: about twice the requests, not four
  // times (each node's polls over the same seconds, plus a constant few).
  const double growth =
      static_cast<double>(large->counts.total) / static_cast<double>(small->counts.total);
  INFO("requests: " << small->counts.total << " at 1,000 nodes, " << large->counts.total
                    << " at 2,000");
  CHECK(growth < 2.3);
  // Today's protocol on the same publish times lists far more.
  CHECK(ModelListingCommit(options).requests > 5 * large->counts.total);
}

TEST_CASE("a node that never publishes: every other node gives up at the timeout, and the "
          "leader of its group names it",
          "[tree_commit]") {
  CommitSimulationOptions options;
  options.nodes = 20;
  options.commit.group_size = 5;
  options.commit.timeout = absl::Seconds(30);
  options.publish_spread = absl::Seconds(2);
  options.never_publish = {7};
  absl::StatusOr<CommitSimulationResult> run = SimulateTreeCommit(options);
  REQUIRE(run.ok());
  CHECK(!run->commit_at.has_value());
  CHECK(run->failed == 19);
  const absl::Status& leader = run->outcomes[5];
  INFO(leader.ToString());
  CHECK(absl::IsDeadlineExceeded(leader));
  CHECK(absl::StrContains(leader.message(), "group 1's nodes 7"));
  CHECK(absl::StrContains(leader.message(), "node 5 of 20"));
  const absl::Status& root = run->outcomes[0];
  INFO(root.ToString());
  CHECK(absl::StrContains(root.message(), "the records of groups 1 (gathered by nodes 5)"));
}

TEST_CASE("a leader that dies after publishing: a member of its group gathers it, and "
          "every other node commits",
          "[tree_commit]") {
  CommitSimulationOptions options;
  options.nodes = 40;
  options.commit.group_size = 8;
  options.publish_spread = absl::Seconds(2);
  options.die_after_publish = {16};  // group 2's leader
  absl::StatusOr<CommitSimulationResult> run = SimulateTreeCommit(options);
  REQUIRE(run.ok());
  INFO(run->first_failure.ToString());
  REQUIRE(run->commit_at.has_value());
  CHECK(run->failed == 0);
  CHECK(run->learn_delays.size() == 39);
  // Two fallback intervals at most, plus their stagger.
  CHECK(*run->commit_at < absl::Seconds(2 + 3 * 10 + 2));
}

TEST_CASE("a root that dies after publishing: another leader merges and commits, and every "
          "other node learns of it",
          "[tree_commit]") {
  CommitSimulationOptions options;
  options.nodes = 40;
  options.commit.group_size = 8;
  options.publish_spread = absl::Seconds(2);
  options.die_after_publish = {0};
  absl::StatusOr<CommitSimulationResult> run = SimulateTreeCommit(options);
  REQUIRE(run.ok());
  INFO(run->first_failure.ToString());
  REQUIRE(run->commit_at.has_value());
  CHECK(run->failed == 0);
  CHECK(run->learn_delays.size() == 39);
  CHECK(run->commits_written >= 1);
}

TEST_CASE("a damaged manifest under a member's key ends the leader's commit at once, naming "
          "the object",
          "[tree_commit]") {
  InMemoryObjectStore store;
  TreeCommitOptions options;
  options.group_size = 2;
  auto nodes = MakeNodes(store, 2, options);
  const std::string key = nodes[0]->layout().NodeManifestKey(1);
  REQUIRE(store.Put(key, "not a manifest").ok());
  const absl::Time start = absl::UnixEpoch();
  for (int i = 0; i < 5 && !nodes[0]->done(); ++i) nodes[0]->Advance(start);
  REQUIRE(nodes[0]->done());
  INFO(nodes[0]->outcome().ToString());
  CHECK(absl::IsDataLoss(nodes[0]->outcome()));
  CHECK(absl::StrContains(nodes[0]->outcome().message(), store.Describe(key)));
  CHECK(!store.Head(nodes[0]->layout().GroupRecordKey(0)).ok());
  // Another node's manifest under node 1's key is refused too.
  v1::Manifest other = SimulatedNodeManifest(0, 2);
  REQUIRE(store.Put(key, FrameMessage(kNodeManifestMagic, other)).ok());
  auto again = MakeNodes(store, 2, options);
  for (int i = 0; i < 5 && !again[0]->done(); ++i) again[0]->Advance(start);
  REQUIRE(again[0]->done());
  CHECK(absl::StrContains(again[0]->outcome().message(), "holds node 0's manifest"));
}

TEST_CASE("requests that fail now and then are retried at the next poll, and the commit "
          "completes",
          "[tree_commit]") {
  InMemoryObjectStore memory;
  FlakyStore flaky(memory, 3);
  TreeCommitOptions options;
  options.group_size = 3;
  auto nodes = MakeNodes(flaky, 9, options);
  RunOnVirtualClock(nodes, absl::Minutes(5));
  CHECK(flaky.failures() > 10);
  for (const auto& node : nodes) {
    REQUIRE(node->done());
    INFO(node->outcome().ToString());
    CHECK(node->outcome().ok());
  }
}

TEST_CASE("a commit that cannot finish names its last failure when it times out",
          "[tree_commit]") {
  InMemoryObjectStore memory;
  FlakyStore down(memory, 1);  // every request fails
  TreeCommitOptions options;
  options.timeout = absl::Seconds(5);
  auto nodes = MakeNodes(down, 1, options);
  RunOnVirtualClock(nodes, absl::Seconds(10));
  REQUIRE(nodes[0]->done());
  INFO(nodes[0]->outcome().ToString());
  CHECK(absl::IsDeadlineExceeded(nodes[0]->outcome()));
  CHECK(absl::StrContains(nodes[0]->outcome().message(), "its own manifest"));
  CHECK(absl::StrContains(nodes[0]->outcome().message(), "last failure: 503 SlowDown"));
}

}  // namespace
}  // namespace ckpt
