// CountingObjectStore: an ObjectStore decorator that counts the requests
// passing through it, by kind and by key prefix per second of its clock:
// what S3 bills and throttles (5,500 GET/HEAD/LIST and 3,500 PUT/DELETE a
// second per prefix). The commit's scale simulation runs it on a virtual
// clock (bench/commit_scale_sim.cc); a daemon can run it on the real one.
//
// A request's prefix is its key up to the last '/' (a List's: its
// prefix's), the unit S3 partitions its request rate by when keys are
// spread over "directories".
//
// Memory: one counter per (prefix, second) seen; a run of S seconds over P
// prefixes holds S * P of them (the simulation: ~60 s * ~200).
// Thread-safety: every method may be called from many threads.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "storage/object_store.h"

namespace ckpt {

enum class ObjectRequest { kPut, kGet, kHead, kList, kDelete };
inline constexpr int kObjectRequestKinds = 5;

struct ObjectRequestCounts {
  std::array<uint64_t, kObjectRequestKinds> by_kind{};
  uint64_t total = 0;
  // The busiest (prefix, second) for reads (GET, HEAD, LIST) and for
  // writes (PUT, DELETE).
  uint64_t peak_reads_per_second = 0;
  std::string peak_reads_prefix;
  uint64_t peak_writes_per_second = 0;
  std::string peak_writes_prefix;
  // The busiest second over all prefixes together.
  uint64_t peak_requests_per_second = 0;

  uint64_t of(ObjectRequest kind) const { return by_kind[static_cast<int>(kind)]; }
};

class CountingObjectStore : public ObjectStore {
 public:
  using Clock = std::function<absl::Time()>;
  CountingObjectStore(ObjectStore& inner, Clock clock)
      : inner_(inner), clock_(std::move(clock)) {}

  std::string Describe(absl::string_view key) const override {
    return inner_.Describe(key);
  }
  absl::Status Put(absl::string_view key, absl::string_view body) override;
  absl::StatusOr<size_t> Get(absl::string_view key, absl::Span<char> into,
                             std::optional<ObjectRange> range = std::nullopt) override;
  absl::StatusOr<ObjectInfo> Head(absl::string_view key) override;
  absl::StatusOr<ObjectListing> List(absl::string_view prefix,
                                     absl::string_view delimiter = "") override;
  absl::Status Delete(absl::string_view key) override;
  // Counted as a HEAD and a GET per key (what the default does), then
  // passed on to the store below.
  std::vector<absl::StatusOr<std::string>> GetSmallObjects(absl::Span<const std::string> keys,
                                                           size_t max_bytes,
                                                           int parallelism) override;
  absl::StatusOr<int> AbortUnfinished(absl::string_view prefix,
                                      absl::Time started_before) override;

  ObjectRequestCounts counts() const;
  // Forgets every count (between the runs of a simulation).
  void Reset();

 private:
  void Count(ObjectRequest kind, absl::string_view key);

  ObjectStore& inner_;
  const Clock clock_;
  mutable absl::Mutex mu_;
  std::array<uint64_t, kObjectRequestKinds> by_kind_ ABSL_GUARDED_BY(mu_){};
  // (prefix, second) -> (reads, writes)
  std::map<std::pair<std::string, int64_t>, std::pair<uint64_t, uint64_t>> per_second_
      ABSL_GUARDED_BY(mu_);
  std::map<int64_t, uint64_t> all_per_second_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt
