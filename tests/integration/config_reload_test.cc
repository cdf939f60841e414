// The config file at start (ckptd --config) and SIGHUP's live reload,
// through a real daemon.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <thread>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "integration/daemon_fixture.h"
#include "integration/daemon_log.h"
#include "integration/test_rank.h"

namespace ckpt::testing {
namespace {

// A directory for config files that outlives the daemons of a test.
class ConfigDir {
 public:
  ConfigDir() {
    std::string tmpl = TempBase() + "/ckptd-conf-XXXXXX";
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    dir_ = tmpl;
  }
  ~ConfigDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  // Writes `text` to `name` in the directory; its path.
  std::string Write(const std::string& name, const std::string& text) const {
    const std::string path = dir_ + "/" + name;
    WriteText(path, text);
    return path;
  }

 private:
  std::string dir_;
};

// The log line of job/`checkpoint`'s commit.
LogfmtFields Committed(const std::string& checkpoint) {
  return {{"msg", "checkpoint committed"}, {"job", "job"}, {"checkpoint", checkpoint}};
}

// The committed checkpoints of `job` in `root`, by their COMMIT files.
int CommittedCheckpoints(const std::string& root, const std::string& job) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(root + "/" + job)) {
    if (e.is_directory() && std::filesystem::exists(e.path() / "COMMIT")) ++n;
  }
  return n;
}

// Retention runs after the commit is published: waits up to 5 s for `job`
// to have `expected` committed checkpoints; the count at the end.
int SettledCommittedCheckpoints(const std::string& root, const std::string& job,
                                int expected) {
  int n = CommittedCheckpoints(root, job);
  for (int waited = 0; n != expected && waited < 5'000; waited += 20) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    n = CommittedCheckpoints(root, job);
  }
  return n;
}

void SaveCommitted(TestRank& rank, const std::string& checkpoint) {
  auto save = rank.client().Save(rank.SaveRequestFor(checkpoint));
  REQUIRE(save.ok());
  const absl::Status committed = (*save)->WaitCommitted();
  INFO(committed.ToString());
  REQUIRE(committed.ok());
}

// A daemon started from `dir`'s ckptd.conf with keep_last 0, and a rank of
// job "job" whose three saves (step-1 to step-3) are committed and all kept.
// The tests rewrite the file and send SIGHUP.
struct ThreeCommittedSaves {
  explicit ThreeCommittedSaves(const ConfigDir& dir)
      : config(dir.Write("ckptd.conf", "keep_last: 0\n")),
        daemon({"--config", config}),
        rank(daemon.socket(), "job", 2, 1 << 20) {
    rank.Fill(1);
    SaveCommitted(rank, "step-1");
    SaveCommitted(rank, "step-2");
    SaveCommitted(rank, "step-3");
  }

  const std::string config;
  DaemonProcess daemon;
  TestRank rank;
};

TEST_CASE("ckptd refuses a config file with an unknown key, naming the file and line",
          "[integration][config]") {
  ConfigDir dir;
  const std::string config =
      dir.Write("bad.conf", "keep_last: 2\n# a comment\nkeep_lats: 3\n");
  const ProcessResult run =
      RunProcess({CKPTD_BINARY, "--config", config, "--socket", "/nonexistent/s.sock",
                  "--root", "/nonexistent/root"});
  INFO(run.out);
  CHECK(run.exit_code == 1);
  CHECK(absl::StrContains(run.out, config + ":3:"));
  CHECK(absl::StrContains(run.out, "keep_lats"));
}

TEST_CASE("flags given on the command line win over the config file, whose other "
          "bad values are refused naming their key and line",
          "[integration][config]") {
  ConfigDir dir;
  // The fixture gives --io_workers 4 on the command line: the file's 0,
  // which alone would refuse the start, is overridden.
  const std::string overridden = dir.Write("overridden.conf", "io_workers: 0\n");
  {
    DaemonProcess daemon({"--config", overridden});  // FAILs if it does not start
  }
  // No flag for queue_depth: the file's 0 stands, and is refused.
  const std::string bad = dir.Write("bad.conf", "keep_last: 1\nqueue_depth: 0\n");
  const ProcessResult run =
      RunProcess({CKPTD_BINARY, "--config", bad, "--socket", "/nonexistent/s.sock",
                  "--root", "/nonexistent/root"});
  INFO(run.out);
  CHECK(run.exit_code == 1);
  CHECK(absl::StrContains(run.out, absl::StrCat("queue_depth (", bad, ":2) must be > 0")));
}

TEST_CASE("SIGHUP applies a changed keep_last and log level live, and a bad file "
          "changes nothing",
          "[integration][config][reload]") {
  ConfigDir dir;
  ThreeCommittedSaves saved(dir);
  const std::string& config = saved.config;
  DaemonProcess& daemon = saved.daemon;
  TestRank& rank = saved.rank;
  CHECK(CommittedCheckpoints(daemon.root(), "job") == 3);  // keep_last 0 keeps all

  // Live: retention keeps 1 from the next commit on; the log keeps only
  // warnings and errors. A restart-only key is reported, not applied.
  dir.Write("ckptd.conf",
            "keep_last: 1\nlog_level: \"warning\"\ncommit_timeout_ms: 1234\n");
  REQUIRE(kill(daemon.pid(), SIGHUP) == 0);
  REQUIRE(WaitForLog(daemon, "reload: log_level: \"info\" -> \"warning\"", 10'000));
  std::string log = DaemonMessages(daemon);
  INFO(log);
  CHECK(absl::StrContains(log, "reload: keep_last: 0 -> 1"));
  CHECK(absl::StrContains(log, "commit_timeout_ms: 600000 -> 1234 needs a restart"));
  SaveCommitted(rank, "step-4");
  CHECK(SettledCommittedCheckpoints(daemon.root(), "job", 1) == 1);
  CHECK(std::filesystem::exists(daemon.root() + "/job/step-4/COMMIT"));
  // At level warning a commit's info line is no longer written.
  CHECK(CountMatching(DaemonLog(daemon), Committed("step-4")) == 0);

  // A file that does not parse is logged, and keep_last 1 and the warning
  // level stay.
  dir.Write("ckptd.conf", "keep_last: 5\nlog_level: \"debug\"\nkeep_lats: 2\n");
  REQUIRE(kill(daemon.pid(), SIGHUP) == 0);
  REQUIRE(WaitForLog(daemon, "reload: nothing changed", 10'000));
  log = DaemonMessages(daemon);
  CHECK(absl::StrContains(log, config + ":3:"));
  SaveCommitted(rank, "step-5");
  CHECK(SettledCommittedCheckpoints(daemon.root(), "job", 1) == 1);
  CHECK(CountMatching(DaemonLog(daemon), Committed("step-5")) == 0);

  // Back to info: the next commit is logged again.
  dir.Write("ckptd.conf", "keep_last: 1\n");
  REQUIRE(kill(daemon.pid(), SIGHUP) == 0);
  REQUIRE(WaitForLog(daemon, "reload: log_level: \"warning\" -> \"info\"", 10'000));
  SaveCommitted(rank, "step-6");
  CHECK(WaitForLog(daemon, Committed("step-6"), 5'000));
}

// The config file replaced by `replace` (which makes `path` something other
// than a regular file), SIGHUP and at once SIGTERM: the reload is refused
// without waiting (was: /dev/zero read without end, a FIFO's open waiting
// for a writer, with SIGTERM never taken), the daemon stops within a few
// seconds, and its log says why the reload changed nothing.
void RefusedReloadThenStop(const std::function<void(const std::string& path)>& replace) {
  ConfigDir dir;
  const std::string config = dir.Write("ckptd.conf", "keep_last: 0\n");
  DaemonProcess daemon({"--config", config});
  REQUIRE(::unlink(config.c_str()) == 0);
  replace(config);
  // SIGHUP is taken first: sigtimedwait returns the lowest pending signal.
  REQUIRE(kill(daemon.pid(), SIGHUP) == 0);
  REQUIRE(kill(daemon.pid(), SIGTERM) == 0);
  const std::optional<int> status = daemon.WaitForExit(5'000);
  if (!status.has_value()) daemon.Kill();  // a wedged daemon fails, not hangs, the test
  const std::string log = DaemonMessages(daemon);
  INFO(log);
  REQUIRE(status.has_value());
  CHECK(WIFEXITED(*status));
  CHECK(WEXITSTATUS(*status) == 0);
  CHECK(absl::StrContains(
      log, absl::StrCat("reload: nothing changed: config file: ", config,
                        " is not a regular file")));
  CHECK(absl::StrContains(log, "ckptd stopping on signal 15"));
}

TEST_CASE("a config file replaced by a symlink to /dev/zero: SIGHUP is refused at "
          "once and SIGTERM still stops the daemon",
          "[integration][config][reload]") {
  RefusedReloadThenStop([](const std::string& path) {
    REQUIRE(::symlink("/dev/zero", path.c_str()) == 0);
  });
}

TEST_CASE("a config file replaced by a FIFO nobody writes: SIGHUP is refused at "
          "once and SIGTERM still stops the daemon",
          "[integration][config][reload]") {
  RefusedReloadThenStop([](const std::string& path) {
    REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
  });
}

TEST_CASE("ckptctl gc applies retention now: a keep_last lowered by SIGHUP "
          "removes the older checkpoints without waiting for a commit",
          "[integration][config][reload][ckptctl]") {
  ConfigDir dir;
  ThreeCommittedSaves saved(dir);
  DaemonProcess& daemon = saved.daemon;
  TestRank& rank = saved.rank;
  // Retention runs after the client hears COMMITTED; the commit's line is
  // written once it read keep_last, so a reload after it waits for the gc.
  REQUIRE(WaitForLog(daemon, Committed("step-3"), 5'000));
  dir.Write("ckptd.conf", "keep_last: 1\n");
  REQUIRE(kill(daemon.pid(), SIGHUP) == 0);
  REQUIRE(WaitForLog(daemon, "reload: keep_last: 0 -> 1", 10'000));
  // No commit since: retention has not run yet.
  CHECK(CommittedCheckpoints(daemon.root(), "job") == 3);
  const ProcessResult gc = RunProcess({CKPTCTL_BINARY, "--socket", daemon.socket(), "gc", "job"});
  INFO(gc.out);
  CHECK(gc.exit_code == 0);
  CHECK(absl::StrContains(gc.out, "removed job/step-1 (retention: keep_last 1,"));
  CHECK(absl::StrContains(gc.out, "removed job/step-2 (retention: keep_last 1,"));
  CHECK(absl::StrContains(gc.out, "2 checkpoint(s) removed"));
  CHECK(CommittedCheckpoints(daemon.root(), "job") == 1);
  auto loaded = rank.client().Load(rank.LoadRequestFor("latest"));
  REQUIRE(loaded.ok());
  CHECK(loaded->checkpoint() == "step-3");
}

}  // namespace
}  // namespace ckpt::testing
