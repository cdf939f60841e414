// Fuzz target: what a trainer asks to save, checked as Save and
// DefineLayout check it before anything is queued: the checkpoint name
// (common/names.h), every tensor item (plan/tensor_item.h
// ValidateTensorItem), its memory inside the session's registered regions
// and the node plan of the items (save/save_plan.h PlanTensorLayout, which
// DefineLayout runs alone), the item limit, and the byte items
// (ValidateByteItems), in SaveCoordinator::Submit's order.
//
// Input: one byte choosing the session's world size (1 to 8) and rank, then
// a serialized SaveRequest (a DefineLayoutRequest has the same tensors
// field number, so its bytes read the same). A request that passes must
// plan to something consistent: each item resolved inside live memory,
// written in exactly one of this rank's files or left to another replica,
// and each file's safetensors header what its items say.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt/v1/control.pb.h"
#include "common/names.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_session.h"
#include "save/save_plan.h"
#include "session/layout_bytes.h"
#include "storage/checkpoint_store.h"

namespace ckpt::fuzz {
namespace {

// SaveOptions' default is 1 << 20; a smaller limit lets the fuzzer reach it.
constexpr uint32_t kMaxItems = 64;

void CheckLayout(const Session& session, const TensorLayout& layout) {
  FUZZ_CHECK(layout.remote.size() == layout.items.size(), "an address per item");
  for (size_t i = 0; i < layout.items.size(); ++i) {
    FUZZ_CHECK(InsideLiveRegion(layout.remote[i], layout.items[i].memory().length()),
               layout.items[i].fqn());
  }
  std::vector<int> placed(layout.items.size(), 0);
  for (const PlannedFile& file : layout.plan.files) {
    std::vector<SafetensorsEntry> entries;
    for (size_t i : file.items) {
      FUZZ_CHECK(i < layout.items.size(), file.name);
      ++placed[i];
      const v1::TensorItem& item = layout.items[i];
      entries.push_back({item.fqn(),
                         item.dtype(),
                         {item.local_shape().begin(), item.local_shape().end()},
                         {item.offsets().begin(), item.offsets().end()},
                         item.memory().length()});
    }
    CheckSafetensorsHeader(file.layout, entries);
    FUZZ_CHECK(std::find(file.replica_set.begin(), file.replica_set.end(),
                         session.rank()) != file.replica_set.end(),
               file.name);
  }
  for (const ForeignChunk& foreign : layout.plan.foreign) {
    FUZZ_CHECK(foreign.item < layout.items.size() && foreign.owner_rank != session.rank() &&
                   foreign.owner_rank < session.world_size(),
               foreign.file);
    ++placed[foreign.item];
  }
  for (size_t i = 0; i < placed.size(); ++i) {
    FUZZ_CHECK(placed[i] == 1, layout.items[i].fqn());
  }
}

void Submit(uint8_t shape, const v1::SaveRequest& request) {
  const uint32_t world = 1 + (shape & 7);
  const uint32_t rank = (shape >> 3) % world;
  std::shared_ptr<Session> session = OpenFuzzSession(rank, world);
  if (!ValidateStorageName(request.checkpoint(), "checkpoint").ok() ||
      request.checkpoint() == kLatestAlias) {
    return;
  }
  if (request.layout_id() != 0 && request.tensors_size() > 0) return;
  // DefineLayout, then the save that names the layout: the same checks as a
  // save with its items inline. As the daemon does, the layout's bound is
  // reserved first; whatever was built must be within it.
  const uint64_t bound = LayoutBytesBound(request.tensors());
  absl::StatusOr<LayoutBudget::Charge> reserved = session->ReserveLayout(bound);
  if (!reserved.ok()) return;  // past the default budget: never built
  absl::StatusOr<std::shared_ptr<const TensorLayout>> layout =
      PlanTensorLayout(*session, request.tensors(), kMaxItems);
  if (!layout.ok()) return;
  CheckLayout(*session, **layout);
  const uint64_t bytes = LayoutBytes(**layout);
  FUZZ_CHECK(bytes <= bound, absl::StrCat("layout holds ", bytes,
                                          " bytes, over its bound ", bound));
  absl::StatusOr<uint64_t> id = session->AddLayout(*layout, *std::move(reserved));
  FUZZ_CHECK(id.ok(), id.status().ToString());
  absl::StatusOr<std::shared_ptr<const TensorLayout>> found = session->FindLayout(*id);
  FUZZ_CHECK(found.ok() && *found == *layout, found.status().ToString());
  (void)session->FindLayout(request.layout_id());
  if ((*layout)->items.size() + request.byte_items_size() > kMaxItems) return;
  (void)ValidateByteItems(**layout, request.byte_items());
}

}  // namespace
}  // namespace ckpt::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ckpt::fuzz::QuietProtobufLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  ckpt::v1::SaveRequest request;
  if (!request.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;
  ckpt::fuzz::Submit(data[0], request);
  return 0;
}
