#include "storage/in_memory_object_store.h"

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ckpt {

absl::StatusOr<size_t> CopyObjectRange(absl::string_view object, absl::Span<char> into,
                                       std::optional<ObjectRange> range,
                                       absl::string_view name) {
  absl::StatusOr<ObjectRange> read = PlanObjectRead(object.size(), into.size(), range, name);
  if (!read.ok()) return read.status();
  if (read->length > 0) std::memcpy(into.data(), object.data() + read->offset, read->length);
  return static_cast<size_t>(read->length);
}

std::string InMemoryObjectStore::Describe(absl::string_view key) const {
  return absl::StrCat("memory:", key);
}

absl::Status InMemoryObjectStore::Put(absl::string_view key, absl::string_view body) {
  if (absl::Status valid = ValidateObjectKey(key); !valid.ok()) return valid;
  absl::MutexLock lock(&mu_);
  auto it = objects_.find(key);
  const uint64_t replaced = it == objects_.end() ? 0 : it->second.size();
  if (bytes_ - replaced + body.size() > max_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "put ", Describe(key), ": the in-memory store's ", max_bytes_,
        " bytes are used up"));
  }
  bytes_ = bytes_ - replaced + body.size();
  if (it == objects_.end()) {
    objects_.emplace(std::string(key), std::string(body));
  } else {
    it->second.assign(body.data(), body.size());
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> InMemoryObjectStore::Get(absl::string_view key,
                                                absl::Span<char> into,
                                                std::optional<ObjectRange> range) {
  if (absl::Status valid = ValidateObjectKey(key); !valid.ok()) return valid;
  absl::MutexLock lock(&mu_);
  auto it = objects_.find(key);
  if (it == objects_.end()) {
    return absl::NotFoundError(absl::StrCat("no object ", Describe(key)));
  }
  return CopyObjectRange(it->second, into, range, Describe(key));
}

absl::StatusOr<ObjectInfo> InMemoryObjectStore::Head(absl::string_view key) {
  if (absl::Status valid = ValidateObjectKey(key); !valid.ok()) return valid;
  absl::MutexLock lock(&mu_);
  auto it = objects_.find(key);
  if (it == objects_.end()) {
    return absl::NotFoundError(absl::StrCat("no object ", Describe(key)));
  }
  return ObjectInfo{it->first, it->second.size()};
}

absl::StatusOr<ObjectListing> InMemoryObjectStore::List(absl::string_view prefix,
                                                        absl::string_view delimiter) {
  if (absl::Status valid = ValidateObjectKey(prefix, /*prefix_only=*/true); !valid.ok()) {
    return valid;
  }
  ObjectListing listing;
  absl::MutexLock lock(&mu_);
  for (auto it = objects_.lower_bound(prefix);
       it != objects_.end() && absl::StartsWith(it->first, prefix); ++it) {
    absl::string_view rest = absl::string_view(it->first).substr(prefix.size());
    if (!delimiter.empty()) {
      size_t cut = rest.find(delimiter);
      if (cut != absl::string_view::npos) {
        std::string rolled = absl::StrCat(prefix, rest.substr(0, cut + delimiter.size()));
        if (listing.prefixes.empty() || listing.prefixes.back() != rolled) {
          listing.prefixes.push_back(std::move(rolled));
        }
        continue;
      }
    }
    listing.objects.push_back({it->first, it->second.size()});
  }
  return listing;
}

absl::Status InMemoryObjectStore::Delete(absl::string_view key) {
  if (absl::Status valid = ValidateObjectKey(key); !valid.ok()) return valid;
  absl::MutexLock lock(&mu_);
  auto it = objects_.find(key);
  if (it == objects_.end()) return absl::OkStatus();
  bytes_ -= it->second.size();
  objects_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<int> InMemoryObjectStore::AbortUnfinished(absl::string_view prefix,
                                                         absl::Time) {
  if (absl::Status valid = ValidateObjectKey(prefix, /*prefix_only=*/true); !valid.ok()) {
    return valid;
  }
  return 0;
}

}  // namespace ckpt
