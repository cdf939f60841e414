// Validation of the names that become storage paths (job and checkpoint ids)
// and of item names (fqns).
//
// Invariant 7: storage paths derive from validated names only. A name that
// passes ValidateStorageName is one path component made of [A-Za-z0-9._-],
// not "." or "..", and not containing "..", so joining it under the storage
// root can never leave the root.
#pragma once

#include "absl/strings/string_view.h"

#include "absl/status/status.h"

namespace ckpt {

inline constexpr size_t kMaxStorageNameLength = 128;
inline constexpr size_t kMaxFqnLength = 1024;

// `what` names the field in the error ("job", "checkpoint").
absl::Status ValidateStorageName(absl::string_view name, absl::string_view what);

// Fqns are stored inside files (JSON header, manifest), never used as paths;
// they must be non-empty, valid printable ASCII without quotes or
// backslashes (so the safetensors JSON header needs no escaping), and at most
// kMaxFqnLength bytes.
absl::Status ValidateFqn(absl::string_view fqn);

}  // namespace ckpt
