#include "common/names.h"

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ckpt {

namespace {

// The generation of `name` ("~N" at its end: N > 0, at most 18 digits, no
// leading zero), its position in `*at`; 0 if it has none.
uint64_t ParseGeneration(absl::string_view name, size_t* at) {
  const size_t tilde = name.rfind(kGenerationSeparator);
  if (tilde == absl::string_view::npos || tilde == 0) return 0;
  absl::string_view digits = name.substr(tilde + 1);
  if (digits.empty() || digits.size() > 18 || digits[0] == '0') return 0;
  uint64_t generation = 0;
  for (char c : digits) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return 0;
    generation = generation * 10 + static_cast<uint64_t>(c - '0');
  }
  *at = tilde;
  return generation;
}

}  // namespace

absl::Status ValidateStorageName(absl::string_view name, absl::string_view what) {
  if (name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " name is empty"));
  }
  if (name.size() > kMaxStorageNameLength) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " name is longer than ", kMaxStorageNameLength,
                     " characters"));
  }
  size_t tilde = name.size();
  if (ParseGeneration(name, &tilde) == 0) tilde = name.size();
  for (size_t i = 0; i < tilde; ++i) {
    const char c = name[i];
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' &&
        c != '_' && c != '-') {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " name '", absl::CEscape(name),
          "' may only contain [A-Za-z0-9._-] (and end in ~N, a generation)"));
    }
  }
  const absl::string_view base = name.substr(0, tilde);
  if (absl::StrContains(base, "..") || base == ".") {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " name '", name, "' may not be '.' or contain '..'"));
  }
  return absl::OkStatus();
}

NameGeneration SplitGeneration(absl::string_view name) {
  size_t tilde = 0;
  const uint64_t generation = ParseGeneration(name, &tilde);
  if (generation == 0) return NameGeneration{name, 0};
  return NameGeneration{name.substr(0, tilde), generation};
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
