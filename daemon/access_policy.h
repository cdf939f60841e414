// AccessPolicy: who may do what with a job (docs/RELIABILITY.md, "Threat
// model").
//
//   - root and the daemon's own user are trusted with everything;
//   - members of the operator group (`--operator_group`) may run every
//     operator call (list, inspect, verify, cancel, gc) on every job;
//   - any other user who may connect (common/socket_access.h) owns the jobs
//     their trainers created (storage/job_ownership.h): their sessions save
//     into and load from those jobs only, and their operator calls see and
//     touch only those jobs;
//   - a session acts only from its own process: its token is honoured on
//     connections that process made (daemon/connection_listener.h).
//
// Thread-safety: immutable after construction.
#pragma once

#include <sys/types.h>

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "daemon/connection_listener.h"

namespace ckpt {

class AccessPolicy {
 public:
  explicit AccessPolicy(std::optional<gid_t> operator_group)
      : operator_group_(operator_group) {}

  // Root, the daemon's user, or a member of the operator group.
  bool IsOperator(const Caller& caller) const;

  // An operator call (`what`) on `job`, whose owner is `owner` (nullopt: no
  // such job, which the call itself then reports).
  absl::Status MayOperate(const Caller& caller, absl::string_view what,
                          absl::string_view job, std::optional<uid_t> owner) const;
  // An operator call on every job at once (gc of the whole root).
  absl::Status MayOperateOnAll(const Caller& caller, absl::string_view what) const;

  // A trainer session of `session_uid` saving into or loading from `job`.
  static absl::Status MayUseJob(uid_t session_uid, absl::string_view job,
                                std::optional<uid_t> owner);

  // A call that carries a session token, made on `caller`'s connection, for
  // a session bound to process `session_pid`.
  static absl::Status MayActFor(const Caller& caller, pid_t session_pid);

 private:
  const std::optional<gid_t> operator_group_;
};

}  // namespace ckpt
