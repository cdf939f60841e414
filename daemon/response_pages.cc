#include "daemon/response_pages.h"

#include <array>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/names.h"
#include "common/status.h"
#include "google/protobuf/io/coded_stream.h"
#include "restore/byte_items.h"

namespace ckpt {
namespace {

constexpr std::array<absl::string_view, 5> kInspectLists = {
    "node_manifests", "files", "replica_sets", "tensors", "byte_items"};

// What an entry of `size` bytes adds to a repeated field: its tag (one
// byte: every field number involved is below 16), its length, its bytes.
uint64_t EntryBytes(uint64_t size) {
  return 1 + google::protobuf::io::CodedOutputStream::VarintSize64(size) + size;
}

uint64_t SizeOf(const std::string& s) { return s.size(); }
template <typename Message>
uint64_t SizeOf(const Message& m) {
  return m.ByteSizeLong();
}

// Moves entries of `from`, from `start` on, to the end of `to` while the
// page stays within `max_bytes` (`used` counts it); returns the first entry
// left.
template <typename T>
int AppendWhileFits(google::protobuf::RepeatedPtrField<T>& from, int start,
                    google::protobuf::RepeatedPtrField<T>* to,
                    uint64_t max_bytes, uint64_t* used) {
  int i = start;
  for (; i < from.size(); ++i) {
    const uint64_t bytes = EntryBytes(SizeOf(from.Get(i)));
    if (*used + bytes > max_bytes) break;
    *used += bytes;
    *to->Add() = std::move(*from.Mutable(i));
  }
  return i;
}

}  // namespace

absl::StatusOr<InspectPosition> ParseInspectPageToken(absl::string_view token) {
  const std::vector<absl::string_view> parts = absl::StrSplit(token, ':');
  InspectPosition position;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[1], &position.list) ||
      !absl::SimpleAtoi(parts[2], &position.entry) || position.list < 0 ||
      position.list >= static_cast<int>(kInspectLists.size()) ||
      position.entry < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", token, "' is not a page token of Inspect"));
  }
  position.checkpoint = std::string(parts[0]);
  RETURN_IF_ERROR(ValidateStorageName(position.checkpoint, "checkpoint"));
  return position;
}

absl::StatusOr<v1::InspectResponse> InspectPage(v1::CommitRecord record,
                                                const std::string& checkpoint,
                                                bool paged,
                                                const InspectPosition& from,
                                                uint64_t max_bytes) {
  v1::InspectResponse response;
  if (!paged) {
    const uint64_t bytes = record.ByteSizeLong();
    if (bytes + kPageOverheadBytes > max_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the COMMIT record of ", checkpoint, " is ", bytes,
          " bytes, more than the ", max_bytes,
          "-byte message limit (--max_request_bytes): inspect it with a "
          "client that asks for pages (ckptctl does)"));
    }
    *response.mutable_record() = std::move(record);
    return response;
  }
  // The lists come out of the record; what is left are its single fields.
  google::protobuf::RepeatedPtrField<std::string> manifests;
  google::protobuf::RepeatedPtrField<v1::DataFile> files;
  google::protobuf::RepeatedPtrField<v1::ReplicaSet> sets;
  google::protobuf::RepeatedPtrField<v1::StoredTensor> tensors;
  google::protobuf::RepeatedPtrField<v1::StoredBytes> bytes;
  manifests.Swap(record.mutable_node_manifests());
  files.Swap(record.mutable_index()->mutable_files());
  sets.Swap(record.mutable_index()->mutable_replica_sets());
  tensors.Swap(record.mutable_index()->mutable_tensors());
  bytes.Swap(record.mutable_index()->mutable_byte_items());
  const std::array<int, 5> sizes = {manifests.size(), files.size(), sets.size(),
                                    tensors.size(), bytes.size()};
  if (from.entry > sizes[from.list]) {
    return absl::InvalidArgumentError(
        absl::StrCat("page token points past the ", sizes[from.list], " ",
                     kInspectLists[from.list], " of ", checkpoint));
  }
  v1::CommitRecord& page = *response.mutable_record();
  const bool first = from.list == 0 && from.entry == 0;
  if (first) page = std::move(record);
  uint64_t used = page.ByteSizeLong() + kPageOverheadBytes;
  bool any = false;
  int entry = from.entry;
  for (int list = from.list; list < static_cast<int>(kInspectLists.size());
       ++list, entry = 0) {
    v1::Manifest* index = page.mutable_index();
    int next = 0;
    switch (list) {
      case 0:
        next = AppendWhileFits(manifests, entry, page.mutable_node_manifests(),
                               max_bytes, &used);
        break;
      case 1:
        next = AppendWhileFits(files, entry, index->mutable_files(), max_bytes,
                               &used);
        break;
      case 2:
        next = AppendWhileFits(sets, entry, index->mutable_replica_sets(),
                               max_bytes, &used);
        break;
      case 3:
        next = AppendWhileFits(tensors, entry, index->mutable_tensors(),
                               max_bytes, &used);
        break;
      default:
        next = AppendWhileFits(bytes, entry, index->mutable_byte_items(),
                               max_bytes, &used);
        break;
    }
    any = any || next > entry;
    if (next == sizes[list]) continue;
    // Entry `next` did not fit: the next page starts there, unless it
    // would not fit a page of its own either.
    if (!any && !first) {
      return absl::ResourceExhaustedError(
          absl::StrCat("entry ", next, " of the ", kInspectLists[list], " of ",
                       checkpoint, "'s COMMIT record is larger than the ",
                       max_bytes, "-byte message limit (--max_request_bytes)"));
    }
    response.set_next_page_token(
        absl::StrCat(checkpoint, ":", list, ":", next));
    return response;
  }
  return response;
}

absl::Status FitLoadResponse(bool paged, uint64_t max_bytes,
                             v1::LoadResponse* response) {
  const uint64_t whole = response->ByteSizeLong() + kPageOverheadBytes;
  if (whole <= max_bytes) return absl::OkStatus();
  if (!paged) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the response to this load is ", whole, " bytes with its ",
        response->byte_items_size(), " byte items, more than the ", max_bytes,
        "-byte message limit (--max_request_bytes); a client that asks for its "
        "byte items in pages (libckpt does) can load it"));
  }
  google::protobuf::RepeatedPtrField<v1::ByteItem> items;
  items.Swap(response->mutable_byte_items());
  uint64_t used = response->ByteSizeLong() + kPageOverheadBytes;
  // Room for every name in pending_byte_items first: any may end up there.
  for (const v1::ByteItem& item : items) used += EntryBytes(item.fqn().size());
  if (used > max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the response to this load is ", used,
                     " bytes even without its byte items, "
                     "more than the ",
                     max_bytes, "-byte message limit (--max_request_bytes)"));
  }
  const int kept = AppendWhileFits(items, 0, response->mutable_byte_items(),
                                   max_bytes, &used);
  for (int i = kept; i < items.size(); ++i) {
    response->add_pending_byte_items(
        std::move(*items.Mutable(i)->mutable_fqn()));
  }
  return absl::OkStatus();
}

absl::Status FillByteItemsPage(
    const v1::Manifest& index, uint32_t rank,
    const google::protobuf::RepeatedPtrField<std::string>& fqns,
    uint64_t max_bytes, v1::LoadByteItemsResponse* response) {
  uint64_t used = kPageOverheadBytes;
  // Room for every name in pending_byte_items first: any may end up there.
  for (const std::string& fqn : fqns) used += EntryBytes(fqn.size());
  if (used > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the names of ", fqns.size(), " byte items alone pass the ", max_bytes,
        "-byte message limit (--max_request_bytes): ask for fewer at a time"));
  }
  // One pass over the record's byte items for all the names at once.
  const ByteItemFinder finder(index, rank, fqns);
  int i = 0;
  for (; i < fqns.size(); ++i) {
    const std::string& fqn = fqns.Get(i);
    ASSIGN_OR_RETURN(const v1::StoredBytes* stored, finder.Find(fqn));
    const uint64_t bytes =
        EntryBytes(EntryBytes(fqn.size()) + EntryBytes(stored->data().size()));
    if (used + bytes > max_bytes) {
      if (i == 0) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "byte item ", fqn, " of ", index.checkpoint(), " is ",
            stored->data().size(), " bytes, more than fits the ", max_bytes,
            "-byte message limit (--max_request_bytes)"));
      }
      break;
    }
    used += bytes;
    v1::ByteItem* item = response->add_byte_items();
    item->set_fqn(fqn);
    item->set_data(stored->data());
  }
  for (; i < fqns.size(); ++i) response->add_pending_byte_items(fqns.Get(i));
  return absl::OkStatus();
}

}  // namespace ckpt
