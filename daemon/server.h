// RunServer: builds the daemon's components, serves until a signal in
// `stop_signals` arrives, then shuts down in order (gRPC first, so no new
// work arrives; then the I/O workers finish what they hold).
#pragma once

#include <csignal>

#include "absl/status/status.h"
#include "daemon/daemon_options.h"

namespace ckpt {

absl::Status ValidateOptions(const DaemonOptions& options);
absl::Status RunServer(const DaemonOptions& options, const sigset_t& stop_signals);

}  // namespace ckpt
