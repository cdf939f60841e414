#include "common/names.h"

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ckpt {

absl::Status ValidateStorageName(absl::string_view name, absl::string_view what) {
  if (name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " name is empty"));
  }
  if (name.size() > kMaxStorageNameLength) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " name is longer than ", kMaxStorageNameLength,
                     " characters"));
  }
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' &&
        c != '_' && c != '-') {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " name '", absl::CEscape(name),
          "' may only contain [A-Za-z0-9._-]"));
    }
  }
  if (absl::StrContains(name, "..") || name == ".") {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " name '", name, "' may not be '.' or contain '..'"));
  }
  return absl::OkStatus();
}

absl::Status ValidateFqn(absl::string_view fqn) {
  if (fqn.empty()) return absl::InvalidArgumentError("item fqn is empty");
  if (fqn.size() > kMaxFqnLength) {
    return absl::InvalidArgumentError(absl::StrCat(
        "item fqn is longer than ", kMaxFqnLength, " characters"));
  }
  for (char c : fqn) {
    if (c < 0x20 || c > 0x7e || c == '"' || c == '\\') {
      return absl::InvalidArgumentError(
          absl::StrCat("item fqn '", absl::CEscape(fqn),
                       "' must be printable ASCII without quotes or "
                       "backslashes"));
    }
  }
  if (fqn == "__metadata__") {
    return absl::InvalidArgumentError(
        "item fqn '__metadata__' is reserved by safetensors");
  }
  return absl::OkStatus();
}

}  // namespace ckpt
