// A daemon run as an ordinary user (issue 32, item 5), as a Slurm job or a
// container without privileges runs it: a uid that is not root, no
// capabilities, no supplementary groups, and the RLIMIT_MEMLOCK such a
// user gets. Its trainer runs as the same user. The daemon must still save
// and restore bit-exact, say once in its log and in `ckptctl status` that
// the staging pool is unpinned and which io_uring rings went without
// registered buffers, and the trainer must name the daemon as its ptracer
// (PR_SET_PTRACER, what Yama ptrace_scope=1 needs) with the daemon's pid.
// Started with no socket named, the daemon serves under the user's
// $XDG_RUNTIME_DIR, where ckptctl looks (common/control_socket.h).
//
// Running as another uid and lowering a limit take root, setpriv and
// prlimit; elsewhere the tests are reported skipped. The PR_SET_PTRACER
// call is watched with strace where it is installed. This kernel may have
// no Yama (then the call fails with EINVAL, which libckpt ignores); Yama's
// ptrace_scope is one sysctl for the whole machine, not per user namespace,
// so a test cannot turn it on for itself (docs/OPERATIONS.md).
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "integration/daemon_fixture.h"
#include "support/skip.h"

namespace ckpt::testing {
namespace {

// Made-up users, one per test: io_uring charges registered buffers to the
// user (all its processes together), so tests that ctest runs side by side
// must not share one.
constexpr uid_t kUnpinnedUser = 61040;
constexpr uid_t kPinnedUser = 61041;
constexpr char kSetpriv[] = "/usr/bin/setpriv";
constexpr char kPrlimit[] = "/usr/bin/prlimit";
constexpr char kStrace[] = "/usr/bin/strace";
// The fixture's daemon: --pool_bytes 64 MiB, --io_workers 4.
constexpr uint64_t kPoolBytes = uint64_t{64} << 20;
constexpr int kWorkers = 4;

// AddressSanitizer's mlock() does nothing and returns 0 (the shadow memory
// could not be locked anyway), so in a sanitizer build the daemon's pool is
// never refused by the limit and reports itself pinned; io_uring's
// registration, a plain system call, is refused as anywhere.
#if defined(__SANITIZE_ADDRESS__)
#define CKPT_TEST_MLOCK_INTERCEPTED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CKPT_TEST_MLOCK_INTERCEPTED 1
#endif
#endif
#ifndef CKPT_TEST_MLOCK_INTERCEPTED
#define CKPT_TEST_MLOCK_INTERCEPTED 0
#endif
constexpr bool kMlockRefusable = !CKPT_TEST_MLOCK_INTERCEPTED;

bool CanRunAsOrdinaryUser() {
  return ::geteuid() == 0 && ::access(kSetpriv, X_OK) == 0 &&
         ::access(kPrlimit, X_OK) == 0;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

int Count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + needle.size())) {
    ++n;
  }
  return n;
}

// The daemon's ckpt-loadgen and ckptctl, copied where `uid` can run them
// (the build tree may not be reachable by it), and a way to run them as
// `uid`: no groups, no capabilities (setuid from root drops them all).
class OrdinaryUser {
 public:
  OrdinaryUser(uid_t uid, const DaemonProcess& daemon) : uid_(uid) {
    const std::filesystem::path dir = daemon.dir();
    loadgen_ = (dir / "ckpt-loadgen").string();
    ckptctl_ = (dir / "ckptctl").string();
    std::filesystem::copy_file(LOADGEN_BINARY, loadgen_);
    std::filesystem::copy_file(CKPTCTL_BINARY, ckptctl_);
    REQUIRE(::chmod(loadgen_.c_str(), 0755) == 0);
    REQUIRE(::chmod(ckptctl_.c_str(), 0755) == 0);
  }
  const std::string& loadgen() const { return loadgen_; }
  const std::string& ckptctl() const { return ckptctl_; }

  ProcessResult Run(const std::vector<std::string>& argv) const {
    std::vector<std::string> cmd = {kSetpriv, absl::StrCat("--reuid=", uid_),
                                    absl::StrCat("--regid=", uid_), "--clear-groups", "--"};
    cmd.insert(cmd.end(), argv.begin(), argv.end());
    return RunProcess(cmd);
  }

 private:
  uid_t uid_;
  std::string loadgen_, ckptctl_;
};

// What the daemon's workers got, by its log: "pwrite" where io_uring is
// unavailable (no test of registration is then possible), else "".
bool IoUringUnavailable(const std::string& log) {
  return absl::StrContains(log, "io_uring unavailable, falling back to pread/pwrite");
}

}  // namespace

TEST_CASE("an ordinary user's daemon under a 1 MiB RLIMIT_MEMLOCK saves and restores "
          "its user's trainer bit-exact, says once that its pool is unpinned and its "
          "buffers unregistered, and the trainer names it with PR_SET_PTRACER") {
  if (!CanRunAsOrdinaryUser()) {
    CKPT_SKIP("needs root, setpriv and prlimit to run the daemon as an ordinary user");
  }
  constexpr uint64_t kMemlock = uint64_t{1} << 20;
  DaemonProcess daemon({}, "", {}, RunAs{kUnpinnedUser, kUnpinnedUser, {}, kMemlock});
  INFO("daemon log: " << ReadFile(daemon.dir() + "/ckptd.log"));
  REQUIRE(daemon.running());
  const OrdinaryUser user(kUnpinnedUser, daemon);

  // The log says it once, with the limit that refused it.
  const std::string log = ReadFile(daemon.dir() + "/ckptd.log");
  if (kMlockRefusable) {
    CHECK(Count(log, "continuing with an unpinned pool") == 1);
    CHECK(absl::StrContains(log, absl::StrCat("mlock staging pool of ", kPoolBytes, " bytes")));
    CHECK(absl::StrContains(log, "RLIMIT_MEMLOCK 1048576 bytes"));
    CHECK(absl::StrContains(log, "pool 67108864 bytes (unpinned), io backend "));
  } else {
    CHECK(Count(log, "unpinned") == 0);
  }
  const std::string unpinned = kMlockRefusable ? "true" : "false";
  std::string backend = "pwrite";
  if (!IoUringUnavailable(log)) {
    // No ring could register the 64 MiB pool: one line for all four.
    backend = "io_uring (unregistered buffers)";
    CHECK(Count(log, "io_uring buffer registration failed") == 1);
  }

  // ckptctl status, as the same user: the pool unpinned, the backend as is.
  const ProcessResult status = user.Run({user.ckptctl(), "--socket", daemon.socket(), "status"});
  INFO("ckptctl status: " << status.out);
  REQUIRE(status.exit_code == 0);
  CHECK(absl::StrContains(status.out, absl::StrCat("pid ", daemon.pid(), " ")));
  CHECK(absl::StrContains(status.out, absl::StrCat("io ", backend, "  pool 64.0 MiB",
                                                   kMlockRefusable ? " unpinned" : "", " (")));
  const ProcessResult json =
      user.Run({user.ckptctl(), "--socket", daemon.socket(), "status", "--json"});
  INFO("ckptctl status --json: " << json.out);
  REQUIRE(json.exit_code == 0);
  CHECK(absl::StrContains(json.out, "\"staging_pool_unpinned\": " + unpinned));
  CHECK(absl::StrContains(json.out, absl::StrCat("\"io_backend\": \"", backend, "\"")));

  // Two ranks save twice; two fresh ranks restore and check every byte. The
  // daemon reads the trainers' memory as their own user, with no capability.
  // One trace file per thread (-ff): a call is never split over two lines
  // by another thread's.
  const std::string trace_dir = daemon.dir() + "/trace";
  std::filesystem::create_directory(trace_dir);
  REQUIRE(::chown(trace_dir.c_str(), kUnpinnedUser, kUnpinnedUser) == 0);
  const bool traced = ::access(kStrace, X_OK) == 0;
  std::vector<std::string> trainer;
  if (traced) {
    // LeakSanitizer stops the world with ptrace, which a process strace
    // already traces cannot do: in a sanitizer build the traced trainers
    // run without the leak check (the other tests' ckpt-loadgen runs keep
    // it). Elsewhere the variable is read by nothing.
    const char* asan = std::getenv("ASAN_OPTIONS");
    const std::string before = asan == nullptr ? "" : asan;
    trainer = {"/usr/bin/env",
               absl::StrCat("ASAN_OPTIONS=", before, before.empty() ? "" : ":",
                            "detect_leaks=0"),
               kStrace, "-ff", "-qq", "-e", "trace=prctl", "-e", "signal=none",
               "-o", trace_dir + "/prctl"};
  }
  const std::vector<std::string> loadgen = {
      user.loadgen(), "--socket", daemon.socket(), "--job", "plain", "--ranks", "2",
      "--tensors", "4", "--bytes-per-rank", std::to_string(16 << 20), "--saves", "2",
      "--restore"};
  trainer.insert(trainer.end(), loadgen.begin(), loadgen.end());
  const ProcessResult run = user.Run(trainer);
  INFO("ckpt-loadgen: " << run.out);
  REQUIRE(run.exit_code == 0);
  CHECK(JsonField(run.out, "verified") == "true");
  CHECK(JsonField(run.out, "staging_pool_unpinned") == unpinned);
  CHECK(JsonField(run.out, "io_backend") == backend);
  struct stat job {};
  REQUIRE(::stat((daemon.root() + "/plain").c_str(), &job) == 0);
  CHECK(job.st_uid == kUnpinnedUser);

  if (!traced) {
    WARN("strace not installed: the trainers' PR_SET_PTRACER calls are not checked");
    return;
  }
  // Each of the four trainer processes (two saving, two restoring) names
  // the daemon, by the pid its handshake gave, and nothing else. Without
  // Yama the kernel refuses the option (EINVAL, which libckpt ignores);
  // with Yama it takes it.
  std::string calls;
  for (const auto& entry : std::filesystem::directory_iterator(trace_dir)) {
    calls += ReadFile(entry.path().string());
  }
  INFO("strace: " << calls);
  const bool yama = ::access("/proc/sys/kernel/yama/ptrace_scope", F_OK) == 0;
  const std::string call = absl::StrCat("prctl(PR_SET_PTRACER, ", daemon.pid(), ")");
  int named = 0;
  for (absl::string_view line : absl::StrSplit(calls, '\n', absl::SkipEmpty())) {
    if (!absl::StrContains(line, "PR_SET_PTRACER")) continue;
    CHECK(absl::StrContains(line, call));
    CHECK(absl::StrContains(line, yama ? "= 0" : "= -1 EINVAL"));
    ++named;
  }
  CHECK(named == 4);
}

TEST_CASE("an ordinary user's RLIMIT_MEMLOCK that holds the pool once pins it, lets "
          "one io_uring ring register it, and status names the rings without") {
  if (!CanRunAsOrdinaryUser()) {
    CKPT_SKIP("needs root, setpriv and prlimit to run the daemon as an ordinary user");
  }
  // mlock charges the pool once to the process; io_uring charges each
  // ring's registration to the user, all of them against the same limit.
  // A small pool: the limit may only be lowered here (raising the hard
  // limit takes CAP_SYS_RESOURCE, which a sandbox's root may lack), and an
  // ordinary hard limit is 8 MiB. Two 1.5 MiB buffers, a 4 MiB limit:
  // the pool fits once, not twice.
  constexpr uint64_t kSmallPool = uint64_t{3} << 20;
  const uint64_t memlock = kSmallPool + (uint64_t{1} << 20);
  rlimit hard{};
  REQUIRE(::getrlimit(RLIMIT_MEMLOCK, &hard) == 0);
  if (hard.rlim_max != RLIM_INFINITY && hard.rlim_max < memlock) {
    CKPT_SKIP("RLIMIT_MEMLOCK's hard limit here is below " << memlock << " bytes");
  }
  DaemonProcess daemon({"--pool_bytes", std::to_string(kSmallPool), "--buffer_bytes",
                        std::to_string(kSmallPool / 2)},
                       "", {}, RunAs{kPinnedUser, kPinnedUser, {}, memlock});
  INFO("daemon log: " << ReadFile(daemon.dir() + "/ckptd.log"));
  REQUIRE(daemon.running());
  const OrdinaryUser user(kPinnedUser, daemon);

  const std::string log = ReadFile(daemon.dir() + "/ckptd.log");
  CHECK(Count(log, "unpinned") == 0);
  if (IoUringUnavailable(log)) CKPT_SKIP("io_uring is unavailable here: nothing registers");
  const std::string backend =
      absl::StrCat("io_uring on 1 of ", kWorkers,
                   " workers, io_uring (unregistered buffers) on ", kWorkers - 1);
  CHECK(Count(log, "io_uring buffer registration failed") == 1);
  CHECK(absl::StrContains(log, absl::StrCat("io backend ", backend, ", gpu ")));

  const ProcessResult status = user.Run({user.ckptctl(), "--socket", daemon.socket(), "status"});
  INFO("ckptctl status: " << status.out);
  REQUIRE(status.exit_code == 0);
  CHECK(absl::StrContains(status.out, absl::StrCat("io ", backend, "  pool 3.0 MiB (")));

  const ProcessResult run =
      user.Run({user.loadgen(), "--socket", daemon.socket(), "--job", "pinned", "--ranks", "2",
                "--tensors", "4", "--bytes-per-rank", std::to_string(4 << 20), "--saves",
                "1", "--restore"});
  INFO("ckpt-loadgen: " << run.out);
  REQUIRE(run.exit_code == 0);
  CHECK(JsonField(run.out, "verified") == "true");
  CHECK(JsonField(run.out, "staging_pool_unpinned") == "false");
}

}  // namespace ckpt::testing

namespace ckpt::testing {

TEST_CASE("an ordinary user's daemon without a socket named serves under XDG_RUNTIME_DIR, "
          "where ckptctl finds it with no socket named") {
  if (!CanRunAsOrdinaryUser()) {
    CKPT_SKIP("needs root, setpriv and prlimit to run the daemon as an ordinary user");
  }
  constexpr uid_t kUser = 61043;
  std::string dir = TempBase() + "/ckptd-xdg-XXXXXX";
  REQUIRE(::mkdtemp(dir.data()) != nullptr);
  REQUIRE(::chown(dir.c_str(), kUser, kUser) == 0);
  REQUIRE(::chmod(dir.c_str(), 0755) == 0);
  const std::string runtime = dir + "/runtime";  // as pam_systemd makes it
  REQUIRE(::mkdir(runtime.c_str(), 0700) == 0);
  REQUIRE(::chown(runtime.c_str(), kUser, kUser) == 0);
  const std::string ckptd = dir + "/ckptd";
  const std::string ckptctl = dir + "/ckptctl";
  std::filesystem::copy_file(CKPTD_BINARY, ckptd);
  std::filesystem::copy_file(CKPTCTL_BINARY, ckptctl);
  REQUIRE(::chmod(ckptd.c_str(), 0755) == 0);
  REQUIRE(::chmod(ckptctl.c_str(), 0755) == 0);
  // As the user, in their session's environment (CKPTD_SOCKET empty: not
  // set, whatever the test's environment holds).
  auto as_user = [&](std::vector<std::string> argv) {
    std::vector<std::string> cmd = {kSetpriv, absl::StrCat("--reuid=", kUser),
                                    absl::StrCat("--regid=", kUser), "--clear-groups", "--",
                                    "/usr/bin/env", "XDG_RUNTIME_DIR=" + runtime,
                                    "CKPTD_SOCKET=", "SLURM_JOB_ID="};
    cmd.insert(cmd.end(), argv.begin(), argv.end());
    return cmd;
  };
  BackgroundProcess daemon(as_user({ckptd, "--root", dir + "/root", "--pool_bytes",
                                    std::to_string(16 << 20), "--buffer_bytes",
                                    std::to_string(4 << 20), "--io_workers", "2",
                                    "--max_sessions", "256", "--max_connections", "1024"}));
  ProcessResult status;
  for (int i = 0; i < 200; ++i) {
    status = RunProcess(as_user({ckptctl, "status"}));
    if (status.exit_code == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const int stopped = ::kill(daemon.pid(), SIGTERM);
  const ProcessResult log = daemon.Wait();
  INFO("ckptctl status: " << status.out << "\ndaemon: " << log.out);
  CHECK(stopped == 0);
  CHECK(status.exit_code == 0);
  CHECK(absl::StrContains(status.out, absl::StrCat("root ", dir, "/root ")));
  CHECK(absl::StrContains(
      log.out, absl::StrCat("ckptd listening on ", runtime, "/ckptd/ckptd.sock root ")));
  CHECK(log.exit_code == 0);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace ckpt::testing
