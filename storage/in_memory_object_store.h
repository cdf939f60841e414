// InMemoryObjectStore: an ObjectStore driver that keeps its objects in this
// process's memory, like TensorStore's "memory" kvstore: the unit tests' and
// the commit's scale simulation's backend (bench/commit_scale_sim.cc), where
// a real server for 10,000 simulated nodes would measure the server, not
// the protocol. It keeps every semantic of object_store.h (atomic Put,
// sorted List with delimiters, ranges, missing-object Delete is OK), so
// code tested on it behaves the same on the real drivers.
//
// Memory: the objects, bounded by `max_bytes` (a Put beyond it fails
// ResourceExhausted, nothing replaced).
// Thread-safety: every method may be called from many threads.
#pragma once

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "storage/object_store.h"

namespace ckpt {

class InMemoryObjectStore : public ObjectStore {
 public:
  explicit InMemoryObjectStore(uint64_t max_bytes = 1ull << 30) : max_bytes_(max_bytes) {}

  std::string Describe(absl::string_view key) const override;
  absl::Status Put(absl::string_view key, absl::string_view body) override;
  absl::StatusOr<size_t> Get(absl::string_view key, absl::Span<char> into,
                             std::optional<ObjectRange> range = std::nullopt) override;
  absl::StatusOr<ObjectInfo> Head(absl::string_view key) override;
  absl::StatusOr<ObjectListing> List(absl::string_view prefix,
                                     absl::string_view delimiter = "") override;
  absl::Status Delete(absl::string_view key) override;
  // Puts here never leave anything unfinished: 0.
  absl::StatusOr<int> AbortUnfinished(absl::string_view prefix,
                                      absl::Time started_before) override;

 private:
  const uint64_t max_bytes_;
  absl::Mutex mu_;
  std::map<std::string, std::string, std::less<>> objects_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// Copies `range` of an object of `size` bytes (the whole when absent) into
// `into` by the rules of ObjectStore::Get, `name` naming it in errors;
// returns the bytes copied. Shared by the drivers that hold objects whole.
absl::StatusOr<size_t> CopyObjectRange(absl::string_view object, absl::Span<char> into,
                                       std::optional<ObjectRange> range,
                                       absl::string_view name);

}  // namespace ckpt
