// Replies that can outgrow the gRPC message limit, cut into pages.
//
// The daemon sends at most --max_request_bytes per message (and clients
// accept at most kMaxControlMessageBytes). Two replies grow with what a
// checkpoint holds rather than with the request: Inspect's COMMIT record
// (block checksums of every chunk, every byte item; the merged index of a
// large job is tens of MB) and a Load's byte items (whatever opaque state
// the ranks saved). Each comes in pages a client asks for one after
// another; a client that does not say it follows pages (an older one)
// gets the whole reply as before, or RESOURCE_EXHAUSTED naming the limit
// where it does not fit (gRPC would refuse to send it anyway).
//
// Inspect pages. The record's lists are sent in a fixed order
// (node_manifests, then the index's files, replica_sets, tensors,
// byte_items), as many entries per page as fit. The first page also
// carries every single field of the record and its index; later pages
// carry list entries only, so the client merges the pages in order
// (protobuf MergeFrom appends repeated fields). The page token is
// "<checkpoint>:<list>:<entry>": the checkpoint that "latest" resolved to
// on the first page (names never contain ':'), so every page is cut from
// the same committed record, which never changes.
//
// Load pages. A Load's response keeps the byte items, in request order,
// that fit with everything else in it; the rest are named in
// pending_byte_items and fetched with LoadByteItems, which answers as many
// of them as fit and names the rest again.
//
// Sizes are computed from the protobuf encoding (an entry of a repeated
// field costs its tag, its length's varint and its bytes) plus
// kPageOverheadBytes for the fields around the entries: the page token and
// the length prefixes of the messages that enclose them.
//
// Thread-safety: functions of their arguments.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/v1/control.pb.h"
#include "ckpt/v1/manifest.pb.h"

namespace ckpt {

inline constexpr uint64_t kPageOverheadBytes = 1024;

// Where an Inspect page starts.
struct InspectPosition {
  std::string checkpoint;  // the name, never "latest"
  int list = 0;            // 0 node_manifests .. 4 byte_items
  int entry = 0;           // into that list
};

// Parses InspectRequest.page_token; InvalidArgument if it is not one this
// daemon makes.
absl::StatusOr<InspectPosition> ParseInspectPageToken(absl::string_view token);

// The Inspect response for `record` (of checkpoint `checkpoint`): the
// whole record if not `paged` (ResourceExhausted if that passes
// `max_bytes`), else the page at `from` (a default position: the first).
absl::StatusOr<v1::InspectResponse> InspectPage(v1::CommitRecord record,
                                                const std::string& checkpoint,
                                                bool paged,
                                                const InspectPosition& from,
                                                uint64_t max_bytes);

// Makes a Load response fit `max_bytes`: with `paged`, moves the byte items
// that do not fit into pending_byte_items; without, ResourceExhausted if it
// does not fit.
absl::Status FitLoadResponse(bool paged, uint64_t max_bytes,
                             v1::LoadResponse* response);

// One LoadByteItems page: the byte items `fqns` names, in order, as many as
// fit `max_bytes` (at least one, else ResourceExhausted), each the copy
// rank `rank` gets (restore/byte_items.h); the rest go to
// pending_byte_items.
absl::Status FillByteItemsPage(
    const v1::Manifest& index, uint32_t rank,
    const google::protobuf::RepeatedPtrField<std::string>& fqns,
    uint64_t max_bytes, v1::LoadByteItemsResponse* response);

}  // namespace ckpt
