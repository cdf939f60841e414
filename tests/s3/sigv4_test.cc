// SigV4 against AWS's published examples (Amazon S3 API Reference,
// "Signature Calculations for the Authorization Header: Transferring
// Payload in a Single Chunk", examples GET Object, PUT Object, GET Bucket
// Lifecycle and Get Bucket (List Objects)): every intermediate checked.
#include <catch2/catch.hpp>

#include "absl/time/time.h"
#include "storage/s3/sigv4.h"

namespace ckpt::s3 {
namespace {

constexpr char kAccessKey[] = "AKIAIOSFODNN7EXAMPLE";
constexpr char kSecretKey[] = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
constexpr char kHost[] = "examplebucket.s3.amazonaws.com";

SigningScope ExampleScope() {
  const absl::Time time =
      absl::FromCivil(absl::CivilSecond(2013, 5, 24, 0, 0, 0), absl::UTCTimeZone());
  REQUIRE(AmzDate(time) == "20130524T000000Z");
  return SigningScope{.time = time, .region = "us-east-1"};
}

struct Expected {
  std::string canonical_request;
  std::string string_to_sign;
  std::string authorization;
};

void CheckExample(const SigningRequest& request, const Expected& expected) {
  const SigningScope scope = ExampleScope();
  std::string signed_headers;
  const std::string canonical = CanonicalRequest(request, &signed_headers);
  CHECK(canonical == expected.canonical_request);
  CHECK(StringToSign(scope, canonical) == expected.string_to_sign);
  auto authorization = AuthorizationHeader(request, scope, kAccessKey, kSecretKey);
  REQUIRE(authorization.ok());
  CHECK(*authorization == expected.authorization);
}

TEST_CASE("SigV4: AWS's GET Object example (a Range header signed)", "[sigv4]") {
  SigningRequest request{
      .method = "GET",
      .canonical_uri = "/test.txt",
      .query = {},
      .headers = {{"Host", kHost},
                  {"Range", "bytes=0-9"},
                  {"x-amz-content-sha256", std::string(kEmptyPayloadSha256)},
                  {"x-amz-date", "20130524T000000Z"}},
      .payload_hash = std::string(kEmptyPayloadSha256)};
  CheckExample(request,
               {.canonical_request = "GET\n/test.txt\n\n"
                                     "host:examplebucket.s3.amazonaws.com\n"
                                     "range:bytes=0-9\n"
                                     "x-amz-content-sha256:"
                                     "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n"
                                     "x-amz-date:20130524T000000Z\n\n"
                                     "host;range;x-amz-content-sha256;x-amz-date\n"
                                     "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                .string_to_sign = "AWS4-HMAC-SHA256\n20130524T000000Z\n"
                                  "20130524/us-east-1/s3/aws4_request\n"
                                  "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972",
                .authorization =
                    "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/"
                    "aws4_request,SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
                    "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"});
}

TEST_CASE("SigV4: AWS's PUT Object example ('$' in the key encoded, the body hashed)",
          "[sigv4]") {
  const std::string payload_hash = Sha256Hex("Welcome to Amazon S3.");
  REQUIRE(payload_hash == "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
  SigningRequest request{
      .method = "PUT",
      .canonical_uri = "/" + UriEncode("test$file.text", /*keep_slash=*/true),
      .query = {},
      .headers = {{"Host", kHost},
                  {"Date", "Fri, 24 May 2013 00:00:00 GMT"},
                  {"x-amz-date", "20130524T000000Z"},
                  {"x-amz-storage-class", "REDUCED_REDUNDANCY"},
                  {"x-amz-content-sha256", payload_hash}},
      .payload_hash = payload_hash};
  CheckExample(
      request,
      {.canonical_request = "PUT\n/test%24file.text\n\n"
                            "date:Fri, 24 May 2013 00:00:00 GMT\n"
                            "host:examplebucket.s3.amazonaws.com\n"
                            "x-amz-content-sha256:"
                            "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072\n"
                            "x-amz-date:20130524T000000Z\n"
                            "x-amz-storage-class:REDUCED_REDUNDANCY\n\n"
                            "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class\n"
                            "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072",
       .string_to_sign = "AWS4-HMAC-SHA256\n20130524T000000Z\n"
                         "20130524/us-east-1/s3/aws4_request\n"
                         "9e0e90d9c76de8fa5b200d8c849cd5b8dc7a3be3951ddb7f6a76b4158342019d",
       .authorization =
           "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
           "SignedHeaders=date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class,"
           "Signature=98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd"});
}

// The two bucket-level GET examples differ only in their query, and so in
// the canonical request's third line, the string to sign and the signature.
void CheckBucketGetExample(const QueryParams& query, const std::string& canonical_query,
                           const std::string& canonical_request_hash,
                           const std::string& signature) {
  SigningRequest request{
      .method = "GET",
      .canonical_uri = "/",
      .query = query,
      .headers = {{"Host", kHost},
                  {"x-amz-date", "20130524T000000Z"},
                  {"x-amz-content-sha256", std::string(kEmptyPayloadSha256)}},
      .payload_hash = std::string(kEmptyPayloadSha256)};
  CheckExample(
      request,
      {.canonical_request = "GET\n/\n" + canonical_query + "\n" +
                            "host:examplebucket.s3.amazonaws.com\n"
                            "x-amz-content-sha256:"
                            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n"
                            "x-amz-date:20130524T000000Z\n\n"
                            "host;x-amz-content-sha256;x-amz-date\n"
                            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
       .string_to_sign = "AWS4-HMAC-SHA256\n20130524T000000Z\n"
                         "20130524/us-east-1/s3/aws4_request\n" +
                         canonical_request_hash,
       .authorization =
           "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
           "SignedHeaders=host;x-amz-content-sha256;x-amz-date,Signature=" +
           signature});
}

TEST_CASE("SigV4: AWS's GET Bucket Lifecycle example (a parameter without a value)",
          "[sigv4]") {
  CheckBucketGetExample({{"lifecycle", ""}}, "lifecycle=",
                        "9766c798316ff2757b517bc739a67f6213b4ab36dd5da2f94eaebf79c77395ca",
                        "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
}

TEST_CASE("SigV4: AWS's List Objects example (parameters sorted by name)", "[sigv4]") {
  CheckBucketGetExample({{"prefix", "J"}, {"max-keys", "2"}},  // out of order on purpose
                        "max-keys=2&prefix=J",
                        "df57d21db20da04d7fa30298dd4488ba3a2b47ca3a489c74750e0f1e7df1b9b7",
                        "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

TEST_CASE("SigV4: URI encoding keeps unreserved bytes and, in paths, '/'", "[sigv4]") {
  CHECK(UriEncode("a-b_c.d~e/f g+h%", true) == "a-b_c.d~e/f%20g%2Bh%25");
  CHECK(UriEncode("a/b", false) == "a%2Fb");
  CHECK(UriEncode("\xc3\xa9", true) == "%C3%A9");  // UTF-8 bytes, upper-case hex
  CHECK(CanonicalQueryString({{"uploadId", "a/b=c"}, {"partNumber", "2"}}) ==
        "partNumber=2&uploadId=a%2Fb%3Dc");
}

TEST_CASE("SigV4: header values are trimmed and inner spaces collapsed", "[sigv4]") {
  SigningRequest request{.method = "GET", .canonical_uri = "/", .query = {},
                         .headers = {{"X-Amz-Meta-A", "  one   two  "}},
                         .payload_hash = std::string(kUnsignedPayload)};
  std::string signed_headers;
  const std::string canonical = CanonicalRequest(request, &signed_headers);
  CHECK(canonical == "GET\n/\n\nx-amz-meta-a:one two\n\nx-amz-meta-a\nUNSIGNED-PAYLOAD");
  CHECK(signed_headers == "x-amz-meta-a");
}

}  // namespace
}  // namespace ckpt::s3
