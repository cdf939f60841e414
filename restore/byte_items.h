// ByteItemFinder: which stored copy of a byte item a rank gets back, checked.
//
// Byte items (step counters, RNG and dataloader state) live in the COMMIT
// record's index, one copy per rank that saved one. A rank gets its own
// copy if it saved one, else any rank's (state every rank holds alike),
// and only after the copy's XXH3 matched the manifest (invariant 10: bytes
// reach a trainer only verified). Load (restore/load_plan.h) and the
// follow-up pages of a load's byte items (LoadByteItems) both go through
// here, so they cannot disagree on which copy a rank gets.
//
// The names a call asks for are looked up together: one pass over the
// index's byte items against a hash set of the names, so that N names
// against a record of M byte items cost O(N + M) time and O(N) memory (a
// page of 100,000 names against a COMMIT of 100,000 byte items took 129 s
// of one I/O worker when each name scanned the whole list, a million of
// each about a hundred times that: tests/daemon/byte_items_page_cost_test.cc).
//
// Thread-safety: immutable once built; Find may be called from any thread
// while `index` lives.
#pragma once

#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/v1/manifest.pb.h"
#include "google/protobuf/repeated_ptr_field.h"

namespace ckpt {

class ByteItemFinder {
 public:
  // Finds, for rank `rank`, the copies of the byte items `fqns` names.
  // `index` and `fqns` must outlive the finder.
  ByteItemFinder(const v1::Manifest& index, uint32_t rank,
                 const google::protobuf::RepeatedPtrField<std::string>& fqns);

  // The copy of byte item `fqn` (one of the names given) that the rank
  // loads. NotFound naming the checkpoint if the index has none; DataLoss
  // naming the item if the copy does not match its checksum.
  absl::StatusOr<const v1::StoredBytes*> Find(absl::string_view fqn) const;

 private:
  const v1::Manifest& index_;
  // Requested name -> its copy (null: none stored).
  absl::flat_hash_map<absl::string_view, const v1::StoredBytes*> copies_;
};

}  // namespace ckpt
