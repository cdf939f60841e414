#include "save/open_sessions.h"

#include <iterator>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace ckpt {

void OpenSessions::Opened(const std::shared_ptr<Session>& session) {
  absl::MutexLock lock(&mu_);
  AddLocked(session);
}

absl::Status OpenSessions::Open(const std::shared_ptr<Session>& session,
                                absl::string_view job,
                                const std::function<absl::Status()>& open) {
  absl::MutexLock lock(&mu_);
  if (session->uid() != 0) {
    for (const auto& [id, weak] : sessions_) {
      const std::shared_ptr<Session> other = weak.lock();
      if (other == nullptr || other->closed() || other->job() != job ||
          other->uid() == session->uid()) {
        continue;
      }
      return absl::PermissionDeniedError(absl::StrCat(
          "job '", job, "' has open sessions of uid ", other->uid(),
          "; this trainer runs as uid ", session->uid(),
          " (the ranks of a job are one user's)"));
    }
  }
  RETURN_IF_ERROR(open());
  AddLocked(session);
  return absl::OkStatus();
}

void OpenSessions::AddLocked(const std::shared_ptr<Session>& session) {
  sessions_[session->id()] = session;
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    const std::shared_ptr<Session> open = it->second.lock();
    it = open == nullptr || open->closed() ? sessions_.erase(it) : std::next(it);
  }
}

void OpenSessions::Closed(const Session& session) {
  absl::MutexLock lock(&mu_);
  sessions_.erase(session.id());
}

std::vector<RankSeen> OpenSessions::Ranks(absl::string_view job,
                                          uint32_t world_size) const {
  std::vector<RankSeen> ranks;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, weak] : sessions_) {
    const std::shared_ptr<Session> session = weak.lock();
    if (session == nullptr || session->closed() || session->job() != job ||
        session->world_size() != world_size) {
      continue;
    }
    ranks.push_back({.rank = session->rank(), .local_rank = session->local_rank()});
  }
  return ranks;
}

}  // namespace ckpt
