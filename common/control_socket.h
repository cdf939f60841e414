// The daemon's control socket as both ends know it: where it is by default,
// the handshake socket beside it, and the largest message either end
// exchanges on it. The daemon (daemon/daemon_options.h) and the clients
// (libckpt, ckptctl) take these from here, so the two cannot drift apart.
#pragma once

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ckpt {

// The gRPC socket of a daemon started without --socket (the path
// deploy/ckptd.service passes, in the directory deploy/ckptd.tmpfiles
// creates), and where clients look when nothing else names one (below).
inline constexpr char kDefaultSocket[] = "/run/ckptd/ckptd.sock";

// Where a daemon of an ordinary user puts its socket when neither --socket
// nor the config file names one, and where clients look for it:
// $XDG_RUNTIME_DIR/ckptd/ckptd.sock ("" without an absolute
// $XDG_RUNTIME_DIR, which a login session's pam_systemd sets).
std::string UserRuntimeSocket();

// A Slurm job's per-node daemon (deploy/slurm/ckptd-slurm):
// /tmp/ckptd-slurm-<uid>-<SLURM_JOB_ID>/ckptd.sock ("" outside a job).
std::string SlurmJobSocket();

// The socket a client (libckpt, ckptctl, the Python package) uses when not
// told: $CKPTD_SOCKET if set; else SlurmJobSocket() if that socket exists;
// else UserRuntimeSocket() if that socket exists; else kDefaultSocket.
// A socket that does not exist is skipped, so a user with a login session
// or a Slurm job still reaches the node's system daemon when they run none
// of their own; so is one that is not this user's (it or its directory
// owned by another uid, a symlink, or a directory others may write), since
// a daemon there is not theirs.
std::string DefaultClientSocket();

// The daemon's socket when neither --socket nor the config file names one:
// $CKPTD_SOCKET if set; else, not running as root, UserRuntimeSocket() if
// $XDG_RUNTIME_DIR is set; else kDefaultSocket (whose directory only root
// or the systemd unit can make).
std::string DefaultDaemonSocket();

// The handshake socket of the daemon whose gRPC socket is `socket`
// (common/handshake_frame.h describes what it carries).
inline std::string HandshakeSocketPath(absl::string_view socket) {
  return absl::StrCat(socket, ".session");
}

// The largest gRPC message on the control socket, requests and responses
// alike.
//
// gRPC limits messages on each end separately (by default 4 MiB received and
// no limit sent), and a message over either end's limit fails the call with
// RESOURCE_EXHAUSTED:
//  - a client's send limit refuses a request before it leaves, so it must be
//    at least the daemon's receive limit, or a request the daemon would
//    accept never reaches it;
//  - a client's receive limit refuses a response the daemon already sent, so
//    it must be at least the daemon's send limit.
// The daemon uses --max_request_bytes as both its receive and its send limit;
// the flag defaults to this constant and may only lower it (daemon/main.cc
// refuses more). Clients set both of their limits to it. So for any setting,
// daemon receive <= this = client send, and daemon send <= this = client
// receive; a request over a lowered daemon limit reaches the daemon, whose
// error names its limit.
inline constexpr int kMaxControlMessageBytes = 64 << 20;

// Keepalive on the control socket. A daemon that stops answering without
// closing its socket (SIGSTOP, a hung host, a debugger) leaves a client's
// call open forever: nothing arrives, and nothing says the end is gone.
// While a call is open, a client pings every keepalive interval and fails
// the call (UNAVAILABLE) when a ping goes unanswered for the timeout, so a
// wait for STAGED or COMMITTED ends within their sum. The daemon accepts
// pings as often as kMinKeepaliveMs; a client may not ping more often (the
// daemon would close a connection that does, as gRPC does by default).
inline constexpr int kDefaultKeepaliveMs = 5'000;
inline constexpr int kDefaultKeepaliveTimeoutMs = 10'000;
inline constexpr int kMinKeepaliveMs = 1'000;

}  // namespace ckpt
