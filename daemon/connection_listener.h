// ConnectionListener: the daemon's own accept loop for the gRPC socket, so
// that every call knows which process and which user made it.
//
// gRPC's listener cannot say who is on the other end of a Unix socket. Here
// the daemon accepts each connection itself, reads the peer's credentials
// as the kernel recorded them at connect() (SO_PEERCRED: pid, uid, gid;
// SO_PEERGROUPS: supplementary groups), refuses users the socket policy
// does not admit (common/socket_access.h), remembers the credentials under
// the connection's descriptor, and only then hands the descriptor to gRPC
// (AddInsecureChannelFromFd). gRPC names such a connection "fd:<n>" in
// ServerContext::peer(), which CallerOf maps back to the credentials.
//
// What that buys: a session token is honoured only on a connection made by
// the session's own process (daemon/service.cc), so a token that leaks is
// not a password; and operator calls know the caller's uid and groups
// (daemon/access_policy.h).
//
// A descriptor number is reused after gRPC closes a connection, so each
// entry also keeps the socket's inode: CallerOf answers only while the
// descriptor is still that socket, and the accept loop forgets entries
// whose descriptor is not. (A call holds its connection open, so the number
// cannot be reused under a running handler.)
//
// Resource exhaustion does not end the loop: when accept fails for want of
// descriptors or memory, it logs once and retries every 100 ms; connections
// beyond `max_connections` are closed at once, with a log line.
//
// Thread-safety: CallerOf may be called from any thread; Serve and Stop
// from the thread that owns the listener. Stop before the gRPC server
// shuts down: the loop adds connections to it.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/daemon_metrics.h"
#include "common/socket_access.h"
#include "common/unique_fd.h"

namespace grpc {
class Server;
}

namespace ckpt {

// The process on the other end of a connection, as it was at connect().
struct Caller {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary
};

class ConnectionListener {
 public:
  // Binds `path` under a temporary name with the file mode `access` asks
  // for and listens; clients see the socket only once Serve runs.
  static absl::StatusOr<std::unique_ptr<ConnectionListener>> Bind(
      const std::string& path, SocketAccess access, uint32_t max_connections);
  ~ConnectionListener();  // Stop

  // Starts accepting into `server`, then gives the socket its name.
  absl::Status Serve(grpc::Server* server);
  // Stops accepting and waits for the loop; connections already handed to
  // gRPC stay until the server closes them.
  void Stop();

  // The credentials of the connection a call came on (its peer() string).
  // Unauthenticated if the connection is not one this listener accepted.
  absl::StatusOr<Caller> CallerOf(absl::string_view peer) const;

  // Connections handed to gRPC that are still open (for status and tests).
  size_t open_connections();

 private:
  struct Connection {
    Caller caller;
    dev_t dev = 0;
    ino_t ino = 0;
  };

  ConnectionListener(UniqueFd listener, UniqueFd stop, std::string path,
                     SocketAccess access, uint32_t max_connections);
  void Run();
  void Admit(UniqueFd fd);
  // Drops entries whose descriptor no longer is their socket; returns how
  // many remain.
  size_t ForgetClosed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True (and remembers now) if a refusal may be logged: at most one line
  // a second, so a peer that reconnects in a loop cannot flood the log.
  bool MayLogRefusal() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const UniqueFd listener_;
  const UniqueFd stop_;  // eventfd: Stop wakes the loop
  const std::string path_;
  const SocketAccess access_;
  const uint32_t max_connections_;
  grpc::Server* server_ = nullptr;  // set by Serve, before the loop starts
  std::thread thread_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<int, Connection> by_fd_ ABSL_GUARDED_BY(mu_);
  absl::Time last_refusal_log_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();

  // Read at each metrics render; last, so unbound before what it reads goes.
  GaugeBinding connections_gauge_ = DaemonMetrics::Get().connections.Bind(
      [this] { return static_cast<double>(open_connections()); });
};

}  // namespace ckpt
