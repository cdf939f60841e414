// Startup recovery (storage/startup_recovery.h): what a crashed daemon's
// node leaves in the storage root, and what the next daemon of that node
// removes, repairs and leaves, on one node and on several sharing the root.
// Crash leftovers are planted by hand (support/planted_files.h); committed
// checkpoints and node manifests are written through the store.
#include "storage/startup_recovery.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "storage/checkpoint_store.h"
#include "storage/durable_file.h"
#include "support/committed_checkpoint.h"
#include "support/planted_files.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

using ::ckpt::testing::CommitInStore;
using ::ckpt::testing::ReadBytes;
using ::ckpt::testing::TempDir;
using ::ckpt::testing::WriteBytes;
namespace fs = std::filesystem;

// Tags of temporaries: an earlier daemon of the node under test, and some
// other node's daemon.
constexpr char kEarlierTag[] = "4242.beef";
constexpr char kOtherTag[] = "77.cafe";

struct Fixture {
  static std::string MakeRoot(const TempDir& tmp) {
    REQUIRE(fs::create_directory(tmp.File("root")));
    return tmp.File("root");
  }
  TempDir tmp;
  std::string root = MakeRoot(tmp);
  CheckpointStore store{root};

  std::string Path(const std::string& relative) const {
    return absl::StrCat(root, "/", relative);
  }
  // A committed checkpoint (marker, COMMIT; LATEST moved to it).
  void Commit(const std::string& job, const std::string& name, int64_t micros) {
    CommitInStore(store, job, name, micros);
  }

  // What a node wrote of a save that died: marker, and `files` (data).
  void Uncommitted(const std::string& job, const std::string& name,
                   const std::vector<std::string>& files) {
    REQUIRE(store.PrepareForSave(job, name, 0).ok());
    for (const std::string& f : files) {
      WriteBytes(Path(absl::StrCat(job, "/", name, "/", f)), "data");
    }
  }
  // Node `node` of `nodes` finished its part: its manifest, listing `file`.
  void NodeManifest(const std::string& job, const std::string& name,
                    uint32_t node, uint32_t nodes, const std::string& file) {
    REQUIRE(store.PrepareForSave(job, name, node).ok());
    WriteBytes(Path(absl::StrCat(job, "/", name, "/", file)), "data");
    v1::Manifest m;
    m.set_format_version(1);
    m.set_job(job);
    m.set_checkpoint(name);
    m.set_node_id(node);
    m.set_nodes(nodes);
    m.set_world_size(nodes);
    m.set_checksum_block_bytes(1 << 20);
    m.add_replica_sets()->add_ranks(node);
    v1::DataFile& f = *m.add_files();
    f.set_name(file);
    f.set_size(4096);
    f.set_data_start(4096);
    f.set_replica_set(0);
    f.set_rank(node);
    REQUIRE(store.WriteNodeManifest(m).ok());
  }
  StartupRecovery Recover(uint32_t node_id, uint32_t nodes,
                          std::vector<std::string> tags = {}) {
    absl::StatusOr<StartupRecovery> r = RecoverAtStart(
        store, {.node_id = node_id, .nodes = nodes, .earlier_temp_tags = tags});
    INFO(r.status());
    REQUIRE(r.ok());
    INFO("errors: " << absl::StrJoin(r->errors, "; "));
    CHECK(r->errors.empty());
    return *std::move(r);
  }
  bool Exists(const std::string& relative) const {
    return fs::exists(fs::symlink_status(Path(relative)));
  }
};

std::string Temp(const std::string& target, const std::string& tag, int n = 0) {
  return absl::StrCat(target, ".tmp.", tag, ".", n);
}

TEST_CASE("a temporary's name gives back its target and its writer's tag",
          "[startup_recovery][durable_file]") {
  const std::optional<TemporaryName> own =
      ParseTemporaryName(Temp("COMMIT", TemporaryTag(), 12));
  REQUIRE(own.has_value());
  CHECK(own->target == "COMMIT");
  CHECK(own->tag == TemporaryTag());
  const std::optional<TemporaryName> dotted =
      ParseTemporaryName("node-0003.manifest.tmp.17.a0f.3");
  REQUIRE(dotted.has_value());
  CHECK(dotted->target == "node-0003.manifest");
  CHECK(dotted->tag == "17.a0f");
  for (const char* not_one : {"COMMIT", "COMMIT.tmp", "COMMIT.tmp.1.2",
                              ".tmp.1.a.0", "COMMIT.tmp.x1.a.0",
                              "COMMIT.tmp.1.xyz.0", "COMMIT.tmp.1.a.0b",
                              "COMMIT.temp.1.a.0"}) {
    INFO(not_one);
    CHECK_FALSE(ParseTemporaryName(not_one).has_value());
  }
}

TEST_CASE(
    "startup recovery on a single-node root removes the uncommitted "
    "checkpoints and the temporaries a crash left, repairs LATEST, and keeps "
    "committed checkpoints and what ckptd did not make",
    "[startup_recovery]") {
  Fixture f;
  f.Commit("job", "step-1", 1'000'000);
  f.Commit("job", "step-2", 2'000'000);
  // The crash fell between step-2's COMMIT and LATEST.
  WriteBytes(f.Path("job/LATEST"), "step-1\n");
  // A save that died mid-way, its manifest written or not.
  f.Uncommitted("job", "step-3", {"shard-00001-model-00001-of-00001.safetensors"});
  WriteBytes(f.Path("job/step-3/" + Temp("COMMIT", kOtherTag)), "partial");
  f.Uncommitted("job", "step-4", {"shard-00001-model-00001-of-00001.safetensors"});
  WriteBytes(f.Path("job/step-4/node-0000.manifest"), "whole manifest");
  // Temporaries of a durable write, untagged by any lock (an older daemon).
  const std::vector<std::string> temporaries = {
      "job/" + Temp("LATEST", kOtherTag, 3),
      "job/step-2/" + Temp("node-0000.manifest", kOtherTag, 1),
      "job/step-1/" + Temp("COMMIT", kOtherTag, 2)};
  for (const std::string& t : temporaries) WriteBytes(f.Path(t), "tmp");
  // Not ckptd's: a DCP checkpoint copied in, and a file that only looks
  // like a temporary of a name ckptd never writes.
  fs::create_directories(f.Path("job/from-dcp"));
  WriteBytes(f.Path("job/from-dcp/.metadata"), "dcp");
  WriteBytes(f.Path("job/" + Temp("notes", kOtherTag)), "user's");

  const StartupRecovery r = f.Recover(0, 1);

  CHECK(r.checkpoints_removed == std::vector<std::string>{"job/step-3", "job/step-4"});
  CHECK_FALSE(f.Exists("job/step-3"));
  CHECK_FALSE(f.Exists("job/step-4"));
  std::vector<std::string> expected_temporaries = temporaries;
  expected_temporaries.push_back("job/step-3/" + Temp("COMMIT", kOtherTag));
  std::sort(expected_temporaries.begin(), expected_temporaries.end());
  std::vector<std::string> removed = r.temporaries_removed;
  std::sort(removed.begin(), removed.end());
  CHECK(removed == expected_temporaries);
  for (const std::string& t : temporaries) CHECK_FALSE(f.Exists(t));
  CHECK(r.latest_repaired == std::vector<std::string>{"job: step-1 -> step-2"});
  CHECK(ReadBytes(f.Path("job/LATEST")) == "step-2\n");
  CHECK(f.store.IsCommitted("job", "step-1"));
  CHECK(f.store.IsCommitted("job", "step-2"));
  CHECK(ReadBytes(f.Path("job/from-dcp/.metadata")) == "dcp");
  CHECK(ReadBytes(f.Path("job/" + Temp("notes", kOtherTag))) == "user's");
  CHECK(r.parts_removed.empty());

  // Nothing is left to do the second time.
  const StartupRecovery again = f.Recover(0, 1);
  CHECK(again.temporaries_removed.empty());
  CHECK(again.checkpoints_removed.empty());
  CHECK(again.latest_repaired.empty());
}

TEST_CASE(
    "startup recovery writes a LATEST that is missing, and leaves one that "
    "names the newest committed checkpoint",
    "[startup_recovery]") {
  Fixture f;
  f.Commit("lost", "step-5", 5);
  f.Commit("fine", "step-1", 1);
  f.Commit("fine", "step-2", 2);
  REQUIRE(fs::remove(f.Path("lost/LATEST")));

  const StartupRecovery r = f.Recover(0, 1);

  CHECK(r.latest_repaired == std::vector<std::string>{"lost: none -> step-5"});
  CHECK(ReadBytes(f.Path("lost/LATEST")) == "step-5\n");
  CHECK(ReadBytes(f.Path("fine/LATEST")) == "step-2\n");
}

TEST_CASE(
    "startup recovery on a node of several removes only this node's "
    "temporaries: its own manifest's and those its earlier daemons tagged",
    "[startup_recovery][multi-node]") {
  Fixture f;
  f.Commit("job", "step-1", 1);
  const std::vector<std::string> own = {
      "job/step-1/" + Temp("COMMIT", kEarlierTag),
      "job/" + Temp("LATEST", kEarlierTag),
      "job/step-1/" + Temp("node-0001.manifest", kOtherTag)};
  const std::vector<std::string> others = {
      "job/step-1/" + Temp("COMMIT", kOtherTag),
      "job/" + Temp("LATEST", kOtherTag),
      "job/step-1/" + Temp("node-0000.manifest", kOtherTag),
      "job/step-1/" + Temp(std::string(kMarkerFileName), kOtherTag)};
  for (const std::string& t : own) WriteBytes(f.Path(t), "tmp");
  for (const std::string& t : others) WriteBytes(f.Path(t), "tmp");

  const StartupRecovery r = f.Recover(1, 3, {kEarlierTag});

  std::vector<std::string> removed = r.temporaries_removed;
  std::sort(removed.begin(), removed.end());
  std::vector<std::string> expected = own;
  std::sort(expected.begin(), expected.end());
  CHECK(removed == expected);
  for (const std::string& t : own) CHECK_FALSE(f.Exists(t));
  for (const std::string& t : others) CHECK(f.Exists(t));
}

TEST_CASE(
    "startup recovery on a node of several removes its data files of a "
    "checkpoint it never finished once every other node's manifest names "
    "theirs, and keeps the other nodes' files",
    "[startup_recovery][multi-node]") {
  Fixture f;
  const std::string mine = "shard-00002-model-00001-of-00001.safetensors";
  const std::string theirs = "shard-00001-model-00001-of-00001.safetensors";
  f.Uncommitted("job", "step-1", {mine});
  f.NodeManifest("job", "step-1", 0, 2, theirs);

  const StartupRecovery r = f.Recover(1, 2);

  CHECK(r.parts_removed == std::vector<std::string>{"job/step-1"});
  CHECK(r.checkpoints_removed.empty());
  CHECK_FALSE(f.Exists("job/step-1/" + mine));
  CHECK(f.Exists("job/step-1/" + theirs));
  CHECK(f.Exists("job/step-1/node-0000.manifest"));
  CHECK(f.Exists("job/step-1/" + std::string(kMarkerFileName)));
}

TEST_CASE(
    "startup recovery on a node of several leaves an uncommitted checkpoint "
    "whose part it finished, and one whose files it cannot tell from a "
    "node that has not finished either",
    "[startup_recovery][multi-node]") {
  Fixture f;
  // Node 0 finished; node 1 (this one) too: node 2 may still commit it.
  f.NodeManifest("job", "done-here", 0, 3, "shard-00001-a.safetensors");
  f.NodeManifest("job", "done-here", 1, 3, "shard-00002-a.safetensors");
  // Node 1 (this one) did not finish, and neither did node 2.
  f.NodeManifest("job", "unfinished", 0, 3, "shard-00001-a.safetensors");
  WriteBytes(f.Path("job/unfinished/shard-00002-a.safetensors"), "mine?");
  WriteBytes(f.Path("job/unfinished/shard-00003-a.safetensors"), "node 2's?");

  const StartupRecovery r = f.Recover(1, 3);

  CHECK(r.parts_removed.empty());
  CHECK(r.checkpoints_removed.empty());
  REQUIRE(r.left.size() == 2);
  CHECK_THAT(r.left[0], Catch::StartsWith("job/done-here: this node's part is complete"));
  CHECK_THAT(r.left[1], Catch::StartsWith("job/unfinished: can never commit"));
  CHECK_THAT(r.left[1], Catch::Contains("nodes [2]"));
  CHECK(f.Exists("job/done-here/shard-00002-a.safetensors"));
  CHECK(f.Exists("job/unfinished/shard-00002-a.safetensors"));
  CHECK(f.Exists("job/unfinished/shard-00003-a.safetensors"));
}

TEST_CASE(
    "startup recovery on a single-node root never removes a checkpoint "
    "directory without ckptd's marker, nor one holding another node's "
    "manifest",
    "[startup_recovery][hostile]") {
  Fixture f;
  fs::create_directories(f.Path("job/copied"));
  WriteBytes(f.Path("job/copied/shard-00001-model-00001-of-00001.safetensors"), "x");
  WriteBytes(f.Path("job/copied/node-0000.manifest"), "x");
  f.NodeManifest("job", "shared", 1, 2, "shard-00002-a.safetensors");

  const StartupRecovery r = f.Recover(0, 1);

  CHECK(r.checkpoints_removed.empty());
  CHECK(f.Exists("job/copied/shard-00001-model-00001-of-00001.safetensors"));
  CHECK(f.Exists("job/shared/shard-00002-a.safetensors"));
  REQUIRE(r.left.size() == 1);
  CHECK_THAT(r.left[0], Catch::StartsWith("job/shared: holds the manifests of nodes [1]"));
}

TEST_CASE(
    "startup recovery removes a checkpoint directory that holds only this "
    "node's marker temporary, and keeps every directory holding anything "
    "else or another node's marker temporary",
    "[startup_recovery][hostile]") {
  Fixture f;
  const std::string marker = std::string(kMarkerFileName);
  // What a crash while the marker was being written leaves: the directory
  // and the marker's temporary, nothing else.
  fs::create_directories(f.Path("job/crashed"));
  WriteBytes(f.Path("job/crashed/" + Temp(marker, kOtherTag)), "partial");
  // Not only ckptd's: a user's file beside the temporary, and an empty
  // directory ckptd left no temporary in.
  fs::create_directories(f.Path("job/shared"));
  WriteBytes(f.Path("job/shared/" + Temp(marker, kOtherTag)), "partial");
  WriteBytes(f.Path("job/shared/notes"), "user's");
  fs::create_directories(f.Path("job/empty"));

  const StartupRecovery r = f.Recover(0, 1);

  CHECK(r.empty_directories_removed == std::vector<std::string>{"job/crashed"});
  CHECK_FALSE(f.Exists("job/crashed"));
  CHECK_FALSE(f.Exists("job/shared/" + Temp(marker, kOtherTag)));
  CHECK(ReadBytes(f.Path("job/shared/notes")) == "user's");
  CHECK(f.Exists("job/empty"));
  CHECK(r.checkpoints_removed.empty());
  CHECK_THAT(r.Summary(), Catch::Contains("removed 1 empty checkpoint directories"));
  // The step-2 of a retried save saves into a fresh directory.
  CHECK(f.store.PrepareForSave("job", "crashed", 0).ok());
}

TEST_CASE(
    "startup recovery on a node of several removes an empty checkpoint "
    "directory only after removing its own marker temporary there",
    "[startup_recovery][multi-node]") {
  Fixture f;
  const std::string marker = std::string(kMarkerFileName);
  fs::create_directories(f.Path("job/mine"));
  WriteBytes(f.Path("job/mine/" + Temp(marker, kEarlierTag)), "partial");
  // Another node's marker write, perhaps about to be renamed.
  fs::create_directories(f.Path("job/theirs"));
  WriteBytes(f.Path("job/theirs/" + Temp(marker, kOtherTag)), "partial");

  const StartupRecovery r = f.Recover(1, 2, {kEarlierTag});

  CHECK(r.empty_directories_removed == std::vector<std::string>{"job/mine"});
  CHECK_FALSE(f.Exists("job/mine"));
  CHECK(f.Exists("job/theirs/" + Temp(marker, kOtherTag)));
}

}  // namespace
}  // namespace ckpt
