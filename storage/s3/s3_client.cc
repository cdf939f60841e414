#include "storage/s3/s3_client.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace ckpt::s3 {

// One S3 operation, as Execute signs and sends it.
struct S3Client::Call {
  const char* operation = "";  // "PutObject": names the call in errors
  absl::string_view bucket = {};
  absl::string_view key = {};  // empty: the bucket itself
  std::string method = {};
  QueryParams query = {};
  HeaderList headers = {};     // besides the signing headers
  absl::string_view body = {};
  bool hash_body = true;       // false: UNSIGNED-PAYLOAD
  absl::Span<char> body_into = {};
};

namespace {

absl::StatusCode CodeForHttpStatus(int status) {
  switch (status) {
    case 400: return absl::StatusCode::kInvalidArgument;
    case 401:
    case 403: return absl::StatusCode::kPermissionDenied;
    case 404: return absl::StatusCode::kNotFound;
    case 408: return absl::StatusCode::kDeadlineExceeded;
    case 409:
    case 412: return absl::StatusCode::kFailedPrecondition;
    case 416: return absl::StatusCode::kOutOfRange;
    case 429: return absl::StatusCode::kUnavailable;
    default:
      return status >= 500 ? absl::StatusCode::kUnavailable : absl::StatusCode::kUnknown;
  }
}

// "s3://bucket/key", or "s3://bucket" for a bucket-level call.
std::string ObjectName(absl::string_view bucket, absl::string_view key) {
  return absl::StrCat("s3://", bucket, key.empty() ? "" : "/", key);
}

// An HTTP error answer as a Status: the status line and the <Error>
// document's code and message (a HEAD answer has no body: its status alone).
absl::Status HttpErrorStatus(const HttpResponse& response, std::string* s3_code) {
  std::string message = absl::StrCat("HTTP ", response.status);
  if (!response.body.empty()) {
    absl::StatusOr<S3ErrorResponse> error = ParseErrorResponse(response.body);
    if (error.ok()) {
      *s3_code = error->code;
      absl::StrAppend(&message, " ", error->code);
      // Ceph RGW sends the code alone.
      if (!error->message.empty()) absl::StrAppend(&message, ": ", error->message);
      if (!error->request_id.empty()) {
        absl::StrAppend(&message, " (request id ", error->request_id, ")");
      }
    } else {
      // Not S3's XML (a proxy's HTML page, say): why it could not be read,
      // not the page itself.
      absl::StrAppend(&message, " (unreadable error body: ", error.status().message(), ")");
    }
  }
  return absl::Status(CodeForHttpStatus(response.status), message);
}

// A parse of an answer's body, its error named like the call's own.
template <typename T>
absl::StatusOr<T> NamedParse(absl::StatusOr<T> parsed, absl::string_view operation,
                             absl::string_view bucket, absl::string_view key) {
  if (parsed.ok()) return parsed;
  return Annotate(parsed.status(), absl::StrCat("S3 ", operation, " ", ObjectName(bucket, key)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<S3Client>> S3Client::Create(S3ClientOptions options) {
  if (options.endpoint.host.empty()) return absl::InvalidArgumentError("S3 endpoint has no host");
  if (options.region.empty()) return absl::InvalidArgumentError("S3 region is empty");
  if (options.credentials.access_key_id.empty() || options.credentials.secret_access_key.empty()) {
    return absl::InvalidArgumentError("S3 credentials are incomplete");
  }
  if (options.list_page_size < 1 || options.list_page_size > 1000) {
    return absl::InvalidArgumentError("list_page_size must be 1 to 1000");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<HttpTransport> transport,
                   HttpTransport::Create(options.transport));
  return std::unique_ptr<S3Client>(new S3Client(std::move(options), std::move(transport)));
}

S3Client::S3Client(S3ClientOptions options, std::unique_ptr<HttpTransport> transport)
    : options_(std::move(options)),
      addressing_(options_.endpoint, options_.region, options_.style),
      retry_(options_.retry, options_.clock),
      transport_(std::move(transport)) {}

absl::StatusOr<HttpResponse> S3Client::Attempt(const Call& call, absl::Duration timeout,
                                               bool* retryable) {
  attempts_.fetch_add(1, std::memory_order_relaxed);
  const std::string query = CanonicalQueryString(call.query);
  RequestTarget target = addressing_.Target(call.bucket, call.key, query);
  SigningRequest signing;
  signing.method = call.method;
  signing.canonical_uri = target.canonical_uri;
  signing.query = call.query;
  signing.payload_hash = std::string(call.body.empty()   ? kEmptyPayloadSha256
                                     : call.hash_body ? Sha256Hex(call.body)
                                                      : kUnsignedPayload);
  const SigningScope scope{.time = absl::Now(), .region = options_.region};
  signing.headers = call.headers;
  signing.headers.emplace_back("host", target.host);
  signing.headers.emplace_back("x-amz-date", AmzDate(scope.time));
  signing.headers.emplace_back("x-amz-content-sha256", signing.payload_hash);
  if (!options_.credentials.session_token.empty()) {
    signing.headers.emplace_back("x-amz-security-token",
                                 std::string(options_.credentials.session_token.Reveal()));
  }
  ASSIGN_OR_RETURN(std::string authorization,
                   AuthorizationHeader(signing, scope, options_.credentials.access_key_id,
                                       options_.credentials.secret_access_key.Reveal()));
  HttpRequest request;
  request.method = call.method;
  request.url = std::move(target.url);
  request.headers = std::move(signing.headers);
  request.headers.emplace_back("Authorization", std::move(authorization));
  request.body = call.body;
  request.body_into = call.body_into;
  request.timeout = timeout;

  absl::StatusOr<HttpResponse> response = transport_->Perform(request);
  if (!response.ok()) {
    *retryable = IsRetryableTransportError(response.status());
    return response.status();
  }
  if (response->status < 200 || response->status >= 300) {
    std::string s3_code;
    absl::Status error = HttpErrorStatus(*response, &s3_code);
    *retryable = IsRetryableHttpError(response->status, s3_code);
    return error;
  }
  return response;
}

absl::StatusOr<HttpResponse> S3Client::Execute(const Call& call) {
  RETURN_IF_ERROR(ValidateBucketName(call.bucket));
  if (!call.key.empty()) RETURN_IF_ERROR(ValidateObjectKey(call.key));
  absl::StatusOr<HttpResponse> answer = absl::UnknownError("not attempted");
  const absl::Status status = retry_.Run([&](int, absl::Duration time_left) {
    bool retryable = false;
    const absl::Duration timeout = std::min(options_.request_timeout, time_left);
    answer = Attempt(call, timeout, &retryable);
    return AttemptResult{answer.status(), retryable};
  });
  if (!status.ok()) {
    return Annotate(status,
                    absl::StrCat("S3 ", call.operation, " ", ObjectName(call.bucket, call.key)));
  }
  return answer;
}

absl::Status S3Client::CreateBucket(absl::string_view bucket) {
  Call call{.operation = "CreateBucket", .bucket = bucket, .method = "PUT"};
  absl::StatusOr<HttpResponse> response = Execute(call);
  // 409 BucketAlreadyOwnedByYou: ours already.
  if (absl::IsFailedPrecondition(response.status()) &&
      absl::StrContains(response.status().message(), "BucketAlreadyOwnedByYou")) {
    return absl::OkStatus();
  }
  return response.status();
}

absl::StatusOr<std::string> S3Client::PutObject(absl::string_view bucket, absl::string_view key,
                                                absl::string_view body) {
  Call call{.operation = "PutObject", .bucket = bucket, .key = key, .method = "PUT",
            .body = body, .hash_body = options_.sign_payloads};
  ASSIGN_OR_RETURN(HttpResponse response, Execute(call));
  return std::string(response.Header("etag"));
}

absl::StatusOr<size_t> S3Client::GetObject(absl::string_view bucket, absl::string_view key,
                                           absl::Span<char> into,
                                           std::optional<ByteRange> range) {
  Call call{.operation = "GetObject", .bucket = bucket, .key = key, .method = "GET"};
  if (range) {
    if (range->length == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "S3 GetObject ", ObjectName(bucket, key), ": an empty byte range"));
    }
    call.headers.emplace_back(
        "range", absl::StrCat("bytes=", range->offset, "-", range->offset + range->length - 1));
  }
  // An empty `into` (an object expected empty) leaves the body to the
  // transport's capped buffer; any byte there is then an error below.
  call.body_into = into;
  ASSIGN_OR_RETURN(HttpResponse response, Execute(call));
  if (range && response.status != 206) {
    return absl::InternalError(absl::StrCat("S3 GetObject ", ObjectName(bucket, key),
                                            ": the server ignored the Range header (HTTP ",
                                            response.status, ")"));
  }
  if (into.empty() && !response.body.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("S3 GetObject ", ObjectName(bucket, key), ": ", response.body.size(),
                     " or more bytes for an empty buffer"));
  }
  return response.bytes_into;
}

absl::StatusOr<ObjectSummary> S3Client::HeadObject(absl::string_view bucket,
                                                   absl::string_view key) {
  Call call{.operation = "HeadObject", .bucket = bucket, .key = key, .method = "HEAD"};
  ASSIGN_OR_RETURN(HttpResponse response, Execute(call));
  ObjectSummary summary;
  summary.key = std::string(key);
  summary.etag = std::string(response.Header("etag"));
  if (!absl::SimpleAtoi(response.Header("content-length"), &summary.size)) {
    return absl::InternalError(absl::StrCat("S3 HeadObject ", ObjectName(bucket, key),
                                            ": no valid Content-Length in the answer"));
  }
  return summary;
}

absl::StatusOr<ListObjectsResult> S3Client::ListObjects(absl::string_view bucket,
                                                        absl::string_view prefix,
                                                        absl::string_view delimiter) {
  ListObjectsResult result;
  std::string token;
  std::set<std::string> tokens_seen;  // a server repeating a token would loop
  while (true) {
    Call call{.operation = "ListObjectsV2", .bucket = bucket, .method = "GET"};
    call.query = {{"list-type", "2"},
                  {"max-keys", absl::StrCat(options_.list_page_size)},
                  {"prefix", std::string(prefix)}};
    if (!delimiter.empty()) call.query.emplace_back("delimiter", std::string(delimiter));
    if (!token.empty()) call.query.emplace_back("continuation-token", token);
    ASSIGN_OR_RETURN(HttpResponse response, Execute(call));
    ++result.pages;
    ASSIGN_OR_RETURN(ListObjectsPage page, NamedParse(ParseListObjectsPage(response.body),
                                                      call.operation, bucket, prefix));
    for (ObjectSummary& object : page.objects) result.objects.push_back(std::move(object));
    for (std::string& common : page.common_prefixes) {
      result.common_prefixes.push_back(std::move(common));
    }
    if (result.objects.size() + result.common_prefixes.size() > options_.max_list_entries) {
      return absl::ResourceExhaustedError(
          absl::StrCat("S3 ListObjectsV2 ", ObjectName(bucket, prefix), ": more than ",
                       options_.max_list_entries, " entries (max_list_entries)"));
    }
    if (!page.is_truncated) return result;
    token = std::move(page.next_continuation_token);
    if (!tokens_seen.insert(token).second) {
      return absl::InternalError(absl::StrCat("S3 ListObjectsV2 ", ObjectName(bucket, prefix),
                                              ": the server repeated a continuation token"));
    }
  }
}

absl::Status S3Client::DeleteObject(absl::string_view bucket, absl::string_view key) {
  Call call{.operation = "DeleteObject", .bucket = bucket, .key = key, .method = "DELETE"};
  return Execute(call).status();
}

absl::StatusOr<std::string> S3Client::CreateMultipartUpload(absl::string_view bucket,
                                                            absl::string_view key) {
  Call call{.operation = "CreateMultipartUpload", .bucket = bucket, .key = key,
            .method = "POST", .query = {{"uploads", ""}}};
  ASSIGN_OR_RETURN(HttpResponse response, Execute(call));
  return NamedParse(ParseInitiateMultipartUpload(response.body), call.operation, bucket, key);
}

absl::StatusOr<std::string> S3Client::UploadPart(absl::string_view bucket,
                                                 absl::string_view key,
                                                 absl::string_view upload_id, int part_number,
                                                 absl::string_view body) {
  Call call{.operation = "UploadPart", .bucket = bucket, .key = key, .method = "PUT",
            .query = {{"partNumber", absl::StrCat(part_number)},
                      {"uploadId", std::string(upload_id)}},
            .body = body, .hash_body = options_.sign_payloads};
  ASSIGN_OR_RETURN(HttpResponse response, Execute(call));
  absl::string_view etag = response.Header("etag");
  if (etag.empty()) {
    return absl::InternalError(absl::StrCat("S3 UploadPart ", ObjectName(bucket, key),
                                            " part ", part_number, ": no ETag in the answer"));
  }
  return std::string(etag);
}

absl::StatusOr<std::string> S3Client::CompleteMultipartUpload(
    absl::string_view bucket, absl::string_view key, absl::string_view upload_id,
    const std::vector<CompletedPart>& parts) {
  const std::string body = CompleteMultipartUploadBody(parts);
  Call call{.operation = "CompleteMultipartUpload", .bucket = bucket, .key = key,
            .method = "POST", .query = {{"uploadId", std::string(upload_id)}},
            .headers = {{"content-type", "application/xml"}}, .body = body};
  ASSIGN_OR_RETURN(HttpResponse response, Execute(call));
  // S3 may answer 200 and then an <Error> (the parse names it).
  ASSIGN_OR_RETURN(std::string etag, NamedParse(ParseCompleteMultipartUpload(response.body),
                                                call.operation, bucket, key));
  if (!etag.empty()) return etag;
  // Ceph RGW 16 (Debian 12's) answers an empty <ETag/>; the object's HEAD
  // has it.
  ASSIGN_OR_RETURN(ObjectSummary head, HeadObject(bucket, key));
  if (head.etag.empty()) {
    return absl::InternalError(absl::StrCat("S3 CompleteMultipartUpload ", ObjectName(bucket, key),
                                            ": no ETag in the answer or the object's HEAD"));
  }
  return std::move(head.etag);
}

absl::Status S3Client::AbortMultipartUpload(absl::string_view bucket, absl::string_view key,
                                            absl::string_view upload_id) {
  Call call{.operation = "AbortMultipartUpload", .bucket = bucket, .key = key,
            .method = "DELETE", .query = {{"uploadId", std::string(upload_id)}}};
  absl::Status status = Execute(call).status();
  // 404 NoSuchUpload: gone already. Ceph RGW answers so to an upload
  // aborted before (SeaweedFS answers 204), and so to a retried abort whose
  // first attempt's answer was lost.
  if (absl::IsNotFound(status) && absl::StrContains(status.message(), "HTTP 404 NoSuchUpload")) {
    return absl::OkStatus();
  }
  return status;
}

absl::StatusOr<std::vector<MultipartUploadSummary>> S3Client::ListMultipartUploads(
    absl::string_view bucket, absl::string_view prefix) {
  std::vector<MultipartUploadSummary> uploads;
  std::string key_marker;
  std::string upload_id_marker;
  while (true) {
    Call call{.operation = "ListMultipartUploads", .bucket = bucket, .method = "GET"};
    call.query = {{"uploads", ""}, {"prefix", std::string(prefix)}};
    if (!key_marker.empty()) {
      call.query.emplace_back("key-marker", key_marker);
      call.query.emplace_back("upload-id-marker", upload_id_marker);
    }
    ASSIGN_OR_RETURN(HttpResponse response, Execute(call));
    ASSIGN_OR_RETURN(MultipartUploadsPage page,
                     NamedParse(ParseMultipartUploadsPage(response.body), call.operation,
                                bucket, prefix));
    for (MultipartUploadSummary& upload : page.uploads) uploads.push_back(std::move(upload));
    if (uploads.size() > options_.max_list_entries) {
      return absl::ResourceExhaustedError(
          absl::StrCat("S3 ListMultipartUploads ", ObjectName(bucket, prefix), ": more than ",
                       options_.max_list_entries, " uploads (max_list_entries)"));
    }
    if (!page.is_truncated) return uploads;
    if (page.next_key_marker == key_marker && page.next_upload_id_marker == upload_id_marker) {
      return absl::InternalError(absl::StrCat("S3 ListMultipartUploads ",
                                              ObjectName(bucket, prefix),
                                              ": the server repeated its markers"));
    }
    key_marker = std::move(page.next_key_marker);
    upload_id_marker = std::move(page.next_upload_id_marker);
  }
}

}  // namespace ckpt::s3
