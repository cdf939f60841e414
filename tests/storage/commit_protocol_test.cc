// Tests of the commit protocol: MergeNodeManifests is a pure, order-free
// function of the node manifests that refuses replicas that disagree, and
// TryCommit commits exactly when every node manifest is durable, writing the
// same COMMIT bytes whichever node (or how many) gets there.
#include "storage/commit_protocol.h"

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "ckpt/v1/manifest.pb.h"
#include "format/chunk_digest.h"
#include "storage/checkpoint_store.h"
#include "storage/durable_file.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

using ::ckpt::testing::TempDir;
namespace fs = std::filesystem;

constexpr char kJob[] = "job";
constexpr char kCheckpoint[] = "step-100";

std::string NodeFile(uint32_t node) {
  return absl::StrCat("shard-0000", node + 1,
                      "-model-00001-of-00001.safetensors");
}

// A chunk of "w" ([8, 4] F32, two rows per chunk) at row `row`.
v1::StoredTensor Stored(uint64_t row, uint32_t file_index) {
  v1::StoredTensor t;
  t.set_fqn("w");
  t.set_dtype(v1::DTYPE_F32);
  t.add_global_shape(8);
  t.add_global_shape(4);
  t.add_offsets(row);
  t.add_offsets(0);
  t.add_local_shape(2);
  t.add_local_shape(4);
  t.set_file_index(file_index);
  t.set_file_offset(4096);
  t.set_length(32);
  t.add_block_xxh3(0x1000 + row);
  return t;
}

// The replica-set entry a node reports for `chunks` held with `ranks`.
v1::ReplicaSet SetOf(std::vector<uint32_t> ranks,
                     const std::vector<v1::StoredTensor>& chunks) {
  v1::ReplicaSet set;
  EncodeReplicaRanks(ranks, &set);
  set.set_chunk_count(chunks.size());
  std::vector<ChunkIdentity> ids;
  for (const auto& c : chunks) ids.push_back(IdentityOf(c));
  set.set_chunk_list_xxh3(ChunkListDigest(std::move(ids)));
  return set;
}

// Node `node` of a two-node job: one data file holding chunk row 2 * node
// (file_index 0), written at `created` micros.
v1::Manifest NodeManifest(uint32_t node, int64_t created) {
  v1::Manifest m;
  m.set_format_version(1);
  m.set_job(kJob);
  m.set_checkpoint(kCheckpoint);
  m.set_node_id(node);
  m.set_world_size(2);
  m.set_nodes(2);
  m.set_checksum_block_bytes(1 << 20);
  m.set_created_unix_micros(created);
  v1::DataFile* f = m.add_files();
  f->set_name(NodeFile(node));
  f->set_size(4096 + 32);
  f->set_data_start(4096);
  f->set_rank(node);
  f->set_replica_set(0);
  *m.add_tensors() = Stored(2 * node, 0);
  *m.add_replica_sets() = SetOf({node}, {Stored(2 * node, 0)});
  v1::StoredBytes* b = m.add_byte_items();
  b->set_fqn(absl::StrCat("rng.", node));
  b->set_data("seed");
  b->set_rank(node);
  return m;
}

v1::CommitRecord MergeOrFail(std::vector<v1::Manifest> manifests) {
  absl::StatusOr<v1::CommitRecord> record = MergeNodeManifests(std::move(manifests));
  INFO(record.status().ToString());
  REQUIRE(record.ok());
  return *std::move(record);
}

// Both nodes hold chunk row 4 with replica set {0, 1}; its owner, node 1,
// stores `stored` (row 4 unless a test changes it) in a second file.
void ShareChunk(v1::Manifest* m0, v1::Manifest* m1, const v1::StoredTensor& stored) {
  const v1::ReplicaSet shared = SetOf({0, 1}, {Stored(4, 0)});
  *m0->add_replica_sets() = shared;
  *m1->add_replica_sets() = shared;
  v1::DataFile* f = m1->add_files();
  f->set_name("shard-00002-replicas-0123456789abcdef.safetensors");
  f->set_size(4096 + 32);
  f->set_data_start(4096);
  f->set_rank(1);
  f->set_replica_set(1);
  v1::StoredTensor* t = m1->add_tensors();
  *t = stored;
  t->set_file_index(1);
}

// Expects the merge to fail with FailedPrecondition whose message has `text`.
void CheckMergeFails(std::vector<v1::Manifest> manifests, absl::string_view text) {
  const absl::StatusOr<v1::CommitRecord> record =
      MergeNodeManifests(std::move(manifests));
  INFO(record.status().ToString());
  CHECK(record.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::string_view(record.status().message()).find(text) !=
        absl::string_view::npos);
}

// ---------------------------------------------------------------------------

TEST_CASE("Merging concatenates node files in node order and remaps indices",
          "[commit_protocol]") {
  const v1::CommitRecord record =
      MergeOrFail({NodeManifest(0, 1000), NodeManifest(1, 3000)});
  const v1::Manifest& index = record.index();
  CHECK(record.format_version() == 1);
  REQUIRE(record.node_manifests_size() == 2);
  CHECK(record.node_manifests(0) == CheckpointStore::NodeManifestName(0));
  CHECK(record.node_manifests(1) == CheckpointStore::NodeManifestName(1));
  CHECK(index.job() == kJob);
  CHECK(index.checkpoint() == kCheckpoint);
  CHECK(index.world_size() == 2);
  REQUIRE(index.files_size() == 2);
  CHECK(index.files(0).name() == NodeFile(0));
  CHECK(index.files(1).name() == NodeFile(1));
  REQUIRE(index.tensors_size() == 2);
  CHECK(index.tensors(0).offsets(0) == 0);
  CHECK(index.tensors(0).file_index() == 0);
  CHECK(index.tensors(1).offsets(0) == 2);
  CHECK(index.tensors(1).file_index() == 1);
  CHECK(index.byte_items_size() == 2);
  CHECK(index.replica_sets_size() == 2);
}

TEST_CASE("The commit time is the newest node manifest's creation time",
          "[commit_protocol]") {
  CHECK(MergeOrFail({NodeManifest(0, 5000), NodeManifest(1, 3000)})
            .committed_unix_micros() == 5000);
  CHECK(MergeOrFail({NodeManifest(0, 1000), NodeManifest(1, 3000)})
            .committed_unix_micros() == 3000);
}

TEST_CASE("Merging node manifests in any order gives the same bytes",
          "[commit_protocol]") {
  v1::Manifest m0 = NodeManifest(0, 1000);
  v1::Manifest m1 = NodeManifest(1, 3000);
  ShareChunk(&m0, &m1, Stored(4, 1));
  const std::string forward = MergeOrFail({m0, m1}).SerializeAsString();
  const std::string reverse = MergeOrFail({m1, m0}).SerializeAsString();
  CHECK(!forward.empty());
  CHECK(forward == reverse);
}

TEST_CASE("A replicated chunk stored once by its owner merges with one set entry",
          "[commit_protocol]") {
  v1::Manifest m0 = NodeManifest(0, 1000);
  v1::Manifest m1 = NodeManifest(1, 3000);
  ShareChunk(&m0, &m1, Stored(4, 1));
  const v1::CommitRecord record = MergeOrFail({m0, m1});
  const v1::Manifest& index = record.index();
  CHECK(index.tensors_size() == 3);
  REQUIRE(index.replica_sets_size() == 3);  // {0}, {0,1}, {1}
  REQUIRE(index.files_size() == 3);
  // Node 1's replica file points at the merged {0, 1} entry.
  const v1::ReplicaSet& shared = index.replica_sets(index.files(2).replica_set());
  CHECK(DecodeReplicaRanks(shared) == std::vector<uint32_t>{0, 1});
}

TEST_CASE("A replicated chunk that no node stored fails the merge",
          "[commit_protocol]") {
  v1::Manifest m0 = NodeManifest(0, 1000);
  v1::Manifest m1 = NodeManifest(1, 3000);
  ShareChunk(&m0, &m1, Stored(4, 1));
  m1.mutable_tensors()->RemoveLast();
  CheckMergeFails({m0, m1}, "replicas disagree");
}

TEST_CASE("A replicated chunk stored with another shape fails the merge",
          "[commit_protocol]") {
  v1::StoredTensor local = Stored(4, 1);
  local.set_local_shape(0, 1);
  v1::StoredTensor dtype = Stored(4, 1);
  dtype.set_dtype(v1::DTYPE_BF16);
  v1::StoredTensor global = Stored(4, 1);
  global.set_global_shape(0, 16);
  for (const v1::StoredTensor& stored : {local, dtype, global}) {
    v1::Manifest m0 = NodeManifest(0, 1000);
    v1::Manifest m1 = NodeManifest(1, 3000);
    ShareChunk(&m0, &m1, stored);
    CheckMergeFails({m0, m1}, "replicas disagree");
  }
}

TEST_CASE("Replica sets round-trip through their compact and listed encodings",
          "[commit_protocol]") {
  for (const std::vector<uint32_t>& ranks :
       std::vector<std::vector<uint32_t>>{{3}, {0, 8, 16, 24}, {0, 1, 5}, {7, 9}}) {
    v1::ReplicaSet set;
    EncodeReplicaRanks(ranks, &set);
    CHECK(DecodeReplicaRanks(set) == ranks);
  }
  v1::ReplicaSet all;
  std::vector<uint32_t> everyone(100000);
  for (uint32_t r = 0; r < everyone.size(); ++r) everyone[r] = r;
  EncodeReplicaRanks(everyone, &all);
  CHECK(all.ByteSizeLong() < 16);
  CHECK(DecodeReplicaRanks(all) == everyone);
}

TEST_CASE("The merge matches replica sets without decoding them, however many ranks they name",
          "[commit_protocol][hostile]") {
  // Before, each set was decoded into a vector of its ranks: these 4096
  // sets of 2^23 ranks each, a few bytes apiece in the manifest, would have
  // taken 128 GiB.
  v1::Manifest m0 = NodeManifest(0, 1000);
  v1::Manifest m1 = NodeManifest(1, 3000);
  for (v1::Manifest* m : {&m0, &m1}) m->set_world_size(1 << 24);
  for (uint32_t i = 0; i < 4096; ++i) {
    v1::ReplicaSet* set = m0.add_replica_sets();
    set->set_first(i);
    set->set_stride(1);
    set->set_count(1 << 23);
    set->set_chunk_list_xxh3(ChunkListDigest({}));
  }
  // One set that node 0 encodes compactly and node 1 lists is one set.
  *m0.add_replica_sets() = SetOf({0, 1}, {});
  v1::ReplicaSet* listed = m1.add_replica_sets();
  *listed = SetOf({0, 1}, {});
  listed->set_first(0);
  listed->set_stride(0);
  listed->set_count(0);
  listed->add_ranks(0);
  listed->add_ranks(1);
  const v1::CommitRecord record = MergeOrFail({m0, m1});
  CHECK(record.index().replica_sets_size() == 2 + 4096 + 1);
}

TEST_CASE("Nodes that disagree on a tensor's dtype fail the merge rather than "
          "commit an index every reader refuses",
          "[commit_protocol][hostile]") {
  v1::Manifest m0 = NodeManifest(0, 1000);
  v1::Manifest m1 = NodeManifest(1, 3000);
  v1::StoredTensor* t = m1.mutable_tensors(0);
  t->set_dtype(v1::DTYPE_BF16);
  t->set_length(16);
  m1.mutable_files(0)->set_size(4096 + 16);
  *m1.mutable_replica_sets(0) = SetOf({1}, {*t});
  const absl::StatusOr<v1::CommitRecord> record = MergeNodeManifests({m0, m1});
  INFO(record.status().ToString());
  CHECK(record.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(record.status().message()), Catch::Contains("disagree"));
}

TEST_CASE("Nodes that report different chunks for one replica set fail the merge",
          "[commit_protocol]") {
  v1::Manifest m0 = NodeManifest(0, 1000);
  v1::Manifest m1 = NodeManifest(1, 3000);
  ShareChunk(&m0, &m1, Stored(4, 1));
  *m0.mutable_replica_sets(1) = SetOf({0, 1}, {Stored(4, 0), Stored(6, 0)});
  CheckMergeFails({m0, m1}, "hold different chunks");
}

TEST_CASE("A chunk stored by two nodes fails the merge", "[commit_protocol]") {
  v1::Manifest m1 = NodeManifest(1, 3000);
  *m1.mutable_tensors(0) = Stored(0, 0);  // node 0 also stores row 0
  CheckMergeFails({NodeManifest(0, 1000), m1}, "stored twice");
}

TEST_CASE("Node manifests that disagree on the job's shape fail the merge",
          "[commit_protocol]") {
  v1::Manifest world = NodeManifest(1, 3000);
  world.set_world_size(4);
  CheckMergeFails({NodeManifest(0, 1000), world}, "does not match");

  v1::Manifest nodes = NodeManifest(1, 3000);
  nodes.set_nodes(3);
  CheckMergeFails({NodeManifest(0, 1000), nodes}, "does not match");
}

TEST_CASE("A data file name written by two nodes fails the merge",
          "[commit_protocol]") {
  v1::Manifest m1 = NodeManifest(1, 3000);
  m1.mutable_files(0)->set_name(NodeFile(0));
  CheckMergeFails({NodeManifest(0, 1000), m1}, "written by two nodes");
}

// ---------------------------------------------------------------------------

struct StoreFixture {
  std::string CommitPath() const {
    return absl::StrCat(store.CheckpointDir(kJob, kCheckpoint), "/",
                        kCommitFileName);
  }
  std::string MustReadCommitBytes() const {
    absl::StatusOr<std::string> bytes = ReadSmallFile(CommitPath());
    INFO(bytes.status().ToString());
    REQUIRE(bytes.ok());
    return *std::move(bytes);
  }
  bool MustTryCommit() {
    absl::StatusOr<bool> committed = protocol.TryCommit(kJob, kCheckpoint, 2);
    INFO(committed.status().ToString());
    REQUIRE(committed.ok());
    return *committed;
  }
  ino_t CommitInode() const {
    struct stat st {};
    REQUIRE(::stat(CommitPath().c_str(), &st) == 0);
    return st.st_ino;
  }

  TempDir tmp;
  CheckpointStore store{tmp.path()};
  CommitProtocol protocol{&store};
};

TEST_CASE("TryCommit commits once every node manifest is durable",
          "[commit_protocol]") {
  StoreFixture f;
  const v1::Manifest m0 = NodeManifest(0, 1000);
  const v1::Manifest m1 = NodeManifest(1, 3000);
  REQUIRE(f.store.PrepareForSave(kJob, kCheckpoint, 0).ok());
  REQUIRE(f.store.PrepareForSave(kJob, kCheckpoint, 1).ok());

  REQUIRE(f.store.WriteNodeManifest(m0).ok());
  CHECK_FALSE(f.MustTryCommit());
  CHECK_FALSE(fs::exists(f.CommitPath()));
  CHECK_FALSE(f.store.IsCommitted(kJob, kCheckpoint));
  CHECK(f.store.ResolveLatest(kJob).status().code() ==
        absl::StatusCode::kNotFound);

  REQUIRE(f.store.WriteNodeManifest(m1).ok());
  CHECK(f.MustTryCommit());
  CHECK(fs::exists(f.CommitPath()));
  CHECK(f.store.IsCommitted(kJob, kCheckpoint));
  const absl::StatusOr<v1::CommitRecord> read = f.store.ReadCommit(kJob, kCheckpoint);
  INFO(read.status().ToString());
  REQUIRE(read.ok());
  CHECK(read->SerializeAsString() == MergeOrFail({m0, m1}).SerializeAsString());
  const absl::StatusOr<std::string> latest = f.store.ResolveLatest(kJob);
  REQUIRE(latest.ok());
  CHECK(*latest == kCheckpoint);
}

TEST_CASE("TryCommit on a committed checkpoint returns true without rewriting",
          "[commit_protocol]") {
  StoreFixture f;
  REQUIRE(f.store.PrepareForSave(kJob, kCheckpoint, 0).ok());
  REQUIRE(f.store.PrepareForSave(kJob, kCheckpoint, 1).ok());
  REQUIRE(f.store.WriteNodeManifest(NodeManifest(0, 1000)).ok());
  REQUIRE(f.store.WriteNodeManifest(NodeManifest(1, 3000)).ok());
  REQUIRE(f.MustTryCommit());
  const ino_t inode = f.CommitInode();
  const std::string bytes = f.MustReadCommitBytes();

  CHECK(f.MustTryCommit());
  // COMMIT is replaced by a rename when written, so an unchanged inode means
  // it was not written again.
  CHECK(f.CommitInode() == inode);
  CHECK(f.MustReadCommitBytes() == bytes);
}

TEST_CASE("Two committers of the same checkpoint write the same COMMIT bytes",
          "[commit_protocol]") {
  StoreFixture f;
  REQUIRE(f.store.PrepareForSave(kJob, kCheckpoint, 0).ok());
  REQUIRE(f.store.PrepareForSave(kJob, kCheckpoint, 1).ok());
  v1::Manifest m0 = NodeManifest(0, 1000);
  v1::Manifest m1 = NodeManifest(1, 3000);
  ShareChunk(&m0, &m1, Stored(4, 1));
  REQUIRE(f.store.WriteNodeManifest(m0).ok());
  REQUIRE(f.store.WriteNodeManifest(m1).ok());
  REQUIRE(f.MustTryCommit());
  const std::string first = f.MustReadCommitBytes();

  // The second committer, which saw every manifest before the first's COMMIT
  // appeared.
  REQUIRE(fs::remove(f.CommitPath()));
  REQUIRE(f.MustTryCommit());
  CHECK(f.MustReadCommitBytes() == first);
  const absl::StatusOr<std::string> latest = f.store.ResolveLatest(kJob);
  REQUIRE(latest.ok());
  CHECK(*latest == kCheckpoint);
}

}  // namespace
}  // namespace ckpt

namespace ckpt {
namespace {

TEST_CASE("A node that finds its checkpoint committed by another moves LATEST before it "
          "reports the commit (the committer may not have yet)",
          "[commit_protocol]") {
  StoreFixture f;
  REQUIRE(f.store.PrepareForSave(kJob, kCheckpoint, 0).ok());
  REQUIRE(f.store.PrepareForSave(kJob, kCheckpoint, 1).ok());
  const v1::Manifest m0 = NodeManifest(0, 1000);
  const v1::Manifest m1 = NodeManifest(1, 3000);
  REQUIRE(f.store.WriteNodeManifest(m0).ok());
  REQUIRE(f.store.WriteNodeManifest(m1).ok());
  // The committer wrote COMMIT and stopped there (LATEST still to come).
  absl::StatusOr<v1::CommitRecord> record = MergeNodeManifests({m0, m1});
  REQUIRE(record.ok());
  REQUIRE(f.store.WriteCommit(*record).ok());
  REQUIRE(absl::IsNotFound(f.store.ResolveLatest(kJob).status()));

  CHECK(f.MustTryCommit());
  const absl::StatusOr<std::string> latest = f.store.ResolveLatest(kJob);
  INFO(latest.status().ToString());
  REQUIRE(latest.ok());
  CHECK(*latest == kCheckpoint);
}

}  // namespace
}  // namespace ckpt
