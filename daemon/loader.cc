#include "daemon/loader.h"

#include <xxhash.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "daemon/save_plan.h"
#include "daemon/shard_reader.h"

namespace ckpt {
namespace {

std::string ChunkKey(absl::string_view fqn,
                     const google::protobuf::RepeatedField<uint64_t>& offsets) {
  return absl::StrCat(fqn, "@", absl::StrJoin(offsets, ","));
}

bool SameShape(const google::protobuf::RepeatedField<uint64_t>& a,
               const google::protobuf::RepeatedField<uint64_t>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end());
}

}  // namespace

void Loader::Start(std::shared_ptr<Session> session, v1::LoadRequest request,
                   Done done) {
  workers_->Post([this, session = std::move(session),
                  request = std::move(request),
                  done = std::move(done)](IoQueue& queue) {
    done(Run(*session, request, queue));
  });
}

absl::StatusOr<v1::LoadResponse> Loader::Run(Session& session,
                                             const v1::LoadRequest& request,
                                             IoQueue& queue) {
  if (!session.opened()) {
    return absl::FailedPreconditionError("call OpenSession before Load");
  }
  if (request.job() != session.job()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "load names job '", request.job(), "' but the session is for job '",
        session.job(), "'"));
  }
  ASSIGN_OR_RETURN(v1::CommitRecord record,
                   store_->ReadCommit(request.job(), request.checkpoint()));
  const v1::Manifest& index = record.index();
  const std::string dir = store_->CheckpointDir(index.job(), index.checkpoint());

  std::map<std::string, const v1::StoredTensor*> stored;
  for (const v1::StoredTensor& t : index.tensors()) {
    stored.emplace(ChunkKey(t.fqn(), t.offsets()), &t);
  }
  // Reads grouped by data file, each group sorted by file offset.
  std::map<uint32_t, std::vector<ItemRead>> reads;
  std::map<std::string, bool> requested;
  for (const v1::TensorItem& item : request.tensors()) {
    RETURN_IF_ERROR(ValidateTensorItem(item));
    const std::string key = ChunkKey(item.fqn(), item.offsets());
    if (!requested.emplace(key, true).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("item ", item.fqn(), " is requested twice"));
    }
    auto it = stored.find(key);
    if (it == stored.end()) {
      return absl::NotFoundError(absl::StrCat(
          "item ", item.fqn(), " at offsets [", absl::StrJoin(item.offsets(), ","),
          "] is not in checkpoint ", index.job(), "/", index.checkpoint()));
    }
    const v1::StoredTensor& t = *it->second;
    if (t.dtype() != item.dtype() || !SameShape(t.global_shape(), item.global_shape()) ||
        !SameShape(t.local_shape(), item.local_shape())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "item ", item.fqn(), ": requested ", v1::DType_Name(item.dtype()), " [",
          absl::StrJoin(item.local_shape(), ","), "] of [",
          absl::StrJoin(item.global_shape(), ","), "] but stored ",
          v1::DType_Name(t.dtype()), " [", absl::StrJoin(t.local_shape(), ","),
          "] of [", absl::StrJoin(t.global_shape(), ","), "]"));
    }
    auto remote = session.Resolve(item.memory());
    if (!remote.ok()) {
      return Annotate(remote.status(), absl::StrCat("item ", item.fqn()));
    }
    if (t.file_index() >= static_cast<uint32_t>(index.files_size())) {
      return absl::DataLossError(absl::StrCat(
          "manifest of ", index.checkpoint(), ": item ", t.fqn(),
          " names file ", t.file_index(), " which does not exist"));
    }
    ItemRead read;
    read.fqn = t.fqn();
    read.item_file_offset = t.file_offset();
    read.item_length = t.length();
    read.block_xxh3 = t.block_xxh3().data();
    read.block_count = t.block_xxh3_size();
    read.begin = 0;
    read.end = t.length();
    read.remote = *remote;
    reads[t.file_index()].push_back(read);
  }

  v1::LoadResponse response;
  response.set_checkpoint(index.checkpoint());
  for (const std::string& fqn : request.byte_items()) {
    const v1::StoredBytes* found = nullptr;
    for (const v1::StoredBytes& b : index.byte_items()) {
      if (b.fqn() != fqn) continue;
      // This rank's own copy if there is one, else any rank's.
      if (found == nullptr || b.rank() == session.rank()) found = &b;
    }
    if (found == nullptr) {
      return absl::NotFoundError(absl::StrCat(
          "byte item ", fqn, " is not in checkpoint ", index.checkpoint()));
    }
    if (XXH3_64bits(found->data().data(), found->data().size()) != found->xxh3()) {
      return absl::DataLossError(absl::StrCat(
          "checksum mismatch in byte item ", fqn, " of ", index.checkpoint()));
    }
    v1::ByteItem* out = response.add_byte_items();
    out->set_fqn(fqn);
    out->set_data(found->data());
  }

  ShardReader reader(pool_, &queue);
  uint64_t bytes_read = 0;
  for (auto& [file_index, items] : reads) {
    const v1::DataFile& file = index.files(file_index);
    std::sort(items.begin(), items.end(), [](const ItemRead& a, const ItemRead& b) {
      return a.item_file_offset < b.item_file_offset;
    });
    ShardReadRequest req;
    req.path = absl::StrCat(dir, "/", file.name());
    req.file_size = file.size();
    req.checksum_block_bytes = index.checksum_block_bytes();
    req.items = std::move(items);
    req.destination = session.memory();
    ASSIGN_OR_RETURN(uint64_t n, reader.Read(req));
    bytes_read += n;
  }
  response.set_bytes_read(bytes_read);
  return response;
}

}  // namespace ckpt
