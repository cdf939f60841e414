// Fault injection at every step of a save's durability protocol (issue 9,
// item 8), one failed step per section, each on a root that already holds a
// committed step-1:
//
//   marker        .ckptd-checkpoint: create, write, fsync, rename, dir fsync
//   data file     O_DIRECT create, write (the IoQueue), ftruncate, fsync
//   node manifest node-0000.manifest: create, write, fsync, rename, dir fsync
//   COMMIT        tests/save/commit_failure_test.cc (each step, ENOSPC)
//   LATEST        create, write, fsync, rename, dir fsync
//
// Every step before COMMIT must fail the save, leave the root exactly as it
// was (step-1's files byte for byte, LATEST, no temporary, nothing of
// step-2), keep step-1 committed and verifiable, and leave the name free:
// a second save of step-2 commits. A failed LATEST write comes after COMMIT,
// so the save is committed anyway (commit_protocol.cc logs it); LATEST then
// still names step-1 unless the rename happened, and the next start
// (RecoverAtStart) moves it to step-2.
//
// The steps fail through the save's seams: FileOps (storage/durable_file.h)
// and, for the data file's bulk writes, the workers' fault-injecting queue.
// docs/RELIABILITY.md's fault table cites the sections by name.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "common/status.h"
#include "io/io_workers.h"
#include "io/staging_pool.h"
#include "restore/verifier.h"
#include "save/save_harness.h"
#include "storage/checkpoint_leases.h"
#include "storage/checkpoint_store.h"
#include "storage/durable_file.h"
#include "storage/startup_recovery.h"
#include "support/fault_injecting_queue.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

using ::ckpt::testing::FaultInjectingQueue;
using ::ckpt::testing::ProgressLog;
using ::ckpt::testing::SaveHarness;
using ::ckpt::testing::SaveHarnessOptions;
using ::ckpt::testing::TempDir;
namespace fs = std::filesystem;

// The file whose write is failed.
enum class File { kMarker, kData, kManifest, kLatest };
// The step of its write that fails. kWrite of a data file is its bulk
// O_DIRECT write, failed by the queue (-EIO); every other step goes
// through FileOps.
enum class Step { kCreate, kWrite, kFsync, kTruncate, kRename, kFsyncDir };
// What the save must end as.
enum class Outcome {
  kFailed,                // FAILED; the root as before
  kCommittedLatestBehind,  // COMMITTED; LATEST still step-1 until a restart
  kCommittedLatestMoved,   // COMMITTED; LATEST already step-2 (renamed)
};

struct Fault {
  const char* section;  // the name the outcome table cites
  File file;
  Step step;
  Outcome outcome;
};

const Fault kFaults[] = {
    {"marker create", File::kMarker, Step::kCreate, Outcome::kFailed},
    {"marker write", File::kMarker, Step::kWrite, Outcome::kFailed},
    {"marker fsync", File::kMarker, Step::kFsync, Outcome::kFailed},
    {"marker rename", File::kMarker, Step::kRename, Outcome::kFailed},
    {"marker dir fsync", File::kMarker, Step::kFsyncDir, Outcome::kFailed},
    {"data file create", File::kData, Step::kCreate, Outcome::kFailed},
    {"data file write", File::kData, Step::kWrite, Outcome::kFailed},
    {"data file ftruncate", File::kData, Step::kTruncate, Outcome::kFailed},
    {"data file fsync", File::kData, Step::kFsync, Outcome::kFailed},
    {"node manifest create", File::kManifest, Step::kCreate, Outcome::kFailed},
    {"node manifest write", File::kManifest, Step::kWrite, Outcome::kFailed},
    {"node manifest fsync", File::kManifest, Step::kFsync, Outcome::kFailed},
    {"node manifest rename", File::kManifest, Step::kRename, Outcome::kFailed},
    {"node manifest dir fsync", File::kManifest, Step::kFsyncDir,
     Outcome::kFailed},
    {"LATEST create", File::kLatest, Step::kCreate,
     Outcome::kCommittedLatestBehind},
    {"LATEST write", File::kLatest, Step::kWrite,
     Outcome::kCommittedLatestBehind},
    {"LATEST fsync", File::kLatest, Step::kFsync,
     Outcome::kCommittedLatestBehind},
    {"LATEST rename", File::kLatest, Step::kRename,
     Outcome::kCommittedLatestBehind},
    {"LATEST dir fsync", File::kLatest, Step::kFsyncDir,
     Outcome::kCommittedLatestMoved},
};

// The name a durable write renames its temporary to (WriteFileDurably's
// target); data files have none.
std::string TargetOf(File file) {
  switch (file) {
    case File::kMarker: return std::string(kMarkerFileName);
    case File::kManifest: return CheckpointStore::NodeManifestName(0);
    case File::kLatest: return std::string(kLatestFileName);
    case File::kData: return "";
  }
  return "";
}

// The real file operations, except that one step of one file's write fails
// with EIO, once. Thread-safe: the steps run on I/O workers.
class OneStepFails final : public FileOps {
 public:
  OneStepFails(File file, Step step) : file_(file), step_(step) {}

  int failures() const { return failures_.load(); }

  absl::StatusOr<int> CreateExclusive(const StorageDir& dir,
                                      const std::string& name) override {
    if (Hit(Step::kCreate, IsTemporary(name))) {
      return Injected("create", dir.PathOf(name));
    }
    return FileOps::CreateExclusive(dir, name);
  }
  absl::StatusOr<int> CreateDirect(const StorageDir& dir,
                                   const std::string& name) override {
    if (Hit(Step::kCreate, file_ == File::kData)) {
      return Injected("create", dir.PathOf(name));
    }
    return FileOps::CreateDirect(dir, name);
  }
  absl::Status WriteAll(int fd, absl::string_view bytes,
                        const std::string& path) override {
    if (Hit(Step::kWrite, IsTemporary(path))) return Injected("write", path);
    return FileOps::WriteAll(fd, bytes, path);
  }
  absl::Status Fsync(int fd, const std::string& path) override {
    if (Hit(Step::kFsync, IsTemporary(path) || IsDataFile(path))) {
      return Injected("fsync", path);
    }
    return FileOps::Fsync(fd, path);
  }
  absl::Status Truncate(int fd, uint64_t size,
                        const std::string& path) override {
    if (Hit(Step::kTruncate, IsDataFile(path))) return Injected("ftruncate", path);
    return FileOps::Truncate(fd, size, path);
  }
  absl::Status Rename(const StorageDir& dir, const std::string& from,
                      const std::string& to) override {
    const bool ours = file_ != File::kData && to == TargetOf(file_);
    if (Hit(Step::kRename, ours)) return Injected("rename", dir.PathOf(from));
    absl::Status renamed = FileOps::Rename(dir, from, to);
    // WriteFileDurably fsyncs the directory next, on this thread.
    renamed_ours_ = renamed.ok() && ours;
    return renamed;
  }
  absl::Status FsyncDir(const StorageDir& dir) override {
    const bool after_ours = std::exchange(renamed_ours_, false);
    if (Hit(Step::kFsyncDir, after_ours)) return Injected("fsync", dir.path());
    return FileOps::FsyncDir(dir);
  }

 private:
  // A temporary of the failed file: "<target>.tmp.<tag>.<n>".
  bool IsTemporary(absl::string_view name_or_path) const {
    if (file_ == File::kData) return false;
    const std::string prefix = absl::StrCat(TargetOf(file_), ".tmp.");
    const size_t slash = name_or_path.rfind('/');
    const absl::string_view name = slash == absl::string_view::npos
                                       ? name_or_path
                                       : name_or_path.substr(slash + 1);
    return absl::StartsWith(name, prefix);
  }
  bool IsDataFile(absl::string_view path) const {
    return file_ == File::kData && absl::EndsWith(path, ".safetensors");
  }
  // True, once, when `step` of the failed file is reached.
  bool Hit(Step step, bool of_the_file) {
    return step == step_ && of_the_file && !fired_.exchange(true);
  }
  absl::Status Injected(const char* what, const std::string& path) {
    ++failures_;
    return ErrnoToStatus(EIO, absl::StrCat("injected failure: ", what, " ", path));
  }

  const File file_;
  const Step step_;
  std::atomic<bool> fired_{false};
  std::atomic<int> failures_{0};
  static thread_local bool renamed_ours_;
};

thread_local bool OneStepFails::renamed_ours_ = false;

// Every file and directory under `root` with its bytes ("<dir>" for a
// directory): compared before and after, it shows a failed save left
// nothing and changed nothing, byte for byte.
std::map<std::string, std::string> Snapshot(const std::string& root) {
  std::map<std::string, std::string> out;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    const std::string path = fs::relative(entry.path(), root).string();
    if (entry.is_directory()) {
      out[path] = "<dir>";
      continue;
    }
    std::ifstream in(entry.path(), std::ios::binary);
    REQUIRE(in.good());
    out[path] = std::string(std::istreambuf_iterator<char>(in), {});
  }
  return out;
}

// The entries of `snapshot` under `prefix` ("job/step-1").
std::map<std::string, std::string> Under(
    const std::map<std::string, std::string>& snapshot,
    const std::string& prefix) {
  std::map<std::string, std::string> out;
  for (const auto& [path, bytes] : snapshot) {
    if (path == prefix || absl::StartsWith(path, prefix + "/")) out[path] = bytes;
  }
  return out;
}

std::string Names(const std::map<std::string, std::string>& snapshot) {
  std::vector<std::string> names;
  for (const auto& [path, bytes] : snapshot) names.push_back(path);
  return absl::StrJoin(names, " ");
}

bool HasTemporary(const std::map<std::string, std::string>& snapshot) {
  return std::any_of(snapshot.begin(), snapshot.end(), [](const auto& entry) {
    return ParseTemporaryName(fs::path(entry.first).filename().string())
        .has_value();
  });
}

// Saves `checkpoint` of the harness's one-rank job through a clean harness
// and requires it to commit.
void SaveCommitted(const std::string& root, const std::string& checkpoint) {
  SaveHarness harness(root);
  const std::shared_ptr<ProgressLog> log =
      harness.Save(harness.AddRank(0, 1, 1), checkpoint);
  const std::optional<v1::SaveProgress> end = log->WaitForEnd();
  INFO(log->Describe());
  REQUIRE(end.has_value());
  REQUIRE(end->phase() == v1::PHASE_COMMITTED);
}

// Loadable, as restore reads it: VerifyCheckpoint re-reads every stored
// byte and checks it against the COMMIT's checksums.
void CheckVerifies(const std::string& root, const std::string& checkpoint) {
  CheckpointStore store(root);
  REQUIRE(store.status().ok());
  CheckpointLeases leases;
  // Larger than the harness's 64 KiB checksum blocks by more than a page
  // (restore/shard_reader.h).
  constexpr uint32_t kBuffer = 128 * 1024;
  absl::StatusOr<std::unique_ptr<StagingPool>> pool =
      StagingPool::Create(8 * kBuffer, kBuffer);
  REQUIRE(pool.ok());
  absl::Notification done;
  std::optional<absl::StatusOr<v1::VerifyResponse>> verified;
  {
    IoWorkers workers(1, 8, **pool);
    VerifyCheckpoint(&store, pool->get(), &workers, &leases, SaveHarness::kJob,
                     checkpoint,
                     [&](absl::StatusOr<v1::VerifyResponse> response) {
                       verified = std::move(response);
                       done.Notify();
                     });
    REQUIRE(done.WaitForNotificationWithTimeout(::ckpt::testing::kPhaseWaitLimit));
  }
  INFO("verify " << checkpoint << ": " << verified->status());
  REQUIRE(verified->ok());
  INFO("damage: " << absl::StrJoin((*verified)->damage(), "; "));
  CHECK((*verified)->damage().empty());
  CHECK((*verified)->bytes_verified() >= SaveHarness::kWeightElements * 4);
}

std::string Latest(const std::string& root) {
  CheckpointStore store(root);
  const absl::StatusOr<std::string> latest = store.ResolveLatest(SaveHarness::kJob);
  INFO(latest.status());
  REQUIRE(latest.ok());
  return *latest;
}

TEST_CASE(
    "A save whose durability protocol fails at any one step before COMMIT "
    "fails and leaves the root as it was, one whose LATEST write fails is "
    "committed and the next start moves LATEST, either way the previous "
    "checkpoint stays committed and verifies, no temporary is left, and the "
    "daemon saves again",
    "[save_coordinator][durability][fault_injection]") {
  for (const Fault& fault : kFaults) {
    DYNAMIC_SECTION(fault.section) {
      TempDir root;
      SaveCommitted(root.path(), "step-1");
      const std::map<std::string, std::string> before = Snapshot(root.path());
      REQUIRE(Latest(root.path()) == "step-1");

      OneStepFails ops(fault.file, fault.step);
      SaveHarnessOptions options;
      options.file_ops = &ops;
      const bool queue_fault = fault.file == File::kData && fault.step == Step::kWrite;
      // The data file's first O_DIRECT write completes with -EIO.
      if (queue_fault) options.faults = [](FaultInjectingQueue& q) { q.eio_nth = 1; };
      v1::SaveProgress end;
      {
        SaveHarness harness(root.path(), options);
        const std::shared_ptr<ProgressLog> log =
            harness.Save(harness.AddRank(0, 1, 1), "step-2");
        const std::optional<v1::SaveProgress> ended = log->WaitForEnd();
        INFO(log->Describe());
        REQUIRE(ended.has_value());
        end = *ended;
        harness.StopWorkers();  // a failed save's files go on a worker
        CHECK(harness.pool().free_bytes() == harness.pool().pool_bytes());
        if (queue_fault) {
          bool injected = false;
          for (const auto& queue : harness.queues()) {
            injected = injected || queue->in_flight_at_fault.has_value();
          }
          CHECK(injected);
        }
      }
      INFO("step-2 ended " << v1::Phase_Name(end.phase()) << ": " << end.reason());
      if (!queue_fault) CHECK(ops.failures() == 1);

      const std::map<std::string, std::string> after = Snapshot(root.path());
      INFO("before: " << Names(before) << "\nafter: " << Names(after));
      CHECK_FALSE(HasTemporary(after));
      // step-1's files, byte for byte.
      CHECK(Under(after, "job/step-1") == Under(before, "job/step-1"));
      CHECK(CheckpointStore(root.path()).IsCommitted(SaveHarness::kJob, "step-1"));
      CheckVerifies(root.path(), "step-1");

      switch (fault.outcome) {
        case Outcome::kFailed: {
          CHECK(end.phase() == v1::PHASE_FAILED);
          CHECK_THAT(end.reason(), Catch::Contains(queue_fault
                                                       ? "Input/output error"
                                                       : "injected failure"));
          // Nothing of step-2, nothing else changed.
          CHECK(after == before);
          // No dead end: the same name saves and commits.
          SaveCommitted(root.path(), "step-2");
          CHECK(Latest(root.path()) == "step-2");
          CheckVerifies(root.path(), "step-2");
          break;
        }
        case Outcome::kCommittedLatestBehind:
        case Outcome::kCommittedLatestMoved: {
          // COMMIT was durable before LATEST was touched.
          CHECK(end.phase() == v1::PHASE_COMMITTED);
          CheckVerifies(root.path(), "step-2");
          const bool behind = fault.outcome == Outcome::kCommittedLatestBehind;
          CHECK(Latest(root.path()) == (behind ? "step-1" : "step-2"));
          // What the next daemon's start does (storage/startup_recovery.h).
          CheckpointStore store(root.path());
          const absl::StatusOr<StartupRecovery> recovered =
              RecoverAtStart(store, {.node_id = 0, .nodes = 1, .earlier_temp_tags = {}});
          INFO(recovered.status());
          REQUIRE(recovered.ok());
          CHECK(recovered->errors.empty());
          CHECK(recovered->latest_repaired ==
                (behind ? std::vector<std::string>{"job: step-1 -> step-2"}
                        : std::vector<std::string>{}));
          CHECK(Latest(root.path()) == "step-2");
          // step-2 is taken; the daemon goes on with the next name.
          {
            SaveHarness harness(root.path());
            SaveHarness::Rank& rank = harness.AddRank(0, 1, 1);
            rank.request.set_checkpoint("step-2");
            const absl::StatusOr<uint64_t> again =
                harness.coordinator().Submit(rank.session, rank.request);
            CHECK(absl::IsAlreadyExists(again.status()));
          }
          SaveCommitted(root.path(), "step-3");
          CHECK(Latest(root.path()) == "step-3");
          break;
        }
      }
    }
  }
}

}  // namespace
}  // namespace ckpt
