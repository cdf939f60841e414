// S3's XML documents, read with expat: results, errors, and malformed input.
#include <catch2/catch.hpp>

#include "storage/s3/s3_responses.h"
#include "storage/s3/xml_tree.h"

namespace ckpt::s3 {
namespace {

bool Contains(const absl::Status& status, const std::string& text) {
  return std::string(status.message()).find(text) != std::string::npos;
}

TEST_CASE("responses: ListBucketResult, truncated with a continuation token", "[xml]") {
  const char xml[] = R"(<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>bucket</Name><Prefix>ckpt/</Prefix><KeyCount>2</KeyCount><MaxKeys>2</MaxKeys>
  <IsTruncated>true</IsTruncated>
  <Contents><Key>ckpt/a&amp;b</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified>
    <ETag>&quot;abc&quot;</ETag><Size>1234</Size><StorageClass>STANDARD</StorageClass></Contents>
  <Contents><Key>ckpt/c</Key><ETag>"def"</ETag><Size>0</Size></Contents>
  <NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</NextContinuationToken>
</ListBucketResult>)";
  auto page = ParseListObjectsPage(xml);
  REQUIRE(page.ok());
  REQUIRE(page->objects.size() == 2);
  CHECK(page->objects[0].key == "ckpt/a&b");
  CHECK(page->objects[0].size == 1234);
  CHECK(page->objects[0].etag == "\"abc\"");
  CHECK(page->objects[1].size == 0);
  CHECK(page->is_truncated);
  CHECK(page->next_continuation_token == "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=");
}

TEST_CASE("responses: ListBucketResult, the last page, with common prefixes", "[xml]") {
  const char xml[] = R"(<ListBucketResult><Name>b</Name><IsTruncated>false</IsTruncated>
<CommonPrefixes><Prefix>ckpt/step-1/</Prefix></CommonPrefixes>
<CommonPrefixes><Prefix>ckpt/step-2/</Prefix></CommonPrefixes></ListBucketResult>)";
  auto page = ParseListObjectsPage(xml);
  REQUIRE(page.ok());
  CHECK(page->objects.empty());
  CHECK(page->common_prefixes == std::vector<std::string>{"ckpt/step-1/", "ckpt/step-2/"});
  CHECK_FALSE(page->is_truncated);
  CHECK(page->next_continuation_token.empty());

  auto no_token = ParseListObjectsPage("<ListBucketResult><IsTruncated>true</IsTruncated>"
                                       "</ListBucketResult>");
  CHECK(Contains(no_token.status(), "no <NextContinuationToken>"));
  auto bad_size = ParseListObjectsPage(
      "<ListBucketResult><Contents><Key>k</Key><Size>-1</Size></Contents></ListBucketResult>");
  CHECK(Contains(bad_size.status(), "no valid <Size>"));
}

TEST_CASE("responses: InitiateMultipartUploadResult and CompleteMultipartUploadResult",
          "[xml]") {
  auto id = ParseInitiateMultipartUpload(
      R"(<?xml version="1.0" encoding="UTF-8"?>
<InitiateMultipartUploadResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
<Bucket>example-bucket</Bucket><Key>example-object</Key>
<UploadId>VXBsb2FkIElEIGZvciA2aWWpbmcncyBteS1tb3ZpZS5tMnRzIHVwbG9hZA</UploadId>
</InitiateMultipartUploadResult>)");
  REQUIRE(id.ok());
  CHECK(*id == "VXBsb2FkIElEIGZvciA2aWWpbmcncyBteS1tb3ZpZS5tMnRzIHVwbG9hZA");
  CHECK(Contains(ParseInitiateMultipartUpload("<InitiateMultipartUploadResult/>").status(),
                 "no <UploadId>"));

  auto etag = ParseCompleteMultipartUpload(
      "<CompleteMultipartUploadResult><ETag>\"3858f62230ac3c915f300c664312c11f-9\"</ETag>"
      "</CompleteMultipartUploadResult>");
  REQUIRE(etag.ok());
  CHECK(*etag == "\"3858f62230ac3c915f300c664312c11f-9\"");
  // A 200 whose body is an <Error>: an error, with the server's words.
  auto late_error = ParseCompleteMultipartUpload(
      "<Error><Code>InternalError</Code><Message>We encountered an internal error.</Message>"
      "</Error>");
  CHECK_FALSE(late_error.ok());
  CHECK(Contains(late_error.status(), "InternalError: We encountered an internal error."));
}

TEST_CASE("responses: Error documents", "[xml]") {
  auto error = ParseErrorResponse(R"(<?xml version="1.0" encoding="UTF-8"?>
<Error><Code>NoSuchKey</Code><Message>The resource you requested does not exist</Message>
<Resource>/mybucket/myfoto.jpg</Resource><RequestId>4442587FB7D0A2F9</RequestId></Error>)");
  REQUIRE(error.ok());
  CHECK(error->code == "NoSuchKey");
  CHECK(error->message == "The resource you requested does not exist");
  CHECK(error->request_id == "4442587FB7D0A2F9");
  CHECK(Contains(ParseErrorResponse("<Error><Message>m</Message></Error>").status(),
                 "no <Code>"));
}

TEST_CASE("responses: ListMultipartUploadsResult with markers", "[xml]") {
  auto page = ParseMultipartUploadsPage(R"(<ListMultipartUploadsResult>
<Bucket>b</Bucket><NextKeyMarker>ckpt/b</NextKeyMarker>
<NextUploadIdMarker>id-2</NextUploadIdMarker><IsTruncated>true</IsTruncated>
<Upload><Key>ckpt/a</Key><UploadId>id-1</UploadId><Initiated>2026-11-27T00:00:00.000Z</Initiated></Upload>
<Upload><Key>ckpt/b</Key><UploadId>id-2</UploadId></Upload>
</ListMultipartUploadsResult>)");
  REQUIRE(page.ok());
  REQUIRE(page->uploads.size() == 2);
  CHECK(page->uploads[0].key == "ckpt/a");
  CHECK(page->uploads[0].upload_id == "id-1");
  CHECK(page->uploads[0].initiated == "2026-11-27T00:00:00.000Z");
  CHECK(page->is_truncated);
  CHECK(page->next_key_marker == "ckpt/b");
  CHECK(page->next_upload_id_marker == "id-2");
  auto empty = ParseMultipartUploadsPage("<ListMultipartUploadsResult><IsTruncated>false"
                                         "</IsTruncated></ListMultipartUploadsResult>");
  REQUIRE(empty.ok());
  CHECK(empty->uploads.empty());
}

TEST_CASE("responses: malformed XML gives a clear error, never a partial result", "[xml]") {
  auto unclosed = ParseListObjectsPage("<ListBucketResult><Contents><Key>k</Key>");
  CHECK(absl::IsInvalidArgument(unclosed.status()));
  CHECK(Contains(unclosed.status(), "malformed XML at line 1"));
  CHECK(Contains(ParseErrorResponse("<Error><Code>x</Cod></Error>").status(),
                 "mismatched tag"));
  CHECK(Contains(ParseErrorResponse("").status(), "malformed XML"));
  CHECK(Contains(ParseErrorResponse("not xml at all").status(), "malformed XML"));
  CHECK(Contains(ParseListObjectsPage("<ListAllMyBucketsResult/>").status(),
                 "expected <ListBucketResult> but the document is <ListAllMyBucketsResult>"));
  CHECK(Contains(
      ParseErrorResponse("<!DOCTYPE x [<!ENTITY a \"aaaa\">]><Error><Code>&a;</Code></Error>")
          .status(),
      "a DOCTYPE is not accepted"));
  std::string deep;
  for (int i = 0; i < kMaxXmlDepth + 1; ++i) deep += "<a>";
  CHECK(Contains(ParseXml(deep).status(), "nested deeper than"));
}

TEST_CASE("responses: the CompleteMultipartUpload body lists parts, ETags escaped", "[xml]") {
  CHECK(CompleteMultipartUploadBody({{1, "\"a\""}, {2, "b"}}) ==
        "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>&quot;a&quot;</ETag>"
        "</Part><Part><PartNumber>2</PartNumber><ETag>b</ETag></Part></CompleteMultipartUpload>");
}

}  // namespace
}  // namespace ckpt::s3
