// LoadPlanBudget: how much memory the plans of loads in flight may hold,
// over the whole daemon.
//
// A load's plan is one Delivery (restore/shard_reader.h, 32 bytes) per copy
// run, and a run is as long as both layouts allow (common/box.h): a dim-0
// reshard is one run per chunk, but a narrow column slice of a wide tensor
// is one run per row. A request of a few bytes can so ask for a column of a
// [2^32, 2] tensor, four billion runs, 256 GiB of plan at the 64 bytes a
// run holds at its peak (below). Each request's runs
// are counted before they are made (CountCopyRuns) and reserved here; a
// load that would pass the budget fails RESOURCE_EXHAUSTED naming its item,
// and the reservation goes back when the load's round ends (its
// deliveries are freed with it).
//
// What is charged is what is held at the peak, so --load_plan_bytes is
// the plan memory, not a fraction of it: kBytesPerRun is two Deliveries.
// The first is the plan itself, kept until the round ends, in lists
// reserved to their exact length (PlanLoadRequest counts every run before
// it makes any, and makes none into a temporary list). The second is the
// one transient copy a run may have at a time: its range in the check that
// an item's runs tile its memory (16 bytes, while that item is planned),
// or its copy while the round merges the plans of loads that read the same
// chunk (MergeLoadPlans, restore/load_plan.h, which frees each source list
// once copied). The test restore/load_plan_memory_test.cc measures both
// peaks on the heap.
//
// Ownership: shared (shared_ptr) by the loader and every reservation, which
// may outlive the loader on a worker. Thread-safety: safe for concurrent
// use (one atomic).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ckpt {

class LoadPlanBudget : public std::enable_shared_from_this<LoadPlanBudget> {
 public:
  // Bytes of plan per copy run at the peak: 2 * sizeof(Delivery) (above).
  static const uint64_t kBytesPerRun;

  // Runs reserved for one load request, given back when destroyed.
  // Move-only; not thread-safe itself (one request is planned on one thread).
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& other) noexcept;
    Reservation& operator=(Reservation&& other) noexcept;
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    ~Reservation();

    // Reserves `runs` more for item `fqn`; RESOURCE_EXHAUSTED (reserving
    // nothing) if the budget cannot take them.
    absl::Status Add(uint64_t runs, absl::string_view fqn);
    uint64_t bytes() const { return bytes_; }

   private:
    friend class LoadPlanBudget;
    explicit Reservation(std::shared_ptr<LoadPlanBudget> budget)
        : budget_(std::move(budget)) {}
    void Release();

    std::shared_ptr<LoadPlanBudget> budget_;
    uint64_t bytes_ = 0;
  };

  static std::shared_ptr<LoadPlanBudget> Create(uint64_t max_bytes);

  // An empty reservation against this budget.
  Reservation Open();

  uint64_t max_bytes() const { return max_bytes_; }
  uint64_t used_bytes() const { return used_.load(std::memory_order_relaxed); }

 private:
  explicit LoadPlanBudget(uint64_t max_bytes) : max_bytes_(max_bytes) {}

  const uint64_t max_bytes_;
  std::atomic<uint64_t> used_{0};
};

}  // namespace ckpt
