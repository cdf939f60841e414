#include "storage/counting_object_store.h"

namespace ckpt {

namespace {
bool IsWrite(ObjectRequest kind) {
  return kind == ObjectRequest::kPut || kind == ObjectRequest::kDelete;
}
}  // namespace

void CountingObjectStore::Count(ObjectRequest kind, absl::string_view key) {
  const size_t slash = key.rfind('/');
  std::string prefix(slash == absl::string_view::npos ? absl::string_view()
                                                      : key.substr(0, slash + 1));
  const int64_t second = absl::ToUnixSeconds(clock_());
  absl::MutexLock lock(&mu_);
  ++by_kind_[static_cast<int>(kind)];
  auto& [reads, writes] = per_second_[{std::move(prefix), second}];
  (IsWrite(kind) ? writes : reads) += 1;
  ++all_per_second_[second];
}

absl::Status CountingObjectStore::Put(absl::string_view key, absl::string_view body) {
  Count(ObjectRequest::kPut, key);
  return inner_.Put(key, body);
}

absl::StatusOr<size_t> CountingObjectStore::Get(absl::string_view key,
                                                absl::Span<char> into,
                                                std::optional<ObjectRange> range) {
  Count(ObjectRequest::kGet, key);
  return inner_.Get(key, into, range);
}

absl::StatusOr<ObjectInfo> CountingObjectStore::Head(absl::string_view key) {
  Count(ObjectRequest::kHead, key);
  return inner_.Head(key);
}

absl::StatusOr<ObjectListing> CountingObjectStore::List(absl::string_view prefix,
                                                        absl::string_view delimiter) {
  Count(ObjectRequest::kList, prefix);
  return inner_.List(prefix, delimiter);
}

absl::Status CountingObjectStore::Delete(absl::string_view key) {
  Count(ObjectRequest::kDelete, key);
  return inner_.Delete(key);
}

std::vector<absl::StatusOr<std::string>> CountingObjectStore::GetSmallObjects(
    absl::Span<const std::string> keys, size_t max_bytes, int parallelism) {
  for (const std::string& key : keys) {
    Count(ObjectRequest::kHead, key);
    Count(ObjectRequest::kGet, key);
  }
  return inner_.GetSmallObjects(keys, max_bytes, parallelism);
}

absl::StatusOr<int> CountingObjectStore::AbortUnfinished(absl::string_view prefix,
                                                         absl::Time started_before) {
  // A listing of the unfinished writes, then one request per abort: counted
  // as the listing (the aborts are rare, and the driver's own business).
  Count(ObjectRequest::kList, prefix);
  return inner_.AbortUnfinished(prefix, started_before);
}

ObjectRequestCounts CountingObjectStore::counts() const {
  ObjectRequestCounts counts;
  absl::MutexLock lock(&mu_);
  counts.by_kind = by_kind_;
  for (uint64_t n : by_kind_) counts.total += n;
  for (const auto& [where, rw] : per_second_) {
    if (rw.first > counts.peak_reads_per_second) {
      counts.peak_reads_per_second = rw.first;
      counts.peak_reads_prefix = where.first;
    }
    if (rw.second > counts.peak_writes_per_second) {
      counts.peak_writes_per_second = rw.second;
      counts.peak_writes_prefix = where.first;
    }
  }
  for (const auto& [second, n] : all_per_second_) {
    counts.peak_requests_per_second = std::max(counts.peak_requests_per_second, n);
  }
  return counts;
}

void CountingObjectStore::Reset() {
  absl::MutexLock lock(&mu_);
  by_kind_ = {};
  per_second_.clear();
  all_per_second_.clear();
}

}  // namespace ckpt
