// An S3 client: the object operations the remote tier needs, each signed
// (SigV4), bounded in time (a deadline per attempt, an overall deadline
// across retries) and retried by retry_policy.h's rules.
//
// Bodies are the caller's memory: PutObject and UploadPart send from it
// without a copy, GetObject writes into it (a whole object or a range).
// Responses read into memory (XML) are capped by the transport's
// max_response_bytes, and listings by max_list_entries.
//
// Errors are absl::Status whose message names the operation, the object
// (s3://bucket/key), the HTTP status and the server's <Code> and <Message>,
// or the transport's failure, and the attempts made when there were
// several, e.g.
//   S3 PutObject s3://ckpt/step-100/0.safetensors: HTTP 403
//   SignatureDoesNotMatch: The request signature we calculated does not
//   match the signature you provided. (request id 1797A2F1)
// Credentials never appear in them. The codes: 404 NotFound, 403
// PermissionDenied, 400 InvalidArgument, 409/412 FailedPrecondition,
// 416 OutOfRange, 408 DeadlineExceeded, 429 and 5xx Unavailable.
//
// Thread-safety: every method may be called from many threads at once (the
// multipart helper does); the transport pools connections between them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "storage/s3/http_transport.h"
#include "storage/s3/retry_policy.h"
#include "storage/s3/s3_credentials.h"
#include "storage/s3/s3_location.h"
#include "storage/s3/s3_responses.h"
#include "storage/s3/sigv4.h"

namespace ckpt::s3 {

struct S3ClientOptions {
  S3Endpoint endpoint;
  std::string region = "us-east-1";
  AddressingStyle style = AddressingStyle::kVirtualHost;
  S3Credentials credentials;
  HttpTransportOptions transport;
  RetryOptions retry;
  RetryClock clock = RetryClock::Real();
  // One attempt's deadline (the overall deadline may cut it shorter).
  absl::Duration request_timeout = absl::Minutes(2);
  // Object and part bodies signed with their SHA-256 (true) or sent as
  // UNSIGNED-PAYLOAD (false: no hashing pass over every byte; over HTTPS
  // TLS already protects them, and ckptd checksums every block itself).
  bool sign_payloads = true;
  // Bound on the entries one ListObjects or ListMultipartUploads returns.
  size_t max_list_entries = 1'000'000;
  // Entries asked for per LIST request (S3's maximum is 1000).
  int list_page_size = 1000;
};

struct ByteRange {
  uint64_t offset = 0;
  uint64_t length = 0;  // > 0
};

struct ListObjectsResult {
  std::vector<ObjectSummary> objects;
  std::vector<std::string> common_prefixes;  // with a delimiter
  int pages = 0;                             // LIST requests made
};

class S3Client {
 public:
  static absl::StatusOr<std::unique_ptr<S3Client>> Create(S3ClientOptions options);

  // Makes `bucket` (tests and first-time setup; a bucket that exists and
  // is ours is not an error).
  absl::Status CreateBucket(absl::string_view bucket);

  // Writes the whole object; returns its ETag.
  absl::StatusOr<std::string> PutObject(absl::string_view bucket, absl::string_view key,
                                        absl::string_view body);
  // Reads the object, or `range` of it, into `into`; returns the bytes
  // read. An object (or range) larger than `into` is an error.
  absl::StatusOr<size_t> GetObject(absl::string_view bucket, absl::string_view key,
                                   absl::Span<char> into,
                                   std::optional<ByteRange> range = std::nullopt);
  // Size and ETag; NotFound when there is no such object.
  absl::StatusOr<ObjectSummary> HeadObject(absl::string_view bucket, absl::string_view key);
  // Every object under `prefix`, following continuation tokens to the end
  // (at most max_list_entries); with a `delimiter`, the "directories" below
  // the prefix come back as common_prefixes.
  absl::StatusOr<ListObjectsResult> ListObjects(absl::string_view bucket,
                                                absl::string_view prefix,
                                                absl::string_view delimiter = "");
  // Deleting an object that is not there succeeds (S3's semantics).
  absl::Status DeleteObject(absl::string_view bucket, absl::string_view key);

  // Multipart upload, step by step (multipart_upload.h drives them).
  absl::StatusOr<std::string> CreateMultipartUpload(absl::string_view bucket,
                                                    absl::string_view key);
  // `part_number` 1..10000; returns the part's ETag.
  absl::StatusOr<std::string> UploadPart(absl::string_view bucket, absl::string_view key,
                                         absl::string_view upload_id, int part_number,
                                         absl::string_view body);
  // Returns the object's ETag (from a HEAD where the server answers an
  // empty one, as Ceph RGW 16 does).
  absl::StatusOr<std::string> CompleteMultipartUpload(
      absl::string_view bucket, absl::string_view key, absl::string_view upload_id,
      const std::vector<CompletedPart>& parts);
  // OK where the upload is gone already (404 NoSuchUpload: aborted or
  // completed before); a missing bucket is still NotFound.
  absl::Status AbortMultipartUpload(absl::string_view bucket, absl::string_view key,
                                    absl::string_view upload_id);
  // The unfinished uploads under `prefix` (a crashed writer's leftovers).
  absl::StatusOr<std::vector<MultipartUploadSummary>> ListMultipartUploads(
      absl::string_view bucket, absl::string_view prefix);

  // HTTP attempts made so far, retries included (tests and metrics).
  uint64_t attempts() const { return attempts_.load(std::memory_order_relaxed); }
  const S3ClientOptions& options() const { return options_; }

 private:
  struct Call;
  S3Client(S3ClientOptions options, std::unique_ptr<HttpTransport> transport);
  // Signs and sends `call`, retrying by the policy; a non-2xx answer is an
  // error named after the call.
  absl::StatusOr<HttpResponse> Execute(const Call& call);
  absl::StatusOr<HttpResponse> Attempt(const Call& call, absl::Duration timeout,
                                       bool* retryable);

  const S3ClientOptions options_;
  const S3Addressing addressing_;
  const RetryPolicy retry_;
  std::unique_ptr<HttpTransport> transport_;
  std::atomic<uint64_t> attempts_{0};
};

}  // namespace ckpt::s3
