// Where objects live: an `s3://bucket/prefix` location, the endpoint that
// serves it, and how a request for one object is addressed (URL and Host
// header) in either of S3's two addressing styles:
//
//   path style:          http://127.0.0.1:8333/bucket/key   Host: 127.0.0.1:8333
//   virtual-host style:  https://bucket.s3.amazonaws.com/key Host: bucket.s3.amazonaws.com
//
// Path style is what S3-compatible servers on an IP address need (SeaweedFS,
// Ceph RGW, MinIO); AWS prefers virtual-host style. Bucket names and keys
// are checked here, once, so that a typo fails at startup with its reason
// rather than as a server's 400 later.
//
// Thread-safety: values.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt::s3 {

// `s3://bucket/prefix`: the prefix has no leading '/', may be empty, and
// keeps a trailing '/' as given.
struct S3Uri {
  std::string bucket;
  std::string prefix;
};
absl::StatusOr<S3Uri> ParseS3Uri(absl::string_view uri);

// S3's bucket naming rules: 3-63 characters of a-z 0-9 . -, starting and
// ending with a letter or digit, no "..", not an IPv4 address.
absl::Status ValidateBucketName(absl::string_view bucket);
// 1-1024 bytes, no NUL or other control characters (they survive
// signing but not every server's path handling).
absl::Status ValidateObjectKey(absl::string_view key);

struct S3Endpoint {
  bool https = true;
  std::string host;   // a name, an IPv4 address, or [IPv6]
  uint16_t port = 0;  // 0: the scheme's default
  // "host" or "host:port" (a non-default port): the Host header's value.
  std::string Authority() const;
};
// "http://host[:port]" or "https://host[:port]", with no path, query,
// user or fragment (a trailing '/' is accepted).
absl::StatusOr<S3Endpoint> ParseEndpoint(absl::string_view url);

enum class AddressingStyle { kPath, kVirtualHost };
absl::StatusOr<AddressingStyle> ParseAddressingStyle(absl::string_view name);

// One request's target. `canonical_uri` is the encoded path, identical in
// the URL and in the signature.
struct RequestTarget {
  std::string url;  // scheme://authority + canonical_uri (+ "?" query)
  std::string host;
  std::string canonical_uri;
};

class S3Addressing {
 public:
  S3Addressing(S3Endpoint endpoint, std::string region, AddressingStyle style)
      : endpoint_(std::move(endpoint)), region_(std::move(region)), style_(style) {}

  // The object `key` in `bucket` (key empty: the bucket itself), with the
  // already canonical query string `query` (may be empty).
  RequestTarget Target(absl::string_view bucket, absl::string_view key,
                       absl::string_view query) const;

  const S3Endpoint& endpoint() const { return endpoint_; }
  const std::string& region() const { return region_; }
  AddressingStyle style() const { return style_; }

 private:
  S3Endpoint endpoint_;
  std::string region_;
  AddressingStyle style_;
};

}  // namespace ckpt::s3
