// libckpt: the trainer-side client of ckptd.
//
//   auto client = ckpt::Client::Connect({.socket = ..., .job = "llama",
//                                        .rank = r, .world_size = n});
//   auto region = (*client)->RegisterRegion(buffer, bytes);
//   auto save = (*client)->Save(request);     // returns at ACCEPTED (~1 ms)
//   (*save)->WaitStaged();                    // before mutating the memory
//   (*save)->WaitCommitted();                 // optional
//
// GPU memory (docs/ARCHITECTURE.md, "The GPU path"):
//
//   auto region = (*client)->RegisterGpuRegion(device_ptr, bytes);
//   auto save = (*client)->Save(request, stream);  // records "ready" on it
//   (*save)->WaitStagedOnStream(stream);  // the stream waits, the CPU not
//
// A caller that takes a save at one moment and submits it later from
// another thread (ckptd.torch: the save call, then its submit thread)
// records the ready event at that moment with RecordReady(stream), then
// submits with Save(request, stream, canceller, GpuReady::kRecordedBefore).
// Its stream can wait for STAGED before the save is submitted, through a
// relay (client/staged_relay.h):
//
//   (*client)->RecordReady(stream);                 // the save call
//   auto relay = (*client)->ReserveRelay();
//   (*relay)->WaitOnStream(stream);                 // the CPU goes on
//   ... on the submit thread:
//   auto save = (*client)->Save(request, stream, nullptr,
//                               ckpt::Client::GpuReady::kRecordedBefore);
//   (*relay)->PassOn(save.ok() ? save->get() : nullptr);
//
// Before freeing GPU memory under a region, release the region
// (ReleaseRegions): the daemon keeps the allocation mapped until then. A
// save notices memory that was freed and allocated again under a region
// and registers the new allocation in its place.
//
// Connect performs the handshake (the daemon learns this process's pid from
// the kernel and returns a session token), allows the daemon to read this
// process's memory where Yama would forbid it (PR_SET_PTRACER), and opens
// the session. Keep the Client alive while saves run: closing it tells the
// daemon this rank is gone.
//
// Cancelling: every blocking call takes an optional CallCanceller
// (client/call_canceller.h, included here), which another thread may fire
// (Cancel) or the calling thread may poll while it waits (the Python binding
// checks for Ctrl-C there). A cancelled Load returns only once the daemon
// confirmed that it writes no more into this process's memory for it
// (Client::Load says how, and what a daemon that does not answer means).
//
// Thread-safety: Client methods may be called from any thread (its GPU
// region table is guarded by one absl::Mutex, held across the region RPCs
// but never while waiting for a save's progress). A SaveHandle is safe to
// use from several threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ckpt/v1/control.grpc.pb.h"
#include "client/call_canceller.h"
#include "client/staged_relay.h"
#include "common/control_socket.h"
#include "common/unique_fd.h"
#include "gpu/trainer_gpu.h"
#include "grpcpp/grpcpp.h"

namespace ckpt {

struct ConnectOptions {
  // DefaultClientSocket(): $CKPTD_SOCKET, a Slurm job's or the user's
  // daemon, else the system daemon's (common/control_socket.h).
  std::string socket = DefaultClientSocket();
  std::string job;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint32_t node = 0;              // the daemon's --node_id
  uint32_t local_world_size = 0;  // ranks on this node; 0: all (one node)
  // This process's index among them (torchrun's LOCAL_RANK), if known: a
  // save that times out waiting for ranks then names the ones that never
  // connected by it.
  std::optional<uint32_t> local_rank = std::nullopt;
  // The GPU seam for CUDA regions (borrowed; outlives the client). Null:
  // the CUDA runtime's when libckpt was built with CUDA.
  TrainerGpu* gpu = nullptr;
  // A daemon that stops answering fails the open calls (UNAVAILABLE) after
  // about keepalive_ms + keepalive_timeout_ms (common/control_socket.h);
  // keepalive_ms may not be below kMinKeepaliveMs.
  uint32_t keepalive_ms = kDefaultKeepaliveMs;
  uint32_t keepalive_timeout_ms = kDefaultKeepaliveTimeoutMs;
  // How long a cancelled Load waits for the daemon to confirm that it
  // writes no more into this process's memory (a live daemon answers in
  // milliseconds; one that does not is stopped or overloaded).
  uint32_t cancel_confirm_ms = 1'000;
};

// A gRPC channel to the daemon's socket that sends and receives messages of
// up to kMaxControlMessageBytes, the daemon's own ceiling, and pings a
// daemon that does not answer while a call is open (both in
// common/control_socket.h).
std::shared_ptr<grpc::Channel> DaemonChannel(
    const std::string& socket, uint32_t keepalive_ms = kDefaultKeepaliveMs,
    uint32_t keepalive_timeout_ms = kDefaultKeepaliveTimeoutMs);

// Turns a gRPC status into an absl::Status with `what` as context.
absl::Status FromGrpc(const grpc::Status& status, absl::string_view what);

// One whole allocation under a registered GPU region.
struct GpuAllocation {
  uint64_t base = 0;   // the allocation's first byte (not the region's)
  uint64_t bytes = 0;  // its size
  uint64_t id = 0;     // its identity (TrainerGpu::AllocationIds) then
  bool operator<(const GpuAllocation& o) const {
    return std::tie(base, bytes, id) < std::tie(o.base, o.bytes, o.id);
  }
};

// A GPU region as registered: what a save checks for re-allocation.
struct GpuRegistration {
  uint64_t daemon_id = 0;  // the daemon's id now (changes on re-register)
  uint64_t address = 0;
  uint64_t length = 0;
  std::string device_uuid;
  std::vector<uint64_t> allocation_ids;
  // The allocations the region lies in, whole: many regions (a tensor
  // each) share a few caching-allocator segments, and a save asks each
  // segment once, not each region (RefreshGpuRegions).
  std::vector<GpuAllocation> allocations;
  // The trainer's allocator returned the memory (Client::ReleaseGpuMemory)
  // and the daemon released the region: a save maps it again only once
  // memory is allocated there again.
  bool released = false;
};

// One rank's in-flight save. A background thread, started on first use (so
// the save call itself stays cheap), follows the daemon's progress stream,
// past COMMITTED while the checkpoint's remote phase runs (WatchSaveRequest.
// follow_remote; the daemon ends that phase within its upload timeout).
// Borrows the Client's stub: a SaveHandle must not outlive its Client.
class SaveHandle {
 public:
  ~SaveHandle();
  uint64_t id() const { return id_; }

  // Blocks until every byte of this rank is copied out of its memory (the
  // memory may be mutated after this returns OK), or the save fails.
  absl::Status WaitStaged();
  // WaitStaged and WaitCommitted for at most `timeout`: DeadlineExceeded
  // if the phase is neither reached nor failed by then (the save goes on).
  // A caller that must stay interruptible (the Python binding checks for
  // Ctrl-C between waits) waits in such slices.
  absl::Status WaitStaged(absl::Duration timeout);
  absl::Status WaitCommitted(absl::Duration timeout);
  // The GPU-side STAGED: makes `stream` wait for the save's copies, so
  // work queued on `stream` after this call (the optimizer step) runs
  // after them. When every tensor of the save is in GPU memory (or in
  // snapshot host regions: RegisterSnapshotRegion), the daemon
  // reserved the save's staged records when it accepted the save
  // (SaveResponse.staged_records) and this blocks the CPU not at all: the
  // stream waits for those records, which the daemon makes once the copies
  // are enqueued (and, if the save fails, once the save before it is
  // staged; the failure shows in WaitCommitted). Otherwise (tensors in the
  // trainer's own host memory too, or a daemon that reserved none) it
  // blocks the CPU until the daemon
  // has enqueued every copy (with a pool smaller than the state, until the
  // part that does not fit went to storage) and read the host tensors, and
  // fails if the save failed by then.
  absl::Status WaitStagedOnStream(GpuStreamHandle stream);
  // Blocks until the checkpoint is committed, or fails.
  absl::Status WaitCommitted();
  // The remote phase, from the progress stream: waits up to `timeout`
  // until the checkpoint is committed in the daemon's remote tier too
  // (--remote) and returns this node's upload of it. Aborted with the
  // daemon's reason (the node, the object, the server's answer) if the
  // remote phase failed (the local commit stands); the save's own error
  // if it failed; NotFound if it committed with no remote phase (a daemon
  // without a remote tier, or one older than the remote phase:
  // Client::WaitRemoteCommitted asks it instead); DeadlineExceeded after
  // `timeout` (the remote phase goes on).
  absl::StatusOr<v1::RemoteUpload> WaitRemoteCommitted(absl::Duration timeout);
  // The latest progress seen.
  v1::SaveProgress progress();
  // Cancels the whole checkpoint this save belongs to.
  absl::Status Cancel(CallCanceller* canceller = nullptr);

 private:
  friend class Client;
  friend class StagedRelay;
  SaveHandle(v1::Ckptd::Stub* stub, std::string token, uint64_t id,
             TrainerGpu* gpu, std::vector<std::string> gpu_devices,
             std::vector<uint64_t> stream_wait_records);
  void Follow();
  void StartFollowing();
  // Waits for `phase`, or with `enqueued` for copies_enqueued (or STAGED),
  // for at most `timeout`.
  absl::Status WaitFor(v1::Phase phase, bool enqueued = false,
                       absl::Duration timeout = absl::InfiniteDuration());
  // What a relay record on device `uuid` waits for (StagedRelay::PassOn):
  // the save's staged record there if the daemon reserved one; otherwise,
  // once the daemon enqueued the copies (blocking until then) or the save
  // failed, the most recent staged record; nothing on a device the save
  // does not read.
  TrainerGpu::StagedWait RelayAfter(const std::string& uuid);
  // Whether the progress seen so far satisfies WaitFor(phase, enqueued).
  bool Reached(v1::Phase phase, bool enqueued) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  v1::Ckptd::Stub* const stub_;
  const std::string token_;
  const uint64_t id_;
  TrainerGpu* const gpu_;                       // null without GPU regions
  const std::vector<std::string> gpu_devices_;  // uuids the save reads
  // The staged record to wait for on each of gpu_devices_, when waiting
  // for them on the stream alone is enough; empty otherwise.
  const std::vector<uint64_t> stream_wait_records_;

  // The progress stream's context: the follower reads through it, the
  // destructor cancels it (grpc::ClientContext::TryCancel is thread-safe).
  grpc::ClientContext context_;
  absl::once_flag follow_once_;
  std::thread follower_;  // set once, inside follow_once_

  // What the follower has seen; waiters Await a change of it.
  absl::Mutex mu_;
  v1::SaveProgress progress_ ABSL_GUARDED_BY(mu_);
  absl::Status stream_error_ ABSL_GUARDED_BY(mu_);
  // The stream ended while the remote phase was pending (the daemon went).
  absl::Status remote_stream_error_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

class Client {
 public:
  // `canceller` (optional, here and below): see CallCanceller.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const ConnectOptions& options, CallCanceller* canceller = nullptr);
  ~Client();

  // Registers [address, address+length) of this process; returns its id.
  absl::StatusOr<uint64_t> RegisterRegion(const void* address, uint64_t length,
                                          CallCanceller* canceller = nullptr);
  // Registers host memory that holds the caller's own copy of bytes it
  // took for a save (a copy buffer), which it promises to write again only
  // after every save that reads it is STAGED (it waits for that itself:
  // WaitStaged). The trainer's later writes never touch it, so a save of
  // GPU tensors and snapshot regions alone keeps the CPU-free GPU-side
  // STAGED (WaitStagedOnStream), as one of GPU tensors alone does.
  absl::StatusOr<uint64_t> RegisterSnapshotRegion(const void* address, uint64_t length,
                                                  CallCanceller* canceller = nullptr);
  // Registers device memory [address, address+length) (a CUDA device
  // pointer of this process); returns its id. The daemon maps the
  // allocations under it now and keeps them until ReleaseRegions.
  absl::StatusOr<uint64_t> RegisterGpuRegion(uint64_t address, uint64_t length);
  // Ends regions (host or GPU); call it before freeing their memory.
  absl::Status ReleaseRegions(const std::vector<uint64_t>& ids,
                              CallCanceller* canceller = nullptr);
  // The trainer's allocator is returning device memory [address, address +
  // length) to the driver (PyTorch's caching allocator freeing or unmapping
  // a segment: client/python/allocator_hook_module.cc calls this). Every
  // GPU region that overlaps it is released at the daemon, which unmaps it
  // as soon as no copy uses it, so the daemon never keeps freed memory
  // alive. The regions stay known under their ids: a later save maps one
  // again if memory is allocated there again, and otherwise leaves it out.
  // Waits at most `timeout` (the caller may hold the allocator's lock): for
  // the daemon, and for this client if another thread is using it, in
  // which case the release is left to the next save (DeadlineExceeded).
  // The regions count as released even if the daemon did not answer.
  absl::Status ReleaseGpuMemory(uint64_t address, uint64_t length,
                                absl::Duration timeout) ABSL_LOCKS_EXCLUDED(gpu_mu_);

  // Registers this rank's tensor items once; later saves pass the returned
  // id in SaveRequest.layout_id instead of the items, which keeps the save
  // call at about a millisecond however many tensors there are.
  absl::StatusOr<uint64_t> DefineLayout(
      const google::protobuf::RepeatedPtrField<v1::TensorItem>& tensors,
      CallCanceller* canceller = nullptr);

  // Reserves, on each device the last RecordReady recorded on, the next
  // record of this client's relay event, for the save about to be
  // submitted (client/staged_relay.h). FailedPrecondition if RecordReady
  // recorded nothing since the last save.
  absl::StatusOr<std::unique_ptr<StagedRelay>> ReserveRelay() ABSL_LOCKS_EXCLUDED(gpu_mu_);

  // Records each GPU device's ready event on `stream` now, for the next
  // Save made with GpuReady::kRecordedBefore: the save then holds the bytes
  // the trainer's stream had written at this moment, whatever it queued
  // since. Fails without GPU regions.
  absl::Status RecordReady(GpuStreamHandle stream) ABSL_LOCKS_EXCLUDED(gpu_mu_);

  // Where a save's GPU copies are ordered after the trainer's writes.
  enum class GpuReady {
    kRecordAtSave,    // Save records the ready events on its `stream`
    kRecordedBefore,  // RecordReady did, for this save; Save checks it
  };

  // Fills in the session token and submits; returns once ACCEPTED. With
  // GPU regions registered, first records each device's ready event on
  // `stream` (after the trainer's last write to the saved tensors; no CPU
  // wait) unless `ready` says RecordReady did (then a device it did not
  // record on fails the save), and re-registers any region whose memory
  // was re-allocated. Cancelling it (`canceller`) before the daemon
  // answered leaves it unknown whether the save was accepted: it then
  // runs without a handle.
  absl::StatusOr<std::unique_ptr<SaveHandle>> Save(
      v1::SaveRequest request, GpuStreamHandle stream = nullptr,
      CallCanceller* canceller = nullptr, GpuReady ready = GpuReady::kRecordAtSave);

  // Restores into registered memory; returns once every byte is verified
  // and in place. Byte items too large for one reply together are fetched
  // in further pages (LoadByteItems) before it returns: the response holds
  // them all, and pending_byte_items is empty.
  //
  // Cancelled through `canceller`, it returns CANCELLED only once no byte
  // of this load is being written into this process's memory, nor will be:
  // the daemon confirmed it (it answers a Cancel naming the load after its
  // last write, restore/load_gate.h), or the Load call itself ended. The
  // memory may then be freed or reused. A daemon that does not confirm
  // within options().cancel_confirm_ms (stopped, hung) makes it return
  // DEADLINE_EXCEEDED instead: the daemon may still write the load's bytes
  // into the destination memory if it resumes, so that memory must not be
  // reused for anything else while this daemon (or session) lives.
  absl::StatusOr<v1::LoadResponse> Load(v1::LoadRequest request,
                                        CallCanceller* canceller = nullptr);

  // The job's checkpoints in every tier; only `checkpoint` and its
  // generations (common/names.h) if that is not empty.
  absl::StatusOr<std::vector<v1::CheckpointInfo>> List(
      const std::string& job, CallCanceller* canceller = nullptr,
      const std::string& checkpoint = "");

  // Waits until this job's `checkpoint` is committed in the daemon's remote
  // tier (--remote; storage/remote_tier.h), asking the daemon's status every
  // 100 ms, and returns its upload. FailedPrecondition if the daemon has no
  // remote tier; Aborted with the daemon's reason (the node, the object,
  // the server's answer) if the upload failed; DeadlineExceeded, naming
  // where it got to, after `timeout`. A checkpoint the daemon has not
  // handed to the tier yet (it does once committed locally) is waited for.
  absl::StatusOr<v1::RemoteUpload> WaitRemoteCommitted(const std::string& checkpoint,
                                                       absl::Duration timeout,
                                                       CallCanceller* canceller = nullptr);

  const ConnectOptions& options() const { return options_; }
  uint32_t daemon_pid() const { return daemon_pid_; }
  // Whether the daemon that made the handshake still holds its end of the
  // session socket (one non-blocking poll): false once it exited or
  // restarted, and then every call of this Client fails; connect anew.
  absl::StatusOr<bool> DaemonAlive() const;

 private:
  Client(ConnectOptions options, UniqueFd handshake, std::string token,
         uint32_t daemon_pid, std::shared_ptr<grpc::Channel> channel);

  // Registers one host region (RegisterRegion, RegisterSnapshotRegion).
  absl::StatusOr<uint64_t> RegisterHostRegion(const void* address, uint64_t length,
                                              bool snapshot, CallCanceller* canceller);
  // Sends a RegisterRegions request of one region; returns its id.
  absl::StatusOr<uint64_t> RegisterOne(const v1::RegisterRegionsRequest& request,
                                       CallCanceller* canceller);
  // Asks the daemon to cancel load `load_id` until it confirms, the load's
  // call ends (`call_ended`), or cancel_confirm_ms pass (DeadlineExceeded).
  absl::Status CancelLoadAndConfirm(uint64_t load_id,
                                    const std::function<bool()>& call_ended);
  // Before a save: re-registers the GPU regions whose memory was
  // re-allocated (or, released, allocated again); sets `gpu` (null without
  // GPU regions) and the devices whose ready events the save records.
  absl::Status RefreshGpuRegions(CallCanceller* canceller, TrainerGpu** gpu,
                                 std::vector<std::string>* devices)
      ABSL_LOCKS_EXCLUDED(gpu_mu_);
  // RefreshGpuRegions' step for a region not found unchanged through its
  // allocations: asks for the region's own allocation ids.
  absl::Status RefreshGpuRegion(CallCanceller* canceller, TrainerGpu* gpu, GpuRegistration& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(gpu_mu_);
  // Byte ranges of this process's memory.
  struct MemoryRange {
    uint64_t address = 0;
    uint64_t length = 0;
  };
  // Takes gpu_mu_ if it can before `deadline`.
  bool TryLockGpuUntil(absl::Time deadline) ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true, gpu_mu_)
      ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Releases at the daemon (one call, until `deadline`) the GPU regions
  // that overlap `ranges`, and marks them released.
  absl::Status ReleaseOverlapping(const std::vector<MemoryRange>& ranges,
                                  absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(gpu_mu_);
  // The devices RecordReady recorded on since the last save, which are
  // then forgotten; fails if a device of `devices` is not among them.
  absl::Status TakeRecordedReady(const std::vector<std::string>& devices)
      ABSL_LOCKS_EXCLUDED(gpu_mu_);
  // Replaces the application's GPU region ids with the daemon's current ones.
  void RemapRegionIds(google::protobuf::RepeatedPtrField<v1::TensorItem>* tensors)
      ABSL_LOCKS_EXCLUDED(gpu_mu_);
  // Watches the session socket once GPU regions exist: the daemon closes it
  // only by exiting, and then its staged events will never complete, so
  // the watcher completes them here (TrainerGpu::SignalStaged) and no
  // trainer stream waits for a daemon that is gone. Returns when `stop_fd`
  // (watch_stop_, an eventfd) becomes readable.
  void WatchDaemon(int stop_fd) ABSL_LOCKS_EXCLUDED(gpu_mu_);
  // The GPU seam, created on first use when options_.gpu is null.
  absl::StatusOr<TrainerGpu*> Gpu() ABSL_EXCLUSIVE_LOCKS_REQUIRED(gpu_mu_);
  // Exports and registers one GPU region; the daemon assigns a new id.
  absl::StatusOr<GpuRegistration> RegisterGpu(uint64_t address, uint64_t length,
                                              CallCanceller* canceller = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(gpu_mu_);

  // Constant after construction.
  const ConnectOptions options_;
  const UniqueFd handshake_;  // held open: the session lives while it does
  const std::string token_;
  const uint32_t daemon_pid_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v1::Ckptd::Stub> stub_;  // thread-safe

  // Names each Load to a Cancel (LoadRequest.load_id).
  std::atomic<uint64_t> next_load_id_{1};

  // Guards the GPU state, which the first GPU region creates. Held across
  // the RegisterRegions and ReleaseRegions calls, so that a save and a
  // (re-)registration never see a half-updated table.
  absl::Mutex gpu_mu_;
  std::unique_ptr<TrainerGpu> own_gpu_ ABSL_GUARDED_BY(gpu_mu_);
  // Live GPU regions by the id the application holds.
  std::map<uint64_t, GpuRegistration> gpu_regions_ ABSL_GUARDED_BY(gpu_mu_);
  // Devices whose staged events a trainer stream may wait on.
  std::vector<std::string> gpu_devices_ ABSL_GUARDED_BY(gpu_mu_);
  // Devices RecordReady recorded on, for the next save (TakeRecordedReady).
  std::vector<std::string> recorded_ready_ ABSL_GUARDED_BY(gpu_mu_);
  TrainerGpu* watched_gpu_ ABSL_GUARDED_BY(gpu_mu_) = nullptr;
  // The watcher and the eventfd that ends it: started once, by the first GPU
  // region; the destructor stops and joins it.
  UniqueFd watch_stop_ ABSL_GUARDED_BY(gpu_mu_);
  std::thread daemon_watch_ ABSL_GUARDED_BY(gpu_mu_);
  // Freed memory ReleaseGpuMemory could not release while gpu_mu_ was
  // held too long; the next save releases the regions over it.
  absl::Mutex freed_mu_ ABSL_ACQUIRED_AFTER(gpu_mu_);
  std::vector<MemoryRange> freed_ ABSL_GUARDED_BY(freed_mu_);
};

}  // namespace ckpt
