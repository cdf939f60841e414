#include "daemon/access_policy.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ckpt {

bool AccessPolicy::IsOperator(const Caller& caller) const {
  if (caller.uid == 0 || caller.uid == ::geteuid()) return true;
  if (!operator_group_.has_value()) return false;
  return caller.gid == *operator_group_ ||
         std::find(caller.groups.begin(), caller.groups.end(), *operator_group_) !=
             caller.groups.end();
}

absl::Status AccessPolicy::MayOperate(const Caller& caller, absl::string_view what,
                                      absl::string_view job,
                                      std::optional<uid_t> owner) const {
  if (IsOperator(caller) || !owner.has_value() || *owner == caller.uid) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      what, " of job '", job, "' refused: it belongs to uid ", *owner,
      ", and uid ", caller.uid, " is neither its owner nor an operator"));
}

absl::Status AccessPolicy::MayOperateOnAll(const Caller& caller,
                                           absl::string_view what) const {
  if (IsOperator(caller)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      what, " of every job refused: that is for operators (root, the daemon's "
            "user or the operator group); uid ",
      caller.uid, " may name one of its own jobs"));
}

absl::Status AccessPolicy::MayUseJob(uid_t session_uid, absl::string_view job,
                                     std::optional<uid_t> owner) {
  if (session_uid == 0 || !owner.has_value() || *owner == session_uid) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "job '", job, "' belongs to uid ", *owner, "; this trainer runs as uid ",
      session_uid, " (jobs are private to the user who created them)"));
}

absl::Status AccessPolicy::MayActFor(const Caller& caller, pid_t session_pid) {
  if (caller.pid == session_pid) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "session token of pid ", session_pid, " used by pid ", caller.pid,
      ": a session acts only from the process that opened it"));
}

}  // namespace ckpt
