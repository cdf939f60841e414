// S3's XML documents, typed: the responses the client reads (read through
// xml_tree.h, i.e. expat) and the one request body it sends
// (CompleteMultipartUpload). Each parser checks the root element's name, so
// that an <Error> where a result was expected (S3 may answer a
// CompleteMultipartUpload with 200 and an <Error> body) is never taken for
// an empty result.
//
// Thread-safety: pure functions over values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt::s3 {

// <Error><Code>NoSuchKey</Code><Message>...</Message>...</Error>
struct S3ErrorResponse {
  std::string code;
  std::string message;
  std::string request_id;
};
absl::StatusOr<S3ErrorResponse> ParseErrorResponse(absl::string_view xml);

struct ObjectSummary {
  std::string key;
  uint64_t size = 0;
  std::string etag;
};

// <ListBucketResult> of ListObjectsV2.
struct ListObjectsPage {
  std::vector<ObjectSummary> objects;
  std::vector<std::string> common_prefixes;
  bool is_truncated = false;
  std::string next_continuation_token;  // set when truncated
};
absl::StatusOr<ListObjectsPage> ParseListObjectsPage(absl::string_view xml);

// <InitiateMultipartUploadResult>: the upload id.
absl::StatusOr<std::string> ParseInitiateMultipartUpload(absl::string_view xml);

// <CompleteMultipartUploadResult>: the object's ETag. An <Error> document
// comes back as an error (with its code and message).
absl::StatusOr<std::string> ParseCompleteMultipartUpload(absl::string_view xml);

struct MultipartUploadSummary {
  std::string key;
  std::string upload_id;
  std::string initiated;  // ISO 8601, as the server wrote it
};
// <ListMultipartUploadsResult>.
struct MultipartUploadsPage {
  std::vector<MultipartUploadSummary> uploads;
  bool is_truncated = false;
  std::string next_key_marker;
  std::string next_upload_id_marker;
};
absl::StatusOr<MultipartUploadsPage> ParseMultipartUploadsPage(absl::string_view xml);

struct CompletedPart {
  int part_number = 0;
  std::string etag;
};
// <CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>...
std::string CompleteMultipartUploadBody(const std::vector<CompletedPart>& parts);

}  // namespace ckpt::s3
