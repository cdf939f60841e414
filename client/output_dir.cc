#include "client/output_dir.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <deque>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"

namespace ckpt {
namespace {

// As the kernel's MAXSYMLINKS: more links than this in one walk is a loop.
constexpr int kMaxLinks = 40;

// The components of `path` to walk: "" and "." change nothing.
std::deque<std::string> Components(absl::string_view path) {
  std::deque<std::string> out;
  for (absl::string_view c : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    if (c != ".") out.emplace_back(c);
  }
  return out;
}

// Where the walk starts for `path`: "/" for an absolute one, else the
// working directory (the caller's own choice).
absl::StatusOr<UniqueFd> Start(absl::string_view path) {
  const char* start = absl::StartsWith(path, "/") ? "/" : ".";
  UniqueFd fd(::open(start, O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("open ", start));
  return fd;
}

// Root's, or the caller's: no other user could have made or placed it.
bool Trusted(uid_t owner, uid_t me) { return owner == 0 || owner == me; }

}  // namespace

absl::StatusOr<UniqueFd> OpenOutputDir(const std::string& path, mode_t mode) {
  if (path.empty()) return absl::InvalidArgumentError("the output directory is empty");
  const uid_t me = ::geteuid();
  ASSIGN_OR_RETURN(UniqueFd at, Start(path));
  std::deque<std::string> rest = Components(path);
  std::string walked = absl::StartsWith(path, "/") ? "" : ".";  // for messages
  int links = 0;
  while (!rest.empty()) {
    const std::string name = std::move(rest.front());
    rest.pop_front();
    const std::string here = absl::StrCat(walked, "/", name);
    UniqueFd next(::openat(at.get(), name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (!next.valid() && errno == ENOENT && rest.empty()) {
      if (::mkdirat(at.get(), name.c_str(), mode) != 0 && errno != EEXIST) {
        return ErrnoToStatus(errno, absl::StrCat("mkdir ", here));
      }
      // Opened as the rest: what another user swapped in meanwhile is checked.
      next.reset(::openat(at.get(), name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    }
    if (!next.valid()) return ErrnoToStatus(errno, absl::StrCat("open ", here));
    struct stat st;
    if (::fstat(next.get(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", here));
    if (S_ISLNK(st.st_mode)) {
      struct stat holder;
      if (::fstat(at.get(), &holder) != 0) {
        return ErrnoToStatus(errno, absl::StrCat("stat ", walked, "/"));
      }
      if (!Trusted(st.st_uid, me) || !Trusted(holder.st_uid, me)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "refusing --out ", path, ": ", here, " is a symbolic link of uid ", st.st_uid,
            " in a directory of uid ", holder.st_uid,
            "; only links of yours or root's, in directories of yours or root's, are "
            "followed (another user's could send the export anywhere you may write): "
            "give the directory it leads to"));
      }
      if (++links > kMaxLinks) {
        return ErrnoToStatus(ELOOP, absl::StrCat("open ", path));
      }
      char target[PATH_MAX];
      // With an empty name: the link `next` holds, not a name someone could
      // change meanwhile.
      const ssize_t n = ::readlinkat(next.get(), "", target, sizeof(target));
      if (n < 0) return ErrnoToStatus(errno, absl::StrCat("readlink ", here));
      if (static_cast<size_t>(n) == sizeof(target)) {
        return ErrnoToStatus(ENAMETOOLONG, absl::StrCat("readlink ", here));
      }
      const absl::string_view to(target, static_cast<size_t>(n));
      std::deque<std::string> more = Components(to);
      rest.insert(rest.begin(), more.begin(), more.end());
      if (absl::StartsWith(to, "/")) {
        ASSIGN_OR_RETURN(at, Start(to));
        walked = "";
      }
      continue;
    }
    if (!S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("--out ", path, ": ", here, " is not a directory"));
    }
    at = std::move(next);
    walked = here;
  }
  // An O_PATH descriptor cannot be listed or written through: the
  // directory itself, opened from it.
  UniqueFd dir(::openat(at.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  return dir;
}

}  // namespace ckpt
