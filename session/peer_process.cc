#include "session/peer_process.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"

// Linux 6.5; Debian 12's headers predate it.
#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

namespace ckpt {
namespace {

// PIDFD_GET_INFO (Linux 6.13, include/uapi/linux/pidfd.h): the first
// published layout of struct pidfd_info, PIDFD_INFO_SIZE_VER0 = 64 bytes.
// Later kernels accept this size and fill only these fields.
struct PidfdInfoV0 {
  uint64_t mask;
  uint64_t cgroupid;
  uint32_t pid, tgid, ppid;
  uint32_t ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid;
  uint32_t spare0;
};
static_assert(sizeof(PidfdInfoV0) == 64);
constexpr uint64_t kPidfdInfoCreds = 1u << 1;
constexpr unsigned long kPidfdGetInfo = _IOWR(0xFF, 11, PidfdInfoV0);

// The status file is a few KiB; its Uid:/Gid: lines come early.
constexpr size_t kStatusBytes = 8192;

std::string Ids(const std::array<uint32_t, 4>& ids) {
  return absl::StrCat(ids[0], "/", ids[1], "/", ids[2], "/", ids[3]);
}

bool AllEqual(const std::array<uint32_t, 4>& ids, uint32_t id) {
  for (uint32_t i : ids) {
    if (i != id) return false;
  }
  return true;
}

// "Uid:\t1000\t1000\t1000\t1000" → the four ids.
absl::StatusOr<std::array<uint32_t, 4>> ParseIdLine(absl::string_view status,
                                                    absl::string_view key) {
  for (absl::string_view line : absl::StrSplit(status, '\n')) {
    if (!absl::ConsumePrefix(&line, key)) continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    std::array<uint32_t, 4> ids{};
    if (fields.size() != ids.size()) break;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!absl::SimpleAtoi(fields[i], &ids[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat("bad ", key, " line in /proc status: ", line));
      }
    }
    return ids;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("no well-formed ", key, " line in /proc status"));
}

// The pidfd of the process at the other end of `socket`.
absl::StatusOr<UniqueFd> PeerPidfd(int socket, pid_t pid) {
  int fd = -1;
  socklen_t len = sizeof(fd);
  if (::getsockopt(socket, SOL_SOCKET, SO_PEERPIDFD, &fd, &len) == 0) {
    return UniqueFd(fd);
  }
  if (errno != ENOPROTOOPT) return ErrnoToStatus(errno, "SO_PEERPIDFD");
  // Before Linux 6.5: by pid. The process may in theory have exited and its
  // pid been reused since connect(); Bind's credential and image checks
  // then judge whichever process the pidfd names.
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!pidfd.valid()) {
    return ErrnoToStatus(errno, absl::StrCat("pidfd_open(", pid, ")"));
  }
  return pidfd;
}

}  // namespace

absl::Status PidfdAlive(int pidfd, pid_t pid) {
  pollfd p{pidfd, POLLIN, 0};
  const int n = ::poll(&p, 1, 0);
  if (n < 0)
    return ErrnoToStatus(errno, absl::StrCat("poll pidfd of pid ", pid));
  if (n > 0) {
    return absl::UnavailableError(
        absl::StrCat("the trainer process (pid ", pid, ") has exited"));
  }
  return absl::OkStatus();
}

std::string ProcessCredentials::ToString() const {
  return absl::StrCat("uid ", Ids(uids), " gid ", Ids(gids));
}

absl::StatusOr<ProcessCredentials> ParseProcStatusCredentials(
    absl::string_view status) {
  ProcessCredentials c;
  ASSIGN_OR_RETURN(c.uids, ParseIdLine(status, "Uid:"));
  ASSIGN_OR_RETURN(c.gids, ParseIdLine(status, "Gid:"));
  return c;
}

absl::StatusOr<ProcessCredentials> ReadStatusCredentials(int status_fd) {
  // A pread at offset 0 makes the kernel generate the file afresh.
  std::string text(kStatusBytes, '\0');
  ssize_t n;
  do {
    n = ::pread(status_fd, text.data(), text.size(), 0);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoToStatus(errno, "read /proc/<pid>/status");
  text.resize(static_cast<size_t>(n));
  return ParseProcStatusCredentials(text);
}

absl::StatusOr<ProcessCredentials> ReadPidfdCredentials(int pidfd) {
  PidfdInfoV0 info{};
  info.mask = kPidfdInfoCreds;
  if (::ioctl(pidfd, kPidfdGetInfo, &info) != 0) {
    // Kernels before 6.13 do not know the request.
    if (errno == ENOTTY || errno == EINVAL) {
      return absl::UnimplementedError("PIDFD_GET_INFO is not supported");
    }
    return ErrnoToStatus(errno, "ioctl(PIDFD_GET_INFO)");
  }
  if ((info.mask & kPidfdInfoCreds) == 0) {
    return absl::UnimplementedError("PIDFD_GET_INFO returned no credentials");
  }
  ProcessCredentials c;
  c.uids = {info.ruid, info.euid, info.suid, info.fsuid};
  c.gids = {info.rgid, info.egid, info.sgid, info.fsgid};
  return c;
}

absl::Status AdmitPeer(const PeerCredentials& peer,
                       const ProcessCredentials& now, uid_t status_owner) {
  if (now.uids[1] != peer.uid || now.gids[1] != peer.gid) {
    return absl::PermissionDeniedError(absl::StrCat(
        "pid ", peer.pid, " connected as uid ", peer.uid, " gid ", peer.gid,
        " but runs as ", now.ToString(),
        " when its memory is bound (it changed credentials or ran another "
        "program): its memory is not this session's"));
  }
  if (peer.uid == 0) return absl::OkStatus();  // root may read anything
  if (!AllEqual(now.uids, peer.uid) || !AllEqual(now.gids, peer.gid)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "pid ", peer.pid, " runs with mixed credentials (", now.ToString(),
        ", real/effective/saved/fs): a process inside a setuid or setgid "
        "program, or keeping a saved privileged id, is not its user's to "
        "read, so ckptd does not read or write its memory"));
  }
  if (status_owner != peer.uid) {
    return absl::PermissionDeniedError(absl::StrCat(
        "pid ", peer.pid,
        " is not dumpable (it ran a setuid, setgid or "
        "file-capability program, changed credentials, or called "
        "prctl(PR_SET_DUMPABLE, 0)): the kernel would not let uid ",
        peer.uid,
        " read its memory, so ckptd does not either (a trainer "
        "that drops privileges without exec can call "
        "prctl(PR_SET_DUMPABLE, 1))"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PeerProcess>> PeerProcess::Bind(int socket) {
  // Step 1: who connected (euid/egid at connect()), and that very process.
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(socket, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return ErrnoToStatus(errno, "SO_PEERCRED");
  }
  const PeerCredentials peer{cred.pid, cred.uid, cred.gid};
  ASSIGN_OR_RETURN(UniqueFd pidfd, PeerPidfd(socket, peer.pid));
  return Pin(peer, /*gid_known=*/true, std::move(pidfd));
}

std::unique_ptr<PeerProcess> PeerProcess::BindProcess(pid_t pid, uid_t uid,
                                                      UniqueFd pidfd) {
  const PeerCredentials peer{pid, uid, 0};
  absl::StatusOr<std::unique_ptr<PeerProcess>> pinned =
      Pin(peer, /*gid_known=*/false, std::move(pidfd));
  if (pinned.ok()) return *std::move(pinned);
  // Unpinned: a binding that holds only the reason.
  std::unique_ptr<PeerProcess> unpinned(
      new PeerProcess(peer, /*gid_known=*/false, UniqueFd(), UniqueFd()));
  auto refused = std::make_shared<Binding>();
  refused->admission = pinned.status();
  absl::MutexLock lock(&unpinned->mu_);
  unpinned->binding_ = std::move(refused);
  return unpinned;
}

absl::StatusOr<std::unique_ptr<PeerProcess>> PeerProcess::Pin(
    PeerCredentials peer, bool gid_known, UniqueFd pidfd) {
  // Step 2: its /proc directory, known to be its own once the pidfd shows it
  // still running afterwards.
  const std::string dir_path = absl::StrCat("/proc/", peer.pid);
  UniqueFd dir(::open(dir_path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid())
    return ErrnoToStatus(errno, absl::StrCat("open ", dir_path));
  RETURN_IF_ERROR(PidfdAlive(pidfd.get(), peer.pid));
  std::unique_ptr<PeerProcess> process(
      new PeerProcess(peer, gid_known, std::move(pidfd), std::move(dir)));
  // Steps 3 and 4 now where the daemon may: the sooner, the fewer chances
  // for the peer to exec first. Without ptrace permission yet, Admit does
  // them later; any other failure means the peer cannot be pinned.
  absl::StatusOr<std::shared_ptr<const Binding>> bound = process->Bound();
  if (!bound.ok() && !absl::IsPermissionDenied(bound.status())) {
    return bound.status();
  }
  return process;
}

absl::StatusOr<std::shared_ptr<const PeerProcess::Binding>> PeerProcess::Bound()
    const {
  absl::MutexLock lock(&mu_);
  if (binding_ == nullptr) {
    // Under the lock: one binding, and no access before it exists.
    ASSIGN_OR_RETURN(binding_, MakeBinding());
    dir_.reset();  // every file the binding needs is open
  }
  return binding_;
}

absl::StatusOr<std::shared_ptr<const PeerProcess::Binding>>
PeerProcess::MakeBinding() const {
  // Step 3: the memory of the image it runs now, bound for good.
  UniqueFd memory(::openat(dir_.get(), "mem", O_RDWR | O_CLOEXEC));
  if (!memory.valid()) {
    const int err = errno;
    if (err == EACCES || err == EPERM) {
      return absl::PermissionDeniedError(absl::StrCat(
          "ckptd may not open /proc/", peer_.pid, "/mem: ", std::strerror(err),
          " (it needs ptrace permission over the trainer: root or "
          "CAP_SYS_PTRACE, or the same user with Yama ptrace_scope <= 1 and "
          "the trainer's PR_SET_PTRACER)"));
    }
    return ErrnoToStatus(err, absl::StrCat("open /proc/", peer_.pid, "/mem"));
  }
  UniqueFd status(::openat(dir_.get(), "status", O_RDONLY | O_CLOEXEC));
  if (!status.valid()) {
    return ErrnoToStatus(errno,
                         absl::StrCat("open /proc/", peer_.pid, "/status"));
  }

  // Step 4: credentials and dumpability after the open, then the image.
  absl::StatusOr<ProcessCredentials> now = ReadPidfdCredentials(pidfd_.get());
  const bool have_pidfd_info = now.ok() || !absl::IsUnimplemented(now.status());
  if (!have_pidfd_info) now = ReadStatusCredentials(status.get());
  if (!now.ok()) {
    return Annotate(now.status(),
                    absl::StrCat("credentials of pid ", peer_.pid));
  }
  struct stat st {};
  if (::fstat(status.get(), &st) != 0) {
    return ErrnoToStatus(errno,
                         absl::StrCat("stat /proc/", peer_.pid, "/status"));
  }
  PeerCredentials expected = peer_;
  if (!gid_known_) expected.gid = now->gids[1];
  auto binding = std::make_shared<Binding>();
  binding->credentials = *now;
  binding->admission = AdmitPeer(expected, *now, st.st_uid);
  ASSIGN_OR_RETURN(const bool image_alive, ImageAlive(memory.get()));
  if (!image_alive && binding->admission.ok()) {
    binding->admission = absl::PermissionDeniedError(
        absl::StrCat("pid ", peer_.pid,
                     " exited or ran another program while its memory "
                     "was being bound: its memory is not this session's"));
  }
  binding->memory = std::move(memory);
  // The status file serves only kernels without PIDFD_GET_INFO.
  if (!have_pidfd_info) binding->status = std::move(status);
  return binding;
}

absl::Status PeerProcess::Admit() const {
  ASSIGN_OR_RETURN(std::shared_ptr<const Binding> binding, Bound());
  return binding->admission;
}

ProcessCredentials PeerProcess::credentials() const {
  absl::MutexLock lock(&mu_);
  return binding_ == nullptr ? ProcessCredentials() : binding_->credentials;
}

int PeerProcess::memory_fd() const {
  absl::MutexLock lock(&mu_);
  return binding_ == nullptr ? -1 : binding_->memory.get();
}

absl::Status PeerProcess::CheckAlive() const {
  return PidfdAlive(pidfd_.get(), peer_.pid);
}

absl::StatusOr<ProcessCredentials> PeerProcess::ReadCredentials(
    int status) const {
  if (status >= 0) return ReadStatusCredentials(status);
  absl::StatusOr<ProcessCredentials> c = ReadPidfdCredentials(pidfd_.get());
  if (absl::IsNotFound(c.status())) {  // ESRCH: reaped
    return absl::UnavailableError(
        absl::StrCat("the trainer process (pid ", peer_.pid, ") has exited"));
  }
  return c;
}

absl::StatusOr<bool> PeerProcess::ImageAlive(int memory) const {
  char byte;
  ssize_t n;
  do {
    n = ::pread(memory, &byte, 1, 0);
  } while (n < 0 && errno == EINTR);
  if (n > 0) return true;  // a process that mapped page 0
  if (n == 0) return false;
  if (errno == EIO) return true;  // alive, nothing mapped at 0
  return ErrnoToStatus(errno, absl::StrCat("probe /proc/", peer_.pid, "/mem"));
}

absl::Status PeerProcess::CheckAccess() const {
  ASSIGN_OR_RETURN(std::shared_ptr<const Binding> binding, Bound());
  RETURN_IF_ERROR(binding->admission);
  ASSIGN_OR_RETURN(
      const ProcessCredentials now,
      ReadCredentials(binding->status.valid() ? binding->status.get() : -1));
  if (now != binding->credentials) {
    return absl::PermissionDeniedError(
        absl::StrCat("the trainer process (pid ", peer_.pid,
                     ") changed its credentials "
                     "since its memory was bound (",
                     binding->credentials.ToString(), ", now ", now.ToString(),
                     "): its memory is no longer this session's"));
  }
  ASSIGN_OR_RETURN(const bool image_alive, ImageAlive(binding->memory.get()));
  if (!image_alive) {
    RETURN_IF_ERROR(CheckAlive());  // exited: Unavailable
    return absl::PermissionDeniedError(absl::StrCat(
        "the trainer process (pid ", peer_.pid,
        ") no longer runs the program "
        "whose memory was bound (it called exec, or is exiting): its memory is "
        "no longer this session's"));
  }
  return absl::OkStatus();
}

}  // namespace ckpt
