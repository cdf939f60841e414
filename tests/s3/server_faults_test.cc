// The failures a real S3 server will not show on demand, from a tiny
// in-test HTTP responder on 127.0.0.1: a server that never answers, one
// that throttles and then recovers, one that fails a part.
#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "s3/tiny_http_server.h"
#include "storage/s3/multipart_upload.h"
#include "storage/s3/s3_client.h"

namespace ckpt::s3 {
namespace {

using testing::TinyHttpServer;

constexpr char kBucket[] = "ckpt-test";

S3ClientOptions LocalOptions(uint16_t port) {
  S3ClientOptions options;
  options.endpoint = S3Endpoint{.https = false, .host = "127.0.0.1", .port = port};
  options.style = AddressingStyle::kPath;
  options.credentials.access_key_id = "AKIDFAULTS";
  options.credentials.secret_access_key = Secret("fault-secret");
  options.retry.initial_backoff = absl::Milliseconds(10);
  options.retry.max_backoff = absl::Milliseconds(50);
  return options;
}

std::string ErrorXml(const std::string& code, const std::string& message) {
  return absl::StrCat("<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>", code,
                      "</Code><Message>", message, "</Message><RequestId>REQ1</RequestId></Error>");
}

TEST_CASE("s3 faults: a server that accepts and never answers fails within the deadline, "
          "naming the key",
          "[server]") {
  TinyHttpServer server(TinyHttpServer::Mode::kSilent);
  S3ClientOptions options = LocalOptions(server.port());
  options.request_timeout = absl::Seconds(2);
  options.transport.low_speed_time = absl::Seconds(1);  // a stall: < 1 KiB/s for 1 s
  options.retry.max_attempts = 2;
  options.retry.overall_deadline = absl::Seconds(5);
  auto client = S3Client::Create(options);
  REQUIRE(client.ok());

  const absl::Time start = absl::Now();
  auto put = (*client)->PutObject(kBucket, "hung/key", "payload");
  const absl::Duration took = absl::Now() - start;
  INFO(put.status());
  CHECK(absl::IsDeadlineExceeded(put.status()));
  CHECK(absl::StrContains(put.status().message(), "S3 PutObject s3://ckpt-test/hung/key"));
  CHECK((*client)->attempts() == 2);
  CHECK(took < options.retry.overall_deadline + absl::Seconds(1));
  CHECK(took >= absl::Seconds(1));  // the stall bound, twice, less the backoff
}

TEST_CASE("s3 faults: 503 SlowDown three times, then success: retried, four attempts",
          "[server]") {
  TinyHttpServer server(TinyHttpServer::Mode::kScripted, [](int index, const std::string&) {
    if (index < 3) {
      return TinyHttpServer::Response(503, ErrorXml("SlowDown", "Please reduce your request rate."));
    }
    return TinyHttpServer::Response(200, "", "ETag: \"etag-after-throttling\"\r\n");
  });
  auto client = S3Client::Create(LocalOptions(server.port()));
  REQUIRE(client.ok());
  auto put = (*client)->PutObject(kBucket, "throttled/key", "payload");
  REQUIRE(put.ok());
  CHECK(*put == "\"etag-after-throttling\"");
  CHECK((*client)->attempts() == 4);
  CHECK(server.request_count() == 4);
  for (const std::string& line : server.requests()) {
    CHECK(line == "PUT /ckpt-test/throttled/key HTTP/1.1");
  }

  // Throttled past max_attempts: the last answer, with the count.
  TinyHttpServer always(TinyHttpServer::Mode::kScripted, [](int, const std::string&) {
    return TinyHttpServer::Response(503, ErrorXml("SlowDown", "Please reduce your request rate."));
  });
  S3ClientOptions options = LocalOptions(always.port());
  options.retry.max_attempts = 3;
  auto throttled = S3Client::Create(options);
  REQUIRE(throttled.ok());
  auto failed = (*throttled)->GetObject(kBucket, "throttled/key", {});
  CHECK(absl::IsUnavailable(failed.status()));
  CHECK(std::string(failed.status().message()) ==
        "S3 GetObject s3://ckpt-test/throttled/key: gave up after 3 attempts: HTTP 503 "
        "SlowDown: Please reduce your request rate. (request id REQ1)");
  CHECK(always.request_count() == 3);
}

TEST_CASE("s3 faults: a part that fails for good aborts the multipart upload", "[server]") {
  TinyHttpServer server(TinyHttpServer::Mode::kScripted, [](int, const std::string& line) {
    if (absl::StartsWith(line, "POST") && absl::StrContains(line, "?uploads=")) {
      return TinyHttpServer::Response(
          200, "<InitiateMultipartUploadResult><UploadId>UPLOAD1</UploadId>"
               "</InitiateMultipartUploadResult>");
    }
    if (absl::StartsWith(line, "PUT") && absl::StrContains(line, "partNumber=2&")) {
      return TinyHttpServer::Response(403, ErrorXml("AccessDenied", "Access Denied"));
    }
    if (absl::StartsWith(line, "PUT")) {
      return TinyHttpServer::Response(200, "", "ETag: \"part\"\r\n");
    }
    if (absl::StartsWith(line, "DELETE")) return TinyHttpServer::Response(204, "");
    return TinyHttpServer::Response(500, ErrorXml("InternalError", "unexpected"));
  });
  auto client = S3Client::Create(LocalOptions(server.port()));
  REQUIRE(client.ok());
  const std::string bytes(12 << 20, 'x');
  auto uploaded = UploadMultipart(**client, kBucket, "mp/key", bytes,
                                  MultipartOptions{.part_size = 5 << 20, .parts_in_flight = 1});
  INFO(uploaded.status());
  CHECK(absl::IsPermissionDenied(uploaded.status()));
  CHECK(absl::StrContains(uploaded.status().message(), "multipart upload UPLOAD1 aborted"));
  CHECK(absl::StrContains(uploaded.status().message(),
                          "S3 UploadPart s3://ckpt-test/mp/key: HTTP 403 AccessDenied"));
  const std::vector<std::string> requests = server.requests();
  REQUIRE(!requests.empty());
  CHECK(requests.back() == "DELETE /ckpt-test/mp/key?uploadId=UPLOAD1 HTTP/1.1");
  for (const std::string& line : requests) {
    CHECK_FALSE(absl::StrContains(line, "POST /ckpt-test/mp/key?uploadId="));  // no complete
    CHECK_FALSE(absl::StrContains(line, "partNumber=3&"));  // nothing after the failure
  }
}

TEST_CASE("s3 faults: an empty ETag in CompleteMultipartUpload's answer (Ceph RGW 16) is "
          "taken from the object's HEAD",
          "[server]") {
  TinyHttpServer server(TinyHttpServer::Mode::kScripted, [](int, const std::string& line) {
    if (absl::StartsWith(line, "POST") && absl::StrContains(line, "uploadId=")) {
      return TinyHttpServer::Response(
          200, "<CompleteMultipartUploadResult><Bucket>ckpt-test</Bucket><Key>mp/key</Key>"
               "<ETag></ETag></CompleteMultipartUploadResult>");
    }
    if (absl::StartsWith(line, "HEAD")) {
      return TinyHttpServer::Response(200, "", "ETag: \"abc-2\"\r\n");
    }
    return TinyHttpServer::Response(500, ErrorXml("InternalError", "unexpected"));
  });
  auto client = S3Client::Create(LocalOptions(server.port()));
  REQUIRE(client.ok());
  auto etag = (*client)->CompleteMultipartUpload(kBucket, "mp/key", "UPLOAD1",
                                                 {{1, "\"a\""}, {2, "\"b\""}});
  INFO(etag.status());
  REQUIRE(etag.ok());
  CHECK(*etag == "\"abc-2\"");
  CHECK(server.request_count() == 2);
}

TEST_CASE("s3 faults: aborting an upload that is gone (404 NoSuchUpload) succeeds, a missing "
          "bucket does not, and a code without a message reads cleanly",
          "[server]") {
  TinyHttpServer server(TinyHttpServer::Mode::kScripted, [](int, const std::string& line) {
    // Ceph RGW's form: the code, an empty message.
    if (absl::StrContains(line, "/ckpt-test/")) {
      return TinyHttpServer::Response(404, ErrorXml("NoSuchUpload", ""));
    }
    return TinyHttpServer::Response(404, ErrorXml("NoSuchBucket", ""));
  });
  auto client = S3Client::Create(LocalOptions(server.port()));
  REQUIRE(client.ok());
  CHECK((*client)->AbortMultipartUpload(kBucket, "mp/key", "UPLOAD1").ok());
  const absl::Status missing = (*client)->AbortMultipartUpload("no-bucket", "mp/key", "UPLOAD1");
  INFO(missing);
  CHECK(absl::IsNotFound(missing));
  CHECK(absl::EndsWith(missing.message(), "HTTP 404 NoSuchBucket (request id REQ1)"));
  CHECK(server.request_count() == 2);
}

}  // namespace
}  // namespace ckpt::s3
