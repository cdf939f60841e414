// CrashPoint: a test facility that kills the process at a named step of the
// durability protocol, so that a test can restart the daemon and check what
// a crash at exactly that step left (tests/integration/crash_matrix_test.cc).
//
// Inert unless the environment variable CKPTD_CRASH_AT is set when the
// process starts:
//
//   CKPTD_CRASH_AT=<where>.<step>[@<n>]
//
// makes the n-th call (default: the first) of CrashPoint(where, step) in
// this process log one line to stderr and raise SIGKILL on the whole
// process: the same death as `kill -9`, at a step a test names instead of
// a moment it guesses. docs/ARCHITECTURE.md ("Crash points") lists the
// points. The variable is read once, during static initialization, and
// never again; a daemon started with it set says so on stderr at once, so
// that one left set by mistake is seen in the log.
//
// Cost when unset: one load of a pointer that static initialization set
// (null) and a branch that is always predicted; no allocation, no string
// work.
//
// Thread-safety: CrashPoint may be called from any thread; the hit count is
// atomic, so exactly one call kills.
#pragma once

#include "absl/base/optimization.h"
#include "absl/strings/string_view.h"

namespace ckpt {

namespace crash_point_internal {
struct Armed;
// Null unless CKPTD_CRASH_AT names a point; set during static
// initialization (zero-initialized before it, so an earlier call is inert)
// and never changed.
extern const Armed* const armed;
// Counts a hit of `where`.`step` and kills the process if it is the
// armed point's n-th.
void Reached(const Armed& spec, absl::string_view where,
             absl::string_view step);
}  // namespace crash_point_internal

// A point named "<where>.<step>", e.g. CrashPoint("COMMIT", "renamed").
inline void CrashPoint(absl::string_view where, absl::string_view step) {
  const crash_point_internal::Armed* const spec = crash_point_internal::armed;
  if (ABSL_PREDICT_FALSE(spec != nullptr)) {
    crash_point_internal::Reached(*spec, where, step);
  }
}

}  // namespace ckpt
