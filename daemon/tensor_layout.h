// TensorLayout: one rank's validated tensor items, ready to save.
//
// Built once per DefineLayout (or per save that sends its items inline) and
// shared, immutable, by every save that uses it, so a save call does no
// per-item work.
#pragma once

#include <cstdint>
#include <vector>

#include "ckpt/v1/control.pb.h"
#include "daemon/safetensors_layout.h"

namespace ckpt {

struct TensorLayout {
  std::vector<v1::TensorItem> items;      // validated, request order
  std::vector<SafetensorsEntry> entries;  // one per item, file order
  std::vector<uint64_t> remote;           // peer address per item
  std::vector<uint64_t> lengths;          // bytes per item
  uint64_t tensor_bytes = 0;
  SafetensorsLayout file;                 // header and offsets of the file
};

}  // namespace ckpt
