#include "bench/commit_scale_sim.h"

#include <algorithm>
#include <map>
#include <memory>
#include <queue>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "format/chunk_digest.h"
#include "storage/in_memory_object_store.h"

namespace ckpt {

namespace {

constexpr char kJob[] = "sim";
constexpr char kCheckpoint[] = "step-1";

// Gives each request `latency` of virtual time, from a cursor the event
// loop sets to the step's time, and makes a Put visible only once its
// request has ended in virtual time (ApplyUntil), so that no node sees an
// object before it was written. Notes when COMMIT is first written.
class VirtualTimeStore : public ObjectStore {
 public:
  VirtualTimeStore(ObjectStore& inner, absl::Duration latency, std::string commit_key)
      : inner_(inner), latency_(latency), commit_key_(std::move(commit_key)) {}

  absl::Time cursor() const { return cursor_; }
  void set_cursor(absl::Time t) { cursor_ = t; }
  std::optional<absl::Time> commit_at() const { return commit_at_; }

  // Makes the Puts that ended at or before `now` visible.
  absl::Status ApplyUntil(absl::Time now) {
    while (!pending_.empty() && pending_.begin()->first.first <= now) {
      auto node = pending_.extract(pending_.begin());
      const auto& [key, body] = node.mapped();
      if (absl::Status put = inner_.Put(key, body); !put.ok()) return put;
      if (key == commit_key_ && !commit_at_) commit_at_ = node.key().first;
    }
    return absl::OkStatus();
  }
  bool has_pending() const { return !pending_.empty(); }

  std::string Describe(absl::string_view key) const override { return inner_.Describe(key); }
  absl::Status Put(absl::string_view key, absl::string_view body) override {
    if (absl::Status valid = ValidateObjectKey(key); !valid.ok()) return valid;
    Tick();
    pending_.emplace(std::make_pair(cursor_, sequence_++),
                     std::make_pair(std::string(key), std::string(body)));
    return absl::OkStatus();
  }
  absl::StatusOr<size_t> Get(absl::string_view key, absl::Span<char> into,
                             std::optional<ObjectRange> range) override {
    Tick();
    return inner_.Get(key, into, range);
  }
  absl::StatusOr<ObjectInfo> Head(absl::string_view key) override {
    Tick();
    return inner_.Head(key);
  }
  absl::StatusOr<ObjectListing> List(absl::string_view prefix,
                                     absl::string_view delimiter) override {
    Tick();
    return inner_.List(prefix, delimiter);
  }
  absl::Status Delete(absl::string_view key) override {
    Tick();
    return inner_.Delete(key);
  }
  // `parallelism` reads at a time, each a HEAD and a GET: the batch takes
  // that many rounds of two requests.
  std::vector<absl::StatusOr<std::string>> GetSmallObjects(absl::Span<const std::string> keys,
                                                           size_t max_bytes,
                                                           int parallelism) override {
    const size_t at_once = static_cast<size_t>(std::max(parallelism, 1));
    cursor_ += latency_ * static_cast<double>(2 * ((keys.size() + at_once - 1) / at_once));
    std::vector<absl::StatusOr<std::string>> results;
    for (const std::string& key : keys) {
      results.push_back(GetSmallObject(inner_, key, max_bytes));
    }
    return results;
  }
  absl::StatusOr<int> AbortUnfinished(absl::string_view prefix,
                                      absl::Time started_before) override {
    Tick();
    return inner_.AbortUnfinished(prefix, started_before);
  }

 private:
  // The request is counted (by the store above) at its start.
  void Tick() { cursor_ += latency_; }

  ObjectStore& inner_;
  const absl::Duration latency_;
  const std::string commit_key_;
  absl::Time cursor_ = absl::UnixEpoch();
  uint64_t sequence_ = 0;
  // (end time, order) -> (key, body): Puts not yet visible.
  std::map<std::pair<absl::Time, uint64_t>, std::pair<std::string, std::string>> pending_;
  std::optional<absl::Time> commit_at_;
};

std::vector<absl::Duration> PublishTimes(const CommitSimulationOptions& options) {
  std::mt19937_64 random(options.seed);
  std::uniform_real_distribution<double> spread(0.0, 1.0);
  std::vector<absl::Duration> times(options.nodes);
  for (absl::Duration& t : times) t = options.publish_spread * spread(random);
  return times;
}

}  // namespace

v1::Manifest SimulatedNodeManifest(uint32_t node, uint32_t nodes) {
  v1::Manifest m;
  m.set_format_version(1);
  m.set_job(kJob);
  m.set_checkpoint(kCheckpoint);
  m.set_node_id(node);
  m.set_world_size(nodes);
  m.set_nodes(nodes);
  m.set_checksum_block_bytes(1 << 20);
  m.set_created_unix_micros(1'000'000 + node);
  v1::DataFile* file = m.add_files();
  file->set_name(absl::StrCat("shard-", node, ".safetensors"));
  file->set_size(4096 + 16);
  file->set_data_start(4096);
  file->set_rank(node);
  file->set_replica_set(0);
  v1::StoredTensor* t = m.add_tensors();
  t->set_fqn("w");
  t->set_dtype(v1::DTYPE_F32);
  t->add_global_shape(nodes);
  t->add_global_shape(4);
  t->add_offsets(node);
  t->add_offsets(0);
  t->add_local_shape(1);
  t->add_local_shape(4);
  t->set_file_index(0);
  t->set_file_offset(4096);
  t->set_length(16);
  t->add_block_xxh3(0x5eed0000 + node);
  v1::ReplicaSet* set = m.add_replica_sets();
  const uint32_t ranks[] = {node};
  EncodeReplicaRanks(ranks, set);
  set->set_chunk_count(1);
  set->set_chunk_list_xxh3(ChunkListDigest({IdentityOf(*t)}));
  return m;
}

absl::StatusOr<CommitSimulationResult> SimulateTreeCommit(
    const CommitSimulationOptions& options) {
  if (options.nodes == 0) return absl::InvalidArgumentError("no nodes to simulate");
  const absl::Time start = absl::UnixEpoch();
  const std::string prefix = absl::StrCat(kJob, "/", kCheckpoint, "/");
  InMemoryObjectStore memory(/*max_bytes=*/uint64_t{8} << 30);
  TreeCommitLayout layout(prefix, options.nodes, options.commit.group_size);
  VirtualTimeStore virtual_time(memory, options.request_latency, layout.CommitKey());
  CountingObjectStore counting(virtual_time, [&virtual_time] { return virtual_time.cursor(); });

  std::vector<absl::Duration> publish = PublishTimes(options);
  std::vector<std::unique_ptr<TreeCommitNode>> nodes(options.nodes);
  // (time, node): a node's next Advance; published nodes start at their
  // publish time.
  using Event = std::pair<absl::Time, uint32_t>;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events;
  CommitSimulationResult result;
  for (uint32_t n = 0; n < options.nodes; ++n) {
    if (options.never_publish.contains(n)) continue;
    result.last_publish = std::max(result.last_publish, publish[n]);
    nodes[n] = std::make_unique<TreeCommitNode>(counting, prefix,
                                                SimulatedNodeManifest(n, options.nodes),
                                                options.commit, start + publish[n]);
    events.push({start + publish[n], n});
  }
  std::vector<std::optional<absl::Time>> learned(options.nodes);
  result.outcomes.assign(options.nodes, absl::UnknownError("never ended"));
  while (!events.empty()) {
    auto [now, n] = events.top();
    events.pop();
    if (now - start > options.horizon) break;
    if (absl::Status applied = virtual_time.ApplyUntil(now); !applied.ok()) return applied;
    TreeCommitNode& node = *nodes[n];
    virtual_time.set_cursor(now);
    std::optional<absl::Time> next = node.Advance(now);
    ++result.steps;
    if (!next) {
      result.outcomes[n] = node.outcome();
      if (node.outcome().ok()) {
        learned[n] = virtual_time.cursor();
      } else {
        if (result.failed++ == 0) result.first_failure = node.outcome();
      }
      if (node.wrote_commit()) ++result.commits_written;
      continue;
    }
    if (options.die_after_publish.contains(n) && node.published()) continue;
    events.push({std::max(*next, virtual_time.cursor()), n});
  }
  if (absl::Status applied = virtual_time.ApplyUntil(absl::InfiniteFuture()); !applied.ok()) {
    return applied;
  }
  for (uint32_t n = 0; n < options.nodes; ++n) {
    if (nodes[n] && nodes[n]->wrote_commit() && !nodes[n]->done()) ++result.commits_written;
  }
  result.counts = counting.counts();
  if (std::optional<absl::Time> at = virtual_time.commit_at()) {
    result.commit_at = *at - start;
    for (const std::optional<absl::Time>& t : learned) {
      if (t) result.learn_delays.push_back(*t - *at);
    }
    std::sort(result.learn_delays.begin(), result.learn_delays.end());
  }
  return result;
}

ListingCommitCounts ModelListingCommit(const CommitSimulationOptions& options,
                                       absl::Duration interval) {
  std::vector<absl::Duration> publish = PublishTimes(options);
  std::sort(publish.begin(), publish.end());
  const absl::Duration last = publish.back();
  ListingCommitCounts counts;
  std::map<int64_t, uint64_t> per_second;
  size_t published = 0;
  for (absl::Duration t = absl::ZeroDuration(); t <= last; t += interval) {
    while (published < publish.size() && publish[published] <= t) ++published;
    const uint64_t pages = (published + 999) / 1000;
    const uint64_t requests = published * (1 + std::max<uint64_t>(pages, 1));
    counts.requests += requests;
    per_second[absl::ToInt64Seconds(t)] += requests;
  }
  for (const auto& [second, n] : per_second) {
    counts.peak_requests_per_second = std::max(counts.peak_requests_per_second, n);
  }
  return counts;
}

}  // namespace ckpt
