#include "daemon/service_notifier.h"

#include <systemd/sd-daemon.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace ckpt {

void ServiceNotifier::Status(absl::string_view line) {
  Send(absl::StrCat("STATUS=", line));
}

void ServiceNotifier::Send(const std::string& state) {
  // 0: $NOTIFY_SOCKET is unset, nothing to tell. The variable is kept
  // (unset_environment 0): STATUS and STOPPING follow READY.
  const int sent = sd_notify(/*unset_environment=*/0, state.c_str());
  if (sent >= 0 || failure_logged_) return;
  failure_logged_ = true;
  LogWarning("cannot notify systemd (", state, "): ", std::strerror(-sent),
             "; further notification failures are not logged");
}

std::string ServiceStatusLine(size_t saves_in_flight, uint64_t pool_used_bytes,
                              uint64_t pool_bytes) {
  constexpr uint64_t kMiB = 1 << 20;
  return absl::StrCat(saves_in_flight, saves_in_flight == 1 ? " save" : " saves",
                      " in flight, pool ", pool_used_bytes / kMiB, "/",
                      pool_bytes / kMiB, " MiB");
}

}  // namespace ckpt
