// The remote tier's commit (storage/tree_commit.h) at scale, simulated: N
// TreeCommitNodes on a virtual clock over the in-memory object store,
// every request counted by kind and by prefix per second
// (storage/counting_object_store.h), each taking `request_latency` of
// virtual time. Nodes publish their manifests at times spread uniformly
// over `publish_spread` (the stragglers of a real save), and the run
// reports when COMMIT was written, how long after it each node learned of
// it, and the request counts and peak rates. The same counts for today's
// protocol (every waiting node lists the one directory every 50 ms) are
// computed from the same publish times, for comparison.
//
// Virtual time: events (a node's Advance) run in time order; a step's
// requests take request_latency each, one after another, from the step's
// time, and the node's next step comes no earlier than its last request's
// end. What one step Puts is visible to steps that run after it, even at
// a virtual time inside its requests (optimistic by at most one step).
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "storage/counting_object_store.h"
#include "storage/tree_commit.h"

namespace ckpt {

struct CommitSimulationOptions {
  uint32_t nodes = 10'000;
  TreeCommitOptions commit;
  absl::Duration publish_spread = absl::Seconds(30);
  absl::Duration request_latency = absl::Milliseconds(20);
  uint64_t seed = 1;
  // Nodes that never publish (the checkpoint cannot commit), and nodes that
  // publish and then die (never advance again).
  std::set<uint32_t> never_publish;
  std::set<uint32_t> die_after_publish;
  // Gives up at this virtual time (past every node's timeout: a safety net).
  absl::Duration horizon = absl::Hours(2);
};

struct CommitSimulationResult {
  ObjectRequestCounts counts;
  absl::Duration last_publish;             // from the start
  std::optional<absl::Duration> commit_at;  // the first Put of COMMIT
  int commits_written = 0;                 // nodes that wrote COMMIT
  // For each node that learned of the commit: how long after commit_at.
  std::vector<absl::Duration> learn_delays;
  uint32_t failed = 0;  // nodes whose commit failed
  absl::Status first_failure;
  // Per node: OK if it learned of the commit, why it gave up if not;
  // Unknown for a node that never published or died (it never ended).
  std::vector<absl::Status> outcomes;
  uint64_t steps = 0;  // Advance calls
};

absl::StatusOr<CommitSimulationResult> SimulateTreeCommit(
    const CommitSimulationOptions& options);

// Today's protocol on the same publish times, modeled: every node that has
// published checks COMMIT (a HEAD) and lists the checkpoint's one prefix
// (ceil(published / 1000) LIST pages) every `interval` until the last node
// publishes; all on one prefix.
struct ListingCommitCounts {
  uint64_t requests = 0;
  uint64_t peak_requests_per_second = 0;  // on the one prefix
};
ListingCommitCounts ModelListingCommit(const CommitSimulationOptions& options,
                                       absl::Duration interval = absl::Milliseconds(50));

// The tiny manifest of node `node` of `nodes` that the simulation
// publishes: one data file with one chunk, valid and mergeable.
v1::Manifest SimulatedNodeManifest(uint32_t node, uint32_t nodes);

}  // namespace ckpt
