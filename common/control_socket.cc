// Which socket each end of the control socket takes when not told
// (common/control_socket.h; docs/OPERATIONS.md, "Running as an ordinary
// user").
#include "common/control_socket.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

// Whether a socket found by default is there and this user's own: the
// socket and its directory owned by this uid and not symlinks, and the
// directory writable by no one else. /tmp is every user's and the Slurm
// name is predictable: another user could make
// /tmp/ckptd-slurm-<our uid>-<job>/ first and serve a daemon there that
// accepts our saves and keeps nothing (deploy/slurm/ckptd-slurm refuses
// such a directory as well). Anything lstat() cannot see is not there.
bool OwnSocketThere(const std::string& path) {
  const uid_t uid = ::getuid();
  struct stat socket {};
  if (::lstat(path.c_str(), &socket) != 0 || S_ISLNK(socket.st_mode) ||
      socket.st_uid != uid) {
    return false;
  }
  const std::string dir = path.substr(0, path.find_last_of('/'));
  struct stat parent {};
  return ::lstat(dir.c_str(), &parent) == 0 && S_ISDIR(parent.st_mode) &&
         parent.st_uid == uid && (parent.st_mode & (S_IWGRP | S_IWOTH)) == 0;
}

bool AllDigits(const std::string& text) {
  if (text.empty()) return false;
  for (const char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

}  // namespace

std::string UserRuntimeSocket() {
  const std::string dir = Env("XDG_RUNTIME_DIR");
  if (dir.empty() || dir.front() != '/') return "";
  return absl::StrCat(dir, "/ckptd/ckptd.sock");
}

std::string SlurmJobSocket() {
  const std::string job = Env("SLURM_JOB_ID");
  if (!AllDigits(job)) return "";
  return absl::StrCat("/tmp/ckptd-slurm-", ::getuid(), "-", job, "/ckptd.sock");
}

std::string DefaultClientSocket() {
  if (std::string named = Env("CKPTD_SOCKET"); !named.empty()) return named;
  for (const std::string& candidate : {SlurmJobSocket(), UserRuntimeSocket()}) {
    if (!candidate.empty() && OwnSocketThere(candidate)) return candidate;
  }
  return kDefaultSocket;
}

std::string DefaultDaemonSocket() {
  if (std::string named = Env("CKPTD_SOCKET"); !named.empty()) return named;
  if (::geteuid() != 0) {
    if (std::string user = UserRuntimeSocket(); !user.empty()) return user;
  }
  return kDefaultSocket;
}

}  // namespace ckpt
