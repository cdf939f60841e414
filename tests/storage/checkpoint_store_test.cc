// Tests of CheckpointStore: name validation before any path is built
// (invariant 7), the save directory's life cycle, and that a checkpoint is
// visible only through a COMMIT that exists and verifies (invariant 1).
#include "storage/checkpoint_store.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "format/manifest_file.h"
#include "storage/durable_file.h"
#include "storage/object_store.h"
#include "storage/posix_object_store.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

using ::ckpt::testing::TempDir;
namespace fs = std::filesystem;

// A store rooted in a subdirectory of a temp dir, so a name that escaped
// the root would land in the (checked) temp dir rather than somewhere real.
struct StoreFixture {
  // The root exists before the store opens it (once, at construction).
  static std::string MakeRoot(const TempDir& tmp) {
    REQUIRE(fs::create_directory(tmp.File("root")));
    return tmp.File("root");
  }

  std::string CommitPath(absl::string_view job,
                         absl::string_view checkpoint) const {
    return absl::StrCat(store.CheckpointDir(job, checkpoint), "/",
                        kCommitFileName);
  }

  // ReadCommit that must succeed.
  v1::CommitRecord MustReadCommit(absl::string_view job,
                                  absl::string_view checkpoint) const {
    absl::StatusOr<v1::CommitRecord> record = store.ReadCommit(job, checkpoint);
    INFO(record.status());
    REQUIRE(record.ok());
    return *std::move(record);
  }

  // How ReadCommit fails (kOk when it does not).
  absl::StatusCode ReadCommitCode(absl::string_view job,
                                  absl::string_view checkpoint) const {
    return store.ReadCommit(job, checkpoint).status().code();
  }

  // List that must succeed.
  std::vector<v1::CheckpointInfo> MustList(absl::string_view job) const {
    absl::StatusOr<std::vector<v1::CheckpointInfo>> list = store.List(job);
    INFO(list.status());
    REQUIRE(list.ok());
    return *std::move(list);
  }

  TempDir tmp;
  std::string root = MakeRoot(tmp);
  CheckpointStore store{root};
};

// Each file of MakeManifest holds a 4096-byte header and a 16-byte chunk
// (the first file's) before the `file_sizes` bytes the test asks for.
constexpr uint64_t kFileBase = 4096 + 16;

v1::Manifest MakeManifest(const std::string& job, const std::string& checkpoint,
                          uint32_t node_id,
                          const std::vector<uint64_t>& file_sizes) {
  v1::Manifest m;
  m.set_format_version(1);
  m.set_job(job);
  m.set_checkpoint(checkpoint);
  m.set_node_id(node_id);
  m.set_nodes(node_id + 1);
  m.set_world_size(4);
  m.add_replica_sets()->add_ranks(0);
  m.set_checksum_block_bytes(1 << 20);
  m.set_created_unix_micros(1700000000000000);
  for (size_t i = 0; i < file_sizes.size(); ++i) {
    v1::DataFile* f = m.add_files();
    f->set_name(absl::StrCat("shard-", i, ".safetensors"));
    f->set_size(kFileBase + file_sizes[i]);
    f->set_data_start(4096);
    f->set_rank(static_cast<uint32_t>(i));
  }
  v1::StoredTensor* t = m.add_tensors();
  t->set_fqn("model.layers.0.weight");
  t->set_dtype(v1::DTYPE_BF16);
  t->add_global_shape(8);
  t->add_local_shape(8);
  t->add_offsets(0);
  t->set_length(16);
  t->set_file_offset(4096);
  t->add_block_xxh3(0x0123456789abcdefULL);
  return m;
}

v1::CommitRecord MakeCommit(const std::string& job,
                            const std::string& checkpoint,
                            const std::vector<uint64_t>& file_sizes,
                            int64_t committed_micros = 1700000000123456) {
  v1::CommitRecord record;
  record.set_format_version(1);
  record.add_node_manifests(CheckpointStore::NodeManifestName(0));
  *record.mutable_index() = MakeManifest(job, checkpoint, 0, file_sizes);
  record.set_committed_unix_micros(committed_micros);
  return record;
}

// Prepares, writes COMMIT and moves LATEST: a complete save.
void Commit(const CheckpointStore& store, const v1::CommitRecord& record) {
  const std::string& job = record.index().job();
  const std::string& checkpoint = record.index().checkpoint();
  REQUIRE(store.PrepareForSave(job, checkpoint, 0).ok());
  REQUIRE(store.WriteCommit(record).ok());
  REQUIRE(store.UpdateLatest(job, checkpoint, record.committed_unix_micros()).ok());
}

void OverwriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  REQUIRE(out.good());
}

std::string MustRead(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadSmallFile(path);
  REQUIRE(bytes.ok());
  return *bytes;
}

bool SameMessage(const google::protobuf::MessageLite& a,
                 const google::protobuf::MessageLite& b) {
  return a.SerializeAsString() == b.SerializeAsString();
}

TEST_CASE(
    "PrepareForSave rejects a job name that would leave the root and "
    "creates nothing",
    "[checkpoint_store]") {
  StoreFixture f;
  for (const char* job : {"../etc", "..", "a/b", "", "x y"}) {
    INFO("job: '" << job << "'");
    CHECK(f.store.PrepareForSave(job, "step-1", 0).code() ==
          absl::StatusCode::kInvalidArgument);
  }
  CHECK(fs::is_empty(f.root));
  CHECK(std::vector<fs::path>(fs::directory_iterator(f.tmp.path()),
                              fs::directory_iterator()) ==
        std::vector<fs::path>{f.root});
}

TEST_CASE(
    "PrepareForSave rejects the reserved checkpoint name 'latest' and "
    "invalid checkpoint names",
    "[checkpoint_store]") {
  StoreFixture f;
  for (const char* checkpoint : {"latest", "../x", "..", "a/b", ""}) {
    INFO("checkpoint: '" << checkpoint << "'");
    CHECK(f.store.PrepareForSave("job", checkpoint, 0).code() ==
          absl::StatusCode::kInvalidArgument);
  }
  CHECK_FALSE(fs::exists(f.store.CheckpointDir("job", "latest")));
}

TEST_CASE("PrepareForSave creates an empty checkpoint directory under its job",
          "[checkpoint_store]") {
  StoreFixture f;
  REQUIRE(f.store.PrepareForSave("job-a", "step-100", 0).ok());
  const std::string dir = f.store.CheckpointDir("job-a", "step-100");
  CHECK(dir == f.root + "/job-a/step-100");
  CHECK(fs::is_directory(dir));
  // Nothing but ckptd's marker.
  CHECK(std::vector<fs::path>(fs::directory_iterator(dir), fs::directory_iterator()) ==
        std::vector<fs::path>{dir + "/" + std::string(kMarkerFileName)});
  CHECK_FALSE(f.store.IsCommitted("job-a", "step-100"));
}

TEST_CASE(
    "PrepareForSave removes only this node's stale manifest and keeps "
    "what other nodes wrote",
    "[checkpoint_store]") {
  StoreFixture f;
  REQUIRE(f.store.PrepareForSave("job", "step-1", 0).ok());
  const std::string dir = f.store.CheckpointDir("job", "step-1");
  REQUIRE(f.store.WriteNodeManifest(MakeManifest("job", "step-1", 0, {10})).ok());
  REQUIRE(f.store.WriteNodeManifest(MakeManifest("job", "step-1", 1, {10})).ok());
  OverwriteFile(dir + "/shard-00002-model-00001-of-00001.safetensors", "node 1");

  REQUIRE(f.store.PrepareForSave("job", "step-1", 0).ok());

  CHECK_FALSE(fs::exists(dir + "/node-0000.manifest"));
  CHECK(fs::exists(dir + "/node-0001.manifest"));
  CHECK(MustRead(dir + "/shard-00002-model-00001-of-00001.safetensors") == "node 1");
}

TEST_CASE("ListNodeManifests lists node ids and ignores temporaries",
          "[checkpoint_store]") {
  StoreFixture f;
  REQUIRE(f.store.PrepareForSave("job", "step-1", 0).ok());
  const std::string dir = f.store.CheckpointDir("job", "step-1");
  REQUIRE(f.store.WriteNodeManifest(MakeManifest("job", "step-1", 2, {1})).ok());
  REQUIRE(f.store.WriteNodeManifest(MakeManifest("job", "step-1", 0, {1})).ok());
  OverwriteFile(dir + "/node-0001.manifest.tmp.77.ab.0", "torn");
  OverwriteFile(dir + "/node-x.manifest", "junk");

  auto ids = f.store.ListNodeManifests("job", "step-1");
  REQUIRE(ids.ok());
  CHECK(*ids == std::vector<uint32_t>{0, 2});
  auto manifest = f.store.ReadNodeManifest("job", "step-1", 2);
  REQUIRE(manifest.ok());
  CHECK(manifest->node_id() == 2);
}

TEST_CASE(
    "RemoveNodePart removes one node's files and manifest, and the "
    "directory only once it is empty",
    "[checkpoint_store]") {
  StoreFixture f;
  REQUIRE(f.store.PrepareForSave("job", "step-1", 0).ok());
  const std::string dir = f.store.CheckpointDir("job", "step-1");
  REQUIRE(f.store.WriteNodeManifest(MakeManifest("job", "step-1", 0, {1})).ok());
  OverwriteFile(dir + "/mine.safetensors", "0");
  OverwriteFile(dir + "/theirs.safetensors", "1");

  REQUIRE(f.store.RemoveNodePart("job", "step-1", 0, {"mine.safetensors"}).ok());
  CHECK_FALSE(fs::exists(dir + "/mine.safetensors"));
  CHECK_FALSE(fs::exists(dir + "/node-0000.manifest"));
  CHECK(fs::exists(dir + "/theirs.safetensors"));

  // The nodes' meeting (storage/tree_local_commit.h) does not keep it: it
  // goes with the last node's files.
  fs::create_directories(dir + "/local-commit/g-0000000");
  OverwriteFile(dir + "/local-commit/g-0000000/node-0000001.manifest", "m");
  REQUIRE(f.store.RemoveNodePart("job", "step-1", 1, {"theirs.safetensors"}).ok());
  CHECK_FALSE(fs::exists(dir));
}

TEST_CASE("RemoveNodePart refuses to touch a committed checkpoint",
          "[checkpoint_store]") {
  StoreFixture f;
  Commit(f.store, MakeCommit("job", "step-1", {1}));
  const std::string dir = f.store.CheckpointDir("job", "step-1");
  OverwriteFile(dir + "/data.safetensors", "x");
  CHECK(f.store.RemoveNodePart("job", "step-1", 0, {"data.safetensors"}).code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(fs::exists(dir + "/data.safetensors"));
}

TEST_CASE("UpdateLatest never moves LATEST back to an older commit",
          "[checkpoint_store]") {
  StoreFixture f;
  Commit(f.store, MakeCommit("job", "step-2", {1}, /*committed_micros=*/2000));
  const v1::CommitRecord older = MakeCommit("job", "step-1", {1}, 1000);
  REQUIRE(f.store.PrepareForSave("job", "step-1", 0).ok());
  REQUIRE(f.store.WriteCommit(older).ok());
  REQUIRE(f.store.UpdateLatest("job", "step-1", 1000).ok());
  auto latest = f.store.ResolveLatest("job");
  REQUIRE(latest.ok());
  CHECK(*latest == "step-2");
}

TEST_CASE("PrepareForSave refuses a committed checkpoint and leaves it intact",
          "[checkpoint_store]") {
  StoreFixture f;
  const v1::CommitRecord record = MakeCommit("job", "step-1", {1000});
  Commit(f.store, record);
  const std::string dir = f.store.CheckpointDir("job", "step-1");
  OverwriteFile(dir + "/shard-0.safetensors", "data");

  CHECK(f.store.PrepareForSave("job", "step-1", 0).code() ==
        absl::StatusCode::kAlreadyExists);

  CHECK(MustRead(dir + "/shard-0.safetensors") == "data");
  CHECK(SameMessage(f.MustReadCommit("job", "step-1"), record));
}

TEST_CASE("WriteNodeManifest writes a framed manifest named after the node",
          "[checkpoint_store]") {
  StoreFixture f;
  REQUIRE(f.store.PrepareForSave("job", "step-1", 0).ok());
  const v1::Manifest manifest = MakeManifest("job", "step-1", 3, {10, 20});
  REQUIRE(f.store.WriteNodeManifest(manifest).ok());

  CHECK(CheckpointStore::NodeManifestName(3) == "node-0003.manifest");
  const std::string path =
      f.store.CheckpointDir("job", "step-1") + "/node-0003.manifest";
  v1::Manifest parsed;
  REQUIRE(ParseFramedMessage(kNodeManifestMagic, MustRead(path), path, &parsed)
              .ok());
  CHECK(SameMessage(parsed, manifest));
  // A node manifest alone does not commit the checkpoint.
  CHECK_FALSE(f.store.IsCommitted("job", "step-1"));
  CHECK(f.ReadCommitCode("job", "step-1") == absl::StatusCode::kNotFound);
}

TEST_CASE(
    "WriteCommit and UpdateLatest round-trip through ReadCommit by name "
    "and by 'latest'",
    "[checkpoint_store]") {
  StoreFixture f;
  const v1::CommitRecord record = MakeCommit("job", "step-1", {1000, 2000});
  REQUIRE(f.store.PrepareForSave("job", "step-1", 0).ok());
  REQUIRE(f.store.WriteNodeManifest(record.index()).ok());
  REQUIRE(f.store.WriteCommit(record).ok());
  CHECK(f.store.IsCommitted("job", "step-1"));
  REQUIRE(f.store.UpdateLatest("job", "step-1", record.committed_unix_micros())
              .ok());

  CHECK(SameMessage(f.MustReadCommit("job", "step-1"), record));
  CHECK(SameMessage(f.MustReadCommit("job", "latest"), record));
  absl::StatusOr<std::string> latest = f.store.ResolveLatest("job");
  REQUIRE(latest.ok());
  CHECK(*latest == "step-1");
}

TEST_CASE("ReadCommit of 'latest' follows LATEST to the newest commit",
          "[checkpoint_store]") {
  StoreFixture f;
  Commit(f.store, MakeCommit("job", "step-1", {1}));
  const v1::CommitRecord second = MakeCommit("job", "step-2", {2});
  Commit(f.store, second);

  const v1::CommitRecord latest = f.MustReadCommit("job", "latest");
  CHECK(latest.index().checkpoint() == "step-2");
  CHECK(SameMessage(latest, second));
}

TEST_CASE("ReadCommit of an uncommitted directory is NotFound",
          "[checkpoint_store]") {
  StoreFixture f;
  REQUIRE(f.store.PrepareForSave("job", "step-1", 0).ok());
  CHECK(f.ReadCommitCode("job", "step-1") == absl::StatusCode::kNotFound);
  CHECK(f.ReadCommitCode("job", "missing") == absl::StatusCode::kNotFound);
}

TEST_CASE("ReadCommit of 'latest' for a job without a commit is NotFound",
          "[checkpoint_store]") {
  StoreFixture f;
  REQUIRE(f.store.PrepareForSave("job", "step-1", 0).ok());
  CHECK(f.ReadCommitCode("job", "latest") == absl::StatusCode::kNotFound);
  CHECK(f.store.ResolveLatest("job").status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(f.ReadCommitCode("nojob", "latest") == absl::StatusCode::kNotFound);
}

TEST_CASE("ReadCommit rejects names that would leave the root",
          "[checkpoint_store]") {
  StoreFixture f;
  CHECK(f.ReadCommitCode("../x", "step-1") ==
        absl::StatusCode::kInvalidArgument);
  CHECK(f.ReadCommitCode("job", "../../x") ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("ReadCommit reports DataLoss for a COMMIT with any one byte flipped",
          "[checkpoint_store]") {
  StoreFixture f;
  Commit(f.store, MakeCommit("job", "step-1", {1000}));
  const std::string path = f.CommitPath("job", "step-1");
  const std::string good = MustRead(path);
  REQUIRE(good.size() > 24);

  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x01);
    OverwriteFile(path, bad);
    const absl::Status status = f.store.ReadCommit("job", "step-1").status();
    INFO("flipped byte " << i << " of " << good.size() << ": " << status);
    CHECK(status.code() == absl::StatusCode::kDataLoss);
  }
  OverwriteFile(path, good);
  CHECK(f.store.ReadCommit("job", "step-1").ok());
}

TEST_CASE("ReadCommit reports DataLoss for a truncated COMMIT",
          "[checkpoint_store]") {
  StoreFixture f;
  Commit(f.store, MakeCommit("job", "step-1", {1000}));
  const std::string path = f.CommitPath("job", "step-1");
  const std::string good = MustRead(path);

  for (size_t length = 0; length < good.size(); ++length) {
    OverwriteFile(path, good.substr(0, length));
    const absl::Status status = f.store.ReadCommit("job", "step-1").status();
    INFO("truncated to " << length << " of " << good.size() << ": " << status);
    CHECK(status.code() == absl::StatusCode::kDataLoss);
  }
}

TEST_CASE("ReadCommit reports DataLoss for a COMMIT with bytes appended",
          "[checkpoint_store]") {
  StoreFixture f;
  Commit(f.store, MakeCommit("job", "step-1", {1000}));
  const std::string path = f.CommitPath("job", "step-1");
  OverwriteFile(path, MustRead(path) + "x");
  CHECK(f.ReadCommitCode("job", "step-1") == absl::StatusCode::kDataLoss);
}

TEST_CASE(
    "List reports committed, uncommitted and latest checkpoints with "
    "their total bytes, sorted by job and name",
    "[checkpoint_store]") {
  StoreFixture f;
  Commit(f.store, MakeCommit("job-b", "step-1", {100, 23}, 11));
  Commit(f.store, MakeCommit("job-a", "step-1", {1000, 2000, 3}, 22));
  Commit(f.store, MakeCommit("job-a", "step-2", {5}, 33));
  REQUIRE(f.store.PrepareForSave("job-a", "step-3", 0).ok());  // crashed save
  // A stray file in the job directory is not a checkpoint.
  OverwriteFile(f.store.JobDir("job-a") + "/notes", "x");

  const std::vector<v1::CheckpointInfo> l = f.MustList("");
  REQUIRE(l.size() == 4);
  CHECK((l[0].job() == "job-a" && l[0].checkpoint() == "step-1"));
  CHECK(l[0].committed());
  CHECK_FALSE(l[0].latest());
  CHECK(l[0].total_bytes() == 3003 + 3 * kFileBase);
  CHECK(l[0].world_size() == 4);
  CHECK(l[0].committed_unix_micros() == 22);

  CHECK((l[1].job() == "job-a" && l[1].checkpoint() == "step-2"));
  CHECK(l[1].committed());
  CHECK(l[1].latest());
  CHECK(l[1].total_bytes() == 5 + kFileBase);
  CHECK(l[1].committed_unix_micros() == 33);

  CHECK((l[2].job() == "job-a" && l[2].checkpoint() == "step-3"));
  CHECK_FALSE(l[2].committed());
  CHECK_FALSE(l[2].latest());
  CHECK(l[2].total_bytes() == 0);

  CHECK((l[3].job() == "job-b" && l[3].checkpoint() == "step-1"));
  CHECK(l[3].committed());
  CHECK(l[3].latest());
  CHECK(l[3].total_bytes() == 123 + 2 * kFileBase);

  const std::vector<v1::CheckpointInfo> only_b = f.MustList("job-b");
  REQUIRE(only_b.size() == 1);
  CHECK(only_b[0].checkpoint() == "step-1");
}

TEST_CASE(
    "List does not report a checkpoint with a damaged COMMIT as "
    "committed",
    "[checkpoint_store]") {
  StoreFixture f;
  Commit(f.store, MakeCommit("job", "step-1", {1000}));
  const std::string path = f.CommitPath("job", "step-1");
  std::string bad = MustRead(path);
  bad.back() = static_cast<char>(bad.back() ^ 0x80);
  OverwriteFile(path, bad);

  const std::vector<v1::CheckpointInfo> list = f.MustList("job");
  REQUIRE(list.size() == 1);
  CHECK_FALSE(list[0].committed());
  CHECK_FALSE(list[0].latest());
}

TEST_CASE(
    "List of a job that does not exist is empty, and of an invalid job "
    "name an error",
    "[checkpoint_store]") {
  StoreFixture f;
  CHECK(f.MustList("nojob").empty());
  CHECK(f.store.List("../x").status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE(
    "The commit protocol's objects are the root's driver's, under the keys "
    "the remote tier gives them",
    "[checkpoint_store]") {
  StoreFixture f;
  const v1::CommitRecord record = MakeCommit("job", "step-1", {10});
  Commit(f.store, record);
  REQUIRE(f.store.WriteNodeManifest(MakeManifest("job", "step-1", 0, {10})).ok());
  absl::StatusOr<std::shared_ptr<PosixObjectStore>> objects = f.store.Objects();
  REQUIRE(objects.ok());
  ObjectStore& driver = **objects;
  absl::StatusOr<std::string> commit = GetSmallObject(driver, "job/step-1/COMMIT", 1 << 20);
  REQUIRE(commit.ok());
  CHECK(*commit == FrameMessage(kCommitMagic, record));
  absl::StatusOr<std::string> latest = GetSmallObject(driver, "job/LATEST", 4096);
  REQUIRE(latest.ok());
  CHECK(*latest == "step-1\n");
  absl::StatusOr<ObjectListing> listing = driver.List("job/step-1/", "/");
  REQUIRE(listing.ok());
  std::vector<std::string> keys;
  for (const ObjectInfo& o : listing->objects) keys.push_back(o.key);
  CHECK(keys == std::vector<std::string>{"job/step-1/.ckptd-checkpoint", "job/step-1/COMMIT",
                                         "job/step-1/node-0000.manifest"});
  // What the driver is told is what the store sees: a COMMIT deleted
  // through it is a checkpoint no longer committed.
  REQUIRE(driver.Delete("job/step-1/COMMIT").ok());
  CHECK_FALSE(f.store.IsCommitted("job", "step-1"));
  CHECK(f.ReadCommitCode("job", "step-1") == absl::StatusCode::kNotFound);
}

TEST_CASE(
    "A manifest, COMMIT or LATEST written after gc removed the checkpoint "
    "fails NotFound and makes no directory",
    "[checkpoint_store]") {
  StoreFixture f;
  REQUIRE(f.store.PrepareForSave("job", "step-1", 0).ok());
  REQUIRE(f.store.DeleteUncommitted("job", "step-1").ok());
  CHECK(f.store.WriteNodeManifest(MakeManifest("job", "step-1", 0, {10})).code() ==
        absl::StatusCode::kNotFound);
  CHECK(f.store.WriteCommit(MakeCommit("job", "step-1", {10})).code() ==
        absl::StatusCode::kNotFound);
  CHECK_FALSE(fs::exists(f.store.CheckpointDir("job", "step-1")));
  // Without the job's directory, LATEST is not made either.
  CHECK(f.store.UpdateLatest("other", "step-1", 1).code() == absl::StatusCode::kNotFound);
  CHECK_FALSE(fs::exists(f.store.JobDir("other")));
  // And listing the manifests of a checkpoint that is gone says so.
  CHECK(f.store.ListNodeManifests("job", "step-1").status().code() ==
        absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ckpt
