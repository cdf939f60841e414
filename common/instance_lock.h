// InstanceLock: an exclusive flock(2) a daemon holds for its whole life on a
// lock file, so that a second daemon for the same thing (a socket, a node of
// a storage root) refuses to start instead of taking it over.
//
// Why flock: the lock belongs to the open file description, so the kernel
// drops it when the holder exits however it exits (kill -9 included): a
// crash never leaves a stale lock behind, and the restarted daemon gets it
// at once. LOCK_NB makes a second daemon fail at once (EWOULDBLOCK) rather
// than wait. On NFS the client emulates flock with POSIX byte-range locks
// (Linux 2.6.12+), so the lock also excludes daemons on other hosts that
// share the file system.
//
// The file's content is a record the holder writes, its first line saying
// who holds it ("pid 1234 on host n1"): the refusal quotes that line, and the
// next holder reads what the previous one left (previous_record). Only the
// lock itself decides; the record is information.
//
// Ownership: owns the descriptor (move-only); destroying it releases the
// lock. Thread-safety: none; one owner.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/unique_fd.h"

namespace ckpt {

class InstanceLock {
 public:
  // Records longer than this are cut when read.
  static constexpr size_t kMaxRecordBytes = 4096;

  // Takes the lock on `fd` (a regular file opened read-write), named `path`
  // in messages. When another process holds it: FailedPrecondition naming
  // `path`, `what` (what the lock guards, e.g. "socket /run/ckptd.sock") and
  // the first line of the holder's record. A file system without flock
  // (Lustre mounted without -o flock, NFS with nolock) is an error, unless
  // `unsupported_ok`: then the lock is not held (locked() is false, and a
  // warning says what that leaves unguarded) and the record still works.
  static absl::StatusOr<InstanceLock> Acquire(UniqueFd fd, std::string path,
                                              absl::string_view what,
                                              bool unsupported_ok = false);
  // Opens `path`, a trusted path (beside the operator's socket), creating it
  // 0644, O_NOFOLLOW so a symlink planted under its name is refused, then
  // Acquire.
  static absl::StatusOr<InstanceLock> AcquireAt(std::string path,
                                                absl::string_view what);

  InstanceLock(InstanceLock&&) = default;
  InstanceLock& operator=(InstanceLock&&) = default;

  const std::string& path() const { return path_; }
  // False only where the file system has no flock (see Acquire).
  bool locked() const { return locked_; }
  // The record the file held when the lock was taken: the previous holder's
  // (empty for a new file).
  const std::string& previous_record() const { return previous_record_; }
  // Replaces the record with `record`: written from offset 0, truncated to
  // its length, fsynced (the next holder reads it after a crash).
  absl::Status WriteRecord(absl::string_view record);

 private:
  InstanceLock(UniqueFd fd, std::string path, std::string previous_record,
               bool locked)
      : fd_(std::move(fd)),
        path_(std::move(path)),
        previous_record_(std::move(previous_record)),
        locked_(locked) {}

  UniqueFd fd_;
  std::string path_;
  std::string previous_record_;
  bool locked_;
};

}  // namespace ckpt
