#include "session/layout_bytes.h"

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "format/dtype.h"
#include "google/protobuf/unknown_field_set.h"

namespace ckpt {
namespace {

// Heap bytes of a std::string (none while it fits the inline buffer).
uint64_t HeapBytes(const std::string& s) {
  return s.capacity() > 15 ? s.capacity() + 1 : 0;
}

template <typename T>
uint64_t HeapBytes(const std::vector<T>& v) {
  return v.capacity() * sizeof(T);
}

// What malloc adds to an item's heap blocks, which SpaceUsedLong does not
// count: about six blocks per TensorItem (fqn, three shapes, the memory
// reference, the replica ranks) at ~16 bytes each. With it the estimate
// matches the measured growth: ~600 bytes per item of a 1,000,000-item
// layout (LayoutBytes 596 MB; RSS +570 to +600 MB per further layout).
constexpr uint64_t kMallocBytesPerItem = 96;

// --- The pieces of LayoutBytesBound, one per structure the build makes. ---

// A copied repeated field of `n` elements of `size` bytes, as SpaceUsedLong
// counts it: the copy reserves max(n, 8 / size) elements behind an 8-byte
// header (protobuf's RepeatedField::Reserve, CalculateReserveSize).
uint64_t RepeatedBound(int n, uint64_t size) {
  return n == 0 ? 0 : 16 + size * static_cast<uint64_t>(n);
}

// Unknown fields a copy carries along. The copy reserves exactly as many
// fields and allocates each string at its length, so it holds no more than
// the parsed original.
uint64_t UnknownBytes(const google::protobuf::Message& m) {
  return m.GetReflection()->GetUnknownFields(m).SpaceUsedExcludingSelfLong();
}

// The item's copy in TensorLayout::items (reserved exactly, so one
// sizeof(TensorItem) each), its heap as SpaceUsedLong counts it, the malloc
// overhead LayoutBytes adds, and its address in TensorLayout::remote.
uint64_t ItemBound(const v1::TensorItem& item) {
  uint64_t bytes = sizeof(v1::TensorItem) + kMallocBytesPerItem +
                   sizeof(uint64_t) + UnknownBytes(item);
  // A string field is a pointer to a heap std::string, which holds its
  // characters at exactly their length when copied.
  bytes += sizeof(std::string) + item.fqn().size() + 1;
  bytes += RepeatedBound(item.global_shape_size(), sizeof(uint64_t)) +
           RepeatedBound(item.offsets_size(), sizeof(uint64_t)) +
           RepeatedBound(item.local_shape_size(), sizeof(uint64_t)) +
           RepeatedBound(item.replica_ranks_size(), sizeof(uint32_t));
  if (item.has_memory()) {
    bytes += sizeof(v1::MemoryRef) + UnknownBytes(item.memory());
  }
  return bytes;
}

uint64_t Digits(uint64_t v) {
  uint64_t digits = 1;
  while (v >= 10) {
    v /= 10;
    ++digits;
  }
  return digits;
}

// "[a,b,c]": brackets, digits and commas.
uint64_t JsonArrayBytes(const google::protobuf::RepeatedField<uint64_t>& values) {
  uint64_t bytes = 2;
  for (uint64_t v : values) bytes += Digits(v) + 1;
  return bytes;
}

// Everything of an entry's JSON in a data file's safetensors header
// (format/safetensors_layout.cc) but its fqn, dtype name and arrays:
//   "<fqn>":{"dtype":"<name>","shape":<array>,"data_offsets":[<b>,<e>]},
// and its DCP_SHARDING_INFO entry, a JSON string inside the JSON, whose 4
// quotes are escaped there:
//   "<fqn>":{"saved_offsets":<array>},
// Counted generously (the exact sum is 74).
constexpr uint64_t kHeaderEntryFixedBytes = 96;
// A header's part that is not one of its entries: the 8-byte length prefix,
// braces, "__metadata__" with its keys and values (~85 bytes), and the
// padding up to kSafetensorsAlignment (< 4096). BuildSafetensorsLayout keeps
// the header without slack (capacity == size), plus HeapBytes' one.
constexpr uint64_t kHeaderFixedBytes = 128 + 4096 + 1;
// A file name: at most 54 characters (node_planner.cc ReplicaFileName), in a
// string StrFormat grew by doubling.
constexpr uint64_t kFileNameHeapBytes = 128;
// The longest safetensors dtype name (format/dtype.cc: "F8_E4M3FNUZ").
constexpr uint64_t kMaxDTypeNameBytes = 16;

// What the plan holds for the item, owned or not, whichever is more:
// owned, its index in PlannedFile::items (grown by doubling), its offset in
// SafetensorsLayout::data_offsets (reserved exactly) and its entry in the
// file's header, whose data_offsets have at most `offset_digits` digits;
// foreign, a ForeignChunk (its vector grown by doubling) with the owner's
// file name.
uint64_t PlanItemBound(const v1::TensorItem& item, uint64_t offset_digits) {
  absl::StatusOr<absl::string_view> name = DTypeSafetensorsName(item.dtype());
  const uint64_t header_entry =
      kHeaderEntryFixedBytes + 2 * item.fqn().size() +
      (name.ok() ? name->size() : kMaxDTypeNameBytes) +
      JsonArrayBytes(item.local_shape()) + JsonArrayBytes(item.offsets()) +
      2 * offset_digits;
  const uint64_t owned = 2 * sizeof(size_t) + sizeof(uint64_t) + header_entry;
  const uint64_t foreign = 2 * sizeof(ForeignChunk) + kFileNameHeapBytes;
  return std::max(owned, foreign);
}

// What the plan holds per replica set of `ranks` members: a PlannedFile and
// a ReplicaSetSummary (their vectors grown by doubling), both copies of the
// set, the file's name and its header's fixed part.
uint64_t PlanSetBound(uint64_t ranks) {
  return 2 * (sizeof(PlannedFile) + sizeof(ReplicaSetSummary)) +
         2 * sizeof(uint32_t) * ranks + kFileNameHeapBytes + kHeaderFixedBytes;
}

}  // namespace

uint64_t LayoutBytes(const TensorLayout& layout) {
  uint64_t bytes =
      sizeof(TensorLayout) + HeapBytes(layout.items) + HeapBytes(layout.remote);
  // SpaceUsedLong counts the message itself too: HeapBytes(items) has it.
  for (const v1::TensorItem& item : layout.items) {
    bytes +=
        item.SpaceUsedLong() - sizeof(v1::TensorItem) + kMallocBytesPerItem;
  }
  const RankPlan& plan = layout.plan;
  bytes +=
      HeapBytes(plan.files) + HeapBytes(plan.foreign) + HeapBytes(plan.sets);
  for (const PlannedFile& f : plan.files) {
    bytes += HeapBytes(f.name) + HeapBytes(f.replica_set) + HeapBytes(f.items) +
             HeapBytes(f.layout.header) + HeapBytes(f.layout.data_offsets);
  }
  for (const ForeignChunk& c : plan.foreign) bytes += HeapBytes(c.file);
  for (const ReplicaSetSummary& s : plan.sets) bytes += HeapBytes(s.ranks);
  return bytes;
}

uint64_t LayoutBytesBound(
    const google::protobuf::RepeatedPtrField<v1::TensorItem>& tensors) {
  // A file's data_offsets are sums of its items' lengths: no more digits
  // than the sum of all of them has (saturated: 20 digits at most).
  uint64_t data_bytes = 0;
  for (const v1::TensorItem& item : tensors) {
    if (__builtin_add_overflow(data_bytes, item.memory().length(), &data_bytes)) {
      data_bytes = std::numeric_limits<uint64_t>::max();
      break;
    }
  }
  const uint64_t offset_digits = Digits(data_bytes);

  // Replica sets, counted as PlanRank meets them: a run of items declaring
  // the same ranks is one set; every item declaring none is in the
  // caller's set alone. Sets that canonicalize alike are counted twice,
  // which only loosens the bound. Sums cannot wrap: each term is at most a
  // few times the bytes of the request, which --max_request_bytes bounds.
  uint64_t bytes = sizeof(TensorLayout);
  bool own_set = false;
  const google::protobuf::RepeatedField<uint32_t>* last = nullptr;
  for (const v1::TensorItem& item : tensors) {
    bytes += ItemBound(item) + PlanItemBound(item, offset_digits);
    const auto& declared = item.replica_ranks();
    if (last != nullptr && !declared.empty() &&
        declared.size() == last->size() &&
        std::equal(declared.begin(), declared.end(), last->begin())) {
      continue;
    }
    last = &declared;
    if (declared.empty()) {
      own_set = true;
    } else {
      bytes += PlanSetBound(static_cast<uint64_t>(declared.size()));
    }
  }
  if (own_set) bytes += PlanSetBound(1);
  return bytes;
}

}  // namespace ckpt
