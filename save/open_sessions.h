// The trainer sessions open on this node, by job: the ranks a checkpoint
// that times out waiting for its local ranks can name as connected, and
// the local ranks it can tell never connected (InFlightCheckpoints::
// ExpireMissingRanks).
//
// It is also where a job's open sessions are kept to one user: a session
// whose hang-up fails an in-flight checkpoint of its job ("rank 1
// disconnected before submitting its part") must not be another user's.
// The job's directory settles who may use a job once it exists
// (AccessPolicy::MayUseJob); before the first save creates it, the first
// open session's uid does, until every session of the job has closed. Root
// joins any job's sessions (it may save into any job).
#ifndef CKPT_SAVE_OPEN_SESSIONS_H_
#define CKPT_SAVE_OPEN_SESSIONS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "save/in_flight_checkpoints.h"
#include "session/session.h"

namespace ckpt {

class OpenSessions {
 public:
  // After a successful Session::Open. The table holds weak references and
  // drops closed sessions at each call, so a session whose close raced
  // with this call is gone by the next one at the latest, and the table
  // never outgrows the daemon's live sessions.
  void Opened(const std::shared_ptr<Session>& session);
  // Opens `session` with `open` (Session::Open) and records it, unless an
  // open session of the same job belongs to another uid (and this one is
  // not root's): PermissionDenied naming both uids, and `open` not run.
  // Atomic against other calls, so two users racing to open sessions of
  // one job cannot both get in.
  absl::Status Open(const std::shared_ptr<Session>& session, absl::string_view job,
                    const std::function<absl::Status()>& open);
  // The session's hang-up (SessionRegistry's closed callback).
  void Closed(const Session& session);
  // The ranks whose open sessions are of `job` with `world_size` ranks.
  std::vector<RankSeen> Ranks(absl::string_view job, uint32_t world_size) const;

 private:
  void AddLocked(const std::shared_ptr<Session>& session) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::unordered_map<uint64_t, std::weak_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt

#endif  // CKPT_SAVE_OPEN_SESSIONS_H_
