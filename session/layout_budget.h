// LayoutBudget: how much memory the layouts that sessions define may hold,
// per session and over the whole daemon.
//
// A DefineLayout request carries up to a million items, and the daemon
// keeps what it builds from it (the validated items, their addresses, the
// node plan with each file's safetensors header) for the session's life,
// up to kMaxLayoutsPerSession layouts. That is about 600 bytes of daemon
// memory per item. Measured with 1,000,000-item layouts (8-byte-shaped
// tensors, 40-byte fqns): the first grew ckptd's RSS by ~1 GiB (the
// request's own buffers included), each further one by ~600 MB; three
// grew it by 2.2 GB. Without a bound one client could grow the daemon by
// gigabytes.
//
// Before a layout is built, DefineLayout reserves LayoutBytesBound of its
// request (session/layout_bytes.h), an upper bound of what it will hold,
// so that a layout that cannot fit is refused without being built and
// builds in flight count against the budget while they run. Once built,
// the charge is resized to LayoutBytes, its size in memory as the daemon
// holds it. The charge counts against its session and against the daemon,
// and RESOURCE_EXHAUSTED names the limit that a layout would pass. The
// charge travels with the layout (Session hands out aliasing pointers that
// own it), so it goes back exactly when the memory does: once the session
// has ended and no save in flight uses the layout.
//
// Ownership: shared (shared_ptr) by the session registry and every charge,
// so charges may outlive the registry. Thread-safety: safe for concurrent
// use; `mu_` is a leaf.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "session/layout_bytes.h"

namespace ckpt {

struct LayoutLimits {
  // A rank's layouts: about 450,000 items (600 bytes each). A 70B model's
  // weights and optimizer state are a few thousand tensors per rank, so
  // this leaves room for two orders of magnitude more, or for several
  // layouts of a rank that saves different state dicts. A rank with more
  // items (up to --max_items_per_save, 1M: ~600 MB) needs it raised.
  uint64_t per_session = 256ull << 20;
  // All sessions together: four ranks at their full per-session budget, or
  // a node of 8 ranks at 128 MiB each; next to the staging pool (512 MiB by
  // default) it keeps the daemon's memory within a few GiB.
  uint64_t total = 1ull << 30;
};

class LayoutBudget : public std::enable_shared_from_this<LayoutBudget> {
 public:
  // Bytes reserved for one layout, given back when destroyed. Move-only.
  class Charge {
   public:
    Charge() = default;
    Charge(Charge&& other) noexcept;
    Charge& operator=(Charge&& other) noexcept;
    Charge(const Charge&) = delete;
    Charge& operator=(const Charge&) = delete;
    ~Charge();

    uint64_t bytes() const { return bytes_; }
    // Makes the charge `bytes`: less gives the difference back at once;
    // more takes the difference if it fits (as Reserve would), else fails
    // and leaves the charge as it was. A default-constructed charge has no
    // budget to resize against (FailedPrecondition).
    absl::Status Resize(uint64_t bytes);

   private:
    friend class LayoutBudget;
    Charge(std::shared_ptr<LayoutBudget> budget, uint64_t session_id,
           uint64_t bytes)
        : budget_(std::move(budget)), session_id_(session_id), bytes_(bytes) {}
    void Release();

    std::shared_ptr<LayoutBudget> budget_;
    uint64_t session_id_ = 0;
    uint64_t bytes_ = 0;
  };

  static std::shared_ptr<LayoutBudget> Create(LayoutLimits limits);

  // Charges `bytes` to session `session_id` and the daemon if they fit
  // both now, else fails ResourceExhausted naming the limit (charging
  // nothing).
  absl::StatusOr<Charge> Reserve(uint64_t session_id, uint64_t bytes);

  const LayoutLimits& limits() const { return limits_; }
  uint64_t used() const;
  uint64_t used_by(uint64_t session_id) const;

 private:
  explicit LayoutBudget(LayoutLimits limits) : limits_(limits) {}
  absl::Status CheckRoomLocked(uint64_t session_id, uint64_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Give(uint64_t session_id, uint64_t bytes);
  // Charges `bytes` more to `session_id`, or fails as Reserve does.
  absl::Status Take(uint64_t session_id, uint64_t bytes);

  const LayoutLimits limits_;

  mutable absl::Mutex mu_;
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  // Sessions with charges outstanding (an ended one until its last layout
  // is dropped).
  absl::flat_hash_map<uint64_t, uint64_t> by_session_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt
