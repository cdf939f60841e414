#include "common/status.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace ckpt {

absl::Status ErrnoToStatus(int err, absl::string_view context) {
  std::string message = absl::StrCat(context, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ESRCH:
      return absl::NotFoundError(message);
    case EEXIST:
      return absl::AlreadyExistsError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
      return absl::ResourceExhaustedError(message);
    case EINVAL:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  absl::Status annotated(status.code(), absl::StrCat(context, ": ", status.message()));
  status.ForEachPayload([&](absl::string_view url, const absl::Cord& payload) {
    annotated.SetPayload(url, payload);
  });
  return annotated;
}

namespace {
constexpr absl::string_view kHostMemoryInUseUrl = "ckptd/host-memory-in-use";
}  // namespace

absl::Status MarkHostMemoryInUse(absl::Status status) {
  if (!status.ok()) status.SetPayload(kHostMemoryInUseUrl, absl::Cord("1"));
  return status;
}

bool HostMemoryInUse(const absl::Status& status) {
  return status.GetPayload(kHostMemoryInUseUrl).has_value();
}

void UpdateKeepingHostMemoryInUse(absl::Status* status, const absl::Status& next) {
  const bool in_use = HostMemoryInUse(*status) || HostMemoryInUse(next);
  status->Update(next);
  if (in_use) *status = MarkHostMemoryInUse(*status);
}

}  // namespace ckpt
