// Test support: a real ckptd process on a private socket and storage root,
// and helpers to run other real processes (ckptctl, ckpt-loadgen).
//
// Each DaemonProcess gets a fresh temporary directory; the daemon runs with
// small pools so tests exercise back-pressure. Not thread-safe.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace ckpt::testing {

class DaemonProcess {
 public:
  // Starts ckptd with `extra_flags` and waits until it answers DaemonStatus.
  explicit DaemonProcess(std::vector<std::string> extra_flags = {});
  ~DaemonProcess();  // SIGTERM, wait, remove the directory

  const std::string& socket() const { return socket_; }
  const std::string& root() const { return root_; }
  const std::string& dir() const { return dir_; }
  pid_t pid() const { return pid_; }

  // SIGKILL, then reap.
  void Kill();
  // Starts the daemon again on the same socket and root.
  void Restart();

 private:
  void Start();
  std::string dir_, socket_, root_;
  std::vector<std::string> flags_;
  pid_t pid_ = -1;
};

struct ProcessResult {
  int exit_code = -1;
  std::string out;  // stdout and stderr together
};

// Runs `argv` to completion, capturing its output.
ProcessResult RunProcess(const std::vector<std::string>& argv);

// The value of "key" in the last line of `out` if it is a flat JSON object
// (numbers, true/false, strings), as text; "" if absent.
std::string JsonField(const std::string& out, const std::string& key);

}  // namespace ckpt::testing
