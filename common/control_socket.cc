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

// A probe: anything stat() cannot see (absent, unreachable) is not there.
bool Exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
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
    if (!candidate.empty() && Exists(candidate)) return candidate;
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
