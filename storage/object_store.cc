#include "storage/object_store.h"

#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/names.h"

namespace ckpt {

namespace {
// S3's limit on a key's length, kept by every driver so that a key written
// to a directory can be written to a bucket too.
constexpr size_t kMaxObjectKeyLength = 1024;
}  // namespace

absl::Status ValidateObjectKey(absl::string_view key, bool prefix_only) {
  if (key.size() > kMaxObjectKeyLength) {
    return absl::InvalidArgumentError(absl::StrCat(
        "object key is longer than ", kMaxObjectKeyLength, " bytes"));
  }
  if (prefix_only) {
    if (key.empty()) return absl::OkStatus();
    if (key.back() == '/') key.remove_suffix(1);
  }
  if (key.empty()) return absl::InvalidArgumentError("object key is empty");
  for (absl::string_view part : absl::StrSplit(key, '/')) {
    absl::Status valid = ValidateStorageName(part, "object key component");
    if (!valid.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("object key '", absl::CEscape(key), "': ", valid.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ObjectRange> PlanObjectRead(uint64_t object_size, size_t into_size,
                                           std::optional<ObjectRange> range,
                                           absl::string_view name) {
  ObjectRange read{0, object_size};
  if (range.has_value()) {
    if (range->length == 0) {
      return absl::InvalidArgumentError(absl::StrCat("empty range of ", name));
    }
    if (range->offset > object_size || object_size - range->offset < range->length) {
      return absl::OutOfRangeError(absl::StrCat(
          "range [", range->offset, ", +", range->length, ") of ", name,
          " ends past its ", object_size, " bytes"));
    }
    read = *range;
  }
  if (read.length > into_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": ", read.length, " bytes do not fit the ", into_size, " given"));
  }
  return read;
}

absl::StatusOr<std::string> GetSmallObject(ObjectStore& store, absl::string_view key,
                                           size_t max_bytes) {
  absl::StatusOr<ObjectInfo> info = store.Head(key);
  if (!info.ok()) return info.status();
  if (info->size > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        store.Describe(key), " is ", info->size, " bytes, more than the ", max_bytes,
        " allowed"));
  }
  std::string bytes(info->size, '\0');
  if (bytes.empty()) return bytes;
  // The object may be replaced between Head and Get: a larger one fails the
  // Get (it does not fit), a smaller one is cut to what was read.
  absl::StatusOr<size_t> read = store.Get(key, absl::MakeSpan(bytes.data(), bytes.size()));
  if (!read.ok()) return read.status();
  bytes.resize(*read);
  return bytes;
}

}  // namespace ckpt
