// Retention and garbage collection in the remote tier
// (storage/remote_retention.h): the newest --remote_keep_last committed
// checkpoints stay; older ones go DELETING marker first, COMMIT next; never
// LATEST's, never one in flight here, never an object ckptd does not write;
// a delete that a crash cut short is finished by the next pass; remnants of
// uncommitted checkpoints go only when older than LATEST's.
#include "storage/remote_retention.h"

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "format/manifest_file.h"
#include "storage/in_memory_object_store.h"
#include "storage/posix_object_store.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

constexpr char kJob[] = "job";
constexpr char kData[] = "shard-00000-of-00001.safetensors";
constexpr char kManifest[] = "g-0000000/node-0000000.manifest";
constexpr char kRecord[] = "groups/g-0000000.manifests";
constexpr char kNotice[] = "g-0000000/COMMITTED";

// Forwards to another store, recording the keys Put and Deleted in order,
// and fails every Delete after `deletes_left` of them (a crash mid-delete).
class RecordingStore : public ObjectStore {
 public:
  explicit RecordingStore(ObjectStore& inner) : inner_(inner) {}
  std::string Describe(absl::string_view key) const override { return inner_.Describe(key); }
  absl::Status Put(absl::string_view key, absl::string_view body) override {
    Note(absl::StrCat("put ", key));
    return inner_.Put(key, body);
  }
  absl::StatusOr<size_t> Get(absl::string_view key, absl::Span<char> into,
                             std::optional<ObjectRange> range) override {
    return inner_.Get(key, into, range);
  }
  absl::StatusOr<ObjectInfo> Head(absl::string_view key) override { return inner_.Head(key); }
  absl::StatusOr<ObjectListing> List(absl::string_view prefix,
                                     absl::string_view delimiter) override {
    return inner_.List(prefix, delimiter);
  }
  absl::Status Delete(absl::string_view key) override {
    {
      absl::MutexLock lock(&mu_);
      if (deletes_left_ == 0) {
        return absl::UnavailableError(absl::StrCat("injected: delete of ", key));
      }
      if (deletes_left_ > 0) --deletes_left_;
    }
    Note(absl::StrCat("delete ", key));
    return inner_.Delete(key);
  }
  absl::StatusOr<int> AbortUnfinished(absl::string_view prefix,
                                      absl::Time started_before) override {
    return inner_.AbortUnfinished(prefix, started_before);
  }

  void FailDeletesAfter(int n) {
    absl::MutexLock lock(&mu_);
    deletes_left_ = n;
  }
  std::vector<std::string> Calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  void Note(std::string call) {
    absl::MutexLock lock(&mu_);
    calls_.push_back(std::move(call));
  }
  ObjectStore& inner_;
  absl::Mutex mu_;
  std::vector<std::string> calls_ ABSL_GUARDED_BY(mu_);
  int deletes_left_ ABSL_GUARDED_BY(mu_) = -1;  // -1: no failures
};

v1::Manifest NodeManifest(const std::string& checkpoint, int64_t created) {
  v1::Manifest m;
  m.set_format_version(1);
  m.set_job(kJob);
  m.set_checkpoint(checkpoint);
  m.set_node_id(0);
  m.set_nodes(1);
  m.set_world_size(1);
  m.set_checksum_block_bytes(1 << 20);
  m.add_replica_sets()->add_ranks(0);
  m.set_created_unix_micros(created);
  v1::DataFile* file = m.add_files();
  file->set_name(kData);
  file->set_size(4096);
  file->set_data_start(4096);
  return m;
}

std::string Key(const std::string& checkpoint, absl::string_view rest) {
  return absl::StrCat(kJob, "/", checkpoint, "/", rest);
}

// Writes a checkpoint's objects as the remote tier does: the data file and
// the node manifest, and if `committed` the group record, COMMIT and the
// group's notice; `latest` moves remote LATEST to it.
void Upload(ObjectStore& store, const std::string& checkpoint, int64_t micros, bool committed,
            bool latest = false) {
  REQUIRE(store.Put(Key(checkpoint, kData), std::string(4096, 'x')).ok());
  const v1::Manifest manifest = NodeManifest(checkpoint, micros);
  REQUIRE(store.Put(Key(checkpoint, kManifest), FrameMessage(kNodeManifestMagic, manifest)).ok());
  if (!committed) return;
  REQUIRE(store.Put(Key(checkpoint, kRecord), "group record").ok());
  v1::CommitRecord record;
  record.set_format_version(1);
  record.add_node_manifests("node-0000.manifest");
  *record.mutable_index() = manifest;
  record.mutable_index()->clear_node_id();
  record.set_committed_unix_micros(micros + 1);
  REQUIRE(store.Put(Key(checkpoint, "COMMIT"), FrameMessage(kCommitMagic, record)).ok());
  REQUIRE(store.Put(Key(checkpoint, kNotice), "").ok());
  if (latest) {
    REQUIRE(store.Put(absl::StrCat(kJob, "/LATEST"), absl::StrCat(checkpoint, "\n", micros + 1,
                                                                  "\n"))
                .ok());
  }
}

std::set<std::string> Keys(ObjectStore& store, const std::string& prefix = "") {
  absl::StatusOr<ObjectListing> listing = store.List(prefix);
  REQUIRE(listing.ok());
  std::set<std::string> keys;
  for (const ObjectInfo& o : listing->objects) keys.insert(o.key);
  return keys;
}

bool Has(ObjectStore& store, const std::string& checkpoint) {
  return !Keys(store, absl::StrCat(kJob, "/", checkpoint, "/")).empty();
}

constexpr int64_t kSecond = 1'000'000;

RemoteRetentionOptions Keep(uint32_t n) {
  RemoteRetentionOptions options;
  options.keep_last = n;
  options.clock_skew = absl::Seconds(1);
  return options;
}

TEST_CASE("remote retention keeps the newest N committed checkpoints and deletes the older ones",
          "[remote_retention]") {
  InMemoryObjectStore memory;
  Upload(memory, "step-1", 1 * kSecond, true);
  Upload(memory, "step-2", 2 * kSecond, true);
  Upload(memory, "step-3", 3 * kSecond, true);
  Upload(memory, "step-4", 4 * kSecond, true, /*latest=*/true);
  RemoteCommitCache cache;
  absl::StatusOr<RemoteRetentionResult> result =
      ApplyRemoteRetention(memory, kJob, "step-4", {}, Keep(2), &cache);
  REQUIRE(result.ok());
  CHECK(result->deleted == std::vector<std::string>{"step-1", "step-2"});
  CHECK(result->objects_deleted == 8);  // 4 objects each besides COMMIT and the marker
  CHECK_FALSE(Has(memory, "step-1"));
  CHECK_FALSE(Has(memory, "step-2"));
  CHECK(Has(memory, "step-3"));
  CHECK(Has(memory, "step-4"));
  CHECK(Keys(memory).count("job/LATEST") == 1);
  // The cache keeps the survivors' COMMIT times only.
  CHECK(cache.size() == 2);

  SECTION("keep_last 0 keeps everything") {
    Upload(memory, "step-5", 5 * kSecond, true, true);
    absl::StatusOr<RemoteRetentionResult> none =
        ApplyRemoteRetention(memory, kJob, "step-5", {}, Keep(0));
    REQUIRE(none.ok());
    CHECK(none->deleted.empty());
    CHECK(Has(memory, "step-3"));
  }
}

TEST_CASE("remote retention deletes a generation a newer committed one replaced, "
          "with keep_last 0 too, and leaves remnants to keep_last",
          "[remote_retention]") {
  for (uint32_t keep_last : {0u, 1u}) {
    INFO("keep_last " << keep_last);
    InMemoryObjectStore memory;
    Upload(memory, "other", 1 * kSecond, true);
    Upload(memory, "x", 2 * kSecond, true);
    Upload(memory, "x~1", 3 * kSecond, false);  // a remnant, older than LATEST's
    Upload(memory, "x~2", 10 * kSecond, true, /*latest=*/true);
    absl::StatusOr<RemoteRetentionResult> result =
        ApplyRemoteRetention(memory, kJob, "x~2", {}, Keep(keep_last));
    REQUIRE(result.ok());
    // Oldest first; keep_last 1 keeps x~2, the replaced x does not count.
    std::vector<std::string> expected{"x"};
    if (keep_last == 1) expected.insert(expected.begin(), "other");
    CHECK(result->deleted == expected);
    CHECK_FALSE(Has(memory, "x"));
    CHECK(Has(memory, "x~2"));
    CHECK(Has(memory, "other") == (keep_last == 0));
    CHECK(Has(memory, "x~1") == (keep_last == 0));
  }
}

TEST_CASE("remote retention deletes the DELETING marker first, COMMIT next, the data files last",
          "[remote_retention]") {
  InMemoryObjectStore memory;
  RecordingStore store(memory);
  Upload(memory, "step-1", 1 * kSecond, true);
  Upload(memory, "step-2", 2 * kSecond, true, true);
  REQUIRE(ApplyRemoteRetention(store, kJob, "step-2", {}, Keep(1)).ok());
  CHECK(store.Calls() == std::vector<std::string>{
                             "put job/step-1/DELETING",
                             "delete job/step-1/COMMIT",
                             "delete job/step-1/g-0000000/COMMITTED",
                             "delete job/step-1/groups/g-0000000.manifests",
                             "delete job/step-1/g-0000000/node-0000000.manifest",
                             "delete job/step-1/shard-00000-of-00001.safetensors",
                             "delete job/step-1/DELETING",
                         });
}

TEST_CASE("remote retention never deletes the checkpoint remote LATEST names, whatever the clocks",
          "[remote_retention]") {
  InMemoryObjectStore memory;
  // LATEST's checkpoint has the oldest commit time (a skewed clock).
  Upload(memory, "step-9", 1 * kSecond, true, /*latest=*/true);
  Upload(memory, "step-1", 5 * kSecond, true);
  Upload(memory, "step-2", 6 * kSecond, true);
  absl::StatusOr<RemoteRetentionResult> result =
      ApplyRemoteRetention(memory, kJob, "step-9", {}, Keep(1));
  REQUIRE(result.ok());
  CHECK(result->deleted == std::vector<std::string>{"step-1"});
  CHECK(Has(memory, "step-9"));
  CHECK(Has(memory, "step-2"));
}

TEST_CASE("remote retention never deletes a checkpoint whose upload is in flight here",
          "[remote_retention]") {
  InMemoryObjectStore memory;
  Upload(memory, "step-1", 1 * kSecond, true);
  Upload(memory, "step-2", 2 * kSecond, false);  // uncommitted, older than LATEST
  Upload(memory, "step-3", 30 * kSecond, true, true);
  absl::StatusOr<RemoteRetentionResult> result =
      ApplyRemoteRetention(memory, kJob, "step-3", {"step-1", "step-2"}, Keep(1));
  REQUIRE(result.ok());
  CHECK(result->deleted.empty());
  CHECK(result->remnants.empty());
  CHECK(Has(memory, "step-1"));
  CHECK(Has(memory, "step-2"));
  // Once they are no longer in flight, the next pass takes both.
  result = ApplyRemoteRetention(memory, kJob, "step-3", {}, Keep(1));
  REQUIRE(result.ok());
  CHECK(result->deleted == std::vector<std::string>{"step-1"});
  CHECK(result->remnants == std::vector<std::string>{"step-2"});
}

TEST_CASE("remote retention leaves and reports objects ckptd does not write",
          "[remote_retention]") {
  InMemoryObjectStore memory;
  Upload(memory, "step-1", 1 * kSecond, true);
  Upload(memory, "step-2", 2 * kSecond, true, true);
  REQUIRE(memory.Put("job/step-1/notes.txt", "mine").ok());
  REQUIRE(memory.Put("job/step-1/g-0000000/extra", "mine").ok());
  REQUIRE(memory.Put("job/README", "mine").ok());
  // The node-local commit's keys (storage/tree_local_commit.h) are ckptd's.
  REQUIRE(memory.Put("job/step-1/local-commit/COMMIT", "x").ok());
  REQUIRE(memory.Put("job/step-1/local-commit/g-0000000/node-0000000.manifest", "x").ok());
  REQUIRE(memory.Put("job/step-1/local-commit/groups/g-0000000.manifests", "x").ok());
  REQUIRE(memory.Put("job/step-1/local-commit/g-0000000/COMMITTED", "").ok());
  absl::StatusOr<RemoteRetentionResult> result =
      ApplyRemoteRetention(memory, kJob, "step-2", {}, Keep(1));
  REQUIRE(result.ok());
  CHECK(result->deleted == std::vector<std::string>{"step-1"});
  CHECK(std::set<std::string>(result->foreign.begin(), result->foreign.end()) ==
        std::set<std::string>{"job/README", "job/step-1/notes.txt",
                              "job/step-1/g-0000000/extra"});
  CHECK(Keys(memory, "job/step-1/") ==
        std::set<std::string>{"job/step-1/notes.txt", "job/step-1/g-0000000/extra"});
  CHECK(Keys(memory).count("job/README") == 1);
  CHECK(IsRemoteCheckpointObject("COMMIT"));
  CHECK(IsRemoteCheckpointObject("g-0000012/node-0000123.manifest"));
  CHECK_FALSE(IsRemoteCheckpointObject("g-12/node-0000123.manifest"));
  CHECK_FALSE(IsRemoteCheckpointObject("groups/g-0000000.manifests.tmp"));
  CHECK_FALSE(IsRemoteCheckpointObject("sub/shard-0.safetensors"));
  CHECK(IsRemoteCheckpointObject("local-commit/COMMIT"));
  CHECK(IsRemoteCheckpointObject("local-commit/g-0000000/COMMITTED"));
  CHECK_FALSE(IsRemoteCheckpointObject("local-commit/shard-0.safetensors"));
  CHECK_FALSE(IsRemoteCheckpointObject("local-commit/DELETING"));
}

TEST_CASE("a remote delete cut short leaves an uncommitted checkpoint that the next pass finishes",
          "[remote_retention]") {
  InMemoryObjectStore memory;
  RecordingStore store(memory);
  Upload(memory, "step-1", 1 * kSecond, true);
  Upload(memory, "step-2", 2 * kSecond, true, true);
  for (int cut = 1; cut <= 5; ++cut) {
    CAPTURE(cut);
    Upload(memory, "step-1", 1 * kSecond, true);
    store.FailDeletesAfter(cut);  // COMMIT and cut - 1 more objects go
    CHECK_FALSE(ApplyRemoteRetention(store, kJob, "step-2", {}, Keep(1)).ok());
    // Never a committed partial checkpoint: COMMIT went first.
    CHECK_FALSE(memory.Head("job/step-1/COMMIT").ok());
    CHECK(memory.Head("job/step-1/DELETING").ok());
    CHECK(Has(memory, "step-1"));
    // The next pass (a restarted daemon's, or the next commit's) finishes it.
    store.FailDeletesAfter(-1);
    absl::StatusOr<RemoteRetentionResult> result =
        ApplyRemoteRetention(store, kJob, "step-2", {}, Keep(1));
    REQUIRE(result.ok());
    CHECK(result->remnants == std::vector<std::string>{"step-1"});
    CHECK_FALSE(Has(memory, "step-1"));
    CHECK(Has(memory, "step-2"));
  }
}

TEST_CASE("remote gc deletes uncommitted remnants older than LATEST's checkpoint only",
          "[remote_retention]") {
  InMemoryObjectStore memory;
  Upload(memory, "old", 1 * kSecond, false);
  Upload(memory, "latest", 10 * kSecond, true, true);
  Upload(memory, "racing", 10 * kSecond, false);  // within the clock skew of LATEST's
  Upload(memory, "newer", 20 * kSecond, false);   // another node may be uploading it
  // Only a data file: no node manifest tells its age.
  REQUIRE(memory.Put(Key("undated", kData), "x").ok());
  REQUIRE(memory.Put(Key("known", kData), "x").ok());
  RemoteRetentionOptions options = Keep(5);
  options.created_locally = [](const std::string& job,
                               const std::string& checkpoint) -> std::optional<int64_t> {
    if (job == kJob && checkpoint == "known") return 2 * kSecond;
    return std::nullopt;
  };
  absl::StatusOr<RemoteRetentionResult> result =
      ApplyRemoteRetention(memory, kJob, "latest", {}, options);
  REQUIRE(result.ok());
  CHECK(result->deleted.empty());
  CHECK(std::set<std::string>(result->remnants.begin(), result->remnants.end()) ==
        std::set<std::string>{"known", "old"});
  CHECK(result->kept.size() == 3);
  CHECK_FALSE(Has(memory, "old"));
  CHECK_FALSE(Has(memory, "known"));
  CHECK(Has(memory, "racing"));
  CHECK(Has(memory, "newer"));
  CHECK(Has(memory, "undated"));
  CHECK(Has(memory, "latest"));

  SECTION("nothing is deleted while remote LATEST names no committed checkpoint") {
    Upload(memory, "old", 1 * kSecond, false);
    result = ApplyRemoteRetention(memory, kJob, "newer", {}, options);
    REQUIRE(result.ok());
    CHECK(result->remnants.empty());
    CHECK(Has(memory, "old"));
  }
}

TEST_CASE("remote retention on a directory leaves no object of a deleted checkpoint",
          "[remote_retention]") {
  testing::TempDir tmp;
  absl::StatusOr<std::unique_ptr<PosixObjectStore>> dir = PosixObjectStore::Open(tmp.path());
  REQUIRE(dir.ok());
  ObjectStore& store = **dir;
  Upload(store, "step-1", 1 * kSecond, true);
  Upload(store, "step-2", 2 * kSecond, true);
  Upload(store, "step-3", 3 * kSecond, true, true);
  absl::StatusOr<RemoteRetentionResult> result =
      ApplyRemoteRetention(store, kJob, "step-3", {}, Keep(1));
  REQUIRE(result.ok());
  CHECK(result->deleted == std::vector<std::string>{"step-1", "step-2"});
  CHECK(Keys(store, "job/step-1/").empty());
  CHECK(Keys(store, "job/step-2/").empty());
  CHECK(Has(store, "step-3"));
  // A second pass finds nothing more to do.
  result = ApplyRemoteRetention(store, kJob, "step-3", {}, Keep(1));
  REQUIRE(result.ok());
  CHECK(result->deleted.empty());
  CHECK(result->remnants.empty());
}

}  // namespace
}  // namespace ckpt
