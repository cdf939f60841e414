// A load of a narrow column slice: "m", U8 [rows, 2], stored whole as one
// chunk of one data file, and a request for columns [column, column +
// width) of every row into a registered buffer: one copy run per row, what
// the load-plan tests and the plan budget are about.
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ckpt/v1/control.pb.h"
#include "ckpt/v1/manifest.pb.h"
#include "format/manifest_check.h"
#include "support/own_process_session.h"

namespace ckpt::testing {

inline v1::Manifest ColumnManifest(uint64_t rows) {
  v1::Manifest m;
  m.set_format_version(1);
  m.set_job("job");
  m.set_checkpoint("step-1");
  m.set_nodes(1);
  m.set_world_size(1);
  m.set_checksum_block_bytes(1 << 20);
  m.add_replica_sets()->add_ranks(0);
  v1::DataFile* f = m.add_files();
  f->set_name("shard-00001-model-00001-of-00001.safetensors");
  f->set_data_start(4096);
  f->set_size(4096 + 2 * rows);
  v1::StoredTensor* t = m.add_tensors();
  t->set_fqn("m");
  t->set_dtype(v1::DTYPE_U8);
  t->add_global_shape(rows);
  t->add_global_shape(2);
  t->add_offsets(0);
  t->add_offsets(0);
  t->add_local_shape(rows);
  t->add_local_shape(2);
  t->set_file_offset(4096);
  t->set_length(2 * rows);
  for (uint64_t b = 0; b < (2 * rows + (1 << 20) - 1) >> 20; ++b) t->add_block_xxh3(0);
  REQUIRE(ValidateManifest(m, "COMMIT").ok());
  return m;
}

struct ColumnSliceLoad {
  v1::Manifest index;
  v1::LoadRequest request;
  std::map<std::string, std::vector<int>> by_fqn;
};

// `memory` holds rows * width bytes; it is registered with `session`.
inline ColumnSliceLoad ColumnSlice(Session& session, uint64_t rows, uint64_t column,
                                   uint64_t width, uint8_t* memory) {
  ColumnSliceLoad load;
  load.index = ColumnManifest(rows);
  load.by_fqn["m"].push_back(0);
  const uint64_t length = rows * width;
  const uint64_t region = RegisterHostRegion(session, memory, length);
  load.request.set_job("job");
  load.request.set_checkpoint("step-1");
  v1::TensorItem* item = load.request.add_tensors();
  item->set_fqn("m");
  item->set_dtype(v1::DTYPE_U8);
  item->add_global_shape(rows);
  item->add_global_shape(2);
  item->add_offsets(0);
  item->add_offsets(column);
  item->add_local_shape(rows);
  item->add_local_shape(width);
  item->mutable_memory()->set_region_id(region);
  item->mutable_memory()->set_length(length);
  return load;
}

}  // namespace ckpt::testing
