#include "storage/tree_commit.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/crash_point.h"
#include "common/status.h"
#include "format/manifest_check.h"
#include "format/manifest_file.h"
#include "storage/commit_protocol.h"

namespace ckpt {

namespace {

constexpr absl::string_view kGroupsDir = "groups/";
constexpr absl::string_view kNodeManifestPrefix = "node-";
constexpr absl::string_view kNodeManifestSuffix = ".manifest";
constexpr absl::string_view kGroupRecordSuffix = ".manifests";
constexpr absl::string_view kNoticeName = "COMMITTED";
constexpr int kIdDigits = 7;  // kMaxStoredNodes (2^20) has 7

std::string GroupName(uint32_t group) {
  return absl::StrCat("g-", absl::Dec(group, absl::kZeroPad7));
}

// Reads exactly kIdDigits decimal digits from the front of `text`.
std::optional<uint32_t> TakeId(absl::string_view& text) {
  if (text.size() < kIdDigits) return std::nullopt;
  uint32_t id = 0;
  for (int i = 0; i < kIdDigits; ++i) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(text[i]))) return std::nullopt;
    id = id * 10 + static_cast<uint32_t>(text[i] - '0');
  }
  text.remove_prefix(kIdDigits);
  return id;
}

// A fixed phase in [0, 1) per node (Knuth's multiplicative hash), so that
// the nodes' fallbacks spread over the interval instead of firing together.
double StaggerOf(uint32_t node) {
  return static_cast<double>(static_cast<uint32_t>(node * 2654435761u)) / 4294967296.0;
}

// Up to 10 ids, then how many more.
std::string DescribeIds(const std::vector<uint32_t>& ids) {
  constexpr size_t kShown = 10;
  std::vector<uint32_t> shown(ids.begin(), ids.begin() + std::min(ids.size(), kShown));
  std::string text = absl::StrJoin(shown, ", ");
  if (ids.size() > kShown) absl::StrAppend(&text, " and ", ids.size() - kShown, " more");
  return text;
}

// A damaged, hostile or inconsistent object, or a bad request: retrying
// cannot help.
bool IsFinal(const absl::Status& status) {
  return absl::IsDataLoss(status) || absl::IsFailedPrecondition(status) ||
         absl::IsInvalidArgument(status);
}

}  // namespace

uint32_t DefaultGroupSize(uint32_t nodes) {
  uint32_t g = static_cast<uint32_t>(std::sqrt(static_cast<double>(nodes)));
  while (static_cast<uint64_t>(g) * g < nodes) ++g;
  return std::max<uint32_t>(g, 1);
}

TreeCommitLayout::TreeCommitLayout(std::string checkpoint_prefix, uint32_t nodes,
                                   uint32_t group_size)
    : prefix_(std::move(checkpoint_prefix)),
      nodes_(std::max<uint32_t>(nodes, 1)),
      group_size_(group_size == 0 ? DefaultGroupSize(nodes_) : group_size) {}

uint32_t TreeCommitLayout::MembersOf(uint32_t group) const {
  const uint32_t first = LeaderOf(group);
  if (first >= nodes_) return 0;
  return std::min(group_size_, nodes_ - first);
}

std::string TreeCommitLayout::GroupPrefix(uint32_t group) const {
  return absl::StrCat(prefix_, GroupName(group), "/", kNodeManifestPrefix);
}

std::string TreeCommitLayout::NodeManifestKey(uint32_t node) const {
  return absl::StrCat(GroupPrefix(GroupOf(node)), absl::Dec(node, absl::kZeroPad7),
                      kNodeManifestSuffix);
}

std::string TreeCommitLayout::GroupRecordKey(uint32_t group) const {
  return absl::StrCat(GroupRecordsPrefix(), GroupName(group), kGroupRecordSuffix);
}

std::string TreeCommitLayout::GroupRecordsPrefix() const {
  return absl::StrCat(prefix_, kGroupsDir);
}

std::string TreeCommitLayout::NoticeKey(uint32_t group) const {
  return absl::StrCat(prefix_, GroupName(group), "/", kNoticeName);
}

std::string TreeCommitLayout::CommitKey() const { return absl::StrCat(prefix_, "COMMIT"); }

std::optional<uint32_t> TreeCommitLayout::NodeOfManifestKey(absl::string_view key) const {
  if (!absl::ConsumePrefix(&key, prefix_) || !absl::ConsumePrefix(&key, "g-")) {
    return std::nullopt;
  }
  std::optional<uint32_t> group = TakeId(key);
  if (!group || !absl::ConsumePrefix(&key, "/") ||
      !absl::ConsumePrefix(&key, kNodeManifestPrefix)) {
    return std::nullopt;
  }
  std::optional<uint32_t> node = TakeId(key);
  if (!node || key != kNodeManifestSuffix || *node >= nodes_ || GroupOf(*node) != *group) {
    return std::nullopt;
  }
  return node;
}

std::optional<uint32_t> TreeCommitLayout::GroupOfRecordKey(absl::string_view key) const {
  if (!absl::ConsumePrefix(&key, GroupRecordsPrefix()) || !absl::ConsumePrefix(&key, "g-")) {
    return std::nullopt;
  }
  std::optional<uint32_t> group = TakeId(key);
  if (!group || key != kGroupRecordSuffix || *group >= groups()) return std::nullopt;
  return group;
}

TreeCommitNode::TreeCommitNode(ObjectStore& store, std::string checkpoint_prefix,
                               v1::Manifest manifest, const TreeCommitOptions& options,
                               absl::Time start)
    : store_(store),
      manifest_(std::move(manifest)),
      options_(options),
      layout_(std::move(checkpoint_prefix), manifest_.nodes(), options.group_size),
      node_(manifest_.node_id()),
      group_(layout_.GroupOf(node_)),
      leader_(layout_.LeaderOf(group_) == node_),
      deadline_(start + options.timeout),
      next_fallback_(start + options.fallback_interval * (1.0 + StaggerOf(node_))) {
  if (node_ >= layout_.nodes()) {
    Finish(absl::InvalidArgumentError(absl::StrCat(
        "remote commit: node id ", node_, " is not below the node count ",
        layout_.nodes())));
  }
}

std::optional<absl::Time> TreeCommitNode::Advance(absl::Time now) {
  if (done_) return std::nullopt;
  if (now >= deadline_) {
    std::string message = absl::StrCat(
        "remote commit of ", store_.Describe(layout_.CommitKey()), " (node ", node_, " of ",
        layout_.nodes(), "): not committed within ",
        absl::FormatDuration(options_.timeout), "; waiting for ", WaitingFor());
    if (!last_failure_.ok()) {
      absl::StrAppend(&message, "; last failure: ", last_failure_.message());
    }
    Finish(absl::DeadlineExceededError(message));
    return std::nullopt;
  }
  absl::Time next = now;
  switch (phase_) {
    case Phase::kPublish: next = Publish(now); break;
    case Phase::kGatherGroup: next = GatherGroup(now); break;
    case Phase::kGatherRoot: next = GatherRoot(now); break;
    case Phase::kAwaitCommit: next = AwaitCommit(now); break;
  }
  if (done_) return std::nullopt;
  return std::min(next, deadline_);
}

absl::Time TreeCommitNode::Publish(absl::Time now) {
  absl::Status put = store_.Put(layout_.NodeManifestKey(node_),
                                FrameMessage(kNodeManifestMagic, manifest_));
  if (!put.ok()) {
    NoteFailure(put);
    return now + options_.poll_interval;
  }
  // The remote commit's steps are crash points (common/crash_point.h): a
  // daemon killed at each must resume and commit (tests/integration/
  // remote_faults_test.cc).
  CrashPoint("REMOTE", "manifest_published");
  phase_ = leader_ ? Phase::kGatherGroup : Phase::kAwaitCommit;
  return now;  // a leader whose members are all in goes on at once
}

absl::Time TreeCommitNode::GatherGroup(absl::Time now) {
  absl::StatusOr<std::vector<uint32_t>> missing = MissingMembers(group_);
  if (!missing.ok()) {
    NoteFailure(missing.status());
    return now + options_.poll_interval;
  }
  if (!missing->empty()) {
    missing_ = *std::move(missing);
    return now + options_.poll_interval;
  }
  if (absl::Status written = WriteGroupRecord(group_); !written.ok()) {
    NoteFailure(written);
    return now + options_.poll_interval;
  }
  missing_.clear();
  phase_ = node_ == 0 ? Phase::kGatherRoot : Phase::kAwaitCommit;
  return now;
}

absl::Time TreeCommitNode::GatherRoot(absl::Time now) {
  absl::StatusOr<std::vector<uint32_t>> missing = MissingGroups();
  if (!missing.ok()) {
    NoteFailure(missing.status());
  } else if (!missing->empty()) {
    missing_ = *std::move(missing);
  } else if (absl::Status written = WriteCommit(); !written.ok()) {
    NoteFailure(written);
  } else {
    missing_.clear();
    phase_ = Phase::kAwaitCommit;
    return now;  // announce it to the group at once
  }
  if (!done_ && now >= next_fallback_) Fallback(now);
  return now + options_.poll_interval;
}

absl::Time TreeCommitNode::AwaitCommit(absl::Time now) {
  const bool announces = leader_ || acting_leader_;
  absl::StatusOr<bool> seen =
      Exists(announces ? layout_.CommitKey() : layout_.NoticeKey(group_));
  if (seen.ok() && *seen) {
    if (announces) {
      // The members learn of it from the notice; one that fails to be
      // written only slows them to their fallback (they Head COMMIT).
      absl::Status notice = store_.Put(layout_.NoticeKey(group_), "");
      if (!notice.ok()) last_failure_ = notice;
    }
    Finish(absl::OkStatus());
    return now;
  }
  if (!done_ && now >= next_fallback_) Fallback(now);
  return now + options_.poll_interval;
}

void TreeCommitNode::Fallback(absl::Time now) {
  // A whole interval from now, not from the missed tick: a takeover needs
  // what it saw at two ticks to have lasted that long.
  next_fallback_ = now + options_.fallback_interval;
  const bool announces = leader_ || acting_leader_;
  if (!announces || phase_ == Phase::kGatherRoot) {
    // A member whose leader died after the commit; a root another leader
    // took over from.
    absl::StatusOr<bool> committed = Exists(layout_.CommitKey());
    if (!committed.ok() || done_) return;
    if (*committed) {
      if (phase_ == Phase::kGatherRoot) {
        phase_ = Phase::kAwaitCommit;  // announce it to group 0
      } else {
        Finish(absl::OkStatus());
      }
      return;
    }
  }
  if (!announces) {
    // A leader that died after publishing: take its place once the group
    // has been complete for a whole interval with no record.
    absl::StatusOr<bool> recorded = Exists(layout_.GroupRecordKey(group_));
    if (!recorded.ok() || done_) return;
    if (*recorded) {
      group_complete_seen_ = false;
      return;
    }
    absl::StatusOr<std::vector<uint32_t>> missing = MissingMembers(group_);
    if (!missing.ok()) {
      NoteFailure(missing.status());
      return;
    }
    if (!missing->empty()) {
      group_complete_seen_ = false;
      return;
    }
    if (!group_complete_seen_) {
      group_complete_seen_ = true;
      return;
    }
    if (absl::Status written = WriteGroupRecord(group_); !written.ok()) {
      NoteFailure(written);
      return;
    }
    acting_leader_ = true;
    return;
  }
  if (phase_ == Phase::kAwaitCommit) {
    // A root that died: merge and commit once every group's record has
    // been there for a whole interval with no COMMIT.
    absl::StatusOr<std::vector<uint32_t>> missing = MissingGroups();
    if (!missing.ok()) {
      NoteFailure(missing.status());
      return;
    }
    if (!missing->empty()) {
      groups_complete_seen_ = false;
      return;
    }
    if (!groups_complete_seen_) {
      groups_complete_seen_ = true;
      return;
    }
    if (absl::Status written = WriteCommit(); !written.ok()) NoteFailure(written);
  }
}

absl::StatusOr<std::vector<uint32_t>> TreeCommitNode::MissingMembers(uint32_t group) {
  ASSIGN_OR_RETURN(ObjectListing listing, store_.List(layout_.GroupPrefix(group)));
  std::set<uint32_t> present;
  for (const ObjectInfo& object : listing.objects) {
    if (std::optional<uint32_t> node = layout_.NodeOfManifestKey(object.key)) {
      present.insert(*node);
    }
  }
  std::vector<uint32_t> missing;
  const uint32_t first = layout_.LeaderOf(group);
  for (uint32_t n = first; n < first + layout_.MembersOf(group); ++n) {
    if (!present.contains(n)) missing.push_back(n);
  }
  return missing;
}

absl::Status TreeCommitNode::WriteGroupRecord(uint32_t group) {
  const uint32_t first = layout_.LeaderOf(group);
  std::vector<uint32_t> ids;
  std::vector<std::string> keys;
  for (uint32_t n = first; n < first + layout_.MembersOf(group); ++n) {
    if (n == node_ || fetched_manifests_.contains(n)) continue;
    ids.push_back(n);
    keys.push_back(layout_.NodeManifestKey(n));
  }
  std::vector<absl::StatusOr<std::string>> read =
      store_.GetSmallObjects(keys, kMaxFramedFileBytes, options_.read_parallelism);
  // Every manifest read is kept, so that a retry reads only the rest; the
  // first failure comes back once they are.
  absl::Status first_failure;
  for (size_t i = 0; i < ids.size(); ++i) {
    absl::Status parsed = [&]() -> absl::Status {
      RETURN_IF_ERROR(read[i].status());
      ASSIGN_OR_RETURN(v1::Manifest manifest,
                       ParseNodeManifestFile(*read[i], store_.Describe(keys[i])));
      if (manifest.node_id() != ids[i]) {
        return absl::DataLossError(absl::StrCat(store_.Describe(keys[i]), " holds node ",
                                                manifest.node_id(), "'s manifest, not node ",
                                                ids[i], "'s"));
      }
      fetched_manifests_.emplace(ids[i], std::move(manifest));
      return absl::OkStatus();
    }();
    if (first_failure.ok()) first_failure = parsed;
  }
  RETURN_IF_ERROR(first_failure);
  v1::ManifestGroup record;
  record.set_format_version(1);
  record.set_group(group);
  for (uint32_t n = first; n < first + layout_.MembersOf(group); ++n) {
    *record.add_manifests() = n == node_ ? manifest_ : fetched_manifests_.at(n);
  }
  RETURN_IF_ERROR(
      store_.Put(layout_.GroupRecordKey(group), FrameMessage(kManifestGroupMagic, record)));
  CrashPoint("REMOTE", "group_gathered");
  fetched_manifests_.clear();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint32_t>> TreeCommitNode::MissingGroups() {
  ASSIGN_OR_RETURN(ObjectListing listing, store_.List(layout_.GroupRecordsPrefix()));
  std::set<uint32_t> present;
  for (const ObjectInfo& object : listing.objects) {
    if (std::optional<uint32_t> group = layout_.GroupOfRecordKey(object.key)) {
      present.insert(*group);
    }
  }
  std::vector<uint32_t> missing;
  for (uint32_t g = 0; g < layout_.groups(); ++g) {
    if (!present.contains(g)) missing.push_back(g);
  }
  return missing;
}

absl::Status TreeCommitNode::WriteCommit() {
  std::vector<uint32_t> groups;
  std::vector<std::string> keys;
  for (uint32_t g = 0; g < layout_.groups(); ++g) {
    if (fetched_groups_.contains(g)) continue;
    groups.push_back(g);
    keys.push_back(layout_.GroupRecordKey(g));
  }
  std::vector<absl::StatusOr<std::string>> read =
      store_.GetSmallObjects(keys, kMaxFramedFileBytes, options_.read_parallelism);
  absl::Status first_failure;
  for (size_t i = 0; i < groups.size(); ++i) {
    absl::Status parsed = [&]() -> absl::Status {
      RETURN_IF_ERROR(read[i].status());
      const uint32_t g = groups[i];
      const std::string what = store_.Describe(keys[i]);
      v1::ManifestGroup record;
      RETURN_IF_ERROR(ParseFramedMessage(kManifestGroupMagic, *read[i], what, &record));
      const uint32_t first = layout_.LeaderOf(g);
      if (record.format_version() != 1 || record.group() != g ||
          record.manifests_size() != static_cast<int>(layout_.MembersOf(g))) {
        return absl::DataLossError(absl::StrCat(
            what, ": not group ", g, "'s record of ", layout_.MembersOf(g),
            " manifests (format ", record.format_version(), ", group ", record.group(),
            ", ", record.manifests_size(), " manifests)"));
      }
      for (int m = 0; m < record.manifests_size(); ++m) {
        const v1::Manifest& manifest = record.manifests(m);
        RETURN_IF_ERROR(ValidateManifest(manifest, what));
        if (manifest.node_id() != first + static_cast<uint32_t>(m)) {
          return absl::DataLossError(absl::StrCat(what, ": manifest ", m, " is node ",
                                                  manifest.node_id(), "'s, not node ",
                                                  first + m, "'s"));
        }
      }
      fetched_groups_.emplace(g, std::move(record));
      return absl::OkStatus();
    }();
    if (first_failure.ok()) first_failure = parsed;
  }
  RETURN_IF_ERROR(first_failure);
  std::vector<v1::Manifest> manifests;
  manifests.reserve(layout_.nodes());
  for (const auto& [g, record] : fetched_groups_) {
    manifests.insert(manifests.end(), record.manifests().begin(), record.manifests().end());
  }
  ASSIGN_OR_RETURN(v1::CommitRecord commit, MergeNodeManifests(std::move(manifests)));
  RETURN_IF_ERROR(store_.Put(layout_.CommitKey(), FrameMessage(kCommitMagic, commit)));
  CrashPoint("REMOTE", "commit_written");
  fetched_groups_.clear();
  wrote_commit_ = true;
  return absl::OkStatus();
}

absl::StatusOr<bool> TreeCommitNode::Exists(absl::string_view key) {
  absl::StatusOr<ObjectInfo> info = store_.Head(key);
  if (info.ok()) return true;
  if (absl::IsNotFound(info.status())) return false;
  NoteFailure(info.status());
  return info.status();
}

void TreeCommitNode::Finish(absl::Status status) {
  done_ = true;
  outcome_ = std::move(status);
}

void TreeCommitNode::NoteFailure(const absl::Status& status) {
  if (IsFinal(status)) {
    Finish(absl::Status(status.code(),
                        absl::StrCat("remote commit of ", store_.Describe(layout_.CommitKey()),
                                     " (node ", node_, " of ", layout_.nodes(),
                                     "): ", status.message())));
    return;
  }
  last_failure_ = status;
}

std::string TreeCommitNode::WaitingFor() const {
  switch (phase_) {
    case Phase::kPublish:
      return absl::StrCat("its own manifest to be written to ",
                          store_.Describe(layout_.NodeManifestKey(node_)));
    case Phase::kGatherGroup:
      return absl::StrCat("the manifests of group ", group_, "'s nodes ",
                          DescribeIds(missing_));
    case Phase::kGatherRoot: {
      std::vector<uint32_t> leaders;
      for (uint32_t g : missing_) leaders.push_back(layout_.LeaderOf(g));
      return absl::StrCat("the records of groups ", DescribeIds(missing_),
                          " (gathered by nodes ", DescribeIds(leaders), ")");
    }
    case Phase::kAwaitCommit:
      return absl::StrCat(store_.Describe(layout_.CommitKey()), " (announced in ",
                          store_.Describe(layout_.NoticeKey(group_)), ")");
  }
  return "";
}

absl::Status RunTreeCommit(TreeCommitNode& node) {
  while (std::optional<absl::Time> next = node.Advance(absl::Now())) {
    absl::SleepFor(*next - absl::Now());
  }
  return node.outcome();
}

}  // namespace ckpt
