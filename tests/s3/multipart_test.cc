// Multipart uploads against a real S3 server (SeaweedFS or Ceph RGW:
// s3_test_server.h): parts in flight
// at once from the caller's buffer, read back bit-exact; an aborted upload
// gone from the server's list.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "s3/s3_test_server.h"
#include "storage/s3/multipart_upload.h"
#include "support/skip.h"

namespace ckpt::s3 {
namespace {

using testing::S3TestServer;

std::string Pattern(size_t size) {
  std::string bytes(size, '\0');
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < size; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    for (size_t b = 0; b < 8 && i + b < size; ++b) bytes[i + b] = static_cast<char>(x >> (8 * b));
  }
  return bytes;
}

bool HasUpload(const std::vector<MultipartUploadSummary>& uploads, const std::string& id) {
  for (const MultipartUploadSummary& upload : uploads) {
    if (upload.upload_id == id) return true;
  }
  return false;
}

TEST_CASE("s3 multipart: 40 MiB in 8 MiB parts, 4 in flight, reads back bit-exact",
          "[server][s3server]") {
  std::string skip_reason;
  auto server = S3TestServer::Start(&skip_reason);
  if (server == nullptr) CKPT_SKIP(skip_reason);
  const std::string bucket = server->bucket();
  S3ClientOptions options = server->ClientOptions();
  options.sign_payloads = false;  // UNSIGNED-PAYLOAD, as the bulk path sends parts
  auto client = S3Client::Create(options);
  REQUIRE(client.ok());
  const std::string bytes = Pattern(40ull << 20);
  const std::string key = "multipart/step-100/node-0.safetensors";

  // SeaweedFS grows its volumes on the first large write (about a second
  // here): that upload is timed apart from the steady one after it.
  const MultipartOptions four_in_flight{.part_size = 8ull << 20, .parts_in_flight = 4};
  absl::Time start = absl::Now();
  auto first = UploadMultipart(**client, bucket, key + ".first", bytes,
                               four_in_flight);
  const absl::Duration first_took = absl::Now() - start;
  REQUIRE(first.ok());
  start = absl::Now();
  auto uploaded = UploadMultipart(**client, bucket, key, bytes, four_in_flight);
  const absl::Duration took = absl::Now() - start;
  REQUIRE(uploaded.ok());
  CHECK(uploaded->parts == 5);
  INFO("ETag " << uploaded->etag);
  CHECK(absl::StrContains(uploaded->etag, "-5"));  // S3's multipart ETag form
  std::printf("multipart: 40 MiB in 5 parts, 4 in flight, to %s: first %s (%.0f MiB/s), "
              "then %s (%.0f MiB/s)\n",
              server->name().c_str(),
              absl::FormatDuration(first_took).c_str(), 40.0 / absl::ToDoubleSeconds(first_took),
              absl::FormatDuration(took).c_str(), 40.0 / absl::ToDoubleSeconds(took));

  std::string back(bytes.size(), '\0');
  auto read = (*client)->GetObject(bucket, key, absl::MakeSpan(back));
  REQUIRE(read.ok());
  CHECK(*read == bytes.size());
  CHECK(back == bytes);
  auto uploads = (*client)->ListMultipartUploads(bucket, "multipart/");
  REQUIRE(uploads.ok());
  CHECK(uploads->empty());

  // Parts below S3's 5 MiB minimum are refused before anything is sent.
  auto tiny = UploadMultipart(**client, bucket, key, bytes,
                              MultipartOptions{.part_size = 1 << 20, .parts_in_flight = 4});
  CHECK(absl::IsInvalidArgument(tiny.status()));
}

TEST_CASE("s3 multipart: two uploads side by side share their parts in flight and part "
          "buffers, and both read back bit-exact",
          "[server][s3server]") {
  std::string skip_reason;
  auto server = S3TestServer::Start(&skip_reason);
  if (server == nullptr) CKPT_SKIP(skip_reason);
  const std::string bucket = server->bucket();
  auto client = server->Client();
  PartSlots slots(3, 5ull << 20);
  const MultipartOptions shared{.part_size = 5ull << 20, .parts_in_flight = 3, .slots = &slots};
  const std::string bytes[2] = {Pattern(26ull << 20), Pattern(21ull << 20).substr(7)};
  std::atomic<int> most_taken{0};
  std::atomic<int> parts_read{0};
  auto upload = [&](int which) {
    const std::string& data = bytes[which];
    return UploadMultipartFrom(
        *client, bucket, absl::StrCat("shared/file-", which), data.size(),
        [&](int, uint64_t offset, size_t length,
            absl::Span<char> scratch) -> absl::StatusOr<absl::string_view> {
          int taken = slots.taken();
          for (int seen = most_taken.load(); taken > seen;) {
            if (most_taken.compare_exchange_weak(seen, taken)) break;
          }
          ++parts_read;
          // The slot's buffer: the part is copied there, as a file's read.
          // (Catch's assertions are for the test's own thread.)
          if (scratch.size() < length) return absl::InternalError("part buffer too small");
          std::memcpy(scratch.data(), data.data() + offset, length);
          absl::SleepFor(absl::Milliseconds(20));  // both uploads overlap
          return absl::string_view(scratch.data(), length);
        },
        /*scratch_needed=*/true, shared);
  };
  absl::StatusOr<MultipartResult> second;
  std::thread other([&] { second = upload(1); });
  absl::StatusOr<MultipartResult> first = upload(0);
  other.join();
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  CHECK(parts_read == 6 + 5);
  // Each upload alone would have sent 3 at once, 6 between them.
  CHECK(most_taken <= 3);
  CHECK(most_taken >= 2);
  CHECK(slots.taken() == 0);
  CHECK(slots.buffers() == 0);  // idle: the part buffers are gone
  for (int which = 0; which < 2; ++which) {
    std::string back(bytes[which].size(), '\0');
    auto read = client->GetObject(bucket, absl::StrCat("shared/file-", which),
                                  absl::MakeSpan(back));
    REQUIRE(read.ok());
    CHECK(back == bytes[which]);
  }
}

TEST_CASE("s3 multipart: an aborted upload is gone from ListMultipartUploads, and a sweep "
          "aborts what is left under a prefix",
          "[server][s3server]") {
  std::string skip_reason;
  auto server = S3TestServer::Start(&skip_reason);
  if (server == nullptr) CKPT_SKIP(skip_reason);
  const std::string bucket = server->bucket();
  auto client = server->Client();
  const std::string bytes = Pattern(5ull << 20);
  auto kept = client->CreateMultipartUpload(bucket, "stale/kept");
  auto aborted = client->CreateMultipartUpload(bucket, "stale/aborted");
  REQUIRE(kept.ok());
  REQUIRE(aborted.ok());
  REQUIRE(client->UploadPart(bucket, "stale/aborted", *aborted, 1, bytes).ok());

  auto before = client->ListMultipartUploads(bucket, "stale/");
  REQUIRE(before.ok());
  CHECK(HasUpload(*before, *kept));
  CHECK(HasUpload(*before, *aborted));

  REQUIRE(client->AbortMultipartUpload(bucket, "stale/aborted", *aborted).ok());
  // Again: gone already is no error (Ceph RGW answers 404 NoSuchUpload).
  CHECK(client->AbortMultipartUpload(bucket, "stale/aborted", *aborted).ok());
  auto after = client->ListMultipartUploads(bucket, "stale/");
  REQUIRE(after.ok());
  CHECK(HasUpload(*after, *kept));
  CHECK_FALSE(HasUpload(*after, *aborted));
  // Completing the aborted upload fails: its parts are gone.
  auto complete = client->CompleteMultipartUpload(bucket, "stale/aborted",
                                                  *aborted, {{1, "\"x\""}});
  CHECK_FALSE(complete.ok());

  // Startup recovery's sweep: an upload begun after the cutoff is left
  // alone, one begun before it aborted (its Initiated time read).
  auto recent = AbortMultipartUploads(*client, bucket, "stale/",
                                      absl::Now() - absl::Hours(1));
  REQUIRE(recent.ok());
  CHECK(recent->aborted == 0);
  CHECK(recent->kept == 1);
  auto swept = AbortMultipartUploads(*client, bucket, "stale/",
                                     absl::Now() + absl::Minutes(1));
  REQUIRE(swept.ok());
  CHECK(swept->aborted == 1);
  auto none = client->ListMultipartUploads(bucket, "stale/");
  REQUIRE(none.ok());
  CHECK(none->empty());
}

}  // namespace
}  // namespace ckpt::s3
