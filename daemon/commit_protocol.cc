#include "daemon/commit_protocol.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status.h"

namespace ckpt {
namespace {

std::string ChunkName(absl::string_view fqn,
                      const google::protobuf::RepeatedField<uint64_t>& offsets) {
  return absl::StrCat(fqn, "@[", absl::StrJoin(offsets, ","), "]");
}

template <typename A, typename B>
bool SameBox(const A& a, const B& b) {
  return a.dtype() == b.dtype() &&
         std::equal(a.global_shape().begin(), a.global_shape().end(),
                    b.global_shape().begin(), b.global_shape().end()) &&
         std::equal(a.local_shape().begin(), a.local_shape().end(),
                    b.local_shape().begin(), b.local_shape().end());
}

}  // namespace

absl::StatusOr<v1::CommitRecord> MergeNodeManifests(
    std::vector<v1::Manifest> manifests) {
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
  // file name -> index into index.files; chunk -> stored tensor
  std::map<std::string, uint32_t> files;
  std::map<std::string, const v1::StoredTensor*> stored;
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
    record.add_node_manifests(CheckpointStore::NodeManifestName(m.node_id()));
    newest = std::max(newest, m.created_unix_micros());
    const uint32_t file_base = index.files_size();
    for (const v1::DataFile& f : m.files()) {
      if (!files.emplace(f.name(), index.files_size()).second) {
        return absl::FailedPreconditionError(
            absl::StrCat("data file ", f.name(), " is written by two nodes"));
      }
      *index.add_files() = f;
    }
    for (const v1::StoredTensor& t : m.tensors()) {
      v1::StoredTensor* out = index.add_tensors();
      *out = t;
      out->set_file_index(file_base + t.file_index());
    }
    for (const v1::StoredBytes& b : m.byte_items()) *index.add_byte_items() = b;
  }
  for (const v1::StoredTensor& t : index.tensors()) {
    if (!stored.emplace(ChunkName(t.fqn(), t.offsets()), &t).second) {
      return absl::FailedPreconditionError(absl::StrCat(
          "chunk ", ChunkName(t.fqn(), t.offsets()), " is stored twice"));
    }
  }
  // Every chunk a node holds but did not write must be stored, identically,
  // in the file its owner was planned to write.
  for (const v1::Manifest& m : manifests) {
    for (const v1::ChunkRef& ref : m.references()) {
      const std::string name = ChunkName(ref.fqn(), ref.offsets());
      auto it = stored.find(name);
      if (it == stored.end() || !SameBox(*it->second, ref) ||
          index.files(it->second->file_index()).name() != ref.file()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "replicas disagree: node ", m.node_id(), " holds chunk ", name,
            " which rank ", ref.owner_rank(), " was to write to ", ref.file(),
            it == stored.end() ? ", but no node stored it"
                               : ", but it was stored differently"));
      }
    }
  }
  index.set_created_unix_micros(newest);
  record.set_committed_unix_micros(newest);
  return record;
}

absl::StatusOr<bool> CommitProtocol::TryCommit(const std::string& job,
                                               const std::string& checkpoint,
                                               uint32_t nodes) const {
  if (store_->IsCommitted(job, checkpoint)) return true;
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
  ASSIGN_OR_RETURN(v1::CommitRecord record, MergeNodeManifests(std::move(manifests)));
  RETURN_IF_ERROR(store_->WriteCommit(record));
  // COMMIT is durable: the checkpoint is committed even if LATEST cannot
  // move; loading it by name works, so only log that.
  absl::Status latest =
      store_->UpdateLatest(job, checkpoint, record.committed_unix_micros());
  if (!latest.ok()) {
    LogError("checkpoint ", job, "/", checkpoint,
             " committed but LATEST not updated: ", latest.ToString());
  }
  return true;
}

}  // namespace ckpt
