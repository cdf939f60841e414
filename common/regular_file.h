// Reading a whole regular file of bounded size, without waiting on what is
// not one: the config file (daemon/config_file.h) and the small files under
// the storage root (storage/storage_dir.h) are read this way.
//
// A name can stand for a FIFO (whose open waits for a writer), a device
// (/dev/zero reads without end) or a file that grows while it is read. The
// file is opened O_NONBLOCK (a FIFO opens at once) and O_NOCTTY, checked
// with fstat before a byte is read, and read up to one byte past the bound:
// whatever the name stands for, the read ends promptly, in bounded memory.
//
// Thread-safety: free functions; no shared state.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace ckpt {

// Reads the file open on `fd` (opened O_NONBLOCK, so that opening it did
// not wait). Anything but a regular file, and a file of more than
// `max_bytes` (by its size, or by what reading it returns: it may grow
// meanwhile), is FailedPrecondition; `path` names it in messages.
absl::StatusOr<std::string> ReadRegularFile(int fd, const std::string& path,
                                            uint64_t max_bytes);

// Opens `path` (symlinks followed: the caller trusts the name) O_RDONLY |
// O_NONBLOCK | O_NOCTTY | O_CLOEXEC and reads it as above.
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes);

}  // namespace ckpt
