#include "daemon/connection_listener.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "common/unix_listener.h"
#include "grpcpp/server.h"
#include "grpcpp/server_posix.h"

namespace ckpt {
namespace {

// How long the loop waits before accepting again after the process or the
// system ran out of descriptors or memory.
constexpr int kStarvedRetryMs = 100;

absl::StatusOr<std::vector<gid_t>> PeerGroups(int fd) {
  std::vector<gid_t> groups(64);
  for (;;) {
    socklen_t len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) == 0) {
      groups.resize(len / sizeof(gid_t));
      return groups;
    }
    // ERANGE: `len` now says how much room the list needs.
    if (errno == ERANGE && len > groups.size() * sizeof(gid_t)) {
      groups.resize(len / sizeof(gid_t));
      continue;
    }
    return ErrnoToStatus(errno, "getsockopt(SO_PEERGROUPS)");
  }
}

absl::StatusOr<Caller> PeerCaller(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return ErrnoToStatus(errno, "getsockopt(SO_PEERCRED)");
  }
  ASSIGN_OR_RETURN(std::vector<gid_t> groups, PeerGroups(fd));
  return Caller{.pid = cred.pid, .uid = cred.uid, .gid = cred.gid,
                .groups = std::move(groups)};
}

bool IsStarvation(int err) {
  return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ConnectionListener>> ConnectionListener::Bind(
    const std::string& path, SocketAccess access, uint32_t max_connections) {
  ASSIGN_OR_RETURN(UniqueFd listener, ListenUnpublished(path, access));
  UniqueFd stop(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!stop.valid()) return ErrnoToStatus(errno, "eventfd");
  return std::unique_ptr<ConnectionListener>(new ConnectionListener(
      std::move(listener), std::move(stop), path, access, max_connections));
}

ConnectionListener::ConnectionListener(UniqueFd listener, UniqueFd stop,
                                       std::string path, SocketAccess access,
                                       uint32_t max_connections)
    : listener_(std::move(listener)),
      stop_(std::move(stop)),
      path_(std::move(path)),
      access_(access),
      max_connections_(max_connections) {}

ConnectionListener::~ConnectionListener() {
  Stop();
  ::unlink(path_.c_str());
  ::unlink(UnpublishedSocketPath(path_).c_str());
}

absl::Status ConnectionListener::Serve(grpc::Server* server) {
  server_ = server;
  thread_ = std::thread([this] { Run(); });
  return PublishUnixSocket(path_);
}

void ConnectionListener::Stop() {
  if (!thread_.joinable()) return;
  const uint64_t one = 1;
  // An eventfd write fails only if its counter would overflow.
  if (::write(stop_.get(), &one, sizeof(one)) != sizeof(one)) {
    LogError("cannot wake the accept loop: ", std::strerror(errno));
  }
  thread_.join();
}

void ConnectionListener::Run() {
  bool starved = false;
  absl::Time last_starved_log = absl::InfinitePast();
  for (;;) {
    pollfd fds[2] = {{stop_.get(), POLLIN, 0}, {listener_.get(), POLLIN, 0}};
    // Starved: wait on the stop descriptor alone for a while, since the
    // listener stays readable and would wake the loop at once.
    const int ready = ::poll(fds, starved ? 1 : 2, starved ? kStarvedRetryMs : -1);
    if (ready < 0 && errno != EINTR) {
      LogError("accept loop: poll: ", std::strerror(errno));
      starved = true;  // wait before trying again rather than spin
      continue;
    }
    if (ready > 0 && fds[0].revents != 0) return;
    UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr,
                          SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd.valid()) {
      const int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED) {
        starved = false;  // nothing pending: back to waiting on the listener
        continue;
      }
      // Once per starvation, and at most every 10 s: a descriptor freed now
      // and then (one accept succeeds, the next fails again) must not turn
      // the warning into a stream.
      const absl::Time now = absl::Now();
      if (!starved && now - last_starved_log >= absl::Seconds(10)) {
        last_starved_log = now;
        LogWarning("cannot accept connections on ", path_, ": ", std::strerror(err),
                   IsStarvation(err) ? " (out of descriptors or memory; retrying every "
                                     : " (retrying every ",
                   kStarvedRetryMs, " ms)");
      }
      starved = true;
      continue;
    }
    if (starved) LogInfo("accepting connections on ", path_, " again");
    starved = false;
    Admit(std::move(fd));
  }
}

void ConnectionListener::Admit(UniqueFd fd) {
  absl::StatusOr<Caller> caller = PeerCaller(fd.get());
  if (!caller.ok()) {
    LogWarning("connection refused: ", caller.status().ToString());
    return;
  }
  if (!MayConnect(access_, caller->uid, caller->gid, caller->groups)) {
    absl::MutexLock lock(&mu_);
    if (MayLogRefusal()) {
      LogWarning("connection of pid ", caller->pid, " uid ", caller->uid,
                 " refused: not root, not the daemon's user and not in the "
                 "socket group");
    }
    return;
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    LogWarning("connection refused: fstat: ", std::strerror(errno));
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    if (ForgetClosed() >= max_connections_) {
      if (MayLogRefusal()) {
        LogWarning("connection of pid ", caller->pid, " refused: ",
                   max_connections_, " connections are open (--max_connections)");
      }
      return;
    }
    by_fd_[fd.get()] = Connection{*std::move(caller), st.st_dev, st.st_ino};
  }
  // gRPC owns the descriptor from here and closes it with the connection.
  grpc::AddInsecureChannelFromFd(server_, fd.release());
}

size_t ConnectionListener::ForgetClosed() {
  for (auto it = by_fd_.begin(); it != by_fd_.end();) {
    struct stat st {};
    const bool same = ::fstat(it->first, &st) == 0 && st.st_dev == it->second.dev &&
                      st.st_ino == it->second.ino;
    if (same) {
      ++it;
    } else {
      by_fd_.erase(it++);
    }
  }
  return by_fd_.size();
}

bool ConnectionListener::MayLogRefusal() {
  const absl::Time now = absl::Now();
  if (last_refusal_log_ + absl::Seconds(1) > now) return false;
  last_refusal_log_ = now;
  return true;
}

absl::StatusOr<Caller> ConnectionListener::CallerOf(absl::string_view peer) const {
  int fd = -1;
  if (!absl::ConsumePrefix(&peer, "fd:") || !absl::SimpleAtoi(peer, &fd)) {
    return absl::UnauthenticatedError(absl::StrCat(
        "call on a connection ckptd did not accept itself (peer ", peer, ")"));
  }
  absl::MutexLock lock(&mu_);
  auto it = by_fd_.find(fd);
  struct stat st {};
  if (it == by_fd_.end() || ::fstat(fd, &st) != 0 || st.st_dev != it->second.dev ||
      st.st_ino != it->second.ino) {
    return absl::UnauthenticatedError(
        absl::StrCat("connection fd:", fd, " is not one ckptd accepted"));
  }
  return it->second.caller;
}

size_t ConnectionListener::open_connections() {
  absl::MutexLock lock(&mu_);
  return ForgetClosed();
}

}  // namespace ckpt
