// TreeCommit: the commit of a checkpoint in the remote tier, in a number of
// storage requests that grows linearly with the nodes and a request rate
// per key prefix that stays under S3's limits (5,500 GET/HEAD and 3,500
// PUT a second per prefix) at 10,000 nodes, with every node learning of the
// commit within a second of it. Storage stays the only meeting point of
// the nodes: no messages between them.
//
// Today's local commit (storage/commit_protocol.h) has every waiting node
// list the checkpoint directory every 50 ms: at 10,000 nodes that is
// 200,000 listings a second of one prefix, each of 10 pages. Here the nodes
// are cut into groups of `group_size` (√nodes by default: 100 groups of 100
// at 10,000) and only a few of them list:
//
//   1. every node Puts its manifest:   <ckpt>/g-GGGGGGG/node-NNNNNNN.manifest
//   2. each group's leader (its lowest node id) lists its group's prefix
//      every poll_interval; once its members' manifests are all there it
//      reads them and Puts them as one record:
//                                      <ckpt>/groups/g-GGGGGGG.manifests
//   3. the root (node 0) lists <ckpt>/groups/ every poll_interval; once
//      every group's record is there it reads them, merges every manifest
//      (MergeNodeManifests: a pure function, so whoever merges writes the
//      same bytes) and Puts <ckpt>/COMMIT: the checkpoint is committed.
//   4. each leader Heads COMMIT every poll_interval once its group's record
//      is written, and on seeing it Puts its group's notice
//                                      <ckpt>/g-GGGGGGG/COMMITTED
//      while every other member Heads that notice every poll_interval.
//      A member learns of the commit within two poll intervals and two
//      requests of it (0.4 s each by default: under a second).
//
// Rates at 10,000 nodes, poll_interval 0.4 s: a group's notice is Headed
// 250 times a second (its own prefix), COMMIT 250 times a second by the
// leaders; listings are 2.5 a second per group prefix. Requests per
// checkpoint: 2 per node to publish and gather, 2 per group to gather and
// notify, plus the polls of the wait (nodes × wait / poll_interval).
// bench/commit_scale_sim.cc counts them at 10,000 nodes.
//
// Failures that would stall a plain tree are covered by slow fallbacks,
// each at most every fallback_interval per node and staggered by node id
// (so 10,000 nodes spread them over the interval instead of firing
// together): a member Heads COMMIT itself (a leader that died after the
// commit); a member whose group has no record though all its manifests
// have been there for a fallback interval gathers the group itself (a
// leader that died after publishing); a leader that sees every group's
// record for a fallback interval with no COMMIT merges and commits itself
// (a root that died). Concurrent gatherers write the same bytes, so a
// takeover that races the slow original is harmless. A node that never
// publishes means the checkpoint never commits (as locally): every node
// gives up after `timeout`, naming what it waited for.
//
// TreeCommitNode is a state machine driven by its caller's clock (Advance
// at or after the time it asked for), so that the daemon runs it on its
// commit thread, and the scale simulation runs 10,000 of them on a virtual
// clock. Requests that fail are retried at the next poll (the S3 driver
// has already retried them by its own policy) until the timeout; the last
// failure is named in the timeout's error. A manifest or record that is
// damaged, hostile or inconsistent ends the node's commit at once.
//
// Thread-safety: a TreeCommitNode is used by one thread at a time; the
// store must be thread-safe (every driver is).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "ckpt/v1/manifest.pb.h"
#include "storage/object_store.h"

namespace ckpt {

inline constexpr absl::string_view kManifestGroupMagic = "CKPTGRP1";

struct TreeCommitOptions {
  uint32_t group_size = 0;  // 0: the smallest g with g * g >= nodes
  absl::Duration poll_interval = absl::Milliseconds(400);
  absl::Duration fallback_interval = absl::Seconds(10);
  absl::Duration timeout = absl::Minutes(30);
  // Manifests and group records read at once by a gather.
  int read_parallelism = 32;
};

// The keys of one checkpoint's commit, below its prefix ("job/step-100/").
class TreeCommitLayout {
 public:
  TreeCommitLayout(std::string checkpoint_prefix, uint32_t nodes, uint32_t group_size);

  uint32_t nodes() const { return nodes_; }
  uint32_t group_size() const { return group_size_; }
  uint32_t groups() const { return (nodes_ + group_size_ - 1) / group_size_; }
  uint32_t GroupOf(uint32_t node) const { return node / group_size_; }
  uint32_t LeaderOf(uint32_t group) const { return group * group_size_; }
  // Node ids of `group`: [LeaderOf(group), LeaderOf(group) + MembersOf(group)).
  uint32_t MembersOf(uint32_t group) const;

  std::string NodeManifestKey(uint32_t node) const;
  std::string GroupPrefix(uint32_t group) const;  // lists its node manifests
  std::string GroupRecordKey(uint32_t group) const;
  std::string GroupRecordsPrefix() const;
  std::string NoticeKey(uint32_t group) const;
  std::string CommitKey() const;

  // The node id of a key NodeManifestKey made, if `key` is one.
  std::optional<uint32_t> NodeOfManifestKey(absl::string_view key) const;
  // The group of a key GroupRecordKey made, if `key` is one.
  std::optional<uint32_t> GroupOfRecordKey(absl::string_view key) const;

 private:
  const std::string prefix_;
  const uint32_t nodes_;
  const uint32_t group_size_;
};

// The smallest g with g * g >= nodes (at least 1).
uint32_t DefaultGroupSize(uint32_t nodes);

class TreeCommitNode {
 public:
  // `manifest` is this node's (its node_id and nodes fields name the node
  // and the node count); `checkpoint_prefix` ends in '/'. Starts at `start`.
  TreeCommitNode(ObjectStore& store, std::string checkpoint_prefix, v1::Manifest manifest,
                 const TreeCommitOptions& options, absl::Time start);

  // Does what is due at `now` (requests included) and returns the time at
  // which to call again; nullopt once done (see outcome()).
  std::optional<absl::Time> Advance(absl::Time now);

  bool done() const { return done_; }
  // True once this node's manifest is written.
  bool published() const { return phase_ != Phase::kPublish; }
  // OK once this node knows the checkpoint is committed; the reason it gave
  // up otherwise. Meaningful once done().
  const absl::Status& outcome() const { return outcome_; }
  // True if this node wrote COMMIT (the root, or a leader that took over).
  bool wrote_commit() const { return wrote_commit_; }
  // The last request that failed and was retried (or, for a leader, its
  // notice that could not be written: its members then learn of the
  // commit at their fallback); OK if none. For the daemon's log.
  const absl::Status& last_failure() const { return last_failure_; }
  const TreeCommitLayout& layout() const { return layout_; }

 private:
  enum class Phase { kPublish, kGatherGroup, kGatherRoot, kAwaitCommit };

  // Each step: the requests of its phase at `now`; returns when to come
  // back, having moved phase_ on or finished.
  absl::Time Publish(absl::Time now);
  absl::Time GatherGroup(absl::Time now);
  absl::Time GatherRoot(absl::Time now);
  absl::Time AwaitCommit(absl::Time now);
  // The fallbacks of a waiting node (see above), every fallback_interval.
  void Fallback(absl::Time now);

  // Lists `group`'s manifests; the member ids missing (empty: complete).
  absl::StatusOr<std::vector<uint32_t>> MissingMembers(uint32_t group);
  // Reads `group`'s manifests (this node's own from memory) and Puts them
  // as the group's record.
  absl::Status WriteGroupRecord(uint32_t group);
  // Lists the group records; the groups missing (empty: complete).
  absl::StatusOr<std::vector<uint32_t>> MissingGroups();
  // Reads every group record, merges and Puts COMMIT.
  absl::Status WriteCommit();
  // Whether `key` exists; a failed request is kept as the last error.
  absl::StatusOr<bool> Exists(absl::string_view key);

  // Ends the commit with `status`.
  void Finish(absl::Status status);
  // A request failed: kept for the timeout's message, retried next poll;
  // a damaged or inconsistent object (DataLoss, FailedPrecondition,
  // InvalidArgument) ends the commit at once.
  void NoteFailure(const absl::Status& status);
  std::string WaitingFor() const;

  ObjectStore& store_;
  const v1::Manifest manifest_;
  const TreeCommitOptions options_;
  const TreeCommitLayout layout_;
  const uint32_t node_;
  const uint32_t group_;
  const bool leader_;
  const absl::Time deadline_;

  Phase phase_ = Phase::kPublish;
  bool done_ = false;
  bool wrote_commit_ = false;
  absl::Status outcome_;
  absl::Status last_failure_;
  absl::Time next_fallback_;
  // What the fallbacks saw at their previous tick: a takeover needs the
  // same at two ticks in a row (the original had a whole interval).
  bool group_complete_seen_ = false;
  // A member that gathered its group in its leader's place announces the
  // commit to the group as the leader would.
  bool acting_leader_ = false;
  bool groups_complete_seen_ = false;
  // What a gather that failed part way had read already: the next attempt
  // reads only the rest (a flaky server still lets it finish). Cleared
  // once written.
  std::map<uint32_t, v1::Manifest> fetched_manifests_;
  std::map<uint32_t, v1::ManifestGroup> fetched_groups_;
  // What the last listing found missing, for the timeout's message.
  std::vector<uint32_t> missing_;
};

// Drives `node` to its end on the real clock (tests, tools); returns its
// outcome.
absl::Status RunTreeCommit(TreeCommitNode& node);

}  // namespace ckpt
