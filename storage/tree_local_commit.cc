#include "storage/tree_local_commit.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/crash_point.h"
#include "common/log.h"
#include "common/names.h"
#include "common/status.h"
#include "format/manifest_check.h"

namespace ckpt {
namespace {

// What identifies a stored chunk's bytes: where it is and its checksums.
std::string ChunkSignature(const v1::StoredTensor& t) {
  return absl::StrCat(t.fqn(), "@", absl::StrJoin(t.offsets(), ","), ":", t.file_offset(), "+",
                      t.length(), "#", absl::StrJoin(t.block_xxh3(), ","));
}

// The chunks `manifest` stores in each of the files named in `files`
// ("file\nchunk" lines, sorted).
std::vector<std::string> ChunksIn(const v1::Manifest& manifest,
                                  const std::set<std::string>& files) {
  std::vector<std::string> chunks;
  for (const v1::StoredTensor& t : manifest.tensors()) {
    if (t.file_index() >= static_cast<uint32_t>(manifest.files_size())) continue;
    const std::string& file = manifest.files(static_cast<int>(t.file_index())).name();
    if (files.contains(file)) chunks.push_back(absl::StrCat(file, "\n", ChunkSignature(t)));
  }
  std::sort(chunks.begin(), chunks.end());
  return chunks;
}

// OK if `record` merged this node's manifest `mine` as it is now: the same
// files with the same chunks. A meeting that an earlier, failed attempt at
// the same name reached with another manifest of this node would commit
// files this node no longer has.
absl::Status HoldsThisPart(const v1::CommitRecord& record, const v1::Manifest& mine,
                           absl::string_view where) {
  std::set<std::string> files;
  for (const v1::DataFile& f : mine.files()) files.insert(f.name());
  std::set<std::string> found;
  for (const v1::DataFile& f : record.index().files()) {
    if (!files.contains(f.name())) continue;
    found.insert(f.name());
    auto it = std::find_if(mine.files().begin(), mine.files().end(),
                           [&](const v1::DataFile& m) { return m.name() == f.name(); });
    if (it->size() != f.size() || it->data_start() != f.data_start() || it->rank() != f.rank()) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, " lists ", f.name(), " other than node ", mine.node_id(),
          " wrote it: the meeting merged another save attempt's manifest of this node"));
    }
  }
  if (found.size() != files.size() ||
      ChunksIn(record.index(), files) != ChunksIn(mine, files)) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, " does not hold node ", mine.node_id(), "'s files and chunks as this node wrote "
        "them: the meeting merged another save attempt's manifest of this node"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Duration MeetingPollInterval(uint32_t nodes) {
  return std::clamp(TreeCommitOptions().poll_interval * (static_cast<double>(nodes) / 1000),
                    absl::Milliseconds(10), TreeCommitOptions().poll_interval);
}

TreeLocalCommit::TreeLocalCommit(const CheckpointStore* store,
                                 std::shared_ptr<ObjectStore> meeting, Root root,
                                 uint32_t node_id, TreeCommitOptions options, FileOps& ops)
    : store_(store),
      meeting_(std::move(meeting)),
      root_(root),
      node_id_(node_id),
      options_(options),
      ops_(ops) {}

std::string TreeLocalCommit::MeetingPrefix(absl::string_view job, absl::string_view checkpoint) {
  return absl::StrCat(job, "/", checkpoint, "/", kLocalCommitPrefix);
}

absl::StatusOr<bool> TreeLocalCommit::TryCommit(const std::string& job,
                                                const std::string& checkpoint, uint32_t nodes) {
  std::shared_ptr<Meeting> meeting;
  {
    absl::MutexLock lock(&mu_);
    auto it = meetings_.find({job, checkpoint});
    if (it != meetings_.end()) meeting = it->second;
  }
  const absl::Time now = absl::Now();
  if (meeting == nullptr) {
    // Rolled forward at start; on a shared root, perhaps by another node.
    // Checked once, not at every poll: on a shared root every node's poll
    // would reach the one file, which the tree keeps them from doing.
    if (store_->IsCommitted(job, checkpoint)) {
      if (root_ == Root::kShared) MoveLatestTo(job, checkpoint);
      return true;
    }
    ASSIGN_OR_RETURN(v1::Manifest manifest, store_->ReadNodeManifest(job, checkpoint, node_id_));
    if (manifest.nodes() != nodes || manifest.node_id() != node_id_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "node manifest of ", job, "/", checkpoint, " names node ", manifest.node_id(), " of ",
          manifest.nodes(), ", not ", node_id_, " of ", nodes));
    }
    meeting = std::make_shared<Meeting>(Meeting{
        TreeCommitNode(*meeting_, MeetingPrefix(job, checkpoint), std::move(manifest), options_,
                       now),
        now, now + options_.fallback_interval});
    absl::MutexLock lock(&mu_);
    meetings_.emplace(std::make_pair(job, checkpoint), meeting);
  }
  if (root_ == Root::kShared && now >= meeting->next_commit_check) {
    // Once a fallback interval (as the tree's own slow checks): a COMMIT
    // the meeting did not bring, written by a node of a version that
    // commits by listing the directory (an upgrade under way; the listing
    // protocol wrote the same bytes), is found within it, not only at the
    // commit timeout.
    meeting->next_commit_check = now + options_.fallback_interval;
    if (store_->IsCommitted(job, checkpoint)) {
      Forget(job, checkpoint);
      MoveLatestTo(job, checkpoint);
      return true;
    }
  }
  if (now < meeting->next) return false;
  if (std::optional<absl::Time> next = meeting->node.Advance(now)) {
    meeting->next = *next;
    return false;
  }
  Forget(job, checkpoint);
  if (!meeting->node.outcome().ok()) {
    return Annotate(meeting->node.outcome(),
                    absl::StrCat("node ", node_id_, ": the nodes' meeting (",
                                 meeting_->Describe(MeetingPrefix(job, checkpoint)), ")"));
  }
  CrashPoint("LOCAL_COMMIT", "met");
  RETURN_IF_ERROR(WriteLocally(job, checkpoint));
  return true;
}

std::string TreeLocalCommit::Waiting(const std::string& job, const std::string& checkpoint,
                                     uint32_t nodes) {
  std::shared_ptr<Meeting> meeting;
  {
    absl::MutexLock lock(&mu_);
    auto it = meetings_.find({job, checkpoint});
    if (it != meetings_.end()) meeting = it->second;
  }
  std::string what = absl::StrCat("the ", nodes, " nodes' meeting (",
                                  meeting_->Describe(MeetingPrefix(job, checkpoint)), ")");
  if (meeting != nullptr && !meeting->node.last_failure().ok()) {
    absl::StrAppend(&what, "; its last failed request: ", meeting->node.last_failure().message());
  }
  return what;
}

void TreeLocalCommit::Forget(const std::string& job, const std::string& checkpoint) {
  absl::MutexLock lock(&mu_);
  meetings_.erase({job, checkpoint});
}

absl::Status TreeLocalCommit::WriteLocally(const std::string& job,
                                           const std::string& checkpoint) {
  const std::string key = absl::StrCat(MeetingPrefix(job, checkpoint), kCommitFileName);
  const std::string where = meeting_->Describe(key);
  ASSIGN_OR_RETURN(std::string bytes, GetSmallObject(*meeting_, key, kMaxFramedFileBytes));
  ASSIGN_OR_RETURN(v1::CommitRecord record, ParseCommitFile(bytes, where));
  if (record.index().job() != job || record.index().checkpoint() != checkpoint) {
    return absl::DataLossError(absl::StrCat(where, " holds the COMMIT of ", record.index().job(),
                                            "/", record.index().checkpoint()));
  }
  ASSIGN_OR_RETURN(v1::Manifest mine, store_->ReadNodeManifest(job, checkpoint, node_id_));
  RETURN_IF_ERROR(HoldsThisPart(record, mine, where));
  if (root_ == Root::kShared && store_->IsCommitted(job, checkpoint)) {
    // Another node got there first (the same bytes).
    MoveLatestTo(job, checkpoint);
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(store_->WriteCommit(record, ops_));
  // COMMIT is durable: committed here even if LATEST cannot move.
  absl::Status latest =
      store_->UpdateLatest(job, checkpoint, record.committed_unix_micros(), ops_);
  if (!latest.ok()) {
    LogError(LogFields().Job(job).Checkpoint(checkpoint),
             "committed but LATEST not updated: ", latest.ToString());
  }
  return absl::OkStatus();
}

void TreeLocalCommit::MoveLatestTo(const std::string& job, const std::string& checkpoint) {
  // The node that wrote COMMIT moves LATEST after it; one that crashed
  // between the two did not, and a trainer here told "committed" may load
  // "latest" at once. So this node moves it too, unless it names the
  // checkpoint already (one read, the common case).
  absl::StatusOr<std::string> latest = store_->ResolveLatest(job);
  if (latest.ok() && *latest == checkpoint) return;
  absl::Status moved = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(v1::CommitRecord record, store_->ReadCommit(job, checkpoint));
    return store_->UpdateLatest(job, checkpoint, record.committed_unix_micros(), ops_);
  }();
  if (!moved.ok()) {
    LogError(LogFields().Job(job).Checkpoint(checkpoint),
             "committed by another node; LATEST not updated here: ", moved.ToString());
  }
}

std::vector<std::string> TreeLocalCommit::RollForward() {
  std::vector<std::string> finished;
  absl::StatusOr<std::vector<v1::CheckpointInfo>> all = store_->List("");
  if (!all.ok()) {
    LogError("local commit at start: cannot list the root: ", all.status().ToString());
    return finished;
  }
  for (const v1::CheckpointInfo& c : *all) {
    if (c.committed()) continue;
    absl::StatusOr<std::vector<uint32_t>> nodes = store_->ListNodeManifests(c.job(), c.checkpoint());
    if (!nodes.ok() || std::find(nodes->begin(), nodes->end(), node_id_) == nodes->end()) {
      continue;  // this node never became durable: it can never commit
    }
    const std::string key = absl::StrCat(MeetingPrefix(c.job(), c.checkpoint()), kCommitFileName);
    absl::StatusOr<ObjectInfo> met = meeting_->Head(key);
    if (absl::IsNotFound(met.status())) continue;
    absl::Status written = met.ok() ? WriteLocally(c.job(), c.checkpoint()) : met.status();
    if (!written.ok()) {
      LogError(LogFields().Job(c.job()).Checkpoint(c.checkpoint()),
               "local commit at start: left uncommitted: ", written.ToString());
      continue;
    }
    LogInfo(LogFields().Job(c.job()).Checkpoint(c.checkpoint()),
            "local commit at start: the nodes had met; committed here");
    finished.push_back(absl::StrCat(c.job(), "/", c.checkpoint()));
  }
  return finished;
}

}  // namespace ckpt
