#include "save/open_sessions.h"

#include <iterator>

namespace ckpt {

void OpenSessions::Opened(const std::shared_ptr<Session>& session) {
  absl::MutexLock lock(&mu_);
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
