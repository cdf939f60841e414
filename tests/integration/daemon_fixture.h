// Test support: a real ckptd process on a private socket and storage root,
// and helpers to run other real processes (ckptctl, ckpt-loadgen).
//
// Each DaemonProcess gets a fresh temporary directory; the daemon runs with
// small pools so tests exercise back-pressure. Not thread-safe.
#pragma once

#include <sys/types.h>

#include <cstdint>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ckpt::testing {

// The path of a binary the build made (`built`), or, where the environment
// sets CKPT_TEST_BIN_DIR (the test binaries copied to a GPU machine with
// scripts/gpu-bundle.sh), the file of that name there.
const char* TestBinary(const char* built);
// The directory test daemons' directories go in: $TMPDIR, else /tmp.
std::string TempBase();
#define CKPTD_BINARY ::ckpt::testing::TestBinary(CKPTD_BINARY_PATH)
#define CKPTCTL_BINARY ::ckpt::testing::TestBinary(CKPTCTL_BINARY_PATH)
#define LOADGEN_BINARY ::ckpt::testing::TestBinary(LOADGEN_BINARY_PATH)
#define GPU_TRAINER_BINARY ::ckpt::testing::TestBinary(GPU_TRAINER_BINARY_PATH)
#define ACCESS_PROBE_BINARY ::ckpt::testing::TestBinary(ACCESS_PROBE_BINARY_PATH)

// A daemon run as a user other than root, the way the systemd unit runs it
// (deploy/ckptd.service.in): as `uid`:`gid` with no supplementary groups,
// exactly `capabilities` (ambient, inheritable and bounding; names as in
// capabilities(7) without "CAP_", lower case, e.g. "sys_ptrace"), through
// setpriv. Resource limits stay the test's: raising LimitMEMLOCK's takes
// CAP_SYS_RESOURCE, which a sandbox may not have (a pool it cannot lock
// the daemon uses unlocked, and says so). With `memlock_bytes`, the
// daemon's RLIMIT_MEMLOCK (soft and hard) is that, set by prlimit(1)
// before setpriv: an ordinary user's limit, as a Slurm job or a container
// gives it.
struct RunAs {
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<std::string> capabilities;
  std::optional<uint64_t> memlock_bytes;
};

class DaemonProcess {
 public:
  // Starts ckptd with `extra_flags` and waits until it answers DaemonStatus.
  // With `shared_root` set, the storage root is that directory (several
  // daemons, one per node, share it) and is not removed here.
  // `environment` ("NAME=value" each) is added to the daemon's own
  // environment, e.g. a crash point (common/crash_point.h).
  // With `run_as`, the daemon's directory is given to that user first, and
  // a daemon that exits at start-up is no test failure: running() says so
  // (a test of what it needs to start).
  explicit DaemonProcess(std::vector<std::string> extra_flags = {},
                         std::string shared_root = "",
                         std::vector<std::string> environment = {},
                         std::optional<RunAs> run_as = std::nullopt);
  ~DaemonProcess();  // SIGTERM, wait, remove the directory

  const std::string& socket() const { return socket_; }
  const std::string& root() const { return root_; }
  const std::string& dir() const { return dir_; }
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }

  // SIGKILL, then reap.
  void Kill();
  // Starts the daemon again on the same socket and root.
  void Restart();

  // For daemons that end themselves (an armed crash point):
  // Replaces what the constructor's `environment` added, from the next
  // start on.
  void SetEnvironment(std::vector<std::string> environment);
  // Waits up to `timeout_ms` for the daemon to exit by itself and reaps it;
  // its wait status, or nullopt if it still runs then.
  std::optional<int> WaitForExit(int timeout_ms);
  // Restart for a daemon that may end during start-up: false, with the
  // status in exit_status(), if it exited before it answered.
  bool TryRestart();
  // The wait status of the last exit WaitForExit or TryRestart saw.
  int exit_status() const { return exit_status_; }

 private:
  void Start();
  // Starts ckptd; true once it answers, false if it exited first. FAILs if
  // it neither answers nor exits within 10 s.
  bool Launch();
  std::string dir_, socket_, root_;
  std::vector<std::string> flags_;
  std::vector<std::string> environment_;
  std::optional<RunAs> run_as_;
  pid_t pid_ = -1;
  int exit_status_ = 0;
};

struct ProcessResult {
  int exit_code = -1;
  std::string out;  // stdout and stderr together
};

// A process running in the background with its output captured.
class BackgroundProcess {
 public:
  explicit BackgroundProcess(const std::vector<std::string>& argv);
  ~BackgroundProcess();  // waits if Wait was not called
  ProcessResult Wait();
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
};

// Runs `argv` to completion, capturing its output.
ProcessResult RunProcess(const std::vector<std::string>& argv);

// How a Cluster's daemons are laid out beyond their flags.
struct ClusterLayout {
  // Each daemon on a root of its own (a node's NVMe) instead of one
  // shared root; node(i).root() names it.
  bool root_per_node = false;
  // Added to node i's environment (DaemonProcess's `environment`), for
  // the nodes it has an entry for.
  std::vector<std::vector<std::string>> environment;
};

// N daemons, nodes 0..N-1 of one job, sharing one storage root (or one
// each, see ClusterLayout); sockets are <dir>/node<i>.sock, so ckpt-loadgen
// reaches them as <dir>/node{node}.sock.
class Cluster {
 public:
  Cluster(uint32_t nodes, std::vector<std::string> extra_flags = {},
          ClusterLayout layout = {});
  ~Cluster();
  DaemonProcess& node(uint32_t i) { return *daemons_[i]; }
  // The shared root; empty with a root per node.
  const std::string& root() const { return root_; }
  std::string socket_template() const { return dir_ + "/node{node}.sock"; }

 private:
  std::string dir_, root_;
  std::vector<std::unique_ptr<DaemonProcess>> daemons_;
};

// The value of "key" in the last line of `out` if it is a flat JSON object
// (numbers, true/false, strings), as text; "" if absent.
std::string JsonField(const std::string& out, const std::string& key);
// JsonField as a number; fails the test if it is not one.
double JsonNumber(const std::string& out, const std::string& key);

}  // namespace ckpt::testing
