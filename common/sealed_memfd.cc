#include "common/sealed_memfd.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace ckpt {

absl::StatusOr<UniqueFd> CreateSealedMemfd(const char* name, uint64_t bytes) {
  if (bytes > static_cast<uint64_t>(std::numeric_limits<off_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat("a memfd of ", bytes, " bytes"));
  }
  UniqueFd fd(::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("memfd_create ", name));
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("ftruncate of memfd ", name, " to ", bytes));
  }
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("sealing memfd ", name));
  }
  return fd;
}

absl::Status CheckSealedMemfd(int fd, uint64_t bytes, absl::string_view what) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoToStatus(errno, absl::StrCat("fstat of ", what));
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the fd is not ", what, " (not a memfd)"));
  }
  if (static_cast<uint64_t>(st.st_size) != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the fd is not ", what, ": its size ", st.st_size,
        " does not match the expected ", bytes, " bytes"));
  }
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 && errno == EINVAL) {
    return absl::InvalidArgumentError(
        absl::StrCat("the fd is not ", what, " (not a memfd: it has no seals)"));
  }
  if (seals < 0) return ErrnoToStatus(errno, absl::StrCat("F_GET_SEALS of ", what));
  if ((seals & F_SEAL_SHRINK) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " is not sealed against shrinking: its owner could truncate it "
              "under the mapping"));
  }
  return absl::OkStatus();
}

}  // namespace ckpt
