// IsFinalPhase: whether a save's phase is one it never leaves; and
// RemotePhasePending: whether a committed save's remote phase still runs.
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

// Committed locally, and its commit in the remote tier has not ended yet:
// a watcher that follows the remote phase (WatchSaveRequest.follow_remote)
// waits for one more message, with PHASE_REMOTE_COMMITTED or
// PHASE_REMOTE_FAILED.
inline bool RemotePhasePending(const v1::SaveProgress& progress) {
  return progress.phase() == v1::PHASE_COMMITTED &&
         progress.remote_phase() == v1::PHASE_REMOTE_UPLOADING;
}

}  // namespace ckpt
