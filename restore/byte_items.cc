#include "restore/byte_items.h"

#include <xxhash.h>

#include "absl/strings/str_cat.h"

namespace ckpt {

ByteItemFinder::ByteItemFinder(
    const v1::Manifest& index, uint32_t rank,
    const google::protobuf::RepeatedPtrField<std::string>& fqns)
    : index_(index) {
  copies_.reserve(static_cast<size_t>(fqns.size()));
  for (const std::string& fqn : fqns) copies_.emplace(fqn, nullptr);
  for (const v1::StoredBytes& b : index.byte_items()) {
    auto it = copies_.find(b.fqn());
    if (it == copies_.end()) continue;
    // This rank's own copy if there is one, else the first rank's listed.
    if (it->second == nullptr || b.rank() == rank) it->second = &b;
  }
}

absl::StatusOr<const v1::StoredBytes*> ByteItemFinder::Find(
    absl::string_view fqn) const {
  auto it = copies_.find(fqn);
  if (it == copies_.end() || it->second == nullptr) {
    return absl::NotFoundError(absl::StrCat("byte item ", fqn, " is not in ",
                                            index_.job(), "/",
                                            index_.checkpoint()));
  }
  const v1::StoredBytes* found = it->second;
  if (XXH3_64bits(found->data().data(), found->data().size()) !=
      found->xxh3()) {
    return absl::DataLossError(absl::StrCat("checksum mismatch in byte item ",
                                            fqn, " of ", index_.checkpoint()));
  }
  return found;
}

}  // namespace ckpt
