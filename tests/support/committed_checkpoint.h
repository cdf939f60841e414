// A committed checkpoint made directly in a CheckpointStore, without a
// save: for tests of what the store, gc, retention and start-up recovery do
// with committed checkpoints (one node, one rank, no data files).
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <string>

#include "ckpt/v1/manifest.pb.h"
#include "storage/checkpoint_store.h"

namespace ckpt::testing {

// The COMMIT record of a one-node, one-rank checkpoint with no items.
inline v1::CommitRecord OneNodeCommitRecord(const std::string& job,
                                            const std::string& name,
                                            int64_t committed_unix_micros) {
  v1::CommitRecord record;
  record.set_format_version(1);
  record.add_node_manifests("node-0000.manifest");
  v1::Manifest& index = *record.mutable_index();
  index.set_format_version(1);
  index.set_job(job);
  index.set_checkpoint(name);
  index.set_nodes(1);
  index.set_world_size(1);
  index.set_checksum_block_bytes(1 << 20);
  index.add_replica_sets()->add_ranks(0);
  record.set_committed_unix_micros(committed_unix_micros);
  return record;
}

// Marker, COMMIT, and LATEST moved to it.
inline void CommitInStore(const CheckpointStore& store, const std::string& job,
                          const std::string& name, int64_t committed_unix_micros) {
  REQUIRE(store.PrepareForSave(job, name, 0).ok());
  REQUIRE(store.WriteCommit(OneNodeCommitRecord(job, name, committed_unix_micros)).ok());
  REQUIRE(store.UpdateLatest(job, name, committed_unix_micros).ok());
}

}  // namespace ckpt::testing
