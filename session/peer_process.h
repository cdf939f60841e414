// PeerProcess: the trainer process behind a handshake, bound to the exec
// image and the credentials it had then.
//
// The daemon runs as root (CAP_SYS_PTRACE), so anything it does "to pid N"
// it could do to whatever pid N is running now: after a trainer execs a
// setuid-root program under the same pid, process_vm_readv/writev on that
// pid would read and write the root program's memory for an unprivileged
// user. A session therefore never names its trainer by pid. It is pinned:
//
//   1. SO_PEERCRED gives the pid, euid and egid the peer had at connect();
//      SO_PEERPIDFD (Linux 6.5+) a pidfd of exactly that process, so a pid
//      reused since cannot stand in for it (older kernels: pidfd_open of
//      the pid, then the credential checks below).
//   2. /proc/<pid> is opened as a directory and the pidfd checked not yet
//      exited: a pid names one process while it lives, so the directory is
//      the peer's. Every later /proc file is opened relative to it.
//   3. /proc/<pid>/mem is opened O_RDWR. The kernel's mem_open takes the
//      process's mm at that moment (mm_access, under the exec lock) and the
//      file keeps that mm, not the pid: reads and writes through it reach
//      that image and nothing else. Once the image is gone (the process
//      exited, or exec replaced it) they return 0 bytes; the new image of an
//      exec is never reachable through it. This is the only path by which
//      ckptd reads or writes a trainer's host memory (HostProcessMemory).
//   4. The credentials are read (PIDFD_GET_INFO on Linux 6.13+, else the
//      Uid:/Gid: lines of /proc/<pid>/status) after the open, and the peer
//      is admitted only if (AdmitPeer):
//        - its euid/egid are still the ones it connected with;
//        - for a non-root peer, its real, effective, saved and filesystem
//          ids are all that uid and that gid (a process midway through a
//          setuid or setgid program, or holding a saved root uid, is not
//          the user's to read: the kernel's own ptrace rule);
//        - for a non-root peer, it is dumpable (/proc/<pid>/status is owned
//          by its uid; the kernel makes a process undumpable when it gains
//          privileges through exec or changes credentials, so an image that
//          a setuid, setgid or file-capability exec produced shows here);
//        - the image opened in step 3 is still alive after those reads.
//      These checks come after the open, so an exec between connect() and
//      the open yields an image that fails them, unless that image made
//      itself the peer's own again (all ids the peer's uid, dumpable):
//      then the kernel would let the peer's user read it too.
//
// Steps 1 and 2 happen at the handshake; so do 3 and 4 where the daemon may
// open the file then (root, CAP_SYS_PTRACE, or a same-user peer without
// Yama). A daemon that needs the trainer's PR_SET_PTRACER (Yama
// ptrace_scope=1), which the client calls only after the handshake, does
// steps 3 and 4 at OpenSession, through the directory pinned in step 2.
// A peer that fails admission keeps its session, but Admit (and so
// OpenSession) and every access report why.
//
// Before each batch of accesses (a save's copy batch, each read or write
// call) CheckAccess re-reads the credentials and fails with
// PermissionDenied naming the pid if any id changed since the binding, and
// checks that the bound image is still alive (Unavailable once the process
// exited, PermissionDenied once it exec'd). Writes cannot race an exec:
// they go through the bound file, so a write that starts after the exec
// reaches no memory at all.
//
// One gap remains, by the kernel's design: an mm outlives an exec while
// another task shares it (clone(CLONE_VM) without CLONE_THREAD). Accesses
// then still reach the image that was bound, never the new one.
//
// Ownership: owns the pidfd, the /proc/<pid> directory until the binding
// is made, the /proc/<pid>/mem file and (where the credentials come from
// it) /proc/<pid>/status. Thread-safety: safe for concurrent use; the binding
// is made once, under mu_, and never changes after.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"

namespace ckpt {

// A process's user and group ids: real, effective, saved, filesystem.
struct ProcessCredentials {
  std::array<uint32_t, 4> uids{};
  std::array<uint32_t, 4> gids{};
  bool operator==(const ProcessCredentials&) const = default;
  // "uid 1000/1000/1000/1000 gid 100/100/100/100" (real/effective/saved/fs).
  std::string ToString() const;
};

// The Uid: and Gid: lines of /proc/<pid>/status; InvalidArgument if either
// is missing or malformed.
absl::StatusOr<ProcessCredentials> ParseProcStatusCredentials(
    absl::string_view status);
// Reads an open /proc/<pid>/status from its start and parses it.
absl::StatusOr<ProcessCredentials> ReadStatusCredentials(int status_fd);
// PIDFD_GET_INFO (Linux 6.13+). Unimplemented where the kernel lacks it;
// NotFound once the process was reaped.
absl::StatusOr<ProcessCredentials> ReadPidfdCredentials(int pidfd);

// What the kernel said about the peer at connect() (SO_PEERCRED).
struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;  // effective, at connect()
  gid_t gid = 0;  // effective, at connect()
};

// Unavailable once the process `pidfd` names exited (the pidfd is
// readable); `pid` names it in the message.
absl::Status PidfdAlive(int pidfd, pid_t pid);

// The admission rules of step 4: `now` are the peer's credentials after its
// memory was opened, `status_owner` the owner of its /proc/<pid>/status
// then. OK, or PermissionDenied naming the pid and the rule it broke.
absl::Status AdmitPeer(const PeerCredentials& peer,
                       const ProcessCredentials& now, uid_t status_owner);

class PeerProcess {
 public:
  // Pins the process at the other end of `socket`, an accepted Unix stream
  // socket (steps 1 and 2, and 3 and 4 where permitted now). An error means
  // the daemon could not pin the peer (it exited, /proc is missing, no
  // descriptors left): refuse the handshake.
  static absl::StatusOr<std::unique_ptr<PeerProcess>> Bind(int socket);
  // Pins process `pid` (with `pidfd` its pidfd) as it runs now, expecting
  // effective uid `uid` and whatever gid it has: for tests and tools that
  // have no handshake socket. Never null; if pinning fails, Admit says why.
  static std::unique_ptr<PeerProcess> BindProcess(pid_t pid, uid_t uid,
                                                  UniqueFd pidfd);

  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  pid_t pid() const { return peer_.pid; }
  uid_t uid() const { return peer_.uid; }
  // Borrowed by the session's GPU regions (pidfd_getfd) and liveness checks.
  int pidfd() const { return pidfd_.get(); }

  // Binds the memory (steps 3 and 4) if that has not happened yet, and
  // returns the admission: OK, or why this peer's memory is refused. A
  // refusal for want of ptrace permission is tried again by the next call.
  absl::Status Admit() const;
  // The credentials at the binding; all zero before it.
  ProcessCredentials credentials() const;
  // /proc/<pid>/mem, bound to one image (for HostProcessMemory); -1 until
  // Admit or CheckAccess succeeded.
  int memory_fd() const;

  // Unavailable once the process exited (its pidfd is readable).
  absl::Status CheckAlive() const;
  // OK while the peer is admitted, holds the credentials it had at the
  // binding and still runs the image bound then. Call before each batch of
  // accesses.
  absl::Status CheckAccess() const;

 private:
  // Steps 3 and 4, made once.
  struct Binding {
    UniqueFd memory;
    UniqueFd status;  // valid only where the kernel lacks PIDFD_GET_INFO
    ProcessCredentials credentials;
    absl::Status admission;
  };

  PeerProcess(PeerCredentials peer, bool gid_known, UniqueFd pidfd,
              UniqueFd dir)
      : peer_(peer),
        gid_known_(gid_known),
        pidfd_(std::move(pidfd)),
        dir_(std::move(dir)) {}
  // Steps 2 (and 3 and 4 if permitted) for `peer`. Without `gid_known` the
  // peer's egid is taken to be the one it has at the binding.
  static absl::StatusOr<std::unique_ptr<PeerProcess>> Pin(PeerCredentials peer,
                                                          bool gid_known,
                                                          UniqueFd pidfd);
  // The binding, made now if not yet; PermissionDenied while the daemon may
  // not open the peer's memory.
  absl::StatusOr<std::shared_ptr<const Binding>> Bound() const;
  absl::StatusOr<std::shared_ptr<const Binding>> MakeBinding() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // From the pidfd where the kernel has PIDFD_GET_INFO, else from `status`.
  absl::StatusOr<ProcessCredentials> ReadCredentials(int status) const;
  // Whether the mm behind `memory` still exists (a read at address 0 gives
  // EIO while it does: nothing is mapped there; 0 bytes once it is gone).
  absl::StatusOr<bool> ImageAlive(int memory) const;

  // Constant after construction.
  const PeerCredentials peer_;  // gid meaningful only with gid_known_
  const bool gid_known_;
  const UniqueFd pidfd_;

  mutable absl::Mutex mu_;
  // /proc/<pid>, the peer's (step 2); closed once the binding is made.
  mutable UniqueFd dir_ ABSL_GUARDED_BY(mu_);
  // Set once; never replaced.
  mutable std::shared_ptr<const Binding> binding_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt
