#include "format/manifest_check.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/names.h"
#include "common/status.h"
#include "format/dtype.h"
#include "format/manifest_file.h"

namespace ckpt {
namespace {

absl::Status Bad(absl::string_view what, absl::string_view problem) {
  return absl::DataLossError(absl::StrCat(what, ": ", problem));
}

// a + b, or false if it overflows.
bool Add(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_add_overflow(a, b, out);
}

absl::Status CheckReplicaSet(const v1::ReplicaSet& set, int i, uint32_t world_size,
                             absl::string_view what) {
  const std::string where = absl::StrCat("replica set ", i);
  if (set.count() == 0) {
    if (set.ranks_size() == 0 || static_cast<uint64_t>(set.ranks_size()) > world_size) {
      return Bad(what, absl::StrCat(where, " lists ", set.ranks_size(),
                                    " ranks (world size ", world_size, ")"));
    }
    for (uint32_t r : set.ranks()) {
      if (r >= world_size) {
        return Bad(what, absl::StrCat(where, " names rank ", r, " of a world of ",
                                      world_size));
      }
    }
    return absl::OkStatus();
  }
  // first + stride * (count - 1) < world_size, in 64 bits (no overflow: all
  // three are u32).
  const uint64_t last =
      uint64_t{set.first()} + uint64_t{set.stride()} * (uint64_t{set.count()} - 1);
  if (set.count() > world_size || last >= world_size ||
      (set.count() > 1 && set.stride() == 0)) {
    return Bad(what, absl::StrCat(where, " (first ", set.first(), ", stride ",
                                  set.stride(), ", count ", set.count(),
                                  ") does not fit a world of ", world_size));
  }
  return absl::OkStatus();
}

absl::Status CheckTensor(const v1::Manifest& m, const v1::StoredTensor& t, int i,
                         absl::string_view what) {
  const std::string where = absl::StrCat("chunk ", i, " (", t.fqn().substr(0, 80), ")");
  const absl::Status fqn = ValidateFqn(t.fqn());
  if (!fqn.ok()) return Bad(what, absl::StrCat(where, ": ", fqn.message()));
  auto element = DTypeSize(t.dtype());
  if (!element.ok()) return Bad(what, absl::StrCat(where, ": unknown dtype ", t.dtype()));
  const int dims = t.global_shape_size();
  if (dims > kMaxStoredTensorDims || t.offsets_size() != dims ||
      t.local_shape_size() != dims) {
    return Bad(what, absl::StrCat(where, ": global shape, offsets and local shape "
                                  "have ", dims, ", ", t.offsets_size(), " and ",
                                  t.local_shape_size(), " dimensions"));
  }
  uint64_t bytes = *element;
  for (int d = 0; d < dims; ++d) {
    uint64_t end = 0;
    if (!Add(t.offsets(d), t.local_shape(d), &end) || end > t.global_shape(d)) {
      return Bad(what, absl::StrCat(where, ": dimension ", d, " (offset ", t.offsets(d),
                                    " + ", t.local_shape(d), ") is past the global size ",
                                    t.global_shape(d)));
    }
    if (__builtin_mul_overflow(bytes, t.local_shape(d), &bytes)) {
      return Bad(what, absl::StrCat(where, ": its size overflows 64 bits"));
    }
  }
  if (bytes != t.length()) {
    return Bad(what, absl::StrCat(where, ": length ", t.length(), " but its shape and "
                                  "dtype make ", bytes, " bytes"));
  }
  if (t.file_index() >= static_cast<uint32_t>(m.files_size())) {
    return Bad(what, absl::StrCat(where, ": file index ", t.file_index(), " but there are ",
                                  m.files_size(), " files"));
  }
  const v1::DataFile& file = m.files(static_cast<int>(t.file_index()));
  uint64_t end = 0;
  if (t.file_offset() < file.data_start() || !Add(t.file_offset(), t.length(), &end) ||
      end > file.size()) {
    return Bad(what, absl::StrCat(where, ": bytes [", t.file_offset(), ", +", t.length(),
                                  ") are outside the data of ", file.name(), " [",
                                  file.data_start(), ", ", file.size(), ")"));
  }
  const uint64_t block = m.checksum_block_bytes();
  const uint64_t blocks = t.length() == 0 ? 1 : (t.length() - 1) / block + 1;
  if (static_cast<uint64_t>(t.block_xxh3_size()) != blocks) {
    return Bad(what, absl::StrCat(where, ": ", t.block_xxh3_size(), " block checksums for ",
                                  t.length(), " bytes in blocks of ", block, " (", blocks,
                                  " expected)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateManifest(const v1::Manifest& m, absl::string_view what) {
  if (m.format_version() != 1) {
    return Bad(what, absl::StrCat("format version ", m.format_version(), " (1 expected)"));
  }
  absl::Status name = ValidateStorageName(m.job(), "job");
  if (name.ok()) name = ValidateStorageName(m.checkpoint(), "checkpoint");
  if (!name.ok()) return Bad(what, name.message());
  if (m.nodes() == 0 || m.nodes() > kMaxStoredNodes || m.node_id() >= m.nodes()) {
    return Bad(what, absl::StrCat("node ", m.node_id(), " of ", m.nodes(), " nodes"));
  }
  if (m.world_size() == 0 || m.world_size() > kMaxStoredWorldSize) {
    return Bad(what, absl::StrCat("world size ", m.world_size()));
  }
  if (m.checksum_block_bytes() == 0 ||
      m.checksum_block_bytes() > kMaxStoredChecksumBlockBytes) {
    return Bad(what, absl::StrCat("checksum block size ", m.checksum_block_bytes()));
  }
  for (int i = 0; i < m.replica_sets_size(); ++i) {
    RETURN_IF_ERROR(CheckReplicaSet(m.replica_sets(i), i, m.world_size(), what));
  }
  std::set<absl::string_view> names;
  for (int i = 0; i < m.files_size(); ++i) {
    const v1::DataFile& f = m.files(i);
    absl::Status file_name = ValidateStorageName(f.name(), "data file");
    if (!file_name.ok()) return Bad(what, file_name.message());
    if (!absl::EndsWith(f.name(), ".safetensors")) {
      return Bad(what, absl::StrCat("data file ", f.name(), " is not a .safetensors file"));
    }
    if (!names.insert(f.name()).second) {
      return Bad(what, absl::StrCat("data file ", f.name(), " is listed twice"));
    }
    if (f.data_start() < 8 || f.data_start() % 4096 != 0 || f.data_start() > f.size()) {
      return Bad(what, absl::StrCat("data file ", f.name(), ": data start ", f.data_start(),
                                    " of ", f.size(), " bytes"));
    }
    if (f.replica_set() >= static_cast<uint32_t>(m.replica_sets_size()) ||
        f.rank() >= m.world_size()) {
      return Bad(what, absl::StrCat("data file ", f.name(), ": replica set ",
                                    f.replica_set(), " of ", m.replica_sets_size(),
                                    ", rank ", f.rank(), " of ", m.world_size()));
    }
  }
  // (file, begin, end, chunk): stored ranges may not overlap, and each chunk
  // (fqn, offsets) is stored once.
  std::vector<std::tuple<uint32_t, uint64_t, uint64_t, int>> ranges;
  ranges.reserve(static_cast<size_t>(m.tensors_size()));
  std::set<std::string> chunks;
  // The chunks of one tensor agree on its dtype and global shape: the loader
  // matches a request with the first chunk and then intersects its box with
  // every chunk's, dimension by dimension (restore/load_plan.cc).
  std::map<absl::string_view, const v1::StoredTensor*> tensor_of;
  for (int i = 0; i < m.tensors_size(); ++i) {
    const v1::StoredTensor& t = m.tensors(i);
    RETURN_IF_ERROR(CheckTensor(m, t, i, what));
    if (!chunks.insert(absl::StrCat(t.fqn(), "@", absl::StrJoin(t.offsets(), ","))).second) {
      return Bad(what, absl::StrCat("chunk ", t.fqn(), " at [",
                                    absl::StrJoin(t.offsets(), ","), "] is stored twice"));
    }
    const v1::StoredTensor* first = tensor_of.emplace(t.fqn(), &t).first->second;
    if (first->dtype() != t.dtype() ||
        !std::equal(first->global_shape().begin(), first->global_shape().end(),
                    t.global_shape().begin(), t.global_shape().end())) {
      return Bad(what, absl::StrCat("chunks of ", t.fqn(), " disagree on its dtype or global "
                                    "shape ([", absl::StrJoin(first->global_shape(), ","),
                                    "] and [", absl::StrJoin(t.global_shape(), ","), "])"));
    }
    ranges.emplace_back(t.file_index(), t.file_offset(), t.file_offset() + t.length(), i);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    const auto& [file, begin, end, chunk] = ranges[i];
    const auto& [prev_file, prev_begin, prev_end, prev_chunk] = ranges[i - 1];
    if (file == prev_file && begin < prev_end) {
      return Bad(what, absl::StrCat("chunks ", m.tensors(prev_chunk).fqn(), " and ",
                                    m.tensors(chunk).fqn(), " overlap in ",
                                    m.files(static_cast<int>(file)).name(), " at byte ",
                                    begin));
    }
  }
  for (const v1::StoredBytes& b : m.byte_items()) {
    absl::Status fqn = ValidateFqn(b.fqn());
    if (!fqn.ok()) return Bad(what, absl::StrCat("byte item: ", fqn.message()));
    if (b.rank() >= m.world_size()) {
      return Bad(what, absl::StrCat("byte item ", b.fqn(), " of rank ", b.rank(),
                                    " in a world of ", m.world_size()));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateCommitRecord(const v1::CommitRecord& record,
                                  absl::string_view what) {
  if (record.format_version() != 1) {
    return Bad(what,
               absl::StrCat("format version ", record.format_version(), " (1 expected)"));
  }
  if (!record.has_index()) return Bad(what, "no index");
  RETURN_IF_ERROR(ValidateManifest(record.index(), what));
  if (record.index().node_id() != 0 ||
      static_cast<uint64_t>(record.node_manifests_size()) != record.index().nodes()) {
    return Bad(what, absl::StrCat("merges ", record.node_manifests_size(),
                                  " node manifests for ", record.index().nodes(),
                                  " nodes"));
  }
  for (int i = 0; i < record.node_manifests_size(); ++i) {
    if (record.node_manifests(i) != absl::StrFormat("node-%04u.manifest", i)) {
      return Bad(what, absl::StrCat("node manifest ", i, " is named '",
                                    record.node_manifests(i).substr(0, 80), "'"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::CommitRecord> ParseCommitFile(absl::string_view bytes,
                                                 absl::string_view what) {
  v1::CommitRecord record;
  RETURN_IF_ERROR(ParseFramedMessage(kCommitMagic, bytes, what, &record));
  RETURN_IF_ERROR(ValidateCommitRecord(record, what));
  return record;
}

absl::StatusOr<v1::Manifest> ParseNodeManifestFile(absl::string_view bytes,
                                                   absl::string_view what) {
  v1::Manifest manifest;
  RETURN_IF_ERROR(ParseFramedMessage(kNodeManifestMagic, bytes, what, &manifest));
  RETURN_IF_ERROR(ValidateManifest(manifest, what));
  return manifest;
}

}  // namespace ckpt
