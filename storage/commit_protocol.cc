#include "storage/commit_protocol.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status.h"
#include "format/chunk_digest.h"
#include "format/manifest_check.h"
#include "format/manifest_file.h"

namespace ckpt {
namespace {

std::string ChunkName(absl::string_view fqn,
                      const google::protobuf::RepeatedField<uint64_t>& offsets) {
  return absl::StrCat(fqn, "@[", absl::StrJoin(offsets, ","), "]");
}

// A replica set's identity without decoding its ranks: as a writer encodes
// them (EncodeReplicaRanks: first/stride/count when they step evenly, else
// listed). Decoded, a set of count N takes 4N bytes however few the
// manifest spends on it, so a node manifest of a thousand small sets of
// millions of ranks each would make the merge allocate gigabytes (found by
// fuzz/commit_record_fuzzer.cc); this key is no larger than the manifest.
using ReplicaSetKey = std::tuple<std::vector<uint32_t>, uint32_t, uint32_t, uint32_t>;
ReplicaSetKey KeyOf(const v1::ReplicaSet& set) {
  v1::ReplicaSet canonical;
  if (set.count() == 0) {
    EncodeReplicaRanks({set.ranks().data(), static_cast<size_t>(set.ranks_size())},
                       &canonical);
  } else {
    canonical.set_first(set.first());
    canonical.set_stride(set.count() == 1 ? 1 : set.stride());  // as encoded
    canonical.set_count(set.count());
  }
  return {{canonical.ranks().begin(), canonical.ranks().end()}, canonical.first(),
          canonical.stride(), canonical.count()};
}

}  // namespace

absl::StatusOr<v1::CommitRecord> MergeNodeManifests(
    std::vector<v1::Manifest> manifests, uint64_t max_record_bytes,
    int64_t latest_creation_micros) {
  if (manifests.empty()) return absl::InvalidArgumentError("no node manifests");
  std::sort(manifests.begin(), manifests.end(),
            [](const v1::Manifest& a, const v1::Manifest& b) {
              return a.node_id() < b.node_id();
            });
  const v1::Manifest& first = manifests.front();
  v1::CommitRecord record;
  record.set_format_version(1);
  v1::Manifest& index = *record.mutable_index();
  index.set_format_version(1);
  index.set_job(first.job());
  index.set_checkpoint(first.checkpoint());
  index.set_world_size(first.world_size());
  index.set_nodes(first.nodes());
  index.set_checksum_block_bytes(first.checksum_block_bytes());
  int64_t newest = 0;
  std::set<std::string> file_names, chunks;
  std::map<ReplicaSetKey, uint32_t> set_index;           // set -> index
  std::map<uint32_t, uint32_t> set_reported_by;         // index -> node
  for (size_t n = 0; n < manifests.size(); ++n) {
    const v1::Manifest& m = manifests[n];
    if (m.node_id() != n || m.job() != first.job() ||
        m.checkpoint() != first.checkpoint() ||
        m.world_size() != first.world_size() || m.nodes() != first.nodes() ||
        m.checksum_block_bytes() != first.checksum_block_bytes()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "node manifest ", m.node_id(), " of ", m.job(), "/", m.checkpoint(),
          " does not match node ", first.node_id(),
          " (job, checkpoint, world size, node count or block size)"));
    }
    if (m.created_unix_micros() > latest_creation_micros) {
      return absl::FailedPreconditionError(absl::StrCat(
          "node manifest ", m.node_id(), " of ", m.job(), "/", m.checkpoint(),
          " was created at ", absl::FormatTime(absl::FromUnixMicros(m.created_unix_micros())),
          ", after ", absl::FormatTime(absl::FromUnixMicros(latest_creation_micros)),
          " (this node's clock plus the ", absl::FormatDuration(kMaxNodeClockSkew),
          " the nodes' clocks may differ): its commit time would order the "
          "checkpoint after every later one"));
    }
    record.add_node_manifests(CheckpointStore::NodeManifestName(m.node_id()));
    newest = std::max(newest, m.created_unix_micros());
    // Replica sets: every node that reports one must report the same chunks.
    std::vector<uint32_t> remap(m.replica_sets_size());
    for (int i = 0; i < m.replica_sets_size(); ++i) {
      const v1::ReplicaSet& set = m.replica_sets(i);
      auto [it, inserted] = set_index.emplace(KeyOf(set), index.replica_sets_size());
      remap[i] = it->second;
      if (inserted) {
        *index.add_replica_sets() = set;
        set_reported_by[it->second] = m.node_id();
      } else if (index.replica_sets(it->second).chunk_count() != set.chunk_count() ||
                 index.replica_sets(it->second).chunk_list_xxh3() !=
                     set.chunk_list_xxh3()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "replicas disagree: nodes ", set_reported_by[it->second], " and ",
            m.node_id(), " hold different chunks with replica set ",
            DescribeReplicaSet(set), " (",
            index.replica_sets(it->second).chunk_count(), " vs ", set.chunk_count(),
            " chunks)"));
      }
    }
    const uint32_t file_base = index.files_size();
    for (const v1::DataFile& f : m.files()) {
      if (!file_names.insert(f.name()).second) {
        return absl::FailedPreconditionError(
            absl::StrCat("data file ", f.name(), " is written by two nodes"));
      }
      if (f.replica_set() >= remap.size()) {
        return absl::DataLossError(absl::StrCat(
            "node manifest ", m.node_id(), ": file ", f.name(),
            " names replica set ", f.replica_set(), " which it does not list"));
      }
      v1::DataFile* out = index.add_files();
      *out = f;
      out->set_replica_set(remap[f.replica_set()]);
    }
    for (const v1::StoredTensor& t : m.tensors()) {
      if (!chunks.insert(ChunkName(t.fqn(), t.offsets())).second) {
        return absl::FailedPreconditionError(absl::StrCat(
            "chunk ", ChunkName(t.fqn(), t.offsets()), " is stored twice"));
      }
      v1::StoredTensor* out = index.add_tensors();
      *out = t;
      out->set_file_index(file_base + t.file_index());
    }
    for (const v1::StoredBytes& b : m.byte_items()) *index.add_byte_items() = b;
  }
  // What was stored for each replica set must be exactly what its members
  // hold: same count, same digest. A chunk no owner stored (or stored
  // differently) changes both.
  std::vector<std::vector<ChunkIdentity>> stored(index.replica_sets_size());
  for (const v1::StoredTensor& t : index.tensors()) {
    stored[index.files(t.file_index()).replica_set()].push_back(IdentityOf(t));
  }
  for (int i = 0; i < index.replica_sets_size(); ++i) {
    const v1::ReplicaSet& set = index.replica_sets(i);
    const uint64_t count = stored[i].size();
    if (count != set.chunk_count() ||
        ChunkListDigest(std::move(stored[i])) != set.chunk_list_xxh3()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "replicas disagree: the chunks stored for replica set ",
          DescribeReplicaSet(set),
          " (", count, ") are not the ", set.chunk_count(),
          " its members hold"));
    }
  }
  index.set_created_unix_micros(newest);
  record.set_committed_unix_micros(newest);
  // Each manifest passed ValidateManifest alone; their union must pass too
  // (nodes can disagree on a tensor's dtype or global shape), or COMMIT
  // would be written, count as committed and move LATEST, while every
  // reader refuses it.
  RETURN_IF_ERROR(ValidateCommitRecord(record, "the merged index"));
  // The frame adds its magic, length and checksum (format/manifest_file.h).
  const uint64_t framed = record.ByteSizeLong() + kFrameHeaderBytes;
  if (framed > max_record_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the merged index of ", manifests.size(), " node manifests of ",
        first.job(), "/", first.checkpoint(), " would make a COMMIT of ", framed,
        " bytes, more than the ", max_record_bytes,
        " a reader takes: it could never be loaded"));
  }
  return record;
}

absl::StatusOr<bool> CommitProtocol::TryCommit(const std::string& job,
                                               const std::string& checkpoint,
                                               uint32_t nodes) {
  if (store_->IsCommitted(job, checkpoint)) {
    // Another node committed it and moves LATEST only after COMMIT: a
    // trainer on this node told "committed" that loads "latest" at once
    // would still find the checkpoint before it. So this node moves LATEST
    // forward too (the same bytes), unless it already names this one (the
    // cheap check, enough once the committer got there first).
    absl::StatusOr<std::string> latest = store_->ResolveLatest(job);
    if (!latest.ok() || *latest != checkpoint) {
      absl::Status moved = [&]() -> absl::Status {
        ASSIGN_OR_RETURN(v1::CommitRecord record, store_->ReadCommit(job, checkpoint));
        return store_->UpdateLatest(job, checkpoint, record.committed_unix_micros(), ops_);
      }();
      if (!moved.ok()) {
        LogError("checkpoint ", job, "/", checkpoint,
                 " committed by another node; LATEST not updated here: ", moved.ToString());
      }
    }
    return true;
  }
  ASSIGN_OR_RETURN(std::vector<uint32_t> present,
                   store_->ListNodeManifests(job, checkpoint));
  std::set<uint32_t> ids(present.begin(), present.end());
  for (uint32_t n = 0; n < nodes; ++n) {
    if (!ids.contains(n)) return false;
  }
  std::vector<v1::Manifest> manifests;
  for (uint32_t n = 0; n < nodes; ++n) {
    ASSIGN_OR_RETURN(v1::Manifest m, store_->ReadNodeManifest(job, checkpoint, n));
    manifests.push_back(std::move(m));
  }
  ASSIGN_OR_RETURN(v1::CommitRecord record, MergeNodeManifests(std::move(manifests), max_record_bytes_,
                                      absl::ToUnixMicros(absl::Now() + kMaxNodeClockSkew)));
  RETURN_IF_ERROR(store_->WriteCommit(record, ops_));
  // COMMIT is durable: the checkpoint is committed even if LATEST cannot
  // move; loading it by name works, so only log that.
  absl::Status latest =
      store_->UpdateLatest(job, checkpoint, record.committed_unix_micros(), ops_);
  if (!latest.ok()) {
    LogError("checkpoint ", job, "/", checkpoint,
             " committed but LATEST not updated: ", latest.ToString());
  }
  return true;
}

std::string CommitProtocol::Waiting(const std::string& job, const std::string& checkpoint,
                                    uint32_t nodes) {
  const auto present = store_->ListNodeManifests(job, checkpoint);
  return absl::StrCat("node manifests present: [",
                      present.ok() ? absl::StrJoin(*present, ",") : "?", "] of ", nodes);
}

}  // namespace ckpt
