#include "restore/byte_items.h"

#include <xxhash.h>

#include "absl/strings/str_cat.h"

namespace ckpt {

absl::StatusOr<const v1::StoredBytes*> FindByteItem(const v1::Manifest& index,
                                                    absl::string_view fqn,
                                                    uint32_t rank) {
  const v1::StoredBytes* found = nullptr;
  for (const v1::StoredBytes& b : index.byte_items()) {
    if (b.fqn() != fqn) continue;
    // This rank's own copy if there is one, else any rank's.
    if (found == nullptr || b.rank() == rank) found = &b;
  }
  if (found == nullptr) {
    return absl::NotFoundError(absl::StrCat("byte item ", fqn, " is not in ",
                                            index.job(), "/",
                                            index.checkpoint()));
  }
  if (XXH3_64bits(found->data().data(), found->data().size()) !=
      found->xxh3()) {
    return absl::DataLossError(absl::StrCat("checksum mismatch in byte item ",
                                            fqn, " of ", index.checkpoint()));
  }
  return found;
}

}  // namespace ckpt
