// S3ObjectStore: the ObjectStore driver (storage/object_store.h) over an S3
// bucket and key prefix, `s3://bucket/prefix`: key "job/step-100/COMMIT" is
// the S3 object "prefix/job/step-100/COMMIT" (a prefix given without a
// trailing '/' gets one, so that keys are always below a "directory").
//
// How each operation keeps object_store.h's semantics:
//  - Put: PutObject for a body below multipart_threshold, else a multipart
//    upload with parts in flight at once (multipart_upload.h); uploads
//    that run side by side share the parts_in_flight bound and its part
//    buffers (part_slots.h). Both are
//    atomic on S3 (the object appears whole at PutObject's end or at
//    CompleteMultipartUpload) and durable once acknowledged. A multipart
//    upload that fails is aborted; a crashed writer's stays on the server
//    until AbortUnfinished.
//  - Get: GetObject, with a Range header for a range. S3 answers a range
//    that begins inside the object but ends past it with the bytes there
//    are: that short answer is turned into OutOfRange here, as the other
//    drivers report it; a body larger than `into` is InvalidArgument.
//  - Head, Delete: HeadObject, DeleteObject (S3 deletes a missing object
//    without complaint).
//  - List: ListObjectsV2 under the store's prefix joined with the caller's,
//    following continuation tokens past S3's 1,000 keys a page; the store's
//    prefix is stripped from the keys and the rolled-up prefixes. Keys no
//    object key can be (written there by something else) are left out,
//    since no other method could name them. SeaweedFS lists a prefix its
//    deletes emptied for a while (object_store.h: a prefix is a hint).
//  - AbortUnfinished: the multipart uploads under the prefix initiated
//    before the cutoff are aborted (by the server's clock).
//
// Errors are the client's (s3_client.h): they name the operation and
// s3://bucket/prefix/key, which is Describe(key).
//
// Thread-safety: every method may be called from many threads; the client
// is shared (it pools connections) and may serve other stores too.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "storage/object_store.h"
#include "storage/s3/multipart_upload.h"
#include "storage/s3/part_slots.h"
#include "storage/s3/s3_client.h"

namespace ckpt::s3 {

struct S3ObjectStoreOptions {
  // Bodies of this many bytes or more go as multipart uploads: one
  // PutObject of a large body is one long request that a failure restarts
  // from the first byte, and it is not sent in parallel.
  size_t multipart_threshold = 64ull << 20;
  // Part size (S3: 5 MiB at least), parts in flight; `slots` null: the
  // store's own, shared by all its uploads.
  MultipartOptions multipart;
};

class S3ObjectStore : public ObjectStore {
 public:
  // `location` is "s3://bucket" or "s3://bucket/prefix". The bucket must
  // exist (nothing is asked of the server here).
  static absl::StatusOr<std::unique_ptr<S3ObjectStore>> Create(
      std::shared_ptr<S3Client> client, absl::string_view location,
      S3ObjectStoreOptions options = {});

  // "s3://bucket/prefix/key".
  std::string Describe(absl::string_view key) const override;
  absl::Status Put(absl::string_view key, absl::string_view body) override;
  // Below the multipart threshold, one PutObject of the body gathered from
  // parts of `part_size`;
  // above it, a multipart upload whose parts (options.multipart.part_size,
  // not `part_size`: S3's limits rule) are asked of `source` as they go,
  // parts_in_flight at a time between all the store's uploads, each in a
  // part slot's buffer (part_slots.h).
  absl::Status PutFromSource(absl::string_view key, uint64_t size, const PartSource& source,
                             size_t part_size) override;
  absl::StatusOr<size_t> Get(absl::string_view key, absl::Span<char> into,
                             std::optional<ObjectRange> range = std::nullopt) override;
  absl::StatusOr<ObjectInfo> Head(absl::string_view key) override;
  absl::StatusOr<ObjectListing> List(absl::string_view prefix,
                                     absl::string_view delimiter = "") override;
  absl::Status Delete(absl::string_view key) override;
  absl::StatusOr<int> AbortUnfinished(absl::string_view prefix,
                                      absl::Time started_before) override;

  const std::string& bucket() const { return bucket_; }
  // "" or ending in '/'.
  const std::string& prefix() const { return prefix_; }

 private:
  S3ObjectStore(std::shared_ptr<S3Client> client, std::string bucket, std::string prefix,
                S3ObjectStoreOptions options)
      : client_(std::move(client)),
        bucket_(std::move(bucket)),
        prefix_(std::move(prefix)),
        part_slots_(options.multipart.parts_in_flight, options.multipart.part_size),
        options_([&] {
          if (options.multipart.slots == nullptr) options.multipart.slots = &part_slots_;
          return options;
        }()) {}

  // The S3 key of `key`: the store's prefix and `key`, once `key` is
  // checked (every method does this first, so nothing outside the prefix
  // can be named, and a key too long with the prefix fails here, not at
  // the server).
  absl::StatusOr<std::string> S3Key(absl::string_view key) const;

  const std::shared_ptr<S3Client> client_;
  const std::string bucket_;
  const std::string prefix_;
  // The store's multipart uploads, side by side or not, send at most
  // parts_in_flight parts at once between them (part_slots.h).
  PartSlots part_slots_;
  const S3ObjectStoreOptions options_;
};

}  // namespace ckpt::s3
