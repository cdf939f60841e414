#include "common/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/unique_fd.h"

namespace ckpt {

absl::StatusOr<std::string> ReadRegularFile(int fd, const std::string& path,
                                            uint64_t max_bytes) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", path));
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a regular file"));
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " is ", st.st_size, " bytes, more than the ", max_bytes,
        " such a file may have"));
  }
  std::string out;
  char chunk[1 << 16];
  while (true) {
    // One byte past the bound tells a file that grew from one that ended.
    const uint64_t want = std::min<uint64_t>(sizeof(chunk), max_bytes + 1 - out.size());
    const ssize_t n = ::read(fd, chunk, want);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("read ", path));
    }
    if (n == 0) break;
    out.append(chunk, static_cast<size_t>(n));
    if (out.size() > max_bytes) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " grew past ", max_bytes, " bytes while being read"));
    }
  }
  return out;
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  return ReadRegularFile(fd.get(), path, max_bytes);
}

}  // namespace ckpt
