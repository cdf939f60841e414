// StagedRelay: the GPU-side STAGED of a save that is not submitted yet.
//
// SaveHandle::WaitStagedOnStream needs the save's handle, which comes with
// the answer to the save RPC. A trainer that submits its saves on another
// thread (ckptd.torch runs the replica exchange and the RPC on its submit
// thread: 1.5-2.6 ms on a loaded machine, and in a multi-rank job the
// slowest rank's save call too) would wait on its CPU for that hand-over
// before its stream could wait. The relay takes that wait off the CPU:
//
//   1. At the save call, after RecordReady, Client::ReserveRelay reserves
//      the next record of a relay event of the trainer's own on each device
//      RecordReady recorded on. The trainer's stream may wait for them at
//      once (WaitOnStream): the optimizer step is queued behind them, and
//      the CPU goes on.
//   2. Once the save is submitted, PassOn(save) enqueues on each device's
//      relay stream (TrainerGpu::Relay) a wait for the save's staged
//      record, then the relay record, after the previous one: the GPU
//      passes STAGED on, and no CPU waits for it.
//
// Every reserved record must be made, or the trainer's stream waits for
// good, so PassOn makes it whatever happened to the save: one that failed
// or was never submitted (`save` null) passes on the daemon's most recent
// staged record as of then (those of earlier saves, all STAGED or failed:
// a save call waits for the previous save's STAGED), and the destructor
// passes on a relay that never was. If the relay stream cannot take the
// operations, PassOn waits on its CPU for the save's STAGED (or failure)
// and completes the record from the CPU once the previous one was reached.
//
// A save whose daemon reserved no staged record for it (a host tensor in
// the trainer's own memory; a daemon before reserved records) is passed on
// once the daemon has enqueued its copies and read the host tensors: PassOn
// blocks until then. A trainer whose CPU may write such a tensor right
// after the save call must not use the relay: it would not wait for that
// read. ckptd.torch relays only saves whose host tensors all went through
// its copy buffers (snapshot regions).
//
// Relays of one client are passed on in the order they were reserved: a
// PassOn whose predecessor was not passed on yet waits for it on the CPU
// (gpu/relay_order.h says why), at most RelayOrder::kTimeout, after which
// its records go to the CPU fallback.
//
// Lifetime: borrows the Client's TrainerGpu: must not outlive the Client.
// Thread-safety: WaitOnStream and PassOn may run on different threads (the
// training loop's and the submit thread); PassOn once.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gpu/trainer_gpu.h"

namespace ckpt {

class SaveHandle;

class StagedRelay {
 public:
  // How long PassOn's CPU fallback waits for the previous relay record.
  static constexpr absl::Duration kCpuCompleteTimeout = absl::Seconds(30);

  ~StagedRelay();  // PassOn(nullptr) if PassOn was never called
  StagedRelay(const StagedRelay&) = delete;
  StagedRelay& operator=(const StagedRelay&) = delete;

  // Makes `stream` wait for the relay records (no CPU wait): work queued
  // on it afterwards runs after the save's copies. Any number of times.
  absl::Status WaitOnStream(GpuStreamHandle stream) const;
  // Step 2 above: `save` is the submitted save (the relay's devices are
  // those RecordReady recorded on, which include every device it reads),
  // or null if it failed before the daemon accepted it. FailedPrecondition
  // if called before; otherwise every record is made (or left to the
  // CPU fallback above), and an error names a relay stream that failed.
  absl::Status PassOn(SaveHandle* save);

  const std::vector<std::string>& devices() const { return devices_; }
  const std::vector<uint64_t>& records() const { return records_; }

 private:
  friend class Client;
  explicit StagedRelay(TrainerGpu* gpu) : gpu_(gpu) {}
  // Relay record `i` from the CPU once the save is over (CPU fallback).
  absl::Status CompleteFromCpu(size_t i, SaveHandle* save);

  // Filled by Client::ReserveRelay before the relay is handed out.
  TrainerGpu* const gpu_;
  std::vector<std::string> devices_;
  std::vector<uint64_t> records_;  // one per device

  std::atomic<bool> passed_on_{false};
};

}  // namespace ckpt
