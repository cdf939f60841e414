// A small element tree read from an XML document with expat: what the S3
// responses (s3_responses.h) are read from. Never parsed by hand: expat
// handles encodings, entities, CDATA and malformed input.
//
// Bounded: the document is at most the transport's response cap, the tree
// at most kMaxDepth deep, and a DOCTYPE (the door to entity expansion
// tricks; S3 never sends one) is refused. Element names are taken as
// written, without namespace processing (S3 uses one default namespace).
// Attributes are not kept (S3's responses carry their data in elements).
//
// Thread-safety: values.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt::s3 {

struct XmlElement {
  std::string name;
  std::string text;  // character data directly inside, concatenated
  std::vector<std::unique_ptr<XmlElement>> children;

  // The first child named `name`, or null.
  const XmlElement* Child(absl::string_view name) const;
  // Its text, or "" when there is no such child.
  absl::string_view ChildText(absl::string_view name) const;
  // Every child named `name`, in document order.
  std::vector<const XmlElement*> Children(absl::string_view name) const;
};

inline constexpr int kMaxXmlDepth = 32;

// The root element of `document`; InvalidArgument with expat's reason and
// the line on malformed input.
absl::StatusOr<std::unique_ptr<XmlElement>> ParseXml(absl::string_view document);

}  // namespace ckpt::s3
