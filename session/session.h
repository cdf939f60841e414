// Sessions: a trainer process's authenticated binding to the daemon.
//
// gRPC C++ does not expose a Unix-socket peer's credentials to handlers, so
// sessions are bound on a separate handshake socket (<socket>.session): the
// daemon accepts, binds the peer process (PeerProcess::Bind: its pidfd, its
// credentials, and its memory through a /proc/<pid>/mem file tied to the
// exec image it runs now), and writes back a random 128-bit token plus its
// own pid (one HandshakeFrame, common/handshake_frame.h).
// Every session RPC carries the token; the memory the daemon reads and
// writes is that bound image's, never a pid or address space a request
// names (invariant 6). A peer that failed admission (peer_process.h) gets a
// session whose OpenSession says why. The client keeps the handshake socket
// open for the life of the session: its hang-up is the daemon's liveness
// signal for the trainer.
//
// Thread-safety: Session and SessionRegistry are safe for concurrent use.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ckpt/v1/control.pb.h"
#include "common/daemon_metrics.h"
#include "common/handshake_frame.h"
#include "common/log.h"
#include "common/socket_access.h"
#include "common/unique_fd.h"
#include "gpu/gpu_device.h"
#include "plan/tensor_layout.h"
#include "session/gpu_backend.h"
#include "session/gpu_regions.h"
#include "session/layout_budget.h"
#include "session/memory_source.h"
#include "session/peer_process.h"
#include "session/pool_share.h"
#include "session/session_memory.h"

namespace ckpt {

// Bounds per session, so one client cannot grow the daemon without limit.
inline constexpr size_t kMaxRegionsPerSession = 1 << 16;
inline constexpr size_t kMaxLayoutsPerSession = 64;

// What a session needs of the daemon's GPU: the backend (null: none) and
// how long a copy may wait for the trainer's stream and run.
struct SessionGpu {
  GpuBackend* backend = nullptr;
  absl::Duration copy_timeout = absl::Minutes(5);
};

class Session {
 public:
  // `peer` must not be null. `layouts` is the daemon's layout budget,
  // shared by its sessions; null: one of this session's own, with the
  // default limits.
  Session(uint64_t id, std::string token, std::unique_ptr<PeerProcess> peer,
          const SessionGpu& gpu = {}, std::shared_ptr<LayoutBudget> layouts = nullptr);
  // A session of process `pid` as it runs now (PeerProcess::BindProcess):
  // for tests and tools without a handshake socket.
  Session(uint64_t id, std::string token, pid_t pid, uid_t uid, UniqueFd pidfd,
          const SessionGpu& gpu = {}, std::shared_ptr<LayoutBudget> layouts = nullptr)
      : Session(id, std::move(token),
                PeerProcess::BindProcess(pid, uid, std::move(pidfd)), gpu,
                std::move(layouts)) {}
  ~Session();

  uint64_t id() const { return id_; }
  const std::string& token() const { return token_; }
  pid_t pid() const { return peer_->pid(); }
  uid_t uid() const { return peer_->uid(); }
  const PeerProcess& peer() const { return *peer_; }

  // Set once by OpenSession. `node_id`/`nodes` are the daemon's: the
  // request must name this node, and may leave local_world_size 0 only on a
  // one-node daemon. The peer's memory is bound here if the handshake could
  // not (PeerProcess::Admit); a peer that failed admission is refused, with
  // the reason (PermissionDenied).
  absl::Status Open(const v1::OpenSessionRequest& request, uint32_t node_id,
                    uint32_t nodes);
  bool opened() const { return opened_.load(); }
  uint32_t rank() const { return rank_; }
  uint32_t world_size() const { return world_size_; }
  uint32_t local_world_size() const { return local_world_size_; }
  // The trainer's index among the node's ranks, if it said (LOCAL_RANK).
  std::optional<uint32_t> local_rank() const { return local_rank_; }
  const std::string& job() const { return job_; }
  // Who this session is in log lines: session and pid, and once opened its
  // job and rank.
  LogFields log_fields() const;

  // Registers host and CUDA regions; returns their ids. CUDA regions are
  // opened now (their allocations mapped, their events opened); if one
  // fails, none of the request's regions is usable (a live CUDA region that
  // an opened one replaced stays released).
  absl::StatusOr<std::vector<uint64_t>> RegisterRegions(
      const google::protobuf::RepeatedPtrField<v1::Region>& regions);
  // Ends regions; a CUDA region's allocations are unmapped once no copy in
  // flight uses them. Unknown ids are an error; released ones are not.
  absl::Status ReleaseRegions(const google::protobuf::RepeatedField<uint64_t>& ids);
  size_t live_gpu_regions() const { return gpu_.live_regions(); }
  // The session's share of the staging pool (session/pool_share.h); null
  // without a GPU backend.
  const std::shared_ptr<PoolShare>& pool_share() const { return gpu_.pool_share(); }
  // The peer address of `ref`, after checking it lies inside its region.
  absl::StatusOr<uint64_t> Resolve(const v1::MemoryRef& ref) const;

  // Reserves `bytes` of the layout budget for a layout about to be built
  // (DefineLayout reserves LayoutBytesBound of its request), so that a
  // layout that cannot fit is refused before the work and memory of
  // building it, and builds in flight count against the budget. Fails
  // ResourceExhausted naming the limit, or if the session has its
  // kMaxLayoutsPerSession layouts; FailedPrecondition once it has ended.
  absl::StatusOr<LayoutBudget::Charge> ReserveLayout(uint64_t bytes);
  // Keeps a validated layout for later saves; returns its id (from 1).
  // `reserved` (from ReserveLayout) becomes LayoutBytes of the layout: the
  // difference goes back, or, if the layout came out larger than reserved,
  // is taken if it fits (else ResourceExhausted). The charge goes back when
  // the session has ended and no save uses the layout any more.
  absl::StatusOr<uint64_t> AddLayout(std::shared_ptr<const TensorLayout> layout,
                                     LayoutBudget::Charge reserved);
  // As above, reserving LayoutBytes of the layout now.
  absl::StatusOr<uint64_t> AddLayout(std::shared_ptr<const TensorLayout> layout);
  absl::StatusOr<std::shared_ptr<const TensorLayout>> FindLayout(uint64_t id) const;

  // Reads/writes the peer's memory, host and GPU (SessionMemory).
  MemorySource* memory() { return &memory_; }

  // What a save of `layout` accepted now reserves: a record of each staged
  // event of the session's GPU regions (session/staged_records.h), and
  // whether every item lies in a GPU region or a snapshot host region, so
  // that a trainer stream that waits for those records has every later
  // write ordered after the save's reads (the trainer's own host memory is
  // read by the CPU until the save is STAGED; a snapshot region is written
  // again only after that, by the client's own wait: v1::HostRegion).
  struct StagedReservation {
    StagedRecords records;
    bool stream_wait_suffices = false;
  };
  StagedReservation ReserveStaged(const TensorLayout& layout);

  // The trainer is gone: its GPU regions are released and its layouts
  // dropped (saves in flight keep the ones they use).
  void MarkClosed();
  bool closed() const { return closed_.load(); }

 private:
  struct Region {
    uint64_t address, length;
    bool gpu = false;
    bool released = false;
    bool snapshot = false;  // host only: v1::HostRegion.snapshot
  };

  // Constant after construction.
  const uint64_t id_;
  const std::string token_;
  const std::unique_ptr<const PeerProcess> peer_;
  GpuRegions gpu_;
  SessionMemory memory_;
  const std::shared_ptr<LayoutBudget> layout_budget_;

  absl::Mutex open_mu_;  // serializes Open
  std::atomic<bool> opened_{false};
  std::atomic<bool> closed_{false};
  uint32_t rank_ = 0;        // written once before opened_ is set
  uint32_t world_size_ = 0;
  uint32_t local_world_size_ = 0;
  std::optional<uint32_t> local_rank_;
  std::string job_;
  mutable absl::Mutex mu_;
  std::vector<Region> regions_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<const TensorLayout>> layouts_ ABSL_GUARDED_BY(mu_);

  // OK while the session may add a layout: it has fewer than
  // kMaxLayoutsPerSession and has not ended.
  absl::Status LayoutRoomLeft() const ABSL_LOCKS_EXCLUDED(mu_);
};

// Accepts handshakes and tracks live sessions.
//
// Running out of descriptors or memory never ends or spins the handshake
// loop: when accept fails for want of either, the loop logs once, stops
// polling the listener (which stays readable) and tries again every 100 ms,
// still serving the hang-ups of open sessions meanwhile; a failing poll
// backs off the same way. Handshakes beyond `max_sessions` are refused,
// which with the open-files limit the daemon checks at start
// (daemon/server.cc) keeps sessions from using up its descriptors.
class SessionRegistry {
 public:
  using ClosedCallback = std::function<void(const std::shared_ptr<Session>&)>;

  // Binds the handshake socket for `path` (replacing a stale one) with the
  // file mode `access` asks for (common/socket_access.h) and starts
  // accepting; `max_sessions` bounds the table. The socket appears
  // at `path` only with Publish: a client that finds it there must find the
  // gRPC service answering too, so the server publishes it after the
  // service listens.
  static absl::StatusOr<std::unique_ptr<SessionRegistry>> Start(
      const std::string& path, const SocketAccess& access, uint32_t max_sessions,
      SessionGpu gpu, ClosedCallback on_closed, LayoutLimits layouts = {});
  ~SessionRegistry();

  // Gives the handshake socket its name (an atomic rename).
  absl::Status Publish();

  // The session for `token`; Unauthenticated if unknown or closed.
  absl::StatusOr<std::shared_ptr<Session>> Find(const std::string& token) const;
  size_t size() const;
  // CUDA regions mapped now, over all live sessions.
  size_t gpu_regions() const;
  // The live opened sessions whose GPU copies hold staging buffers now.
  std::vector<std::shared_ptr<Session>> PoolHolders() const;

 private:
  SessionRegistry(UniqueFd listener, UniqueFd wake, std::string path,
                  uint32_t max_sessions, SessionGpu gpu, ClosedCallback on_closed,
                  LayoutLimits layouts);
  void Run();
  // Accepts one handshake. False when accept itself failed for a reason
  // that persists (no descriptors or memory left): the listener stays
  // readable, so Run must wait before trying again rather than spin. The
  // failure is logged unless `starved` (an earlier one was).
  bool Accept(bool starved);
  void Close(int fd);
  // True (and remembers now) if a refused handshake may be logged: at most
  // one line a second, so clients retrying in a loop cannot flood the log.
  bool MayLogRefusal() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const UniqueFd listener_;
  const UniqueFd wake_;  // eventfd that stops Run
  const std::string path_;
  const uint32_t max_sessions_;
  const SessionGpu gpu_;
  const ClosedCallback on_closed_;
  const std::shared_ptr<LayoutBudget> layouts_;  // shared by every session
  std::thread thread_;

  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::unordered_map<std::string, std::shared_ptr<Session>> by_token_
      ABSL_GUARDED_BY(mu_);
  // Handshake socket of each session (owned here; closing ends it).
  std::unordered_map<int, std::pair<UniqueFd, std::shared_ptr<Session>>> by_fd_
      ABSL_GUARDED_BY(mu_);
  absl::Time last_refusal_log_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();

  // Read at each metrics render; last, so unbound before what it reads goes.
  GaugeBinding sessions_gauge_ = DaemonMetrics::Get().sessions.Bind(
      [this] { return static_cast<double>(size()); });
};

}  // namespace ckpt
