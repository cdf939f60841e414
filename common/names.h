// Validation of the names that become storage paths (job and checkpoint ids)
// and of item names (fqns).
//
// Invariant 7: storage paths derive from validated names only. A name that
// passes ValidateStorageName is one path component made of [A-Za-z0-9._-],
// not "." or "..", and not containing "..", so joining it under the storage
// root can never leave the root; it may end in "~N" (N a decimal number
// from 1, no leading zero), a generation of the name before it.
//
// Generations are how a checkpoint name is saved again (DCP's overwrite):
// "step-100~2" is generation 2 of "step-100" (the plain name is generation
// 0). A reader of "step-100" takes its newest committed generation, and
// retention deletes a committed generation once a newer one of the same
// name has committed (storage/retention.h; docs/FORMAT.md). '~' is outside
// the plain names' characters, so no name a user chose before can read as
// a generation of another.
#pragma once

#include <cstdint>

#include "absl/strings/string_view.h"

#include "absl/status/status.h"

namespace ckpt {

inline constexpr size_t kMaxStorageNameLength = 128;
inline constexpr size_t kMaxFqnLength = 1024;

// `what` names the field in the error ("job", "checkpoint").
absl::Status ValidateStorageName(absl::string_view name, absl::string_view what);

inline constexpr char kGenerationSeparator = '~';
inline constexpr uint64_t kMaxGeneration = 999999999999999999ull;  // 18 digits

// A valid storage name split into the name it is a generation of and the
// generation (0 for a name without "~N").
struct NameGeneration {
  absl::string_view base;
  uint64_t generation = 0;
};
NameGeneration SplitGeneration(absl::string_view name);
// Whether `name` is `base` or a generation of it.
inline bool IsGenerationOf(absl::string_view name, absl::string_view base) {
  return SplitGeneration(name).base == base;
}

// Fqns are stored inside files (JSON header, manifest), never used as paths;
// they must be non-empty, valid printable ASCII without quotes or
// backslashes (so the safetensors JSON header needs no escaping), and at most
// kMaxFqnLength bytes.
absl::Status ValidateFqn(absl::string_view fqn);

}  // namespace ckpt
