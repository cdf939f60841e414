// The trainer sessions open on this node, by job: the ranks a checkpoint
// that times out waiting for its local ranks can name as connected, and
// the local ranks it can tell never connected (InFlightCheckpoints::
// ExpireMissingRanks).
#ifndef CKPT_SAVE_OPEN_SESSIONS_H_
#define CKPT_SAVE_OPEN_SESSIONS_H_

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
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
  // The session's hang-up (SessionRegistry's closed callback).
  void Closed(const Session& session);
  // The ranks whose open sessions are of `job` with `world_size` ranks.
  std::vector<RankSeen> Ranks(absl::string_view job, uint32_t world_size) const;

 private:
  mutable absl::Mutex mu_;
  std::unordered_map<uint64_t, std::weak_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt

#endif  // CKPT_SAVE_OPEN_SESSIONS_H_
