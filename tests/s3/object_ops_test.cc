// Object operations against a real S3 server (SeaweedFS or Ceph RGW:
// s3_test_server.h; signatures checked): round trips, ranged reads, listing past a page, and the
// errors that must not be retried.
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "s3/s3_test_server.h"
#include "support/skip.h"

namespace ckpt::s3 {
namespace {

using testing::S3TestServer;

std::string Pattern(size_t size, uint32_t seed) {
  std::string bytes(size, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (char& c : bytes) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<char>(x >> 24);
  }
  return bytes;
}

bool Contains(const absl::Status& status, const std::string& text) {
  return std::string(status.message()).find(text) != std::string::npos;
}

// The server (SeaweedFS, or Ceph RGW: s3_test_server.h) and its bucket.
#define START_SERVER(server)                                    \
  std::string skip_reason;                                      \
  auto server = S3TestServer::Start(&skip_reason);              \
  if (server == nullptr) CKPT_SKIP(skip_reason);                \
  const std::string bucket = server->bucket()

TEST_CASE("s3 object ops: put, head, get and delete round trip, and a range reads exact bytes",
          "[server][s3server]") {
  START_SERVER(server);
  auto client = server->Client();
  const std::string bytes = Pattern(3 << 20, 1);
  const std::string key = "round trip/object $1.bin";  // encoded on the way
  auto etag = client->PutObject(bucket, key, bytes);
  REQUIRE(etag.ok());
  CHECK_FALSE(etag->empty());

  auto head = client->HeadObject(bucket, key);
  REQUIRE(head.ok());
  CHECK(head->size == bytes.size());

  std::string whole(bytes.size(), '\0');
  auto read = client->GetObject(bucket, key, absl::MakeSpan(whole));
  REQUIRE(read.ok());
  CHECK(*read == bytes.size());
  CHECK(whole == bytes);

  // A range in the middle, across no particular boundary, and the tail.
  for (auto [offset, length] : std::vector<std::pair<uint64_t, uint64_t>>{
           {12345, 777777}, {bytes.size() - 10, 10}, {0, 1}}) {
    std::string part(length, '\0');
    auto got = client->GetObject(bucket, key, absl::MakeSpan(part),
                                 ByteRange{offset, length});
    REQUIRE(got.ok());
    CHECK(*got == length);
    CHECK(part == bytes.substr(offset, length));
  }

  // A buffer too small for the object: an error, not a truncated read.
  std::string small(100, '\0');
  auto too_small = client->GetObject(bucket, key, absl::MakeSpan(small));
  CHECK(absl::IsResourceExhausted(too_small.status()));

  REQUIRE(client->DeleteObject(bucket, key).ok());
  auto gone = client->HeadObject(bucket, key);
  CHECK(absl::IsNotFound(gone.status()));
  CHECK(Contains(gone.status(),
                 absl::StrCat("S3 HeadObject s3://", bucket, "/round trip/object $1.bin")));
  auto get_gone = client->GetObject(bucket, key, absl::MakeSpan(whole));
  CHECK(absl::IsNotFound(get_gone.status()));
  CHECK(Contains(get_gone.status(), "NoSuchKey"));
  // The caller's buffer is not written with the error's XML.
  CHECK(whole == bytes);
}

TEST_CASE("s3 object ops: LIST of 1,100 keys follows continuation tokens to all of them",
          "[server][s3server]") {
  START_SERVER(server);
  auto client = server->Client();
  std::set<std::string> expected;
  for (int i = 0; i < 1100; ++i) {
    const std::string key = absl::StrFormat("list/step-1/obj-%05d", i);
    REQUIRE(client->PutObject(bucket, key, "x").ok());
    expected.insert(key);
  }
  REQUIRE(client->PutObject(bucket, "list/step-2/only", "y").ok());
  REQUIRE(client->PutObject(bucket, "elsewhere", "z").ok());

  auto listed = client->ListObjects(bucket, "list/step-1/");
  REQUIRE(listed.ok());
  CHECK(listed->pages >= 2);
  std::set<std::string> keys;
  for (const ObjectSummary& object : listed->objects) {
    CHECK(object.size == 1);
    keys.insert(object.key);
  }
  CHECK(listed->objects.size() == 1100);  // none twice
  CHECK(keys == expected);

  auto by_step = client->ListObjects(bucket, "list/", "/");
  REQUIRE(by_step.ok());
  CHECK(by_step->objects.empty());
  CHECK(by_step->common_prefixes == std::vector<std::string>{"list/step-1/", "list/step-2/"});
}

TEST_CASE("s3 object ops: a wrong secret is a 403 naming the key, tried once",
          "[server][s3server]") {
  START_SERVER(server);
  S3ClientOptions options = server->ClientOptions();
  const std::string wrong_secret = "not-the-secret-at-all-0123456789";
  options.credentials.secret_access_key = Secret(wrong_secret);
  auto client = S3Client::Create(options);
  REQUIRE(client.ok());
  auto put = (*client)->PutObject(bucket, "denied/key", "bytes");
  INFO(put.status());
  CHECK(absl::IsPermissionDenied(put.status()));
  CHECK(Contains(put.status(), absl::StrCat("S3 PutObject s3://", bucket,
                                            "/denied/key: HTTP 403 SignatureDoesNotMatch")));
  CHECK_FALSE(Contains(put.status(), wrong_secret));
  CHECK_FALSE(Contains(put.status(), server->secret_key()));
  CHECK((*client)->attempts() == 1);

  options.credentials.access_key_id = "NOSUCHACCESSKEY";
  auto unknown = S3Client::Create(options);
  REQUIRE(unknown.ok());
  auto get = (*unknown)->HeadObject(bucket, "denied/key");
  CHECK(absl::IsPermissionDenied(get.status()));
  CHECK((*unknown)->attempts() == 1);
}

TEST_CASE("s3 object ops: a missing bucket is a 404 NoSuchBucket, tried once",
          "[server][s3server]") {
  START_SERVER(server);
  auto client = server->Client();
  auto put = client->PutObject("no-such-bucket", "k", "bytes");
  INFO(put.status());
  CHECK(absl::IsNotFound(put.status()));
  CHECK(Contains(put.status(), "S3 PutObject s3://no-such-bucket/k: HTTP 404 NoSuchBucket"));
  CHECK(client->attempts() == 1);
  auto list = client->ListObjects("no-such-bucket", "");
  CHECK(absl::IsNotFound(list.status()));
  CHECK(client->attempts() == 2);
}

}  // namespace
}  // namespace ckpt::s3
