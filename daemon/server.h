// RunServer: builds the daemon's components and serves until SIGTERM or
// SIGINT, reloading the live settings on SIGHUP (daemon/live_reload.h) and
// keeping systemd told (daemon/service_notifier.h). A stop drains the saves
// in flight up to drain_timeout_ms and cancels the rest
// (daemon/save_drain.h), then shuts down in order (gRPC first, so no new
// work arrives; then the I/O workers finish what they hold).
#pragma once

#include <csignal>
#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/config_file.h"
#include "daemon/daemon_options.h"

namespace ckpt {

// OK if `options` can run a daemon; otherwise why not, naming each setting
// as `origins` says it was given (a config file's key and line, or a flag).
absl::Status ValidateOptions(const DaemonOptions& options,
                             const OptionOrigins& origins = OptionOrigins());

// Reads the options again for SIGHUP: the config file as it is now, with
// the command line's flags over it, validated.
using OptionsReader = std::function<absl::StatusOr<DaemonOptions>()>;

// `signals` holds SIGTERM, SIGINT and SIGHUP, blocked in every thread of
// the process, so that only RunServer's sigtimedwait takes them. Without
// `reread` (no config file) SIGHUP is logged and ignored.
absl::Status RunServer(const DaemonOptions& options, const sigset_t& signals,
                       const OptionsReader& reread = nullptr);

}  // namespace ckpt
