#include "storage/s3/s3_object_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status.h"

namespace ckpt::s3 {
namespace {

// S3's limit on a whole key, the store's prefix included.
constexpr size_t kMaxS3KeyLength = 1024;

}  // namespace

absl::StatusOr<std::unique_ptr<S3ObjectStore>> S3ObjectStore::Create(
    std::shared_ptr<S3Client> client, absl::string_view location,
    S3ObjectStoreOptions options) {
  if (client == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("S3 store ", location, ": no client"));
  }
  ASSIGN_OR_RETURN(S3Uri uri, ParseS3Uri(location));
  if (!uri.prefix.empty() && uri.prefix.back() != '/') uri.prefix.push_back('/');
  // The prefix is part of every key, so it obeys the keys' rules too.
  if (absl::Status valid = ckpt::ValidateObjectKey(uri.prefix, /*prefix_only=*/true);
      !valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("S3 store ", location, ": prefix: ", valid.message()));
  }
  // UploadMultipart checks these too, but only at the first large Put: a
  // wrong configuration should fail at startup.
  const MultipartOptions& multipart = options.multipart;
  if (multipart.part_size < kMinPartSize || multipart.part_size > kMaxPartSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("S3 store ", location, ": part size ", multipart.part_size,
                     " is outside S3's 5 MiB to 5 GiB"));
  }
  if (multipart.parts_in_flight < 1 || multipart.parts_in_flight > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "S3 store ", location, ": parts_in_flight ", multipart.parts_in_flight,
        " is not 1 to 64"));
  }
  return std::unique_ptr<S3ObjectStore>(new S3ObjectStore(
      std::move(client), std::move(uri.bucket), std::move(uri.prefix), options));
}

std::string S3ObjectStore::Describe(absl::string_view key) const {
  return absl::StrCat("s3://", bucket_, "/", prefix_, key);
}

absl::StatusOr<std::string> S3ObjectStore::S3Key(absl::string_view key) const {
  RETURN_IF_ERROR(ckpt::ValidateObjectKey(key));
  if (prefix_.size() + key.size() > kMaxS3KeyLength) {
    return absl::InvalidArgumentError(absl::StrCat(
        Describe(key), ": the S3 key is longer than ", kMaxS3KeyLength, " bytes"));
  }
  return absl::StrCat(prefix_, key);
}

absl::Status S3ObjectStore::Put(absl::string_view key, absl::string_view body) {
  ASSIGN_OR_RETURN(const std::string s3_key, S3Key(key));
  if (body.size() < options_.multipart_threshold) {
    return client_->PutObject(bucket_, s3_key, body).status();
  }
  absl::StatusOr<MultipartResult> uploaded =
      UploadMultipart(*client_, bucket_, s3_key, body, options_.multipart);
  if (!uploaded.ok()) {
    return Annotate(uploaded.status(), absl::StrCat("multipart put ", Describe(key)));
  }
  return absl::OkStatus();
}

absl::Status S3ObjectStore::PutFromSource(absl::string_view key, uint64_t size,
                                          const PartSource& source, size_t part_size) {
  ASSIGN_OR_RETURN(const std::string s3_key, S3Key(key));
  if (size < options_.multipart_threshold) {
    // Gathered (below the threshold: bounded) and sent as one PutObject.
    return ObjectStore::PutFromSource(key, size, source, part_size);
  }
  absl::StatusOr<MultipartResult> uploaded = UploadMultipartFrom(
      *client_, bucket_, s3_key, size,
      [&source](int, uint64_t offset, size_t length, absl::Span<char> scratch) {
        return source(offset, length, scratch);
      },
      /*scratch_needed=*/true, options_.multipart);
  if (!uploaded.ok()) {
    return Annotate(uploaded.status(), absl::StrCat("multipart put ", Describe(key)));
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> S3ObjectStore::Get(absl::string_view key, absl::Span<char> into,
                                          std::optional<ObjectRange> range) {
  ASSIGN_OR_RETURN(const std::string s3_key, S3Key(key));
  if (range.has_value()) {
    if (range->length == 0) {
      return absl::InvalidArgumentError(absl::StrCat("empty range of ", Describe(key)));
    }
    if (range->length > into.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          Describe(key), ": ", range->length, " bytes do not fit the ", into.size(),
          " given"));
    }
    // A range starting past the end is the server's 416 (OutOfRange).
    ASSIGN_OR_RETURN(const size_t got,
                     client_->GetObject(bucket_, s3_key, into.first(range->length),
                                        ByteRange{range->offset, range->length}));
    if (got < range->length) {
      // S3 sends what there is of a range that ends past the object.
      return absl::OutOfRangeError(absl::StrCat(
          "range [", range->offset, ", +", range->length, ") of ", Describe(key),
          " ends past its ", range->offset + got, " bytes"));
    }
    return got;
  }
  absl::StatusOr<size_t> got = client_->GetObject(bucket_, s3_key, into);
  // The client stops reading a body larger than `into` (ResourceExhausted);
  // for the store that is the caller's mistake, as on the other drivers.
  if (absl::IsResourceExhausted(got.status())) {
    return absl::InvalidArgumentError(absl::StrCat(
        Describe(key), ": the object does not fit the ", into.size(), " bytes given (",
        got.status().message(), ")"));
  }
  return got;
}

absl::StatusOr<ObjectInfo> S3ObjectStore::Head(absl::string_view key) {
  ASSIGN_OR_RETURN(const std::string s3_key, S3Key(key));
  ASSIGN_OR_RETURN(const ObjectSummary summary, client_->HeadObject(bucket_, s3_key));
  return ObjectInfo{std::string(key), summary.size};
}

absl::StatusOr<ObjectListing> S3ObjectStore::List(absl::string_view prefix,
                                                  absl::string_view delimiter) {
  RETURN_IF_ERROR(ckpt::ValidateObjectKey(prefix, /*prefix_only=*/true));
  ASSIGN_OR_RETURN(ListObjectsResult result,
                   client_->ListObjects(bucket_, absl::StrCat(prefix_, prefix), delimiter));
  ObjectListing listing;
  for (ObjectSummary& object : result.objects) {
    absl::string_view key = object.key;
    if (!absl::ConsumePrefix(&key, prefix_) || !ckpt::ValidateObjectKey(key).ok()) continue;
    listing.objects.push_back({std::string(key), object.size});
  }
  for (const std::string& common : result.common_prefixes) {
    absl::string_view rolled = common;
    if (!absl::ConsumePrefix(&rolled, prefix_) ||
        !ckpt::ValidateObjectKey(rolled, /*prefix_only=*/true).ok()) {
      continue;
    }
    listing.prefixes.emplace_back(rolled);
  }
  // S3 lists in byte order already; the contract does not rest on it.
  std::sort(listing.objects.begin(), listing.objects.end(),
            [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
  std::sort(listing.prefixes.begin(), listing.prefixes.end());
  return listing;
}

absl::Status S3ObjectStore::Delete(absl::string_view key) {
  ASSIGN_OR_RETURN(const std::string s3_key, S3Key(key));
  return client_->DeleteObject(bucket_, s3_key);
}

absl::StatusOr<int> S3ObjectStore::AbortUnfinished(absl::string_view prefix,
                                                   absl::Time started_before) {
  RETURN_IF_ERROR(ckpt::ValidateObjectKey(prefix, /*prefix_only=*/true));
  ASSIGN_OR_RETURN(const AbortedUploads aborted,
                   AbortMultipartUploads(*client_, bucket_, absl::StrCat(prefix_, prefix),
                                         started_before));
  return aborted.aborted;
}

}  // namespace ckpt::s3
