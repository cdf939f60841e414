#include "storage/s3/xml_tree.h"

#include <expat.h>

#include <climits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ckpt::s3 {
namespace {

struct Builder {
  XML_Parser parser = nullptr;
  std::unique_ptr<XmlElement> root;
  std::vector<XmlElement*> open;  // the path from the root to the current element
  std::string error;              // why the handlers stopped the parser

  void Stop(std::string why) {
    if (error.empty()) error = std::move(why);
    XML_StopParser(parser, XML_FALSE);
  }
};

void OnStart(void* data, const XML_Char* name, const XML_Char** /*attributes*/) {
  auto* builder = static_cast<Builder*>(data);
  if (builder->open.size() >= static_cast<size_t>(kMaxXmlDepth)) {
    builder->Stop(absl::StrCat("elements nested deeper than ", kMaxXmlDepth));
    return;
  }
  auto element = std::make_unique<XmlElement>();
  element->name = name;
  XmlElement* raw = element.get();
  if (builder->open.empty()) {
    builder->root = std::move(element);
  } else {
    builder->open.back()->children.push_back(std::move(element));
  }
  builder->open.push_back(raw);
}

void OnEnd(void* data, const XML_Char* /*name*/) {
  auto* builder = static_cast<Builder*>(data);
  if (!builder->open.empty()) builder->open.pop_back();
}

void OnText(void* data, const XML_Char* text, int size) {
  auto* builder = static_cast<Builder*>(data);
  if (!builder->open.empty()) builder->open.back()->text.append(text, static_cast<size_t>(size));
}

void OnDoctype(void* data, const XML_Char* /*name*/, const XML_Char* /*sysid*/,
               const XML_Char* /*pubid*/, int /*has_internal_subset*/) {
  static_cast<Builder*>(data)->Stop("a DOCTYPE is not accepted");
}

}  // namespace

const XmlElement* XmlElement::Child(absl::string_view wanted) const {
  for (const auto& child : children) {
    if (child->name == wanted) return child.get();
  }
  return nullptr;
}

absl::string_view XmlElement::ChildText(absl::string_view wanted) const {
  const XmlElement* child = Child(wanted);
  return child == nullptr ? absl::string_view() : absl::string_view(child->text);
}

std::vector<const XmlElement*> XmlElement::Children(absl::string_view wanted) const {
  std::vector<const XmlElement*> found;
  for (const auto& child : children) {
    if (child->name == wanted) found.push_back(child.get());
  }
  return found;
}

absl::StatusOr<std::unique_ptr<XmlElement>> ParseXml(absl::string_view document) {
  if (document.size() > static_cast<size_t>(INT_MAX)) {
    return absl::InvalidArgumentError("XML document too large");
  }
  Builder builder;
  builder.parser = XML_ParserCreate("UTF-8");
  if (builder.parser == nullptr) {
    return absl::ResourceExhaustedError("XML_ParserCreate failed (out of memory)");
  }
  XML_SetUserData(builder.parser, &builder);
  XML_SetElementHandler(builder.parser, OnStart, OnEnd);
  XML_SetCharacterDataHandler(builder.parser, OnText);
  XML_SetStartDoctypeDeclHandler(builder.parser, OnDoctype);
  const XML_Status parsed = XML_Parse(builder.parser, document.data(),
                                      static_cast<int>(document.size()), XML_TRUE);
  absl::Status status;
  if (parsed != XML_STATUS_OK) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "malformed XML at line ", XML_GetCurrentLineNumber(builder.parser), ": ",
        builder.error.empty() ? XML_ErrorString(XML_GetErrorCode(builder.parser))
                              : builder.error));
  }
  XML_ParserFree(builder.parser);
  if (!status.ok()) return status;
  if (builder.root == nullptr) return absl::InvalidArgumentError("XML document has no element");
  return std::move(builder.root);
}

}  // namespace ckpt::s3
