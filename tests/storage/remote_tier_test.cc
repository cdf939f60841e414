// The remote tier (storage/remote_tier.h): nodes' locally committed parts
// copied to a remote store and committed there with the same COMMIT as the
// local one; from memory-tier images or the local files; the local copy
// leased until the upload ends; failures that end and name the node, the
// object and the server's answer.
#include "storage/remote_tier.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bench/commit_scale_sim.h"
#include "format/manifest_check.h"
#include "storage/commit_protocol.h"
#include "storage/counting_object_store.h"
#include "storage/in_memory_object_store.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

using ::ckpt::testing::TempDir;

constexpr char kJob[] = "sim";
constexpr char kCheckpoint[] = "step-1";  // SimulatedNodeManifest's names
constexpr uint64_t kFileSize = (3 << 20) + 4096 + 123;

std::string RandomBytes(size_t size, uint32_t seed) {
  std::mt19937 random(seed);
  std::string bytes(size, '\0');
  for (char& c : bytes) c = static_cast<char>(random());
  return bytes;
}

// `nodes` nodes' parts of one checkpoint, committed in one (shared) local
// root: each node one data file of kFileSize random bytes.
struct LocalCheckpoint {
  explicit LocalCheckpoint(uint32_t nodes) {
    for (uint32_t n = 0; n < nodes; ++n) {
      REQUIRE(store.PrepareForSave(kJob, kCheckpoint, n).ok());
      v1::Manifest manifest = SimulatedNodeManifest(n, nodes);
      manifest.mutable_files(0)->set_size(kFileSize);
      files.push_back(manifest.files(0).name());
      contents.push_back(RandomBytes(kFileSize, n + 7));
      std::FILE* f = std::fopen(FilePath(n).c_str(), "wb");
      REQUIRE(f != nullptr);
      REQUIRE(std::fwrite(contents[n].data(), 1, kFileSize, f) == kFileSize);
      REQUIRE(std::fclose(f) == 0);
      REQUIRE(store.WriteNodeManifest(manifest).ok());
    }
    absl::StatusOr<bool> committed = CommitProtocol(&store).TryCommit(kJob, kCheckpoint, nodes);
    REQUIRE(committed.ok());
    REQUIRE(*committed);
  }
  std::string FilePath(uint32_t node) const {
    return absl::StrCat(store.CheckpointDir(kJob, kCheckpoint), "/", files[node]);
  }

  TempDir tmp;
  CheckpointStore store{tmp.path()};
  CheckpointLeases leases;
  std::vector<std::string> files;
  std::vector<std::string> contents;
};

RemoteTierOptions NodeOptions(uint32_t node, uint32_t nodes) {
  RemoteTierOptions options;
  options.node_id = node;
  options.nodes = nodes;
  options.part_size = 1 << 20;  // several parts per file
  options.commit.poll_interval = absl::Milliseconds(20);
  options.upload_timeout = absl::Seconds(20);
  return options;
}

std::string ReadObject(ObjectStore& store, const std::string& key) {
  absl::StatusOr<std::string> bytes = GetSmallObject(store, key, 64 << 20);
  INFO(bytes.status().ToString());
  REQUIRE(bytes.ok());
  return *bytes;
}

// Fails every Put with the answer S3 gives a key without write access.
class DeniedStore : public InMemoryObjectStore {
 public:
  absl::Status Put(absl::string_view key, absl::string_view) override {
    return absl::PermissionDeniedError(absl::StrCat(
        "S3 PutObject s3://ckpt/", key, ": HTTP 403 AccessDenied: Access Denied"));
  }
};

TEST_CASE("two nodes' parts are uploaded and committed in the remote tier with the local "
          "COMMIT's bytes, every file whole",
          "[remote_tier]") {
  LocalCheckpoint local(2);
  auto remote = std::make_shared<InMemoryObjectStore>();
  RemoteTier node0(NodeOptions(0, 2), &local.store, nullptr, &local.leases, remote);
  RemoteTier node1(NodeOptions(1, 2), &local.store, nullptr, &local.leases, remote);
  REQUIRE(node0.Enqueue(kJob, kCheckpoint).ok());
  REQUIRE(node1.Enqueue(kJob, kCheckpoint).ok());
  CHECK(node0.Enqueue(kJob, kCheckpoint).ok());  // already queued: nothing new
  for (RemoteTier* tier : {&node0, &node1}) {
    std::optional<RemoteProgress> p = tier->WaitFor(kJob, kCheckpoint, absl::Seconds(30));
    REQUIRE(p.has_value());
    INFO(p->error);
    CHECK(p->state == RemoteState::kCommitted);
    CHECK(p->bytes_uploaded == kFileSize);
    CHECK(p->bytes_total == kFileSize);
    CHECK(p->files_uploaded == 1);
  }
  const std::string prefix = absl::StrCat(kJob, "/", kCheckpoint, "/");
  for (uint32_t n = 0; n < 2; ++n) {
    CHECK(ReadObject(*remote, prefix + local.files[n]) == local.contents[n]);
  }
  absl::StatusOr<std::string> local_commit = local.store.Root().value()->ReadFile(
      absl::StrCat(kJob, "/", kCheckpoint, "/COMMIT"), 64 << 20);
  REQUIRE(local_commit.ok());
  CHECK(ReadObject(*remote, prefix + "COMMIT") == *local_commit);
  // The leases are gone with the uploads: retention may take it now.
  CHECK(local.leases.ClaimForDeletion(kJob, kCheckpoint));
}

TEST_CASE("a file the memory tier holds is sent from its image, the local file unread",
          "[remote_tier]") {
  LocalCheckpoint local(1);
  MemoryTier images(64 << 20);
  std::shared_ptr<FileImage> image =
      images.Reserve(kJob, kCheckpoint, local.files[0], kFileSize);
  REQUIRE(image != nullptr);
  std::memcpy(image->data(), local.contents[0].data(), kFileSize);
  images.MarkComplete(kJob, kCheckpoint);
  image.reset();
  // The file is gone from the local root: only the image can give its bytes.
  REQUIRE(std::filesystem::remove(local.FilePath(0)));
  auto remote = std::make_shared<InMemoryObjectStore>();
  RemoteTier tier(NodeOptions(0, 1), &local.store, &images, &local.leases, remote);
  REQUIRE(tier.Enqueue(kJob, kCheckpoint).ok());
  std::optional<RemoteProgress> p = tier.WaitFor(kJob, kCheckpoint, absl::Seconds(30));
  REQUIRE(p.has_value());
  INFO(p->error);
  CHECK(p->state == RemoteState::kCommitted);
  CHECK(ReadObject(*remote, absl::StrCat(kJob, "/", kCheckpoint, "/", local.files[0])) ==
        local.contents[0]);
}

TEST_CASE("the local checkpoint is leased while its upload runs, and the upload keeps to "
          "its rate",
          "[remote_tier]") {
  LocalCheckpoint local(1);
  auto remote = std::make_shared<InMemoryObjectStore>();
  RemoteTierOptions options = NodeOptions(0, 1);
  options.max_bytes_per_second = 1 << 20;  // ~3 MiB in 1 MiB parts
  RemoteTier tier(options, &local.store, nullptr, &local.leases, remote);
  const absl::Time start = absl::Now();
  REQUIRE(tier.Enqueue(kJob, kCheckpoint).ok());
  CHECK_FALSE(local.leases.ClaimForDeletion(kJob, kCheckpoint));
  std::optional<RemoteProgress> p = tier.WaitFor(kJob, kCheckpoint, absl::Seconds(30));
  REQUIRE(p.has_value());
  CHECK(p->state == RemoteState::kCommitted);
  const absl::Duration took = absl::Now() - start;
  INFO(absl::FormatDuration(took));
  // 3 MiB at 1 MiB/s, one second's worth at once: the rest at least 2 s.
  CHECK(took > absl::Milliseconds(1800));
  CHECK(local.leases.ClaimForDeletion(kJob, kCheckpoint));
}

TEST_CASE("a server that refuses the upload fails it at once, naming the node, the object "
          "and the server's answer, and nothing is committed and the lease is released",
          "[remote_tier]") {
  LocalCheckpoint local(1);
  auto remote = std::make_shared<DeniedStore>();
  RemoteTier tier(NodeOptions(0, 1), &local.store, nullptr, &local.leases, remote);
  REQUIRE(tier.Enqueue(kJob, kCheckpoint).ok());
  std::optional<RemoteProgress> p = tier.WaitFor(kJob, kCheckpoint, absl::Seconds(30));
  REQUIRE(p.has_value());
  INFO(p->error);
  CHECK(p->state == RemoteState::kFailed);
  CHECK(absl::StrContains(p->error, "node 0"));
  CHECK(absl::StrContains(p->error, absl::StrCat(kJob, "/", kCheckpoint, "/", local.files[0])));
  CHECK(absl::StrContains(p->error, "403 AccessDenied"));
  CHECK(!remote->Head(absl::StrCat(kJob, "/", kCheckpoint, "/COMMIT")).ok());
  CHECK(local.leases.ClaimForDeletion(kJob, kCheckpoint));
}

TEST_CASE("a node whose partner never uploads gives up at the timeout, naming what it waited "
          "for, and commits nothing",
          "[remote_tier]") {
  LocalCheckpoint local(2);
  auto remote = std::make_shared<InMemoryObjectStore>();
  RemoteTierOptions options = NodeOptions(0, 2);
  options.upload_timeout = absl::Seconds(1);
  RemoteTier tier(options, &local.store, nullptr, &local.leases, remote);
  REQUIRE(tier.Enqueue(kJob, kCheckpoint).ok());
  std::optional<RemoteProgress> p = tier.WaitFor(kJob, kCheckpoint, absl::Seconds(30));
  REQUIRE(p.has_value());
  INFO(p->error);
  CHECK(p->state == RemoteState::kFailed);
  CHECK(absl::StrContains(p->error, "not committed within"));
  CHECK(absl::StrContains(p->error, "group 0's nodes 1"));
  CHECK(!remote->Head(absl::StrCat(kJob, "/", kCheckpoint, "/COMMIT")).ok());
}

TEST_CASE("a read-ahead fetch does not wait for memory other fetches hold, a fetch that "
          "waits gets it once they let go, and both give the file's bytes",
          "[remote_tier]") {
  LocalCheckpoint local(1);
  auto remote = std::make_shared<InMemoryObjectStore>();
  RemoteTierOptions options = NodeOptions(0, 1);
  options.fetch_bytes = 2 << 20;
  options.fetch_timeout = absl::Seconds(20);
  RemoteTier tier(options, &local.store, nullptr, &local.leases, remote);
  REQUIRE(tier.Enqueue(kJob, kCheckpoint).ok());
  std::optional<RemoteProgress> p = tier.WaitFor(kJob, kCheckpoint, absl::Seconds(30));
  REQUIRE(p.has_value());
  REQUIRE(p->state == RemoteState::kCommitted);
  // One round of requests (1 MiB parts x 8) is more than a quarter of the
  // fetch memory: a window is the quarter.
  CHECK(tier.fetch_window_bytes() == (2u << 20) / 4);
  const std::string& file = local.files[0];
  const std::string& bytes = local.contents[0];
  using Memory = RemoteTier::FetchMemory;
  absl::StatusOr<std::shared_ptr<const FileImage>> held =
      tier.FetchRange(kJob, kCheckpoint, file, kFileSize, 4096, 3 << 19, Memory::kWait);
  REQUIRE(held.ok());
  REQUIRE(*held != nullptr);
  CHECK(std::string((*held)->data(), 3 << 19) == bytes.substr(4096, 3 << 19));
  // 1.5 MiB held of 2: a second MiB is not free.
  absl::StatusOr<std::shared_ptr<const FileImage>> ahead =
      tier.FetchRange(kJob, kCheckpoint, file, kFileSize, 0, 1 << 20, Memory::kIfFree);
  REQUIRE(ahead.ok());
  CHECK(*ahead == nullptr);
  // Half a MiB is.
  ahead = tier.FetchRange(kJob, kCheckpoint, file, kFileSize, kFileSize - (1 << 19), 1 << 19,
                          Memory::kIfFree);
  REQUIRE(ahead.ok());
  REQUIRE(*ahead != nullptr);
  CHECK(std::string((*ahead)->data(), 1 << 19) == bytes.substr(kFileSize - (1 << 19)));
  ahead->reset();
  // A fetch that waits gets its memory when the held window goes.
  std::thread release([&] {
    absl::SleepFor(absl::Milliseconds(300));
    held->reset();
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<const FileImage>> waited =
      tier.FetchRange(kJob, kCheckpoint, file, kFileSize, 0, 1 << 20, Memory::kWait);
  release.join();
  REQUIRE(waited.ok());
  REQUIRE(*waited != nullptr);
  CHECK(absl::Now() - start >= absl::Milliseconds(250));
  CHECK(std::string((*waited)->data(), 1 << 20) == bytes.substr(0, 1 << 20));
}

TEST_CASE("stopping the tier ends a running upload and drops the queue", "[remote_tier]") {
  LocalCheckpoint local(2);
  auto remote = std::make_shared<InMemoryObjectStore>();
  RemoteTierOptions options = NodeOptions(0, 2);
  options.max_queued = 1;
  auto tier = std::make_unique<RemoteTier>(options, &local.store, nullptr, &local.leases,
                                           remote);
  REQUIRE(tier->Enqueue(kJob, kCheckpoint).ok());  // waits for node 1 for good
  absl::SleepFor(absl::Milliseconds(200));
  std::vector<RemoteProgress> progress = tier->Progress();
  REQUIRE(progress.size() == 1);
  CHECK(progress[0].state == RemoteState::kCommitting);
  const absl::Time start = absl::Now();
  tier->Stop();
  CHECK(absl::Now() - start < absl::Seconds(2));
  CHECK(!tier->Enqueue(kJob, kCheckpoint).ok());
  tier.reset();
  CHECK(local.leases.ClaimForDeletion(kJob, kCheckpoint));
}

// The checkpoint's upload once it has ended (fails after 30 s).
RemoteProgress Ended(const RemoteTier& tier, const std::string& checkpoint) {
  std::optional<RemoteProgress> p = tier.WaitFor(kJob, checkpoint, absl::Seconds(30));
  REQUIRE(p.has_value());
  INFO(p->error);
  REQUIRE((p->state == RemoteState::kCommitted || p->state == RemoteState::kFailed));
  return *p;
}

TEST_CASE("an Enqueue while the checkpoint's upload runs joins it: one upload, which Progress "
          "follows to its commit",
          "[remote_tier]") {
  LocalCheckpoint local(1);
  auto remote = std::make_shared<InMemoryObjectStore>();
  RemoteTierOptions options = NodeOptions(0, 1);
  options.max_bytes_per_second = 1 << 20;  // seconds: the second Enqueue joins it
  RemoteTier tier(options, &local.store, nullptr, &local.leases, remote);
  REQUIRE(tier.Enqueue(kJob, kCheckpoint).ok());
  REQUIRE(tier.Enqueue(kJob, kCheckpoint).ok());
  const RemoteProgress p = Ended(tier, kCheckpoint);
  CHECK(p.state == RemoteState::kCommitted);
  CHECK(p.bytes_uploaded == kFileSize);
  CHECK(p.ended_at != absl::InfinitePast());
  CHECK(tier.Progress().size() == 1);  // one upload
}

TEST_CASE("an upload's failure is in its progress with its reason", "[remote_tier]") {
  LocalCheckpoint local(1);
  auto remote = std::make_shared<DeniedStore>();
  RemoteTier tier(NodeOptions(0, 1), &local.store, nullptr, &local.leases, remote);
  REQUIRE(tier.Enqueue(kJob, kCheckpoint).ok());
  const RemoteProgress p = Ended(tier, kCheckpoint);
  CHECK(p.state == RemoteState::kFailed);
  CHECK(absl::StrContains(p.error, "node 0"));
  CHECK(absl::StrContains(p.error, "403 AccessDenied"));
}

TEST_CASE("stopping the tier ends the running upload and the queued ones failed before Stop "
          "returns, and one queued too late is refused in the same words",
          "[remote_tier]") {
  LocalCheckpoint local(2);
  auto remote = std::make_shared<InMemoryObjectStore>();
  RemoteTier tier(NodeOptions(0, 2), &local.store, nullptr, &local.leases, remote);
  REQUIRE(tier.Enqueue(kJob, kCheckpoint).ok());  // waits for node 1
  REQUIRE(tier.Enqueue(kJob, "step-2").ok());     // queued behind it
  absl::SleepFor(absl::Milliseconds(200));
  tier.Stop();
  for (const std::string& name : {std::string(kCheckpoint), std::string("step-2")}) {
    std::optional<RemoteProgress> p = tier.Progress(kJob, name);
    REQUIRE(p.has_value());
    INFO(name << ": " << p->error);
    CHECK(p->state == RemoteState::kFailed);
    CHECK(absl::StrContains(p->error, "stop"));
    CHECK(p->ended_at != absl::InfinitePast());
  }
  CHECK(absl::StrContains(tier.Progress(kJob, "step-2")->error,
                          "the daemon stopped before the upload of sim/step-2 began"));
  // One queued too late hears what one still in the queue heard: the daemon
  // reports both alike (a save's COMMITTED can reach its trainer before
  // the upload is queued, and a SIGTERM can come between).
  const absl::Status late = tier.Enqueue(kJob, "step-3");
  CHECK(absl::IsCancelled(late));
  CHECK(absl::StrContains(late.message(), "the daemon stopped before the upload of sim/step-3 "
                                          "began"));
}

}  // namespace
}  // namespace ckpt

namespace ckpt {
namespace {

TEST_CASE("a tier that starts resumes what an earlier daemon left: a checkpoint committed "
          "locally and not remotely is uploaded, one committed there is left alone",
          "[remote_tier]") {
  LocalCheckpoint local(1);
  auto remote = std::make_shared<InMemoryObjectStore>();
  const std::string commit_key = absl::StrCat(kJob, "/", kCheckpoint, "/COMMIT");
  {
    RemoteTier tier(NodeOptions(0, 1), &local.store, nullptr, &local.leases, remote);
    tier.ResumeUnfinished();
    // WaitFor knows of the upload only once the tier's thread queued it.
    std::optional<RemoteProgress> p;
    for (int i = 0; i < 300; ++i) {
      p = tier.WaitFor(kJob, kCheckpoint, absl::Seconds(30));
      if (p.has_value()) break;
      absl::SleepFor(absl::Milliseconds(10));
    }
    REQUIRE(p.has_value());
    INFO(p->error);
    CHECK(p->state == RemoteState::kCommitted);
  }
  REQUIRE(remote->Head(commit_key).ok());
  {
    auto counted = std::make_shared<CountingObjectStore>(*remote, [] { return absl::Now(); });
    RemoteTier tier(NodeOptions(0, 1), &local.store, nullptr, &local.leases, counted);
    tier.ResumeUnfinished();
    absl::SleepFor(absl::Milliseconds(300));
    CHECK(tier.Progress().empty());
    // Not uploaded again; the root only checks that the remote LATEST
    // names it (a Head and a Get of LATEST), which it does: no Put.
    CHECK(counted->counts().of(ObjectRequest::kPut) == 0);
    CHECK(counted->counts().of(ObjectRequest::kHead) == 2);
  }
}

TEST_CASE("a tier that starts moves the remote LATEST forward to the checkpoint a daemon "
          "killed between COMMIT and LATEST committed there",
          "[remote_tier]") {
  LocalCheckpoint local(1);
  auto remote = std::make_shared<InMemoryObjectStore>();
  const std::string latest_key = absl::StrCat(kJob, "/LATEST");
  {
    RemoteTier tier(NodeOptions(0, 1), &local.store, nullptr, &local.leases, remote);
    REQUIRE(tier.Enqueue(kJob, kCheckpoint).ok());
    std::optional<RemoteProgress> p = tier.WaitFor(kJob, kCheckpoint, absl::Seconds(30));
    REQUIRE(p.has_value());
    REQUIRE(p->state == RemoteState::kCommitted);
  }
  // What the killed daemon left: COMMIT there, LATEST on an older one.
  REQUIRE(remote->Put(latest_key, "step-0\n1\n").ok());
  RemoteTier tier(NodeOptions(0, 1), &local.store, nullptr, &local.leases, remote);
  tier.ResumeUnfinished();
  std::string latest;
  for (int i = 0; i < 500 && !absl::StartsWith(latest, kCheckpoint); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    latest = GetSmallObject(*remote, latest_key, 1024).value_or("");
  }
  CHECK(absl::StartsWith(latest, absl::StrCat(kCheckpoint, "\n")));
  CHECK(tier.Progress().empty());  // nothing uploaded again
}

}  // namespace
}  // namespace ckpt
