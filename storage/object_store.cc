#include "storage/object_store.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/aligned_buffer.h"
#include "common/names.h"
#include "common/status.h"

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

std::vector<absl::StatusOr<std::string>> ObjectStore::GetSmallObjects(
    absl::Span<const std::string> keys, size_t max_bytes, int parallelism) {
  std::vector<absl::StatusOr<std::string>> results(
      keys.size(), absl::StatusOr<std::string>(absl::UnknownError("not read")));
  std::atomic<size_t> next{0};
  auto read = [&] {
    for (size_t i = next++; i < keys.size(); i = next++) {
      results[i] = GetSmallObject(*this, keys[i], max_bytes);
    }
  };
  const size_t threads =
      std::min<size_t>(keys.size(), static_cast<size_t>(std::max(parallelism, 1)));
  if (threads <= 1) {
    read();
    return results;
  }
  std::vector<std::thread> workers;
  workers.reserve(threads - 1);
  for (size_t t = 1; t < threads; ++t) workers.emplace_back(read);
  read();
  for (std::thread& worker : workers) worker.join();
  return results;
}

absl::Status ObjectStore::PutFromSource(absl::string_view key, uint64_t size,
                                        const PartSource& source, size_t part_size) {
  if (part_size == 0) return absl::InvalidArgumentError("part size 0");
  AlignedBuffer scratch;
  if (size <= part_size) {
    RETURN_IF_ERROR(scratch.Allocate(size));
    ASSIGN_OR_RETURN(absl::string_view whole, source(0, size, scratch.span()));
    if (whole.size() != size) {
      return absl::InternalError(absl::StrCat("the source of ", Describe(key), " gave ",
                                              whole.size(), " bytes, not ", size));
    }
    return Put(key, whole);
  }
  RETURN_IF_ERROR(scratch.Allocate(part_size));
  std::string body;
  body.reserve(size);
  for (uint64_t offset = 0; offset < size; offset += part_size) {
    const size_t length = static_cast<size_t>(std::min<uint64_t>(part_size, size - offset));
    ASSIGN_OR_RETURN(absl::string_view part,
                     source(offset, length, scratch.span()));
    if (part.size() != length) {
      return absl::InternalError(absl::StrCat("the source of ", Describe(key), " gave ",
                                              part.size(), " bytes at ", offset, ", not ",
                                              length));
    }
    body.append(part.data(), part.size());
  }
  return Put(key, body);
}

}  // namespace ckpt
