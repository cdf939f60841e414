// IsFinalPhase: whether a save's phase is one it never leaves.
//
// The daemon (which publishes progress), its watch streams (which end after
// the last message) and libckpt (which stops waiting) must agree on which
// phases end a save, so the test is written once, here, where every room
// and the client may include it. Header only: its users already link the
// generated protobuf code.
//
// Thread-safety: a pure function.
#pragma once

#include "ckpt/v1/control.pb.h"

namespace ckpt {

// COMMITTED, FAILED and CANCELLED end a save: no later phase follows them.
inline bool IsFinalPhase(v1::Phase phase) {
  return phase == v1::PHASE_COMMITTED || phase == v1::PHASE_FAILED ||
         phase == v1::PHASE_CANCELLED;
}

}  // namespace ckpt
