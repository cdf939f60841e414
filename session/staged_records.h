// StagedRecords: the "staged" records one save reserved when it was
// accepted, one per GPU event of its session, and the promise that each
// reaches its number.
//
// Why reserve: the trainer's stream must not run its next step's writes
// before the daemon's copies of the save have run (they are enqueued
// behind the trainer's ready event, on the daemon's own streams). A stream
// wait covers only records already made, so waiting for the daemon to
// *record* "staged" before making the trainer's stream wait would
// hold the trainer's CPU for the daemon's enqueue (the part's turn on an
// I/O worker, a window loop, a reply). With the record's number known when
// the save call returns (SaveResponse.staged_records), the trainer's
// stream waits for that number at once (TrainerGpu::WaitStagedRecord) and
// its CPU goes on.
//
// The promise: every reserved record reaches its number, in order, on
// every path a save can take. The save's copy batch records the ones of
// the devices it copied from on its streams, after its last copy
// (Take, GpuStream::RecordReserved); CompleteRest hands the others to the
// daemon's StagedCompleter, which completes each from the CPU once the
// record before it was reached: those of devices the save did not copy
// from, those of a save that failed, a record that could not be enqueued.
// The copy batch calls CompleteRest once its copies are enqueued, the save
// coordinator once the part ended, and the destructor last. A record the
// batch enqueued on a device whose context then failed never runs: the
// batch hands it to StagedCompleter::CompleteIfDeviceFails when it abandons
// its copies.
//
// Thread-safety: one thread at a time (the save call creates it, then the
// part's I/O worker uses it).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpu/gpu_device.h"
#include "session/staged_completer.h"

namespace ckpt {

class StagedRecords {
 public:
  struct Record {
    std::shared_ptr<GpuEvent> event;
    std::string device_uuid;  // the trainer's name of the event's device
    uint64_t number = 0;
    bool made = false;  // recorded on a stream, or handed to the completer
  };

  StagedRecords() = default;
  // `completer` is not null if `records` is not empty, and outlives this
  // object (it is the daemon's GpuBackend's).
  StagedRecords(std::vector<Record> records, StagedCompleter* completer)
      : records_(std::move(records)), completer_(completer) {}
  ~StagedRecords() { CompleteRest(); }
  StagedRecords(StagedRecords&& other) noexcept;
  StagedRecords& operator=(StagedRecords&& other) noexcept;
  StagedRecords(const StagedRecords&) = delete;
  StagedRecords& operator=(const StagedRecords&) = delete;

  const std::vector<Record>& records() const { return records_; }
  // The number reserved for `event`, now counted as made (the caller
  // records it on a stream; if that fails, Untake); nullopt if none was.
  std::optional<uint64_t> Take(const GpuEvent* event);
  // The record of `event` was not enqueued after all: CompleteRest
  // completes it.
  void Untake(const GpuEvent* event);
  // Hands every record not made to the completer.
  void CompleteRest();

 private:
  std::vector<Record> records_;
  StagedCompleter* completer_ = nullptr;
};

}  // namespace ckpt
