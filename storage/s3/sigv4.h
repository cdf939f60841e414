// AWS Signature Version 4 for S3 requests, header-based
// (docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html).
//
// Written here rather than taken from a library: Debian has no AWS C++ SDK,
// and the algorithm is a page of string building over two primitives that
// OpenSSL provides (SHA-256, HMAC-SHA256). The steps are separate functions
// so that the unit tests check each intermediate (canonical request, string
// to sign, signature) against AWS's published examples.
//
// Every header handed to SignRequest is signed; S3 needs host,
// x-amz-date and x-amz-content-sha256, and any x-amz-* header that is sent
// must be signed too (S3 rejects an unsigned x-amz-* header).
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ckpt::s3 {

// The x-amz-content-sha256 of a body that is sent unhashed (a large part
// whose integrity ckptd's own block checksums already cover; hashing 64 MiB
// parts twice would cost CPU on the upload path for nothing).
inline constexpr absl::string_view kUnsignedPayload = "UNSIGNED-PAYLOAD";
// SHA-256 of the empty string: the payload hash of GET, HEAD and DELETE.
inline constexpr absl::string_view kEmptyPayloadSha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

using HeaderList = std::vector<std::pair<std::string, std::string>>;
using QueryParams = std::vector<std::pair<std::string, std::string>>;

// Percent-encodes `text` as SigV4 wants: the unreserved characters
// (A-Z a-z 0-9 - _ . ~) stay, every other byte becomes %XX (upper-case
// hex); '/' stays only when `keep_slash` (object key paths: each segment
// encoded, the separators kept).
std::string UriEncode(absl::string_view text, bool keep_slash);

// "name=value&..." with names and values encoded and sorted by name, then
// value; a parameter without a value gives "name=". The same string is the
// request URL's query, so what is signed is what is sent.
std::string CanonicalQueryString(const QueryParams& params);

// Lower-case hex SHA-256 of `data`.
std::string Sha256Hex(absl::string_view data);

// "20130524T000000Z": the x-amz-date form of `time` (UTC).
std::string AmzDate(absl::Time time);

struct SigningRequest {
  std::string method;         // "GET", "PUT", ...
  std::string canonical_uri;  // the encoded path, as sent ("/bucket/a%24b")
  QueryParams query;          // not encoded
  HeaderList headers;         // every header to sign, any case
  std::string payload_hash;   // Sha256Hex(body), or kUnsignedPayload
};

struct SigningScope {
  absl::Time time;     // the request's x-amz-date
  std::string region;  // "us-east-1"
  std::string service = "s3";
};

// The signature's steps, in order.
std::string CanonicalRequest(const SigningRequest& request,
                             std::string* signed_headers);
std::string StringToSign(const SigningScope& scope,
                         absl::string_view canonical_request);
// HMAC chain of "AWS4"+secret over date, region, service, "aws4_request".
absl::StatusOr<std::string> SigningKey(absl::string_view secret_access_key,
                                       const SigningScope& scope);
// Lower-case hex HMAC-SHA256(signing_key, string_to_sign).
absl::StatusOr<std::string> Signature(absl::string_view signing_key,
                                      absl::string_view string_to_sign);

// The Authorization header's value for `request`:
// "AWS4-HMAC-SHA256 Credential=<id>/<scope>,SignedHeaders=...,Signature=...".
absl::StatusOr<std::string> AuthorizationHeader(
    const SigningRequest& request, const SigningScope& scope,
    absl::string_view access_key_id, absl::string_view secret_access_key);

}  // namespace ckpt::s3
