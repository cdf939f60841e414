// The crash matrix (issue 9, item 8): a real ckptd killed with SIGKILL at
// 37 points of a save, restarted, and checked.
//
// Every point starts a daemon with a committed step-1 and a save of step-2
// in progress, kills it at the point, restarts it and requires:
//   - step-1 restores bit-exact (TestRank::Holds);
//   - step-2 is committed and restores bit-exact if the kill came after
//     COMMIT's rename, and is otherwise never loadable (NotFound) and gone
//     from the root;
//   - LATEST names the newest committed checkpoint;
//   - no temporary of a durable write is left;
//   - a retried save of step-2 commits (or, step-2 being committed, is
//     refused as existing while the next save commits);
//   - the restart's log names what startup recovery did.
//
// The points:
//   - the data phase by progress: killed from outside (kill -9) once the
//     data file on disk reached k/12 of its size, k = 1..11, the writes
//     slowed by --write_rate_limit so that each twelfth is ~60 ms long;
//   - each step of the protocol, exactly: the daemon kills itself there
//     (CKPTD_CRASH_AT, common/crash_point.h): the marker's, the node
//     manifest's, COMMIT's and LATEST's durable writes (temporary created,
//     written, fsynced, renamed, directory fsynced) and the data file's
//     create and fsync;
//   - retention deleting the oldest checkpoint after step-2 committed
//     (COMMIT removed; everything but the marker removed);
//   - a second crash inside startup recovery itself (removing the
//     uncommitted checkpoint; repairing LATEST), then a third start.
//
// With CKPT_CRASH_MATRIX_TABLE=<file> in the environment each point
// appends its outcome to <file> as a markdown table row (the outcome table
// in docs/RELIABILITY.md).
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "integration/daemon_fixture.h"
#include "integration/test_rank.h"
#include "storage/durable_file.h"
#include "support/logfmt.h"
#include "support/planted_files.h"

namespace ckpt::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr char kJob[] = "job";
// step-0 and step-1: 1 MiB. step-2 at a protocol step: the same size;
// step-2 by progress: 24 MiB, written in 1 MiB windows at 32 MiB/s, so
// each twelfth of it takes ~60 ms and the whole ~0.75 s.
constexpr uint32_t kSmallTensors = 4;
constexpr uint64_t kSmallTensorBytes = 256 << 10;
constexpr uint32_t kLargeTensors = 24;
constexpr uint64_t kLargeTensorBytes = 1 << 20;
constexpr uint64_t kWindowBytes = 1 << 20;
constexpr uint64_t kWriteRate = 32 << 20;
constexpr int kWaitLimitMs = 30'000;

enum class Trigger { kProgress, kCrashPoint };

struct MatrixPoint {
  std::string name;  // the section; the outcome table's first column
  Trigger trigger = Trigger::kCrashPoint;
  // kCrashPoint: "<where>.<step>" armed for step-2's save, at its hit
  // `hit` (1 + the hits of the saves before step-2, unless `first_hit`).
  std::string crash_at;
  bool first_hit = false;  // armed at the point's first hit (a deletion)
  // kProgress: killed once the data file reached this many twelfths.
  uint32_t twelfths = 0;
  // step-0 committed before step-1, --keep_last 2: step-2's commit retires
  // step-0.
  bool retention = false;
  // Armed for the first restart: a second crash inside startup recovery;
  // a third start then recovers.
  std::string recovery_crash_at;
  bool step2_committed = false;
  // Lines the last restart's log holds ("startup recovery: " cut).
  std::vector<std::string> recovery_log;
};

constexpr char kRemovedStep2[] = "removed uncommitted checkpoint job/step-2";
constexpr char kLatestRepaired[] = "LATEST of job: step-1 -> step-2";
constexpr char kNothingDone[] =
    "removed 0 temporaries, 0 uncommitted checkpoints and this node's part "
    "of 0 more; removed 0 empty checkpoint directories; repaired LATEST of 0 "
    "jobs; left 0 uncommitted checkpoints; 0 errors";

std::vector<MatrixPoint> ProgressPoints() {
  std::vector<MatrixPoint> points;
  for (uint32_t k = 1; k <= 11; ++k) {
    MatrixPoint p;
    p.name = absl::StrCat("data file ", k, "/12 written");
    p.trigger = Trigger::kProgress;
    p.twelfths = k;
    p.recovery_log = {kRemovedStep2};
    points.push_back(p);
  }
  return points;
}

std::vector<MatrixPoint> ProtocolPoints() {
  std::vector<MatrixPoint> points;
  const std::vector<std::string> temp_steps = {"tmp_created", "tmp_written",
                                               "tmp_synced"};
  const std::vector<std::string> final_steps = {"renamed", "dir_synced"};
  auto add = [&](std::string crash_at, bool committed,
                 std::vector<std::string> log) {
    MatrixPoint p;
    p.name = crash_at;
    p.crash_at = std::move(crash_at);
    p.step2_committed = committed;
    p.recovery_log = std::move(log);
    points.push_back(std::move(p));
  };
  // The marker, before any data file: its temporary is all the directory
  // holds, so both go.
  for (const std::string& step : temp_steps) {
    add(absl::StrCat(".ckptd-checkpoint.", step), false,
        {"removed temporary job/step-2/.ckptd-checkpoint.tmp.",
         "removed empty checkpoint directory job/step-2"});
  }
  for (const std::string& step : final_steps) {
    add(absl::StrCat(".ckptd-checkpoint.", step), false, {kRemovedStep2});
  }
  add("data.created", false, {kRemovedStep2});
  add("data.synced", false, {kRemovedStep2});
  for (const char* file : {"node-0000.manifest", "COMMIT"}) {
    for (const std::string& step : temp_steps) {
      add(absl::StrCat(file, ".", step), false,
          {absl::StrCat("removed temporary job/step-2/", file, ".tmp."),
           kRemovedStep2});
    }
  }
  for (const std::string& step : final_steps) {
    add(absl::StrCat("node-0000.manifest.", step), false, {kRemovedStep2});
  }
  // COMMIT renamed: committed, whatever comes after.
  for (const std::string& step : final_steps) {
    add(absl::StrCat("COMMIT.", step), true, {kLatestRepaired});
  }
  for (const std::string& step : temp_steps) {
    add(absl::StrCat("LATEST.", step), true,
        {"removed temporary job/LATEST.tmp.", kLatestRepaired});
  }
  for (const std::string& step : final_steps) {
    add(absl::StrCat("LATEST.", step), true, {kNothingDone});
  }
  return points;
}

std::vector<MatrixPoint> AfterCommitAndRecoveryPoints() {
  std::vector<MatrixPoint> points;
  // Retention deletes step-0 once step-2 committed: COMMIT first (durably),
  // so a crash at either point leaves an uncommitted step-0 behind.
  for (const char* at : {"delete_committed.commit_removed", "remove_tree.last_left"}) {
    MatrixPoint p;
    p.name = absl::StrCat("retention: ", at);
    p.crash_at = at;
    p.first_hit = true;
    p.retention = true;
    p.step2_committed = true;
    p.recovery_log = {"removed uncommitted checkpoint job/step-0"};
    points.push_back(p);
  }
  {
    MatrixPoint p;
    p.name = "recovery: data.synced, then remove_tree.last_left at restart";
    p.crash_at = "data.synced";
    p.recovery_crash_at = "remove_tree.last_left";
    p.recovery_log = {kRemovedStep2};
    points.push_back(p);
  }
  {
    MatrixPoint p;
    p.name = "recovery: COMMIT.renamed, then LATEST.tmp_written at restart";
    p.crash_at = "COMMIT.renamed";
    p.recovery_crash_at = "LATEST.tmp_written";
    p.step2_committed = true;
    p.recovery_log = {"removed temporary job/LATEST.tmp.", kLatestRepaired};
    points.push_back(p);
  }
  return points;
}

void SaveCommitted(TestRank& rank, uint32_t step) {
  rank.Fill(step);
  auto save = rank.client().Save(rank.SaveRequestFor(absl::StrCat("step-", step)));
  INFO("save step-" << step << ": " << save.status());
  REQUIRE(save.ok());
  const absl::Status committed = (*save)->WaitCommitted();
  INFO(committed);
  REQUIRE(committed.ok());
}

// Loads `checkpoint` into the rank's zeroed memory; its status.
absl::Status LoadInto(TestRank& rank, const std::string& checkpoint,
                      std::string* loaded_name = nullptr) {
  rank.Zero();
  auto loaded = rank.client().Load(rank.LoadRequestFor(checkpoint));
  if (loaded.ok() && loaded_name != nullptr) *loaded_name = loaded->checkpoint();
  return loaded.status();
}

std::string ReadLog(const DaemonProcess& daemon) {
  return ReadBytes(daemon.dir() + "/ckptd.log");
}

// The startup-recovery lines of `log` after byte `from`, "startup
// recovery: " cut.
std::vector<std::string> RecoveryLines(const std::string& log, size_t from) {
  std::vector<std::string> lines;
  for (const LogfmtFields& line : ParseLog(log.substr(from))) {
    const std::string message = Field(line, "msg");
    absl::string_view rest = message;
    if (absl::ConsumePrefix(&rest, "startup recovery: ")) lines.emplace_back(rest);
  }
  return lines;
}

// The data file of `checkpoint`, if one is there.
std::optional<fs::path> DataFile(const std::string& root, const std::string& checkpoint) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root + "/job/" + checkpoint, ec)) {
    const std::string name = e.path().filename().string();
    if (absl::StartsWith(name, "shard-") && absl::EndsWith(name, ".safetensors")) {
      return e.path();
    }
  }
  return std::nullopt;
}

// What the root holds of step-2 and LATEST, in a few words, for the table.
std::string OnDisk(const std::string& root) {
  std::vector<std::string> parts;
  const std::string dir = root + "/job/step-2";
  if (!fs::exists(dir)) {
    parts.push_back("no step-2 dir");
  } else {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (absl::StartsWith(name, "shard-")) {
        names.insert(absl::StrCat("data ", e.file_size() >> 10, " KiB"));
      } else if (const auto temp = ParseTemporaryName(name)) {
        names.insert(absl::StrCat(temp->target, ".tmp"));
      } else if (name == ".ckptd-checkpoint") {
        names.insert("marker");
      } else {
        names.insert(name);
      }
    }
    parts.push_back(names.empty() ? "step-2: empty dir"
                                  : absl::StrCat("step-2: ", absl::StrJoin(names, ", ")));
  }
  for (const auto& e : fs::directory_iterator(root + "/job")) {
    const std::string name = e.path().filename().string();
    if (const auto temp = ParseTemporaryName(name)) parts.push_back(temp->target + ".tmp");
  }
  const std::string latest = ReadBytes(root + "/job/LATEST");
  parts.push_back(absl::StrCat("LATEST ", absl::StripAsciiWhitespace(latest)));
  if (fs::exists(root + "/job/step-0")) {
    parts.push_back(fs::exists(root + "/job/step-0/COMMIT") ? "step-0 committed"
                                                            : "step-0 uncommitted");
  }
  return absl::StrJoin(parts, "; ");
}

// Temporaries of durable writes anywhere under the root.
std::vector<std::string> Temporaries(const std::string& root) {
  std::vector<std::string> found;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (ParseTemporaryName(e.path().filename().string()).has_value()) {
      found.push_back(fs::relative(e.path(), root).string());
    }
  }
  return found;
}

// Kills the daemon once step-2's data file on disk holds `twelfths` of
// `total` bytes; returns the size it had when the kill was sent.
uint64_t KillAtProgress(DaemonProcess& daemon, uint64_t total, uint32_t twelfths) {
  const uint64_t threshold = total * twelfths / 12;
  const auto deadline = Clock::now() + std::chrono::milliseconds(kWaitLimitMs);
  while (Clock::now() < deadline) {
    if (const auto file = DataFile(daemon.root(), "step-2")) {
      struct stat st;
      if (::stat(file->c_str(), &st) == 0 && static_cast<uint64_t>(st.st_size) >= threshold) {
        daemon.Kill();
        return static_cast<uint64_t>(st.st_size);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  FAIL("step-2's data file did not reach " << threshold << " bytes within "
                                           << kWaitLimitMs << " ms");
  return 0;
}

// Waits for an armed daemon to kill itself and checks that it did, at
// `point`.
void ExpectCrashAt(DaemonProcess& daemon, const std::string& point) {
  const std::optional<int> status = daemon.WaitForExit(kWaitLimitMs);
  INFO("log:\n" << ReadLog(daemon));
  REQUIRE(status.has_value());
  CHECK(WIFSIGNALED(*status));
  CHECK(WTERMSIG(*status) == SIGKILL);
  CHECK(absl::StrContains(ReadLog(daemon), absl::StrCat("crash point ", point, " reached")));
}

void AppendRow(const std::string& row) {
  const char* path = std::getenv("CKPT_CRASH_MATRIX_TABLE");
  if (path == nullptr || *path == '\0') return;
  std::ofstream out(path, std::ios::app);
  out << row << "\n";
  REQUIRE(out.good());
}

void RunPoint(const MatrixPoint& point) {
  const auto started = Clock::now();
  const bool by_progress = point.trigger == Trigger::kProgress;
  // A checksum block must fit a buffer less a page (restore/shard_reader.h).
  std::vector<std::string> flags = {"--buffer_bytes", std::to_string(kWindowBytes),
                                    "--checksum_block_bytes",
                                    std::to_string(kWindowBytes / 2)};
  if (by_progress) flags.insert(flags.end(), {"--write_rate_limit", std::to_string(kWriteRate)});
  if (point.retention) flags.insert(flags.end(), {"--keep_last", "2"});
  // Each save before step-2 reaches each save-path point once.
  const uint32_t hit = point.first_hit ? 1 : (point.retention ? 3 : 2);
  std::vector<std::string> env;
  if (!by_progress) env.push_back(absl::StrCat("CKPTD_CRASH_AT=", point.crash_at, "@", hit));
  DaemonProcess daemon(flags, "", env);
  const std::string root = daemon.root();
  const uint32_t step2_tensors = by_progress ? kLargeTensors : kSmallTensors;
  const uint64_t step2_tensor_bytes = by_progress ? kLargeTensorBytes : kSmallTensorBytes;

  // Committed step-1 (and step-0), then step-2 in progress, then the kill.
  std::string killed_by;
  {
    TestRank previous(daemon.socket(), kJob, kSmallTensors, kSmallTensorBytes);
    if (point.retention) SaveCommitted(previous, 0);
    SaveCommitted(previous, 1);
    TestRank next(daemon.socket(), kJob, step2_tensors, step2_tensor_bytes);
    next.Fill(2);
    auto save = next.client().Save(next.SaveRequestFor("step-2"));
    INFO(save.status());
    REQUIRE(save.ok());
    if (by_progress) {
      uint64_t total = 0;
      for (int i = 0; i < kWaitLimitMs && total == 0; ++i) {
        total = (*save)->progress().total_bytes();
        if (total == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      REQUIRE(total > 0);
      const uint64_t at = KillAtProgress(daemon, total, point.twelfths);
      CHECK(at < total);  // mid-way, not after the last write
      killed_by = absl::StrCat("kill -9 at ", at >> 10, " of ", total >> 10, " KiB");
    } else {
      ExpectCrashAt(daemon, point.crash_at);
      killed_by = absl::StrCat("CKPTD_CRASH_AT=", point.crash_at, "@", hit);
    }
    // The trainer hears that its save did not commit, never that it did.
    CHECK_FALSE((*save)->WaitCommitted().ok());
  }
  const std::string at_kill = OnDisk(root);

  // Restart; with a recovery crash point, twice.
  std::string recovery_crash;
  if (!point.recovery_crash_at.empty()) {
    daemon.SetEnvironment({absl::StrCat("CKPTD_CRASH_AT=", point.recovery_crash_at)});
    const bool answered = daemon.TryRestart();
    INFO("log:\n" << ReadLog(daemon));
    REQUIRE_FALSE(answered);  // recovery runs before the daemon serves
    CHECK(WIFSIGNALED(daemon.exit_status()));
    CHECK(WTERMSIG(daemon.exit_status()) == SIGKILL);
    CHECK(absl::StrContains(ReadLog(daemon), absl::StrCat("crash point ",
                                                          point.recovery_crash_at,
                                                          " reached")));
    recovery_crash = absl::StrCat("restart killed at ", point.recovery_crash_at, " (",
                                  OnDisk(root), "); ");
  }
  daemon.SetEnvironment({});
  const size_t log_from = ReadLog(daemon).size();
  daemon.Restart();
  const std::vector<std::string> recovery = RecoveryLines(ReadLog(daemon), log_from);
  INFO("point " << point.name << "; at the kill: " << at_kill << "\nrecovery:\n"
                << absl::StrJoin(recovery, "\n"));
  for (const std::string& expected : point.recovery_log) {
    CHECK(std::any_of(recovery.begin(), recovery.end(), [&](const std::string& line) {
      return absl::StrContains(line, expected);
    }));
  }
  // The summary line: recovery ran through without an error.
  CHECK(std::any_of(recovery.begin(), recovery.end(), [](const std::string& line) {
    return absl::EndsWith(line, "; 0 errors");
  }));
  const std::vector<std::string> temporaries = Temporaries(root);
  INFO("temporaries: " << absl::StrJoin(temporaries, " "));
  CHECK(temporaries.empty());

  // step-1 restores bit-exact; step-0, retired, is gone.
  TestRank previous(daemon.socket(), kJob, kSmallTensors, kSmallTensorBytes);
  const absl::Status step1 = LoadInto(previous, "step-1");
  INFO("load step-1: " << step1);
  CHECK(step1.ok());
  const bool step1_intact = step1.ok() && previous.Holds(1);
  CHECK(step1_intact);
  if (point.retention) CHECK(absl::IsNotFound(LoadInto(previous, "step-0")));

  // step-2 committed and bit-exact, or never loadable.
  TestRank next(daemon.socket(), kJob, step2_tensors, step2_tensor_bytes);
  const absl::Status step2 = LoadInto(next, "step-2");
  INFO("load step-2: " << step2);
  if (point.step2_committed) {
    CHECK(step2.ok());
    CHECK(next.Holds(2));
  } else {
    CHECK(absl::IsNotFound(step2));
  }

  // LATEST names the newest committed checkpoint, and List agrees.
  const std::string newest = point.step2_committed ? "step-2" : "step-1";
  auto list = previous.client().List(kJob);
  REQUIRE(list.ok());
  std::vector<std::string> committed, uncommitted;
  std::string latest;
  for (const auto& info : *list) {
    (info.committed() ? committed : uncommitted).push_back(info.checkpoint());
    if (info.latest()) latest = info.checkpoint();
  }
  const std::vector<std::string> expected_committed =
      point.step2_committed ? std::vector<std::string>{"step-1", "step-2"}
                            : std::vector<std::string>{"step-1"};
  CHECK(committed == expected_committed);
  // What became of step-2, as observed, for the table.
  std::string step2_after;
  if (std::find(committed.begin(), committed.end(), "step-2") != committed.end()) {
    step2_after = step2.ok() && next.Holds(2) ? "committed, bit-exact" : "committed";
  } else {
    const std::string on_disk = OnDisk(root);
    step2_after = absl::StrCat(
        fs::exists(root + "/job/step-2")
            ? absl::StrCat("uncommitted, left as ", on_disk.substr(0, on_disk.find(';')))
            : "absent",
        absl::IsNotFound(step2) ? "; load NotFound" : "");
  }
  CHECK(uncommitted.empty());
  if (!point.step2_committed) CHECK_FALSE(fs::exists(root + "/job/step-2"));
  CHECK(latest == newest);
  CHECK(ReadBytes(root + "/job/LATEST") == newest + "\n");
  std::string loaded;
  if (point.step2_committed) {
    CHECK(LoadInto(next, "latest", &loaded).ok());
    CHECK(next.Holds(2));
  } else {
    CHECK(LoadInto(previous, "latest", &loaded).ok());
    CHECK(previous.Holds(1));
  }
  CHECK(loaded == newest);

  // The trainer saves again: step-2 retried, or (committed) the next one.
  std::string retry;
  if (!point.step2_committed) {
    SaveCommitted(next, 2);
    CHECK(LoadInto(next, "step-2").ok());
    CHECK(next.Holds(2));
    retry = "step-2 retried: committed, bit-exact";
  } else {
    next.Fill(2);
    auto again = next.client().Save(next.SaveRequestFor("step-2"));
    CHECK(absl::IsAlreadyExists(again.status()));
    SaveCommitted(next, 3);
    CHECK(LoadInto(next, "latest", &loaded).ok());
    CHECK(loaded == "step-3");
    CHECK(next.Holds(3));
    retry = "step-2 refused (exists); step-3 committed, bit-exact";
  }

  const double seconds =
      std::chrono::duration<double>(Clock::now() - started).count();
  std::vector<std::string> actions;
  for (const std::string& line : recovery) {
    if (absl::StartsWith(line, "removed ") && absl::StrContains(line, " temporaries, ")) {
      continue;  // the summary
    }
    std::string action = line.substr(0, line.find(" ("));
    // A temporary's writer tag and counter say nothing here.
    if (const size_t tmp = action.find(".tmp."); tmp != std::string::npos) {
      action = absl::StrCat(action.substr(0, tmp), ".tmp.*",
                            action.substr(std::min(action.find(' ', tmp), action.size())));
    }
    actions.push_back(action);
  }
  if (actions.empty()) actions.push_back("nothing to do");
  AppendRow(absl::StrCat("| ", point.name, " | ", killed_by, " | ", at_kill, " | ",
                         recovery_crash, absl::StrJoin(actions, "; "), " | ", step2_after,
                         " | ", step1_intact ? "bit-exact" : "DAMAGED", " | ", latest,
                         " | ", retry, " | ", absl::StrFormat("%.1f", seconds), " s |"));
}

}  // namespace

TEST_CASE("a ckptd started with a malformed CKPTD_CRASH_AT says so and arms "
          "nothing, and one whose crash point is never reached runs as usual",
          "[integration][crash][crash_matrix]") {
  for (const char* spec : {"COMMIT", "COMMIT.renamed@0", "COMMIT.renamed@x", ".renamed"}) {
    DaemonProcess daemon({}, "", {absl::StrCat("CKPTD_CRASH_AT=", spec)});
    TestRank rank(daemon.socket(), kJob, kSmallTensors, kSmallTensorBytes);
    SaveCommitted(rank, 1);
    SaveCommitted(rank, 2);
    const std::string log = ReadLog(daemon);
    INFO(log);
    CHECK(absl::StrContains(log, absl::StrCat("CKPTD_CRASH_AT=", spec,
                                              " is not <where>.<step>[@<n>]")));
    CHECK_FALSE(absl::StrContains(log, " reached ("));
  }
  // Armed for a third commit that never comes.
  DaemonProcess daemon({}, "", {"CKPTD_CRASH_AT=COMMIT.renamed@3"});
  TestRank rank(daemon.socket(), kJob, kSmallTensors, kSmallTensorBytes);
  SaveCommitted(rank, 1);
  SaveCommitted(rank, 2);
  rank.Zero();
  REQUIRE(rank.client().Load(rank.LoadRequestFor("latest")).ok());
  CHECK(rank.Holds(2));
  const std::string log = ReadLog(daemon);
  INFO(log);
  CHECK(absl::StrContains(log, "at hit 3 of crash point COMMIT.renamed"));
  CHECK_FALSE(absl::StrContains(log, "crash point COMMIT.renamed reached"));
}

TEST_CASE("crash matrix: ckptd killed while step-2's data file is written, at "
          "each twelfth of it, keeps step-1 bit-exact, never commits step-2, "
          "and saves it again after a restart",
          "[integration][crash][crash_matrix]") {
  for (const MatrixPoint& point : ProgressPoints()) {
    DYNAMIC_SECTION(point.name) { RunPoint(point); }
  }
}

TEST_CASE("crash matrix: ckptd killed at each step of the durability protocol "
          "keeps step-1 bit-exact, commits step-2 exactly when COMMIT was "
          "renamed, and recovers LATEST and its leftovers at restart",
          "[integration][crash][crash_matrix]") {
  for (const MatrixPoint& point : ProtocolPoints()) {
    DYNAMIC_SECTION(point.name) { RunPoint(point); }
  }
}

TEST_CASE("crash matrix: ckptd killed while retention deletes a checkpoint, or "
          "again inside startup recovery, recovers at the next start",
          "[integration][crash][crash_matrix]") {
  for (const MatrixPoint& point : AfterCommitAndRecoveryPoints()) {
    DYNAMIC_SECTION(point.name) { RunPoint(point); }
  }
}

}  // namespace ckpt::testing
