// The daemon's config file: protobuf text format against v1::Config
// (proto/ckpt/v1/config.proto), one key per DaemonOptions member, e.g.
//
//   root: "/srv/ckpt"
//   pool_bytes: 8589934592   # 8 GiB
//   keep_last: 3
//
// Precedence, lowest first: DaemonOptions' defaults, the file's keys, the
// flags given on the command line (daemon/main.cc). A file that does not
// parse (an unknown key, a malformed or out-of-range value, a key given
// twice) is refused as a whole with "FILE:LINE:COLUMN: reason"; values that
// parse but make no sense (io_workers: 0) are refused by ValidateOptions
// (daemon/server.h), which names the key and its line through the
// OptionOrigins kept here. deploy/ckptd.conf lists every key with its
// default; a unit test checks that it still equals DaemonOptions{}.
//
// Thread-safety: free functions and value types; no shared state.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/v1/config.pb.h"
#include "common/log.h"
#include "daemon/daemon_options.h"

namespace ckpt {

// Where each option's value came from, so that an error names what the
// operator wrote: a key the config file set as "key (FILE:LINE)", any other
// (a flag or a default) as its flag "--key".
class OptionOrigins {
 public:
  void SetFromFile(const std::string& key, const std::string& file, int line);
  std::string Name(absl::string_view key) const;

 private:
  std::string file_;
  std::map<std::string, int, std::less<>> lines_;  // 1-based, by key
};

// A parsed config file: the keys it set are the fields present in `config`.
struct ConfigFile {
  std::string path;
  v1::Config config;
  std::map<std::string, int> lines;  // 1-based line of each key set
};

// Parses `text`, the contents of `path` (named in errors only).
absl::StatusOr<ConfigFile> ParseConfig(absl::string_view text,
                                       const std::string& path);
// The largest config file read: every key with a comment fits in a few
// KiB (deploy/ckptd.conf), so a larger one is a mistake, and the cap keeps
// a reload from reading without end (issue 33).
inline constexpr uint64_t kMaxConfigFileBytes = 1 << 20;

// Reads and parses the file at `path` (symlinks followed: the operator
// names it). Anything but a regular file of at most kMaxConfigFileBytes is
// refused (FailedPrecondition) without waiting: it is opened non-blocking,
// so a FIFO with no writer does not hang the open, checked with fstat
// before a byte is read, so /dev/zero is never read, and read up to one
// byte past the cap. A SIGHUP reload runs on the main loop, which takes
// SIGTERM only between reloads: a reload that could wait would keep the
// daemon from stopping.
absl::StatusOr<ConfigFile> ReadConfigFile(const std::string& path);

// Sets each option the file has a key for, except the keys in `flags_given`
// (flags given on the command line, which win), and records the file's
// keys in `origins`.
void ApplyConfig(const ConfigFile& file, const std::set<std::string>& flags_given,
                 DaemonOptions* options, OptionOrigins* origins);

// Every option as a Config with every key set: for comparing option sets
// key by key (the live reload's diff, the shipped file's test).
v1::Config ConfigOf(const DaemonOptions& options);

// "debug", "info", "warning" or "error".
absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name);

}  // namespace ckpt
