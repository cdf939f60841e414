// ExportHuggingFace: a committed checkpoint's model weights in the files
// Hugging Face tools load (`ckptctl export --format hf`): each tensor whole
// (consolidated from however many shards and ranks saved it) in
// model-0000N-of-0000M.safetensors files of bounded size, and
// model.safetensors.index.json naming the file of each tensor.
//
// The bytes come through the daemon, never from the files directly: the
// exporter is rank 0 of a world of 1 of the job's session and loads each
// tensor, whole or in dim-0 slices, into one registered buffer. The daemon
// reshards the stored chunks into the slice and verifies every block
// before it delivers a byte (restore/shard_reader.h), so a damaged
// checkpoint fails the export instead of producing plausible files. Small
// tensors share a load; memory is the buffer, whatever the model's size.
//
// Files appear whole or not at all: each is written to a temporary in the
// output directory, fsynced and renamed; the index comes last, so a reader
// that finds the index finds every file it names. The output directory must
// be new or empty: nothing already there is overwritten.
//
// Thread-safety: one call at a time per Client.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "ckpt/v1/manifest.pb.h"
#include "client/ckpt_client.h"

namespace ckpt {

struct HfExportOptions {
  std::string out_dir;
  // Tensors whose fqn starts with this are exported, under their fqn
  // without it: {"model": model.state_dict(), "optim": ...} saves
  // "model.lm_head.weight", exported as "lm_head.weight". Optimizer state
  // and byte items are left out.
  std::string prefix = "model.";
  // A file holds tensors up to this many bytes (a larger tensor gets a file
  // of its own), as transformers' save_pretrained(max_shard_size="5GB").
  uint64_t max_file_bytes = 5'000'000'000;
  // The load buffer: the export's memory. A tensor row larger than it is
  // refused with the size needed.
  uint64_t buffer_bytes = 256ull << 20;
};

struct HfExportResult {
  uint32_t files = 0;
  uint32_t tensors = 0;
  uint64_t bytes = 0;  // tensor bytes written
};

// Exports the model weights of `record` (a committed checkpoint of
// `client`'s job, as Inspect returns it) into options.out_dir.
absl::StatusOr<HfExportResult> ExportHuggingFace(Client& client,
                                                 const v1::CommitRecord& record,
                                                 const HfExportOptions& options);

}  // namespace ckpt
