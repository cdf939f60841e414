#include "restore/verifier.h"

#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/damage_list.h"
#include "common/names.h"
#include "common/status.h"
#include "format/data_file_header.h"
#include "restore/shard_reader.h"

namespace ckpt {
namespace {

// Deliveries go nowhere: verification only needs the reads and hashes.
class Discard final : public MemorySource {
 public:
  absl::Status Read(absl::Span<const CopySpan>) override {
    return absl::InternalError("Discard is write-only");
  }
  absl::Status Write(absl::Span<const CopySpan>) override { return absl::OkStatus(); }
};

absl::StatusOr<v1::VerifyResponse> Verify(const CheckpointStore& store,
                                          StagingPool* pool, IoQueue& queue,
                                          CheckpointLeases& leases,
                                          const std::string& job,
                                          const std::string& checkpoint) {
  // The name first, then the lease, then COMMIT: read after the lease, a
  // COMMIT that exists stays until the lease goes.
  std::string name = checkpoint.empty() ? std::string(kLatestAlias) : checkpoint;
  if (name == kLatestAlias) {
    ASSIGN_OR_RETURN(name, store.ResolveLatest(job));
  }
  RETURN_IF_ERROR(ValidateStorageName(job, "job"));
  RETURN_IF_ERROR(ValidateStorageName(name, "checkpoint"));
  ASSIGN_OR_RETURN(const CheckpointLease lease, leases.Hold(job, name));
  ASSIGN_OR_RETURN(v1::CommitRecord record, store.ReadCommit(job, name));
  const v1::Manifest& index = record.index();
  ASSIGN_OR_RETURN(StorageDir dir, store.OpenCheckpoint(index.job(), index.checkpoint()));
  v1::VerifyResponse response;
  response.set_checkpoint(index.checkpoint());
  response.set_files(index.files_size());
  // Bounded, so that the reply fits a message (common/damage_list.h).
  DamageList damage;
  std::map<uint32_t, std::vector<const v1::StoredTensor*>> by_file;
  for (const v1::StoredTensor& t : index.tensors()) by_file[t.file_index()].push_back(&t);
  Discard discard;
  ShardReader reader(pool, &queue);
  for (int f = 0; f < index.files_size(); ++f) {
    const v1::DataFile& file = index.files(f);
    const std::string path = dir.PathOf(file.name());
    // lstat: a symlink planted as a data file is damage, not followed.
    const absl::StatusOr<struct stat> stat = dir.Stat(file.name());
    if (!stat.ok()) {
      damage.Add(absl::IsNotFound(stat.status())
                     ? absl::StrCat(path, ": missing")
                     : std::string(stat.status().message()));
      continue;
    }
    const struct stat& st = *stat;
    if (!S_ISREG(st.st_mode)) {
      damage.Add(absl::StrCat(path, ": not a regular file (a symlink?)"));
      continue;
    }
    if (static_cast<uint64_t>(st.st_size) != file.size()) {
      damage.Add(absl::StrCat(path, ": size ", st.st_size, " but the manifest says ",
                              file.size()));
    }
    auto& tensors = by_file[f];
    // The header is rebuilt from the manifest and must match the file's
    // first bytes (format/data_file_header.h); it is compared on the read of
    // the first item, which passes it anyway.
    absl::StatusOr<std::string> header = ExpectedDataFileHeader(file, tensors);
    if (!header.ok()) damage.Add(std::string(header.status().message()));
    std::sort(tensors.begin(), tensors.end(), [](const auto* a, const auto* b) {
      return a->file_offset() < b->file_offset();
    });
    // Item by item, so that one damaged item does not hide the next.
    for (const v1::StoredTensor* t : tensors) {
      ShardReadRequest req;
      req.path = path;
      req.dir = &dir;
      req.name = file.name();
      req.file_size = file.size();
      req.checksum_block_bytes = index.checksum_block_bytes();
      ItemRead read;
      read.fqn = t->fqn();
      read.item_file_offset = t->file_offset();
      read.item_length = t->length();
      read.block_xxh3 = t->block_xxh3().data();
      read.block_count = t->block_xxh3_size();
      read.deliveries.push_back({0, t->length(), &discard, 0});
      req.items.push_back(std::move(read));
      if (t == tensors.front() && header.ok()) req.expected_header = *header;
      auto result = reader.Read(req);
      if (result.ok()) {
        response.set_bytes_verified(response.bytes_verified() + t->length());
      } else {
        damage.Add(std::string(result.status().message()));
      }
    }
  }
  for (const v1::StoredBytes& b : index.byte_items()) {
    if (XXH3_64bits(b.data().data(), b.data().size()) != b.xxh3()) {
      damage.Add(absl::StrCat("byte item ", b.fqn(), " of rank ", b.rank(),
                              ": checksum mismatch"));
    }
  }
  for (std::string& line : damage.Lines()) response.add_damage(std::move(line));
  return response;
}

}  // namespace

void VerifyCheckpoint(const CheckpointStore* store, StagingPool* pool,
                      IoWorkers* workers, CheckpointLeases* leases,
                      std::string job, std::string checkpoint,
                      std::function<void(absl::StatusOr<v1::VerifyResponse>)> done) {
  workers->Post([=, done = std::move(done)](IoQueue& queue) {
    done(Verify(*store, pool, queue, *leases, job, checkpoint));
  });
}

}  // namespace ckpt
