// A crafted node manifest in a multi-node commit: the merge itself, in a
// checkpoint directory ckptd made (its marker present), with node 0's
// genuine manifest written by the store and node 1's planted as raw framed
// bytes, as a hostile or broken peer on the shared root would leave it.
//
// What each crafted manifest can no longer do:
//  - claim a chunk node 0 stored (the merge refuses; no COMMIT);
//  - date itself in the future: the commit time is the newest manifest's,
//    and LATEST, retention, startup recovery and the remote tier order
//    checkpoints by it, so a manifest of the year 3000 kept its checkpoint
//    "latest" for ever (found here: LATEST never moved again). A manifest
//    dated past the committer's clock plus kMaxNodeClockSkew fails the
//    commit;
//  - make the merged COMMIT larger than a reader takes, though each
//    manifest alone is within it (found here: the COMMIT was written, the
//    checkpoint counted as committed and LATEST moved to it, and no reader
//    could open it). The bound is lowered in the test, so that it needs
//    kilobytes instead of 256 MB.
#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ckpt/v1/manifest.pb.h"
#include "format/chunk_digest.h"
#include "format/manifest_file.h"
#include "storage/checkpoint_store.h"
#include "storage/commit_protocol.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

using ::ckpt::testing::TempDir;
namespace fs = std::filesystem;

constexpr char kJob[] = "job";

int64_t NowMicros() { return absl::ToUnixMicros(absl::Now()); }

// A chunk of "w" ([8, 4] F32, two rows per chunk) at row `row`.
v1::StoredTensor Chunk(uint64_t row) {
  v1::StoredTensor t;
  t.set_fqn("w");
  t.set_dtype(v1::DTYPE_F32);
  t.add_global_shape(8);
  t.add_global_shape(4);
  t.add_offsets(row);
  t.add_offsets(0);
  t.add_local_shape(2);
  t.add_local_shape(4);
  t.set_file_index(0);
  t.set_file_offset(4096);
  t.set_length(32);
  t.add_block_xxh3(0x1000 + row);
  return t;
}

// Node `node` of a two-node, two-rank job: rank `node`'s file holding the
// chunk at `row`, and `padding` bytes of byte item.
v1::Manifest NodeManifest(const std::string& checkpoint, uint32_t node, uint64_t row,
                          int64_t created, size_t padding = 4) {
  v1::Manifest m;
  m.set_format_version(1);
  m.set_job(kJob);
  m.set_checkpoint(checkpoint);
  m.set_node_id(node);
  m.set_world_size(2);
  m.set_nodes(2);
  m.set_checksum_block_bytes(1 << 20);
  m.set_created_unix_micros(created);
  v1::DataFile* f = m.add_files();
  f->set_name(absl::StrCat("shard-0000", node + 1, "-model-00001-of-00001.safetensors"));
  f->set_size(4096 + 32);
  f->set_data_start(4096);
  f->set_rank(node);
  f->set_replica_set(0);
  *m.add_tensors() = Chunk(row);
  v1::ReplicaSet* set = m.add_replica_sets();
  EncodeReplicaRanks({node}, set);
  set->set_chunk_count(1);
  set->set_chunk_list_xxh3(ChunkListDigest({IdentityOf(Chunk(row))}));
  v1::StoredBytes* b = m.add_byte_items();
  b->set_fqn(absl::StrCat("state.", node));
  b->set_data(std::string(padding, 's'));
  b->set_rank(node);
  return m;
}

struct TwoNodes {
  // Prepares `checkpoint` (the marker, as node 0's save makes it) and
  // writes node 0's genuine manifest through the store.
  void Node0(const std::string& checkpoint, int64_t created, size_t padding = 4) {
    REQUIRE(store.PrepareForSave(kJob, checkpoint, 0).ok());
    REQUIRE(fs::exists(absl::StrCat(store.CheckpointDir(kJob, checkpoint), "/",
                                    kMarkerFileName)));
    const absl::Status written =
        store.WriteNodeManifest(NodeManifest(checkpoint, 0, 0, created, padding));
    INFO(written);
    REQUIRE(written.ok());
  }
  // Plants node 1's manifest as framed bytes, replacing any there; returns
  // its size.
  uint64_t Plant(const v1::Manifest& m) {
    const std::string path = absl::StrCat(store.CheckpointDir(kJob, m.checkpoint()), "/",
                                          CheckpointStore::NodeManifestName(1));
    const std::string bytes = FrameMessage(kNodeManifestMagic, m);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    REQUIRE(out.good());
    return bytes.size();
  }
  bool Committed(const std::string& checkpoint) const {
    return fs::exists(
        absl::StrCat(store.CheckpointDir(kJob, checkpoint), "/", kCommitFileName));
  }
  std::string Latest() const {
    const absl::StatusOr<std::string> latest = store.ResolveLatest(kJob);
    return latest.ok() ? *latest : latest.status().ToString();
  }
  // Commits `checkpoint` with genuine manifests of both nodes.
  void CommitGenuine(const std::string& checkpoint) {
    Node0(checkpoint, NowMicros());
    Plant(NodeManifest(checkpoint, 1, 2, NowMicros()));
    const absl::StatusOr<bool> committed = CommitProtocol(&store).TryCommit(kJob, checkpoint, 2);
    INFO(committed.status());
    REQUIRE(committed.ok());
    REQUIRE(*committed);
  }

  TempDir tmp;
  CheckpointStore store{tmp.path()};
};

TEST_CASE(
    "A crafted node manifest that claims a chunk another node stored fails "
    "the commit: no COMMIT, and LATEST stays on the checkpoint before",
    "[commit_protocol][hostile]") {
  TwoNodes nodes;
  nodes.CommitGenuine("step-1");
  nodes.Node0("step-2", NowMicros());
  // Node 1 says it stored row 0, node 0's chunk, in its own file.
  nodes.Plant(NodeManifest("step-2", 1, 0, NowMicros()));
  const absl::StatusOr<bool> committed =
      CommitProtocol(&nodes.store).TryCommit(kJob, "step-2", 2);
  INFO(committed.status());
  CHECK(committed.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(committed.status().message()), Catch::Contains("stored twice"));
  CHECK_FALSE(nodes.Committed("step-2"));
  CHECK(nodes.Latest() == "step-1");
}

TEST_CASE(
    "A crafted node manifest dated past the committer's clock and its "
    "allowed skew fails the commit, so that it cannot hold LATEST for ever, "
    "and one within the skew commits",
    "[commit_protocol][hostile]") {
  TwoNodes nodes;
  nodes.CommitGenuine("step-1");
  nodes.Node0("step-2", NowMicros());
  const int64_t year_3000 = absl::ToUnixMicros(
      absl::FromCivil(absl::CivilSecond(3000, 1, 1, 0, 0, 0), absl::UTCTimeZone()));
  const int64_t just_past_skew =
      absl::ToUnixMicros(absl::Now() + kMaxNodeClockSkew + absl::Minutes(5));
  for (int64_t created : {year_3000, just_past_skew}) {
    nodes.Plant(NodeManifest("step-2", 1, 2, created));
    const absl::StatusOr<bool> committed =
        CommitProtocol(&nodes.store).TryCommit(kJob, "step-2", 2);
    INFO(committed.status());
    CHECK(committed.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK_THAT(std::string(committed.status().message()),
               Catch::Contains("node manifest 1 of job/step-2 was created at"));
    CHECK_FALSE(nodes.Committed("step-2"));
    CHECK(nodes.Latest() == "step-1");
  }
  // A peer whose clock runs ten minutes ahead still commits, and the next
  // checkpoint, a little over ten minutes later by that clock, moves LATEST
  // past it (here: dated later directly).
  const int64_t ahead = absl::ToUnixMicros(absl::Now() + absl::Minutes(10));
  nodes.Plant(NodeManifest("step-2", 1, 2, ahead));
  const absl::StatusOr<bool> committed =
      CommitProtocol(&nodes.store).TryCommit(kJob, "step-2", 2);
  INFO(committed.status());
  REQUIRE(committed.ok());
  CHECK(*committed);
  CHECK(nodes.Latest() == "step-2");
  nodes.Node0("step-3", ahead + 1);
  nodes.Plant(NodeManifest("step-3", 1, 2, ahead + 2));
  const absl::StatusOr<bool> next = CommitProtocol(&nodes.store).TryCommit(kJob, "step-3", 2);
  INFO(next.status());
  REQUIRE(next.ok());
  CHECK(nodes.Latest() == "step-3");
}

TEST_CASE(
    "Node manifests each within the size a reader takes whose merge is not "
    "fail the commit, rather than write a COMMIT no reader could open",
    "[commit_protocol][hostile]") {
  // A reader's bound of 64 KiB; each manifest carries 40 KiB of byte item.
  constexpr uint64_t kLimit = 64 << 10;
  constexpr size_t kPadding = 40 << 10;
  TwoNodes nodes;
  nodes.CommitGenuine("step-1");
  nodes.Node0("step-2", NowMicros(), kPadding);
  const uint64_t planted = nodes.Plant(NodeManifest("step-2", 1, 2, NowMicros(), kPadding));
  CHECK(planted < kLimit);
  const absl::StatusOr<bool> committed =
      CommitProtocol(&nodes.store, DefaultFileOps(), kLimit).TryCommit(kJob, "step-2", 2);
  INFO(committed.status());
  CHECK(committed.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(committed.status().message()),
             Catch::Contains("more than the 65536 a reader takes"));
  CHECK_FALSE(nodes.Committed("step-2"));
  CHECK(nodes.Latest() == "step-1");
  // At the real bound the same manifests commit, and the COMMIT reads back.
  const absl::StatusOr<bool> at_real_bound =
      CommitProtocol(&nodes.store).TryCommit(kJob, "step-2", 2);
  INFO(at_real_bound.status());
  REQUIRE(at_real_bound.ok());
  CHECK(*at_real_bound);
  const absl::StatusOr<v1::CommitRecord> read = nodes.store.ReadCommit(kJob, "step-2");
  INFO(read.status());
  REQUIRE(read.ok());
  CHECK(read->index().byte_items_size() == 2);
  CHECK(nodes.Latest() == "step-2");
}

}  // namespace
}  // namespace ckpt
