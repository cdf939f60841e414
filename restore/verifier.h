// VerifyCheckpoint: re-reads a committed checkpoint and checks every stored
// byte against its manifest (invariant 4), for `ckptctl verify`.
//
// Each data file's size must match the manifest, and every chunk is read
// whole through ShardReader, which re-hashes every checksum block; byte
// items are re-hashed too. Problems are collected (one line each, naming
// file, item and byte range), not stopped at, so one run reports all the
// damage: the first kMaxListedDamage problems by line, the rest counted in a
// last line, so that the reply of a badly damaged checkpoint still fits a
// message (common/damage_list.h).
//
// The checkpoint is leased (CheckpointLeases) from before its COMMIT is read
// until the last byte is checked, so retention cannot delete it under the
// verify and make it report files it deleted as damage: a checkpoint that
// retention is already deleting is NotFound, as one deleted a moment
// earlier would be.
//
// Thread-safety: runs on an I/O worker; `done` is called there. The store,
// pool, workers and leases must outlive the call.
#pragma once

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "ckpt/v1/control.pb.h"
#include "io/io_workers.h"
#include "io/staging_pool.h"
#include "storage/checkpoint_leases.h"
#include "storage/checkpoint_store.h"

namespace ckpt {

void VerifyCheckpoint(const CheckpointStore* store, StagingPool* pool,
                      IoWorkers* workers, CheckpointLeases* leases,
                      std::string job, std::string checkpoint,
                      std::function<void(absl::StatusOr<v1::VerifyResponse>)> done);

}  // namespace ckpt
