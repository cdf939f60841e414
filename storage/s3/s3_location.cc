#include "storage/s3/s3_location.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "storage/s3/sigv4.h"

namespace ckpt::s3 {
namespace {

bool LooksLikeIpv4(absl::string_view name) {
  std::vector<absl::string_view> parts = absl::StrSplit(name, '.');
  if (parts.size() != 4) return false;
  for (absl::string_view part : parts) {
    int value = 0;
    if (part.empty() || !absl::SimpleAtoi(part, &value)) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<S3Uri> ParseS3Uri(absl::string_view uri) {
  absl::string_view rest = uri;
  if (!absl::ConsumePrefix(&rest, "s3://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", uri, "' is not an s3://bucket/prefix location"));
  }
  const size_t slash = rest.find('/');
  S3Uri parsed;
  parsed.bucket = std::string(rest.substr(0, slash));
  if (slash != absl::string_view::npos) parsed.prefix = std::string(rest.substr(slash + 1));
  if (absl::Status bucket = ValidateBucketName(parsed.bucket); !bucket.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("'", uri, "': ", bucket.message()));
  }
  if (!parsed.prefix.empty()) {
    if (absl::Status prefix = ValidateObjectKey(parsed.prefix); !prefix.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("'", uri, "': prefix: ", prefix.message()));
    }
  }
  return parsed;
}

absl::Status ValidateBucketName(absl::string_view bucket) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucket name '", absl::CEscape(bucket), "' ", why));
  };
  if (bucket.size() < 3 || bucket.size() > 63) return bad("must be 3 to 63 characters long");
  for (char c : bucket) {
    if (!(absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '.' || c == '-')) {
      return bad("may hold only lower-case letters, digits, '.' and '-'");
    }
  }
  if (!absl::ascii_isalnum(bucket.front()) || !absl::ascii_isalnum(bucket.back())) {
    return bad("must start and end with a letter or digit");
  }
  if (absl::StrContains(bucket, "..")) return bad("must not hold '..'");
  if (LooksLikeIpv4(bucket)) return bad("must not be an IP address");
  return absl::OkStatus();
}

absl::Status ValidateObjectKey(absl::string_view key) {
  if (key.empty() || key.size() > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("object key must be 1 to 1024 bytes long (is ", key.size(), ")"));
  }
  for (char c : key) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat(
          "object key '", absl::CEscape(key), "' holds a control character"));
    }
  }
  return absl::OkStatus();
}

std::string S3Endpoint::Authority() const {
  return port == 0 ? host : absl::StrCat(host, ":", port);
}

absl::StatusOr<S3Endpoint> ParseEndpoint(absl::string_view url) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("endpoint '", url, "' ", why));
  };
  S3Endpoint endpoint;
  absl::string_view rest = url;
  if (absl::ConsumePrefix(&rest, "https://")) {
    endpoint.https = true;
  } else if (absl::ConsumePrefix(&rest, "http://")) {
    endpoint.https = false;
  } else {
    return bad("must start with http:// or https://");
  }
  absl::ConsumeSuffix(&rest, "/");
  if (rest.find_first_of("/?#@ ") != absl::string_view::npos) {
    return bad("must be scheme://host[:port] only (no path, query or user)");
  }
  absl::string_view host = rest;
  absl::string_view port;
  if (absl::StartsWith(rest, "[")) {  // [IPv6]:port
    const size_t close = rest.find(']');
    if (close == absl::string_view::npos) return bad("has an unclosed '['");
    host = rest.substr(0, close + 1);
    absl::string_view after = rest.substr(close + 1);
    if (!after.empty() && !absl::ConsumePrefix(&after, ":")) return bad("has junk after ']'");
    port = after;
  } else if (const size_t colon = rest.rfind(':'); colon != absl::string_view::npos) {
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  if (host.empty()) return bad("has no host");
  endpoint.host = std::string(host);
  if (!port.empty() || rest.back() == ':') {
    int number = 0;
    if (!absl::SimpleAtoi(port, &number) || number < 1 || number > 65535) {
      return bad("has a port that is not 1-65535");
    }
    endpoint.port = static_cast<uint16_t>(number);
  }
  return endpoint;
}

absl::StatusOr<AddressingStyle> ParseAddressingStyle(absl::string_view name) {
  if (name == "path") return AddressingStyle::kPath;
  if (name == "virtual" || name == "virtual-host") return AddressingStyle::kVirtualHost;
  return absl::InvalidArgumentError(absl::StrCat(
      "addressing style '", name, "' is neither 'path' nor 'virtual'"));
}

RequestTarget S3Addressing::Target(absl::string_view bucket, absl::string_view key,
                                   absl::string_view query) const {
  RequestTarget target;
  const std::string encoded_key = UriEncode(key, /*keep_slash=*/true);
  if (style_ == AddressingStyle::kPath) {
    target.host = endpoint_.Authority();
    target.canonical_uri = absl::StrCat("/", bucket, key.empty() ? "" : "/", encoded_key);
  } else {
    target.host = absl::StrCat(bucket, ".", endpoint_.Authority());
    target.canonical_uri = absl::StrCat("/", encoded_key);
  }
  target.url = absl::StrCat(endpoint_.https ? "https://" : "http://", target.host,
                            target.canonical_uri, query.empty() ? "" : "?", query);
  return target;
}

}  // namespace ckpt::s3
