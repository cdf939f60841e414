// TensorLayout: one rank's validated tensor items and its node plan, ready
// to save.
//
// Built once per DefineLayout (or per save that sends its items inline) and
// shared, immutable, by every save that uses it, so a save call does no
// per-item work.
#pragma once

#include <cstdint>
#include <vector>

#include "ckpt/v1/control.pb.h"
#include "plan/node_planner.h"

namespace ckpt {

struct TensorLayout {
  std::vector<v1::TensorItem> items;  // validated, request order
  std::vector<uint64_t> remote;       // peer address per item
  RankPlan plan;                      // the files this rank writes
};

}  // namespace ckpt
