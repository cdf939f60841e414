#include "common/socket_access.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/unique_fd.h"

namespace ckpt {

absl::StatusOr<gid_t> ResolveGroup(absl::string_view name_or_number) {
  uint32_t number = 0;
  if (absl::SimpleAtoi(name_or_number, &number)) return static_cast<gid_t>(number);
  const std::string name(name_or_number);
  std::vector<char> buffer(16 << 10);
  group entry{};
  group* found = nullptr;
  for (;;) {
    const int err =
        ::getgrnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found);
    if (err == ERANGE && buffer.size() < (1u << 20)) {
      buffer.resize(buffer.size() * 2);  // a group with very many members
      continue;
    }
    if (err != 0) return ErrnoToStatus(err, absl::StrCat("look up group ", name));
    break;
  }
  if (found == nullptr) {
    return absl::NotFoundError(absl::StrCat("no group named '", name, "'"));
  }
  return found->gr_gid;
}

absl::Status RestrictSocketFile(const std::string& path, const SocketAccess& access) {
  // O_PATH | O_NOFOLLOW: a symlink put in place of the socket is opened as
  // the link itself and refused below, never followed to its target.
  UniqueFd fd(::open(path.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("stat ", path));
  }
  if (!S_ISSOCK(st.st_mode) || st.st_uid != ::geteuid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " is not the socket this daemon bound (mode ", st.st_mode,
        ", owner ", st.st_uid, "): was it replaced?"));
  }
  if (access.group.has_value() &&
      ::fchownat(fd.get(), "", static_cast<uid_t>(-1), *access.group,
                 AT_EMPTY_PATH) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("give ", path, " to group ",
                                             *access.group));
  }
  // fchmod refuses O_PATH descriptors; chmod through /proc/self/fd acts on
  // the very file opened above, not on whatever the path names now.
  const std::string self = absl::StrCat("/proc/self/fd/", fd.get());
  const mode_t mode = access.group.has_value() ? 0660 : 0600;
  if (::chmod(self.c_str(), mode) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("chmod ", path));
  }
  return absl::OkStatus();
}

bool MayConnect(const SocketAccess& access, uid_t uid, gid_t gid,
                const std::vector<gid_t>& groups) {
  if (uid == 0 || uid == ::geteuid()) return true;
  if (!access.group.has_value()) return false;
  return gid == *access.group ||
         std::find(groups.begin(), groups.end(), *access.group) != groups.end();
}

}  // namespace ckpt
