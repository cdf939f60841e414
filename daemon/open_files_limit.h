// The daemon's open-files limit: raised at start, and checked against what
// the configured bounds can use, so that ckptd cannot run out of
// descriptors in normal operation.
//
// Every descriptor the daemon holds is bounded by a flag: sessions by
// --max_sessions, gRPC connections by --max_connections, storage files by
// --io_workers. The limit it needs is
//
//   max_sessions    * kDescriptorsPerSession
//   + max_connections                  (one socket each; gRPC owns it)
//   + io_workers    * kDescriptorsPerWorker
//   + kDescriptorMargin
//
// A session holds at most kDescriptorsPerSession = 6: its handshake socket,
// the peer's pidfd, its /proc/<pid> directory (until the memory is bound),
// /proc/<pid>/mem, /proc/<pid>/status (kernels before 6.13, which lack
// PIDFD_GET_INFO), and the checkpoint directory a load round of it holds
// open. (CUDA regions hold none: the daemon closes each shareable handle
// and event page once it has imported or mapped it.) A trainer's gRPC
// connection is one of max_connections. An I/O worker holds at most
// kDescriptorsPerWorker = 7: its io_uring, the data files it writes
// (kMaxOpenDataFiles = 4, save/shard_writer.h) or the one it reads, that
// checkpoint's directory, and one small file of a task (a manifest,
// COMMIT, LATEST, a marker). kDescriptorMargin = 256 covers the
// rest, none of which grows with load: the two listeners and their
// eventfds, the storage root and the two lock files, stdio, gRPC's own
// epoll and wake-up descriptors per completion queue, and the nested
// directory descriptors of a gc or retention walk (one per level, a few
// levels deep).
//
// With the defaults (1024 sessions, 4096 connections, 8 workers) that is
// 1024 * 6 + 4096 + 8 * 7 + 256 = 10,552; systemd's default hard limit is
// 524,288 (deploy/ckptd.service sets 65,536).
//
// Thread-safety: call once, at start, before any thread opens files.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "daemon/daemon_options.h"
#include "save/shard_writer.h"

namespace ckpt {

inline constexpr uint64_t kDescriptorsPerSession = 6;
inline constexpr uint64_t kDescriptorsPerWorker = 3 + kMaxOpenDataFiles;
inline constexpr uint64_t kDescriptorMargin = 256;

// The open-files limit `options` needs (the sum above).
uint64_t OpenFilesNeeded(const DaemonOptions& options);

// Raises the soft RLIMIT_NOFILE to the hard one, logs it, and returns it.
// FailedPrecondition, naming the arithmetic and the flags to lower, if the
// hard limit is below OpenFilesNeeded: a daemon that could run out of
// descriptors under its own bounds refuses to start rather than fail later
// in the middle of saves.
absl::StatusOr<uint64_t> RaiseOpenFilesLimit(const DaemonOptions& options);

}  // namespace ckpt
