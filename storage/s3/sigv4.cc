#include "storage/s3/sigv4.h"

#include <openssl/hmac.h>
#include <openssl/sha.h>

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt::s3 {
namespace {

bool IsUnreserved(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' ||
         c == '_' || c == '.' || c == '~';
}

std::string Hex(const unsigned char* bytes, size_t size) {
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), size));
}

absl::StatusOr<std::string> HmacSha256(absl::string_view key,
                                       absl::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(data.data()), data.size(),
           digest, &size) == nullptr) {
    return absl::InternalError("HMAC-SHA256 failed (OpenSSL)");
  }
  return std::string(reinterpret_cast<const char*>(digest), size);
}

// A header value as SigV4 canonicalizes it: trimmed, inner runs of spaces
// collapsed to one.
std::string TrimAll(absl::string_view value) {
  std::string out;
  bool space = false;
  for (char c : absl::StripAsciiWhitespace(value)) {
    if (c == ' ' || c == '\t') {
      space = true;
      continue;
    }
    if (space) out.push_back(' ');
    space = false;
    out.push_back(c);
  }
  return out;
}

std::string DateStamp(absl::Time time) {
  return absl::FormatTime("%Y%m%d", time, absl::UTCTimeZone());
}

std::string CredentialScope(const SigningScope& scope) {
  return absl::StrCat(DateStamp(scope.time), "/", scope.region, "/",
                      scope.service, "/aws4_request");
}

}  // namespace

std::string UriEncode(absl::string_view text, bool keep_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (IsUnreserved(c) || (keep_slash && c == '/')) {
      out.push_back(c);
    } else {
      const auto byte = static_cast<unsigned char>(c);
      out.push_back('%');
      out.push_back(kHex[byte >> 4]);
      out.push_back(kHex[byte & 0xF]);
    }
  }
  return out;
}

std::string CanonicalQueryString(const QueryParams& params) {
  std::vector<std::pair<std::string, std::string>> encoded;
  encoded.reserve(params.size());
  for (const auto& [name, value] : params) {
    encoded.emplace_back(UriEncode(name, false), UriEncode(value, false));
  }
  std::sort(encoded.begin(), encoded.end());
  return absl::StrJoin(encoded, "&", absl::PairFormatter("="));
}

std::string Sha256Hex(absl::string_view data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  // SHA256() only fails on a null output buffer, which this is not.
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(),
         digest);
  return Hex(digest, sizeof(digest));
}

std::string AmzDate(absl::Time time) {
  return absl::FormatTime("%Y%m%dT%H%M%SZ", time, absl::UTCTimeZone());
}

std::string CanonicalRequest(const SigningRequest& request,
                             std::string* signed_headers) {
  std::vector<std::pair<std::string, std::string>> headers;
  headers.reserve(request.headers.size());
  for (const auto& [name, value] : request.headers) {
    headers.emplace_back(absl::AsciiStrToLower(name), TrimAll(value));
  }
  std::sort(headers.begin(), headers.end());
  std::string canonical_headers;
  std::vector<absl::string_view> names;
  for (const auto& [name, value] : headers) {
    absl::StrAppend(&canonical_headers, name, ":", value, "\n");
    names.push_back(name);
  }
  *signed_headers = absl::StrJoin(names, ";");
  return absl::StrCat(request.method, "\n", request.canonical_uri, "\n",
                      CanonicalQueryString(request.query), "\n",
                      canonical_headers, "\n", *signed_headers, "\n",
                      request.payload_hash);
}

std::string StringToSign(const SigningScope& scope,
                         absl::string_view canonical_request) {
  return absl::StrCat("AWS4-HMAC-SHA256\n", AmzDate(scope.time), "\n",
                      CredentialScope(scope), "\n",
                      Sha256Hex(canonical_request));
}

absl::StatusOr<std::string> SigningKey(absl::string_view secret_access_key,
                                       const SigningScope& scope) {
  std::string key = absl::StrCat("AWS4", secret_access_key);
  const std::string date = DateStamp(scope.time);
  for (absl::string_view step : {absl::string_view(date),
                                 absl::string_view(scope.region),
                                 absl::string_view(scope.service),
                                 absl::string_view("aws4_request")}) {
    auto next = HmacSha256(key, step);
    if (!next.ok()) return next.status();
    key = *std::move(next);
  }
  return key;
}

absl::StatusOr<std::string> Signature(absl::string_view signing_key,
                                      absl::string_view string_to_sign) {
  auto mac = HmacSha256(signing_key, string_to_sign);
  if (!mac.ok()) return mac.status();
  return absl::BytesToHexString(*mac);
}

absl::StatusOr<std::string> AuthorizationHeader(
    const SigningRequest& request, const SigningScope& scope,
    absl::string_view access_key_id, absl::string_view secret_access_key) {
  std::string signed_headers;
  const std::string canonical = CanonicalRequest(request, &signed_headers);
  auto key = SigningKey(secret_access_key, scope);
  if (!key.ok()) return key.status();
  auto signature = Signature(*key, StringToSign(scope, canonical));
  if (!signature.ok()) return signature.status();
  return absl::StrCat("AWS4-HMAC-SHA256 Credential=", access_key_id, "/",
                      CredentialScope(scope), ",SignedHeaders=", signed_headers,
                      ",Signature=", *signature);
}

}  // namespace ckpt::s3
