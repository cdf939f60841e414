#include "storage/s3/s3_responses.h"

#include <memory>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "storage/s3/xml_tree.h"

namespace ckpt::s3 {
namespace {

// The document's root, which must be named `expected`.
absl::StatusOr<std::unique_ptr<XmlElement>> ParseRoot(absl::string_view xml,
                                                      absl::string_view expected) {
  absl::StatusOr<std::unique_ptr<XmlElement>> root = ParseXml(xml);
  if (!root.ok()) return Annotate(root.status(), absl::StrCat("reading <", expected, ">"));
  if ((*root)->name != expected) {
    if ((*root)->name == "Error") {
      return absl::InternalError(absl::StrCat(
          "the server answered <Error> (", (*root)->ChildText("Code"), ": ",
          (*root)->ChildText("Message"), ") where <", expected, "> was expected"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "expected <", expected, "> but the document is <", (*root)->name, ">"));
  }
  return root;
}

absl::Status Missing(absl::string_view root, absl::string_view field) {
  return absl::InvalidArgumentError(absl::StrCat("<", root, "> has no <", field, ">"));
}

std::string XmlEscape(absl::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<S3ErrorResponse> ParseErrorResponse(absl::string_view xml) {
  ASSIGN_OR_RETURN(std::unique_ptr<XmlElement> root, ParseRoot(xml, "Error"));
  S3ErrorResponse error;
  error.code = std::string(root->ChildText("Code"));
  error.message = std::string(root->ChildText("Message"));
  error.request_id = std::string(root->ChildText("RequestId"));
  if (error.code.empty()) return Missing("Error", "Code");
  return error;
}

absl::StatusOr<ListObjectsPage> ParseListObjectsPage(absl::string_view xml) {
  ASSIGN_OR_RETURN(std::unique_ptr<XmlElement> root, ParseRoot(xml, "ListBucketResult"));
  ListObjectsPage page;
  for (const XmlElement* contents : root->Children("Contents")) {
    ObjectSummary object;
    object.key = std::string(contents->ChildText("Key"));
    if (object.key.empty()) return Missing("Contents", "Key");
    if (!absl::SimpleAtoi(contents->ChildText("Size"), &object.size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "<Contents> of '", object.key, "' has no valid <Size>"));
    }
    object.etag = std::string(contents->ChildText("ETag"));
    page.objects.push_back(std::move(object));
  }
  for (const XmlElement* prefix : root->Children("CommonPrefixes")) {
    page.common_prefixes.emplace_back(prefix->ChildText("Prefix"));
  }
  page.is_truncated = root->ChildText("IsTruncated") == "true";
  page.next_continuation_token = std::string(root->ChildText("NextContinuationToken"));
  if (page.is_truncated && page.next_continuation_token.empty()) {
    return absl::InvalidArgumentError(
        "<ListBucketResult> is truncated but has no <NextContinuationToken>");
  }
  return page;
}

absl::StatusOr<std::string> ParseInitiateMultipartUpload(absl::string_view xml) {
  ASSIGN_OR_RETURN(std::unique_ptr<XmlElement> root,
                   ParseRoot(xml, "InitiateMultipartUploadResult"));
  absl::string_view id = root->ChildText("UploadId");
  if (id.empty()) return Missing("InitiateMultipartUploadResult", "UploadId");
  return std::string(id);
}

absl::StatusOr<std::string> ParseCompleteMultipartUpload(absl::string_view xml) {
  ASSIGN_OR_RETURN(std::unique_ptr<XmlElement> root,
                   ParseRoot(xml, "CompleteMultipartUploadResult"));
  return std::string(root->ChildText("ETag"));
}

absl::StatusOr<MultipartUploadsPage> ParseMultipartUploadsPage(absl::string_view xml) {
  ASSIGN_OR_RETURN(std::unique_ptr<XmlElement> root,
                   ParseRoot(xml, "ListMultipartUploadsResult"));
  MultipartUploadsPage page;
  for (const XmlElement* upload : root->Children("Upload")) {
    MultipartUploadSummary summary;
    summary.key = std::string(upload->ChildText("Key"));
    summary.upload_id = std::string(upload->ChildText("UploadId"));
    summary.initiated = std::string(upload->ChildText("Initiated"));
    if (summary.key.empty()) return Missing("Upload", "Key");
    if (summary.upload_id.empty()) return Missing("Upload", "UploadId");
    page.uploads.push_back(std::move(summary));
  }
  page.is_truncated = root->ChildText("IsTruncated") == "true";
  page.next_key_marker = std::string(root->ChildText("NextKeyMarker"));
  page.next_upload_id_marker = std::string(root->ChildText("NextUploadIdMarker"));
  if (page.is_truncated && page.next_key_marker.empty()) {
    return absl::InvalidArgumentError(
        "<ListMultipartUploadsResult> is truncated but has no <NextKeyMarker>");
  }
  return page;
}

std::string CompleteMultipartUploadBody(const std::vector<CompletedPart>& parts) {
  std::string body = "<CompleteMultipartUpload>";
  for (const CompletedPart& part : parts) {
    absl::StrAppend(&body, "<Part><PartNumber>", part.part_number,
                    "</PartNumber><ETag>", XmlEscape(part.etag), "</ETag></Part>");
  }
  body += "</CompleteMultipartUpload>";
  return body;
}

}  // namespace ckpt::s3
