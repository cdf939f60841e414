#include "daemon/open_files_limit.h"

#include <sys/resource.h>

#include <cerrno>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/log.h"
#include "common/status.h"
#include "storage/durable_file.h"

namespace ckpt {
namespace {

// The most descriptors the kernel lets one process have
// (/proc/sys/fs/nr_open): where the hard limit says "infinity", the soft
// one can go only this high.
absl::StatusOr<uint64_t> KernelOpenFilesCeiling() {
  ASSIGN_OR_RETURN(std::string text, ReadSmallFile("/proc/sys/fs/nr_open"));
  uint64_t value = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &value)) {
    return absl::InternalError(
        absl::StrCat("/proc/sys/fs/nr_open holds '", text, "', not a number"));
  }
  return value;
}

}  // namespace

uint64_t OpenFilesNeeded(const DaemonOptions& o) {
  return uint64_t{o.max_sessions} * kDescriptorsPerSession + o.max_connections +
         uint64_t{o.io_workers} * kDescriptorsPerWorker + kDescriptorMargin;
}

absl::StatusOr<uint64_t> RaiseOpenFilesLimit(const DaemonOptions& options) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    return ErrnoToStatus(errno, "getrlimit(RLIMIT_NOFILE)");
  }
  uint64_t target = limit.rlim_max;
  if (limit.rlim_max == RLIM_INFINITY) {
    ASSIGN_OR_RETURN(target, KernelOpenFilesCeiling());
  }
  const uint64_t needed = OpenFilesNeeded(options);
  if (target < needed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the open-files limit (hard RLIMIT_NOFILE) is ", target, ", below the ",
        needed, " descriptors ckptd may need: --max_sessions ",
        options.max_sessions, " x ", kDescriptorsPerSession,
        " + --max_connections ", options.max_connections, " + --io_workers ",
        options.io_workers, " x ", kDescriptorsPerWorker, " + ",
        kDescriptorMargin,
        "; raise the limit (LimitNOFILE= in the systemd unit, ulimit -Hn) or "
        "lower those flags"));
  }
  if (limit.rlim_cur < target) {
    const rlim_t before = limit.rlim_cur;
    limit.rlim_cur = static_cast<rlim_t>(target);
    if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("setrlimit(RLIMIT_NOFILE) from ",
                                               before, " to ", target));
    }
  }
  LogInfo("open-files limit ", target, " (", needed,
          " needed for --max_sessions ", options.max_sessions,
          ", --max_connections ", options.max_connections, ", --io_workers ",
          options.io_workers, ")");
  return target;
}

}  // namespace ckpt
