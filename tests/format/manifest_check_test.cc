// Manifests with a valid frame but hostile fields are DataLoss naming the
// field, never a crash, an out-of-range index or a huge allocation
// (issue 9, item 3). Each case starts from a valid manifest and breaks one
// field; the store's readers run the same check (ReadCommit,
// ReadNodeManifest), shown at the end through real framed files.
#include "format/manifest_check.h"

#include <catch2/catch.hpp>
#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "format/manifest_file.h"
#include "storage/checkpoint_store.h"
#include "storage/durable_file.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

// One node, two ranks, one file holding two 32-byte chunks back to back.
v1::Manifest Valid() {
  v1::Manifest m;
  m.set_format_version(1);
  m.set_job("job");
  m.set_checkpoint("step-1");
  m.set_nodes(1);
  m.set_world_size(2);
  m.set_checksum_block_bytes(16);
  v1::ReplicaSet* set = m.add_replica_sets();
  set->add_ranks(0);
  v1::DataFile* f = m.add_files();
  f->set_name("shard-00001-model-00001-of-00001.safetensors");
  f->set_size(4096 + 64);
  f->set_data_start(4096);
  for (int i = 0; i < 2; ++i) {
    v1::StoredTensor* t = m.add_tensors();
    t->set_fqn(absl::StrCat("w", i));
    t->set_dtype(v1::DTYPE_F32);
    t->add_global_shape(8);
    t->add_offsets(0);
    t->add_local_shape(8);
    t->set_file_offset(4096 + 32 * i);
    t->set_length(32);
    t->add_block_xxh3(1);
    t->add_block_xxh3(2);
  }
  v1::StoredBytes* b = m.add_byte_items();
  b->set_fqn("step");
  b->set_data("7");
  b->set_rank(1);
  return m;
}

struct Case {
  const char* what;
  std::function<void(v1::Manifest&)> breaks;
  const char* message;  // part of the error
};

TEST_CASE("ValidateManifest accepts a valid manifest", "[manifest_check]") {
  CHECK(ValidateManifest(Valid(), "m").ok());
}

TEST_CASE("ValidateManifest refuses each hostile field with DataLoss naming it",
          "[manifest_check][hostile]") {
  const std::vector<Case> cases = {
      {"zero block size", [](v1::Manifest& m) { m.set_checksum_block_bytes(0); },
       "checksum block size 0"},
      {"huge block size", [](v1::Manifest& m) { m.set_checksum_block_bytes(uint64_t{1} << 40); },
       "checksum block size"},
      {"format version", [](v1::Manifest& m) { m.set_format_version(7); }, "format version 7"},
      {"job with a slash", [](v1::Manifest& m) { m.set_job("../etc"); }, "job name"},
      {"checkpoint with a slash", [](v1::Manifest& m) { m.set_checkpoint("a/b"); },
       "checkpoint name"},
      {"zero world", [](v1::Manifest& m) { m.set_world_size(0); }, "world size 0"},
      {"zero nodes", [](v1::Manifest& m) { m.set_nodes(0); }, "nodes"},
      {"node past nodes", [](v1::Manifest& m) { m.set_node_id(3); }, "node 3 of 1"},
      {"file name with a slash",
       [](v1::Manifest& m) { m.mutable_files(0)->set_name("../../etc/passwd"); },
       "data file name"},
      {"file name not safetensors",
       [](v1::Manifest& m) { m.mutable_files(0)->set_name("COMMIT"); }, "not a .safetensors"},
      {"file listed twice", [](v1::Manifest& m) { *m.add_files() = m.files(0); },
       "listed twice"},
      {"data start past the end",
       [](v1::Manifest& m) { m.mutable_files(0)->set_data_start(8192); }, "data start 8192"},
      {"replica set index out of range",
       [](v1::Manifest& m) { m.mutable_files(0)->set_replica_set(9); }, "replica set 9"},
      {"replica set of four billion ranks",
       [](v1::Manifest& m) {
         v1::ReplicaSet* s = m.mutable_replica_sets(0);
         s->clear_ranks();
         s->set_first(0);
         s->set_stride(1);
         s->set_count(0xffffffff);
       },
       "does not fit a world of 2"},
      {"replica rank out of range",
       [](v1::Manifest& m) { m.mutable_replica_sets(0)->add_ranks(5); }, "rank 5"},
      {"file index out of range",
       [](v1::Manifest& m) { m.mutable_tensors(1)->set_file_index(7); }, "file index 7"},
      {"bad fqn", [](v1::Manifest& m) { m.mutable_tensors(0)->set_fqn("a\"b"); }, "fqn"},
      {"unknown dtype",
       [](v1::Manifest& m) { m.mutable_tensors(0)->set_dtype(static_cast<v1::DType>(999)); },
       "unknown dtype"},
      {"rank mismatch", [](v1::Manifest& m) { m.mutable_tensors(0)->add_offsets(0); },
       "dimensions"},
      {"chunk past the global shape",
       [](v1::Manifest& m) { m.mutable_tensors(0)->set_offsets(0, 4); }, "past the global size"},
      {"length disagreeing with shape",
       [](v1::Manifest& m) { m.mutable_tensors(0)->set_length(33); }, "length 33"},
      {"size overflowing 64 bits",
       [](v1::Manifest& m) {
         v1::StoredTensor* t = m.mutable_tensors(0);
         t->set_global_shape(0, uint64_t{1} << 62);
         t->set_local_shape(0, uint64_t{1} << 62);
       },
       "overflows"},
      {"bytes past the file end",
       [](v1::Manifest& m) { m.mutable_files(0)->set_size(4096 + 40); }, "outside the data"},
      {"bytes inside the header",
       [](v1::Manifest& m) { m.mutable_tensors(0)->set_file_offset(100); }, "outside the data"},
      {"offset wrapping around",
       [](v1::Manifest& m) { m.mutable_tensors(0)->set_file_offset(~uint64_t{0} - 8); },
       "outside the data"},
      {"too few block checksums",
       [](v1::Manifest& m) { m.mutable_tensors(0)->mutable_block_xxh3()->RemoveLast(); },
       "block checksums"},
      {"overlapping chunks",
       [](v1::Manifest& m) {
         v1::StoredTensor* t = m.mutable_tensors(1);
         t->set_fqn("w0b");
         t->set_file_offset(4096 + 16);
       },
       "overlap"},
      {"a chunk stored twice",
       [](v1::Manifest& m) {
         m.mutable_files(0)->set_size(4096 + 96);
         v1::StoredTensor* t = m.add_tensors();
         *t = m.tensors(0);
         t->set_file_offset(4096 + 64);
       },
       "stored twice"},
      {"chunks of one tensor with different ranks",
       [](v1::Manifest& m) {
         v1::StoredTensor* t = m.mutable_tensors(1);
         t->set_fqn("w0");
         t->add_global_shape(1);
         t->add_offsets(0);
         t->add_local_shape(1);
       },
       "chunks of w0 disagree"},
      {"chunks of one tensor with different dtypes",
       [](v1::Manifest& m) {
         for (int i = 0; i < 2; ++i) {
           v1::StoredTensor* t = m.mutable_tensors(i);
           t->set_fqn("w0");
           t->set_global_shape(0, 16);
           t->set_offsets(0, 8 * i);
         }
         m.mutable_tensors(1)->set_dtype(v1::DTYPE_I32);
       },
       "chunks of w0 disagree"},
      {"byte item of a rank past the world",
       [](v1::Manifest& m) { m.mutable_byte_items(0)->set_rank(2); }, "rank 2"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    v1::Manifest m = Valid();
    c.breaks(m);
    const absl::Status status = ValidateManifest(m, "COMMIT of test");
    CHECK(status.code() == absl::StatusCode::kDataLoss);
    CHECK_THAT(std::string(status.message()), Catch::Contains(c.message));
    CHECK_THAT(std::string(status.message()), Catch::Contains("COMMIT of test"));
  }
}

TEST_CASE("ValidateCommitRecord checks the node manifest names and count",
          "[manifest_check][hostile]") {
  v1::CommitRecord record;
  record.set_format_version(1);
  *record.mutable_index() = Valid();
  record.add_node_manifests("node-0000.manifest");
  CHECK(ValidateCommitRecord(record, "c").ok());
  record.set_node_manifests(0, "../../x");
  CHECK(ValidateCommitRecord(record, "c").code() == absl::StatusCode::kDataLoss);
  record.set_node_manifests(0, "node-0000.manifest");
  record.add_node_manifests("node-0001.manifest");
  CHECK(ValidateCommitRecord(record, "c").code() == absl::StatusCode::kDataLoss);
  record.clear_index();
  record.clear_node_manifests();
  CHECK(ValidateCommitRecord(record, "c").code() == absl::StatusCode::kDataLoss);
}

TEST_CASE(
    "A framed COMMIT or node manifest with hostile fields is DataLoss from "
    "the store's readers and not listed as committed",
    "[manifest_check][hostile]") {
  testing::TempDir tmp;
  CheckpointStore store(tmp.path());
  REQUIRE(store.PrepareForSave("job", "step-1", 0).ok());
  v1::Manifest m = Valid();
  m.set_checksum_block_bytes(0);
  const std::string dir = store.CheckpointDir("job", "step-1");
  REQUIRE(WriteFileDurably(dir, "node-0000.manifest", FrameMessage(kNodeManifestMagic, m)).ok());
  v1::CommitRecord record;
  record.set_format_version(1);
  record.add_node_manifests("node-0000.manifest");
  *record.mutable_index() = m;
  REQUIRE(WriteFileDurably(dir, "COMMIT", FrameMessage(kCommitMagic, record)).ok());

  const auto commit = store.ReadCommit("job", "step-1");
  CHECK(commit.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(commit.status().message()), Catch::Contains("checksum block size 0"));
  CHECK(store.ReadNodeManifest("job", "step-1", 0).status().code() ==
        absl::StatusCode::kDataLoss);
  const auto list = store.List("job");
  REQUIRE(list.ok());
  REQUIRE(list->size() == 1);
  CHECK_FALSE((*list)[0].committed());

  // A valid COMMIT of another checkpoint copied here is refused too.
  record.mutable_index()->set_checksum_block_bytes(16);
  record.mutable_index()->set_checkpoint("step-0");
  REQUIRE(WriteFileDurably(dir, "COMMIT", FrameMessage(kCommitMagic, record)).ok());
  CHECK(store.ReadCommit("job", "step-1").status().code() == absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace ckpt
