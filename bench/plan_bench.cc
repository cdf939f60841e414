// ckpt-plan-bench: the cost of node planning and of the commit at scale.
//
//   ckpt-plan-bench [--nodes 16,256,4096] [--ranks-per-node 8]
//                   [--shard-degree 64] [--layout llama-70b] [--dir DIR]
//
// For each node count: builds the chunks node 0's ranks hold in an HSDP job
// (shard degree F, replicate degree = world / F, a 70B-style layout at full
// size, plus the scalar every rank holds), times NodePlanner over them (what
// a daemon does when its ranks define their layouts), and reports node 0's
// manifest size and an estimate of the merged index (every node's chunks and
// files, plus the job's distinct replica sets once). With --dir it also times what a committing node does
// on the file system: list a directory of `nodes` manifests and open and
// read each one. Prints one JSON object per node count.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/layout.h"
#include "ckpt/v1/manifest.pb.h"
#include "format/chunk_digest.h"
#include "plan/node_planner.h"

namespace {

double Ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

std::vector<ckpt::v1::TensorItem> Items(const std::vector<ckpt::bench::Chunk>& chunks) {
  std::vector<ckpt::v1::TensorItem> items;
  uint64_t offset = 0;
  for (const auto& c : chunks) {
    ckpt::v1::TensorItem item;
    item.set_fqn(c.fqn);
    item.set_dtype(c.dtype);
    for (uint64_t d : c.global_shape) item.add_global_shape(d);
    for (uint64_t d : c.offsets) item.add_offsets(d);
    for (uint64_t d : c.local_shape) item.add_local_shape(d);
    for (uint32_t r : c.replicas) item.add_replica_ranks(r);
    item.mutable_memory()->set_offset(offset);
    item.mutable_memory()->set_length(c.bytes);
    offset += c.bytes;
    items.push_back(std::move(item));
  }
  return items;
}

struct ManifestSize {
  uint64_t node_manifest = 0;  // node 0's, replica sets included
  uint64_t chunks_and_files = 0;  // of it, without the replica sets
};

// The serialized size of node 0's manifest: its stored chunks (with one
// checksum per MiB, as the daemon writes them), its files and the replica
// sets its ranks are in (each once, as BuildNodeManifest dedupes them).
ManifestSize NodeManifestBytes(const std::vector<std::vector<ckpt::v1::TensorItem>>& ranks,
                               const std::vector<ckpt::RankPlan>& plans) {
  ckpt::v1::Manifest m;
  std::set<std::vector<uint32_t>> seen;
  for (size_t r = 0; r < plans.size(); ++r) {
    for (const ckpt::PlannedFile& file : plans[r].files) {
      ckpt::v1::DataFile* f = m.add_files();
      f->set_name(file.name);
      f->set_size(file.layout.file_size);
      f->set_data_start(file.layout.data_start);
      for (size_t i : file.items) {
        const ckpt::v1::TensorItem& item = ranks[r][i];
        ckpt::v1::StoredTensor* t = m.add_tensors();
        t->set_fqn(item.fqn());
        t->set_dtype(item.dtype());
        *t->mutable_global_shape() = item.global_shape();
        *t->mutable_offsets() = item.offsets();
        *t->mutable_local_shape() = item.local_shape();
        t->set_file_offset(file.layout.data_start);
        t->set_length(item.memory().length());
        const uint64_t blocks = std::max<uint64_t>(1, (item.memory().length() + (1 << 20) - 1) >> 20);
        for (uint64_t b = 0; b < blocks; ++b) t->add_block_xxh3(b * 0x9e3779b97f4a7c15ull);
      }
    }
  }
  ManifestSize size;
  size.chunks_and_files = m.ByteSizeLong();
  for (const ckpt::RankPlan& plan : plans) {
    for (const ckpt::ReplicaSetSummary& set : plan.sets) {
      if (!seen.insert(set.ranks).second) continue;
      ckpt::v1::ReplicaSet* out = m.add_replica_sets();
      ckpt::EncodeReplicaRanks(set.ranks, out);
      out->set_chunk_count(set.chunk_count);
      out->set_chunk_list_xxh3(set.chunk_list_xxh3);
    }
  }
  size.node_manifest = m.ByteSizeLong();
  return size;
}

// Bytes the job's distinct replica sets take in the merged index: F shard
// groups of R ranks and the set of every rank.
uint64_t ReplicaSetBytes(uint32_t world, uint32_t shards) {
  ckpt::v1::Manifest m;
  std::vector<uint32_t> ranks;
  for (uint32_t s = 0; s < shards; ++s) {
    ranks.clear();
    for (uint32_t r = s; r < world; r += shards) ranks.push_back(r);
    ckpt::EncodeReplicaRanks(ranks, m.add_replica_sets());
  }
  ranks.clear();
  for (uint32_t r = 0; r < world; ++r) ranks.push_back(r);
  ckpt::EncodeReplicaRanks(ranks, m.add_replica_sets());
  return m.ByteSizeLong();
}

// Lists `dir` and reads every file in it, as TryCommit does with the node
// manifests; returns milliseconds.
double ListAndRead(const std::string& dir) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<char> buf(1 << 16);
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const int fd = open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    while (read(fd, buf.data(), buf.size()) > 0) {
    }
    close(fd);
  }
  return Ms(std::chrono::steady_clock::now() - t0);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<uint32_t> node_counts = {16, 256, 4096};
  uint32_t ranks_per_node = 8, shard_degree = 64;
  std::string layout = "llama-70b", dir;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    bool ok = true;
    if (flag == "--nodes") {
      node_counts.clear();
      for (absl::string_view n : absl::StrSplit(value, ',')) {
        uint32_t v = 0;
        ok = ok && absl::SimpleAtoi(n, &v);
        node_counts.push_back(v);
      }
    } else if (flag == "--ranks-per-node") {
      ok = absl::SimpleAtoi(value, &ranks_per_node);
    } else if (flag == "--shard-degree") {
      ok = absl::SimpleAtoi(value, &shard_degree);
    } else if (flag == "--layout") {
      layout = value;
    } else if (flag == "--dir") {
      dir = value;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "bad flag %s %s\n", flag.c_str(), value.c_str());
      return 2;
    }
  }
  for (uint32_t nodes : node_counts) {
    ckpt::bench::LayoutSpec spec;
    spec.preset = layout;
    spec.world = nodes * ranks_per_node;
    spec.replicas = std::max<uint32_t>(1, spec.world / shard_degree);
    spec.bytes_per_rank = 1ull << 30;  // shapes only; nothing is allocated
    if (!ckpt::bench::ValidateLayoutSpec(spec).ok()) {
      std::fprintf(stderr, "shard degree %u does not divide world %u\n",
                   shard_degree, spec.world);
      return 2;
    }
    const auto tensors = ckpt::bench::GlobalTensors(spec);
    // Node 0's ranks; chunk construction is the trainer's side, not timed.
    std::vector<std::vector<ckpt::v1::TensorItem>> ranks;
    for (uint32_t r = 0; r < ranks_per_node; ++r) {
      ranks.push_back(Items(ckpt::bench::ChunksOfRank(spec, tensors, r)));
    }
    size_t chunks = 0, files = 0, foreign = 0;
    double best_ms = 1e30;
    std::vector<ckpt::RankPlan> plans;
    for (int rep = 0; rep < 5; ++rep) {
      chunks = files = foreign = 0;
      plans.clear();
      const auto t0 = std::chrono::steady_clock::now();
      for (uint32_t r = 0; r < ranks_per_node; ++r) {
        auto plan = ckpt::PlanRank(r, spec.world, ranks[r]);
        if (!plan.ok()) {
          std::fprintf(stderr, "%s\n", plan.status().ToString().c_str());
          return 1;
        }
        chunks += ranks[r].size();
        files += plan->files.size();
        foreign += plan->foreign.size();
        plans.push_back(*std::move(plan));
      }
      best_ms = std::min(best_ms, Ms(std::chrono::steady_clock::now() - t0));
    }
    const ManifestSize manifest = NodeManifestBytes(ranks, plans);
    // Every node stores about as much as node 0; replica sets appear once.
    const uint64_t index_bytes =
        manifest.chunks_and_files * nodes + ReplicaSetBytes(spec.world, spec.world / spec.replicas);
    double list_ms = -1;
    if (!dir.empty()) {
      // `nodes` manifest-sized files, as a committing node finds them.
      const std::string d = dir + "/nodes-" + std::to_string(nodes);
      std::filesystem::create_directories(d);
      const std::string payload(4096, 'm');
      for (uint32_t n = 0; n < nodes; ++n) {
        const std::string path = d + "/node-" + std::to_string(n) + ".manifest";
        const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0 || write(fd, payload.data(), payload.size()) < 0) return 1;
        close(fd);
      }
      list_ms = ListAndRead(d);
      std::filesystem::remove_all(d);
    }
    std::printf(
        "{\"nodes\": %u, \"ranks_per_node\": %u, \"world\": %u, \"shard_degree\": "
        "%u, \"replicas\": %u, \"tensors\": %zu, \"chunks_per_node\": %zu, "
        "\"files_per_node\": %zu, \"foreign_chunks_per_node\": %zu, "
        "\"plan_ms_per_node\": %.3f, \"node_manifest_bytes\": %llu, "
        "\"index_bytes_estimate\": %llu, \"list_and_read_manifests_ms\": %.3f}\n",
        nodes, ranks_per_node, spec.world, shard_degree, spec.replicas,
        tensors.size(), chunks, files, foreign, best_ms,
        static_cast<unsigned long long>(manifest.node_manifest),
        static_cast<unsigned long long>(index_bytes), list_ms);
  }
  return 0;
}
