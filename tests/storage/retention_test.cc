// Retention keeps the newest committed checkpoints, deletes older ones
// COMMIT first, and never deletes what a load is reading, an uncommitted
// checkpoint, or LATEST.
#include "storage/retention.h"

#include <catch2/catch.hpp>
#include <filesystem>

#include "storage/checkpoint_leases.h"
#include "storage/checkpoint_store.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

struct Fixture {
  testing::TempDir tmp;
  CheckpointStore store{tmp.path()};
  CheckpointLeases leases;

  // A committed checkpoint `name` committed at `micros`, with one data file.
  void Commit(const std::string& name, int64_t micros) {
    REQUIRE(store.PrepareForSave("job", name, 0).ok());
    v1::CommitRecord record;
    record.set_format_version(1);
    record.add_node_manifests("node-0000.manifest");
    v1::Manifest& index = *record.mutable_index();
    index.set_format_version(1);
    index.set_job("job");
    index.set_checkpoint(name);
    index.set_nodes(1);
    index.set_world_size(1);
    index.set_checksum_block_bytes(1 << 20);
    index.add_replica_sets()->add_ranks(0);
    v1::DataFile* file = index.add_files();
    file->set_name("data.safetensors");
    file->set_size(4096);
    file->set_data_start(4096);
    record.set_committed_unix_micros(micros);
    REQUIRE(store.WriteCommit(record).ok());
    REQUIRE(store.UpdateLatest("job", name, micros).ok());
  }
  bool Exists(const std::string& name) { return fs::exists(store.CheckpointDir("job", name)); }
};

TEST_CASE("retention keeps the newest N committed checkpoints and deletes the rest",
          "[retention]") {
  Fixture f;
  f.Commit("a", 100);
  f.Commit("b", 200);
  f.Commit("c", 300);
  REQUIRE(f.store.PrepareForSave("job", "in-flight", 0).ok());  // uncommitted

  auto deleted = ApplyRetention(f.store, f.leases, "job", 2);
  REQUIRE(deleted.ok());
  CHECK(*deleted == std::vector<std::string>{"a"});
  CHECK_FALSE(f.Exists("a"));
  CHECK(f.Exists("b"));
  CHECK(f.Exists("c"));
  CHECK(f.Exists("in-flight"));
  auto latest = f.store.ResolveLatest("job");
  REQUIRE(latest.ok());
  CHECK(*latest == "c");
}

TEST_CASE("retention with keep_last 0 deletes nothing", "[retention]") {
  Fixture f;
  f.Commit("a", 100);
  f.Commit("b", 200);
  auto deleted = ApplyRetention(f.store, f.leases, "job", 0);
  REQUIRE(deleted.ok());
  CHECK(deleted->empty());
  CHECK(f.Exists("a"));
}

TEST_CASE("a newer committed generation of a name replaces the older ones, with any "
          "keep_last, and does not count towards it",
          "[retention]") {
  for (uint32_t keep_last : {0u, 1u, 2u}) {
    INFO("keep_last " << keep_last);
    Fixture f;
    f.Commit("other", 50);
    f.Commit("x", 100);
    f.Commit("x~1", 200);
    REQUIRE(f.store.PrepareForSave("job", "x~3", 0).ok());  // in flight: no say yet
    f.Commit("x~2", 300);
    auto deleted = ApplyRetention(f.store, f.leases, "job", keep_last);
    REQUIRE(deleted.ok());
    // Newest first: x~1 (200) before x (100); keep_last 1 keeps x~2 and
    // lets "other" go; 2 keeps both.
    std::vector<std::string> expected{"x~1", "x"};
    if (keep_last == 1) expected.push_back("other");
    CHECK(*deleted == expected);
    CHECK(f.Exists("x~2"));
    CHECK(f.Exists("x~3"));
    CHECK(f.Exists("other") == (keep_last != 1));
  }
}

TEST_CASE("a replaced generation being read stays until a later pass", "[retention]") {
  Fixture f;
  f.Commit("x", 100);
  REQUIRE(f.leases.Acquire("job", "x").ok());
  f.Commit("x~1", 200);
  auto first = ApplyRetention(f.store, f.leases, "job", 0);
  REQUIRE(first.ok());
  CHECK(first->empty());
  CHECK(f.store.IsCommitted("job", "x"));
  f.leases.Release("job", "x");
  auto second = ApplyRetention(f.store, f.leases, "job", 0);
  REQUIRE(second.ok());
  CHECK(*second == std::vector<std::string>{"x"});
}

TEST_CASE("retention skips a checkpoint being read and deletes it on a later pass",
          "[retention]") {
  Fixture f;
  f.Commit("a", 100);
  f.Commit("b", 200);
  REQUIRE(f.leases.Acquire("job", "a").ok());
  auto first = ApplyRetention(f.store, f.leases, "job", 1);
  REQUIRE(first.ok());
  CHECK(first->empty());
  CHECK(f.store.IsCommitted("job", "a"));

  f.leases.Release("job", "a");
  auto second = ApplyRetention(f.store, f.leases, "job", 1);
  REQUIRE(second.ok());
  CHECK(*second == std::vector<std::string>{"a"});
  CHECK_FALSE(f.Exists("a"));
}

TEST_CASE("a checkpoint claimed for deletion cannot be leased", "[retention]") {
  CheckpointLeases leases;
  REQUIRE(leases.ClaimForDeletion("job", "a"));
  CHECK(leases.Acquire("job", "a").code() == absl::StatusCode::kNotFound);
  leases.Deleted("job", "a");
  CHECK(leases.Acquire("job", "a").ok());
  CHECK_FALSE(leases.ClaimForDeletion("job", "a"));
}

TEST_CASE(
    "retention never deletes a committed checkpoint directory ckptd did not "
    "create, and deletes the others",
    "[retention][hostile]") {
  Fixture f;
  f.Commit("a", 100);
  f.Commit("b", 200);
  f.Commit("c", 300);
  // "a" as if copied in by hand from another root: no marker.
  REQUIRE(fs::remove(f.store.CheckpointDir("job", "a") + "/" + std::string(kMarkerFileName)));
  auto deleted = ApplyRetention(f.store, f.leases, "job", 1);
  REQUIRE(deleted.ok());
  CHECK(*deleted == std::vector<std::string>{"b"});
  CHECK(f.Exists("a"));
  CHECK(f.store.IsCommitted("job", "a"));
  CHECK_FALSE(f.Exists("b"));
}

TEST_CASE("DeleteCommitted refuses a directory without ckptd's marker",
          "[retention][hostile]") {
  Fixture f;
  f.Commit("a", 100);
  REQUIRE(fs::remove(f.store.CheckpointDir("job", "a") + "/" + std::string(kMarkerFileName)));
  CHECK(f.store.DeleteCommitted("job", "a").code() == absl::StatusCode::kFailedPrecondition);
  CHECK(f.store.IsCommitted("job", "a"));
}

TEST_CASE("DeleteCommitted makes the checkpoint invisible and removes its files",
          "[retention]") {
  Fixture f;
  f.Commit("a", 100);
  REQUIRE(f.store.DeleteCommitted("job", "a").ok());
  CHECK(f.store.ReadCommit("job", "a").status().code() == absl::StatusCode::kNotFound);
  CHECK_FALSE(f.Exists("a"));
}

}  // namespace
}  // namespace ckpt
