// Status helpers shared by every ckptd component.
//
// Errors are absl::Status everywhere; errno values become a Status in exactly
// one place (ErrnoToStatus) so that the mapping and the message format are the
// same for every syscall, io_uring completion and library call.
#pragma once

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt {

// Turns an errno value into a Status whose message is "<context>: <strerror>".
// ENOENT maps to NotFound, EEXIST to AlreadyExists, EACCES/EPERM to
// PermissionDenied, ENOSPC/EDQUOT/ENOMEM to ResourceExhausted, EINVAL to
// InvalidArgument, ESRCH to NotFound (a vanished peer); anything else is
// Internal.
absl::Status ErrnoToStatus(int err, absl::string_view context);

// Returns `status` with `context` prepended to its message ("context: msg");
// its payloads go with it.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

// An error after which a copy engine may still read or write the host
// memory the failed call was given (GPU copies that did not end within
// their timeout): its owner must never reuse or unmap that memory
// (StagingLease::Withhold; a tier image kept for the daemon's life).
// Marked with a payload, which Annotate keeps.
absl::Status MarkHostMemoryInUse(absl::Status status);
bool HostMemoryInUse(const absl::Status& status);
// `status->Update(next)` that keeps the mark: the result is marked when
// either was (the first error's message, and its owner must keep the
// memory whichever call it was that left copies running).
void UpdateKeepingHostMemoryInUse(absl::Status* status, const absl::Status& next);

}  // namespace ckpt

#define CKPT_CONCAT_INNER(a, b) a##b
#define CKPT_CONCAT(a, b) CKPT_CONCAT_INNER(a, b)

// Returns early with the error of `expr` (an absl::Status) if it is not OK.
#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    ::absl::Status ckpt_status_ = (expr);              \
    if (!ckpt_status_.ok()) return ckpt_status_;       \
  } while (0)

// `lhs = value` of the StatusOr `rexpr`, or returns its error.
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  ASSIGN_OR_RETURN_IMPL(CKPT_CONCAT(ckpt_statusor_, __LINE__), lhs, rexpr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                          \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()
