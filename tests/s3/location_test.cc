// s3:// locations, endpoints, names, and both addressing styles' URLs.
#include <catch2/catch.hpp>

#include "storage/s3/s3_location.h"

namespace ckpt::s3 {
namespace {

TEST_CASE("location: s3://bucket/prefix parses, and a bad bucket says why", "[location]") {
  auto parsed = ParseS3Uri("s3://ckpt-bucket/jobs/llama/");
  REQUIRE(parsed.ok());
  CHECK(parsed->bucket == "ckpt-bucket");
  CHECK(parsed->prefix == "jobs/llama/");
  auto bare = ParseS3Uri("s3://ckpt-bucket");
  REQUIRE(bare.ok());
  CHECK(bare->prefix.empty());

  CHECK(absl::IsInvalidArgument(ParseS3Uri("http://b/x").status()));
  auto upper = ParseS3Uri("s3://Bucket/x");
  CHECK(absl::IsInvalidArgument(upper.status()));
  CHECK(std::string(upper.status().message()).find("lower-case") != std::string::npos);
  for (const char* bad : {"ab", "-abc", "abc-", "a..b", "192.168.1.1", "a_b",
                          "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}) {
    INFO(bad);
    CHECK(absl::IsInvalidArgument(ValidateBucketName(bad)));
  }
  for (const char* good : {"abc", "my.bucket-1", "0ckpt9"}) {
    INFO(good);
    CHECK(ValidateBucketName(good).ok());
  }
  CHECK(absl::IsInvalidArgument(ValidateObjectKey("")));
  CHECK(absl::IsInvalidArgument(ValidateObjectKey(std::string(1025, 'k'))));
  CHECK(absl::IsInvalidArgument(ValidateObjectKey("a\nb")));
  CHECK(ValidateObjectKey("step-100/rank 0/ü.safetensors").ok());
}

TEST_CASE("location: endpoints: scheme, host, port", "[location]") {
  auto local = ParseEndpoint("http://127.0.0.1:8333/");
  REQUIRE(local.ok());
  CHECK_FALSE(local->https);
  CHECK(local->host == "127.0.0.1");
  CHECK(local->port == 8333);
  CHECK(local->Authority() == "127.0.0.1:8333");
  auto aws = ParseEndpoint("https://s3.eu-west-1.amazonaws.com");
  REQUIRE(aws.ok());
  CHECK(aws->https);
  CHECK(aws->Authority() == "s3.eu-west-1.amazonaws.com");
  auto v6 = ParseEndpoint("http://[::1]:9000");
  REQUIRE(v6.ok());
  CHECK(v6->host == "[::1]");
  CHECK(v6->port == 9000);
  for (const char* bad : {"ftp://x", "x:80", "http://", "http://h:0", "http://h:99999",
                          "http://h/path", "http://u@h", "http://h:"}) {
    INFO(bad);
    CHECK(absl::IsInvalidArgument(ParseEndpoint(bad).status()));
  }
  CHECK(*ParseAddressingStyle("path") == AddressingStyle::kPath);
  CHECK(*ParseAddressingStyle("virtual") == AddressingStyle::kVirtualHost);
  CHECK(absl::IsInvalidArgument(ParseAddressingStyle("dns").status()));
}

TEST_CASE("location: path style puts the bucket in the path, virtual-host style in the host",
          "[location]") {
  struct Case {
    const char* endpoint;
    AddressingStyle style;
    const char* bucket;
    const char* key;
    const char* query;
    const char* url;
    const char* host;
    const char* canonical_uri;
  };
  const Case cases[] = {
      {"http://127.0.0.1:8333", AddressingStyle::kPath, "ckpt", "step 1/a$b", "",
       "http://127.0.0.1:8333/ckpt/step%201/a%24b", "127.0.0.1:8333", "/ckpt/step%201/a%24b"},
      {"http://127.0.0.1:8333", AddressingStyle::kPath, "ckpt", "", "list-type=2&prefix=x",
       "http://127.0.0.1:8333/ckpt?list-type=2&prefix=x", "127.0.0.1:8333", "/ckpt"},
      {"https://s3.amazonaws.com", AddressingStyle::kVirtualHost, "examplebucket", "test.txt",
       "", "https://examplebucket.s3.amazonaws.com/test.txt", "examplebucket.s3.amazonaws.com",
       "/test.txt"},
      {"https://s3.amazonaws.com", AddressingStyle::kVirtualHost, "examplebucket", "",
       "uploads=", "https://examplebucket.s3.amazonaws.com/?uploads=",
       "examplebucket.s3.amazonaws.com", "/"},
  };
  for (const Case& c : cases) {
    INFO(c.url);
    S3Addressing addressing(*ParseEndpoint(c.endpoint), "us-east-1", c.style);
    const RequestTarget target = addressing.Target(c.bucket, c.key, c.query);
    CHECK(target.url == c.url);
    CHECK(target.host == c.host);
    CHECK(target.canonical_uri == c.canonical_uri);
  }
}

}  // namespace
}  // namespace ckpt::s3
