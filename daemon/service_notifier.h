// ServiceNotifier: tells systemd where the daemon is in its life
// (Type=notify), through libsystemd's sd_notify on $NOTIFY_SOCKET:
//
//   READY=1     once the gRPC and handshake sockets both serve
//   STATUS=...  what `systemctl status` shows: saves in flight and pool
//               use, refreshed every few seconds by the signal loop
//   STOPPING=1  when SIGTERM or SIGINT starts the drain
//
// Without $NOTIFY_SOCKET (not started by systemd, or Type=simple) every
// call is a no-op. A notification that cannot be sent is logged once and
// otherwise ignored: systemd's own timeouts report a daemon that never
// became ready, and the daemon's work does not depend on it.
//
// Thread-safety: not thread-safe; the server's start and its signal loop
// (one thread) are its callers.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace ckpt {

class ServiceNotifier {
 public:
  void Ready() { Send("READY=1"); }
  void Stopping() { Send("STOPPING=1"); }
  // `line` must be one line.
  void Status(absl::string_view line);

 private:
  void Send(const std::string& state);

  bool failure_logged_ = false;
};

// The STATUS line: "3 saves in flight, pool 412/512 MiB".
std::string ServiceStatusLine(size_t saves_in_flight, uint64_t pool_used_bytes,
                              uint64_t pool_bytes);

}  // namespace ckpt
