// Retention on both tiers with the remote tier on: local retention
// (--keep_last) never takes a checkpoint whose upload has not ended (the
// upload's lease), and the remote tier's own retention (--remote_keep_last)
// runs on the node that moves remote LATEST, after its commit.
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "format/chunk_digest.h"
#include "storage/checkpoint_leases.h"
#include "storage/checkpoint_store.h"
#include "storage/commit_protocol.h"
#include "storage/in_memory_object_store.h"
#include "storage/remote_tier.h"
#include "storage/retention.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

constexpr char kJob[] = "job";
constexpr uint64_t kFileSize = 3 << 20;

// A one-node, one-rank manifest of `checkpoint`: one data file of
// kFileSize bytes holding one small tensor.
v1::Manifest NodeManifest(const std::string& checkpoint, int64_t created) {
  v1::Manifest m;
  m.set_format_version(1);
  m.set_job(kJob);
  m.set_checkpoint(checkpoint);
  m.set_node_id(0);
  m.set_world_size(1);
  m.set_nodes(1);
  m.set_checksum_block_bytes(1 << 20);
  m.set_created_unix_micros(created);
  v1::DataFile* file = m.add_files();
  file->set_name("shard-0.safetensors");
  file->set_size(kFileSize);
  file->set_data_start(4096);
  file->set_rank(0);
  file->set_replica_set(0);
  v1::StoredTensor* t = m.add_tensors();
  t->set_fqn("w");
  t->set_dtype(v1::DTYPE_F32);
  t->add_global_shape(1);
  t->add_global_shape(4);
  t->add_offsets(0);
  t->add_offsets(0);
  t->add_local_shape(1);
  t->add_local_shape(4);
  t->set_file_index(0);
  t->set_file_offset(4096);
  t->set_length(16);
  t->add_block_xxh3(0x5eed0000);
  v1::ReplicaSet* set = m.add_replica_sets();
  const uint32_t ranks[] = {0};
  EncodeReplicaRanks(ranks, set);
  set->set_chunk_count(1);
  set->set_chunk_list_xxh3(ChunkListDigest({IdentityOf(*t)}));
  return m;
}

// One node's local root, with checkpoints committed in it by Commit.
struct LocalRoot {
  // Commits `name` in the root: one data file of kFileSize bytes.
  void Commit(const std::string& name, int64_t created) {
    REQUIRE(store.PrepareForSave(kJob, name, 0).ok());
    const v1::Manifest manifest = NodeManifest(name, created);
    std::string bytes(kFileSize, '\0');
    std::mt19937 random(static_cast<uint32_t>(created));
    for (char& c : bytes) c = static_cast<char>(random());
    const std::string path =
        absl::StrCat(store.CheckpointDir(kJob, name), "/", manifest.files(0).name());
    std::FILE* f = std::fopen(path.c_str(), "wb");
    REQUIRE(f != nullptr);
    REQUIRE(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
    REQUIRE(std::fclose(f) == 0);
    REQUIRE(store.WriteNodeManifest(manifest).ok());
    absl::StatusOr<bool> committed = CommitProtocol(&store).TryCommit(kJob, name, 1);
    REQUIRE(committed.ok());
    REQUIRE(*committed);
    REQUIRE(store.UpdateLatest(kJob, name, absl::ToUnixMicros(absl::Now())).ok());
  }
  bool Has(const std::string& name) const {
    absl::StatusOr<v1::CommitRecord> commit = store.ReadCommit(kJob, name);
    return commit.ok();
  }

  testing::TempDir tmp;
  CheckpointStore store{tmp.path()};
  CheckpointLeases leases;
};

RemoteTierOptions OneNode() {
  RemoteTierOptions options;
  options.part_size = 1 << 20;
  options.commit.poll_interval = absl::Milliseconds(20);
  options.upload_timeout = absl::Seconds(20);
  return options;
}

bool RemoteHas(ObjectStore& store, const std::string& name) {
  absl::StatusOr<ObjectListing> listing = store.List(absl::StrCat(kJob, "/", name, "/"));
  REQUIRE(listing.ok());
  return !listing->objects.empty();
}

TEST_CASE("local keep_last 1 keeps the older local checkpoint until its slow remote upload ends",
          "[remote_tier][retention]") {
  LocalRoot local;
  local.Commit("step-1", 1'000'000);
  auto remote = std::make_shared<InMemoryObjectStore>();
  RemoteTierOptions options = OneNode();
  options.max_bytes_per_second = 2 << 20;  // 3 MiB: about half a second
  RemoteTier tier(options, &local.store, nullptr, &local.leases, remote);
  REQUIRE(tier.Enqueue(kJob, "step-1").ok());
  local.Commit("step-2", 2'000'000);

  // step-1 is beyond keep_last 1, but its upload holds it.
  absl::StatusOr<std::vector<std::string>> deleted =
      ApplyRetention(local.store, local.leases, kJob, 1);
  REQUIRE(deleted.ok());
  CHECK(deleted->empty());
  CHECK(local.Has("step-1"));

  std::optional<RemoteProgress> p = tier.WaitFor(kJob, "step-1", absl::Seconds(20));
  REQUIRE(p.has_value());
  INFO(p->error);
  REQUIRE(p->state == RemoteState::kCommitted);
  // Uploaded whole from the local file that retention kept.
  CHECK(p->bytes_uploaded == kFileSize);
  deleted = ApplyRetention(local.store, local.leases, kJob, 1);
  REQUIRE(deleted.ok());
  CHECK(*deleted == std::vector<std::string>{"step-1"});
  CHECK_FALSE(local.Has("step-1"));
  CHECK(local.Has("step-2"));
}

TEST_CASE("the node that moves remote LATEST deletes the remote checkpoints beyond "
          "remote_keep_last after its commit, and the local ones stay",
          "[remote_tier][retention]") {
  LocalRoot local;
  auto remote = std::make_shared<InMemoryObjectStore>();
  RemoteTierOptions options = OneNode();
  options.retention.keep_last = 2;
  RemoteTier tier(options, &local.store, nullptr, &local.leases, remote);
  const std::vector<std::string> names = {"step-1", "step-2", "step-3", "step-4"};
  for (size_t i = 0; i < names.size(); ++i) {
    local.Commit(names[i], static_cast<int64_t>(i + 1) * 60'000'000);
    REQUIRE(tier.Enqueue(kJob, names[i]).ok());
    std::optional<RemoteProgress> p = tier.WaitFor(kJob, names[i], absl::Seconds(20));
    REQUIRE(p.has_value());
    INFO(p->error);
    REQUIRE(p->state == RemoteState::kCommitted);
  }
  absl::StatusOr<RemoteLatest> latest = tier.ReadLatest(kJob);
  REQUIRE(latest.ok());
  CHECK(latest->checkpoint == "step-4");
  CHECK_FALSE(RemoteHas(*remote, "step-1"));
  CHECK_FALSE(RemoteHas(*remote, "step-2"));
  CHECK(tier.ReadCommit(kJob, "step-3").ok());
  CHECK(tier.ReadCommit(kJob, "step-4").ok());
  for (const std::string& name : names) CHECK(local.Has(name));

  SECTION("a tier that starts finishes a remote delete an earlier daemon cut short, and "
          "does not upload again what retention deleted") {
    // step-2 as a crash left it after its COMMIT and manifest went.
    REQUIRE(remote->Put(absl::StrCat(kJob, "/step-2/DELETING"), "").ok());
    REQUIRE(remote->Put(absl::StrCat(kJob, "/step-2/shard-0.safetensors"), "x").ok());
    tier.Stop();
    RemoteTier restarted(options, &local.store, nullptr, &local.leases, remote);
    restarted.ResumeUnfinished();
    const absl::Time end = absl::Now() + absl::Seconds(10);
    while (RemoteHas(*remote, "step-2") && absl::Now() < end) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    CHECK_FALSE(RemoteHas(*remote, "step-2"));
    // step-1 and step-2, committed locally only, are older than remote
    // LATEST: not uploaded again.
    CHECK(restarted.Progress().empty());
    CHECK_FALSE(RemoteHas(*remote, "step-1"));
    CHECK(tier.ReadCommit(kJob, "step-3").ok());
    CHECK(tier.ReadCommit(kJob, "step-4").ok());
  }
}

}  // namespace
}  // namespace ckpt
