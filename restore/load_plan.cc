#include "restore/load_plan.h"

#include <algorithm>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/box.h"
#include "common/status.h"
#include "format/dtype.h"
#include "plan/tensor_item.h"
#include "restore/byte_items.h"

namespace ckpt {
namespace {

bool SameDims(const google::protobuf::RepeatedField<uint64_t>& a,
              const google::protobuf::RepeatedField<uint64_t>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end());
}

Box BoxOf(const google::protobuf::RepeatedField<uint64_t>& offsets,
          const google::protobuf::RepeatedField<uint64_t>& shape) {
  return {{offsets.data(), static_cast<size_t>(offsets.size())},
          {shape.data(), static_cast<size_t>(shape.size())}};
}

// The overlaps' element counts summing to the box's does not mean the
// stored chunks cover it: chunks that overlap each other (only a damaged or
// hostile index has them) can make up for a hole. So the runs must tile the
// item's `length` bytes exactly, or its memory would be left partly stale
// after a load that reports success (fuzz/load_request_fuzzer.cc checks
// every plan for this).
absl::Status CheckFilledOnce(std::vector<std::pair<uint64_t, uint64_t>> filled,
                             uint64_t length, absl::string_view fqn,
                             const v1::Manifest& index) {
  std::sort(filled.begin(), filled.end());
  uint64_t next = 0;
  for (const auto& [begin, end] : filled) {
    if (begin != next) break;
    next = end;
  }
  if (next == length) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      "index of ", index.job(), "/", index.checkpoint(), ": the stored chunks of ", fqn,
      " overlap each other (byte ", next, " of the ", length,
      " requested is not filled exactly once)"));
}

}  // namespace

absl::Status PlanLoadRequest(Session& session, const v1::LoadRequest& request,
                             const v1::Manifest& index,
                             const std::map<std::string, std::vector<int>>& by_fqn,
                             LoadPlanBudget::Reservation* plan,
                             std::map<int, std::vector<Delivery>>* deliveries,
                             v1::LoadResponse* response) {
  if (!session.opened()) {
    return absl::FailedPreconditionError("call OpenSession before Load");
  }
  std::map<int, std::vector<Delivery>> planned;
  std::set<std::string> seen;
  for (const v1::TensorItem& item : request.tensors()) {
    RETURN_IF_ERROR(ValidateTensorItem(item));
    const std::string key =
        absl::StrCat(item.fqn(), "@[", absl::StrJoin(item.offsets(), ","), "]");
    if (!seen.insert(key).second) {
      return absl::InvalidArgumentError(absl::StrCat("item ", key, " is requested twice"));
    }
    auto remote = session.Resolve(item.memory());
    if (!remote.ok()) return Annotate(remote.status(), absl::StrCat("item ", item.fqn()));
    auto chunks = by_fqn.find(item.fqn());
    const Box want = BoxOf(item.offsets(), item.local_shape());
    auto missing = [&](const std::string& why) -> absl::Status {
      if (request.allow_missing()) {
        response->add_missing(item.fqn());
        return absl::OkStatus();
      }
      return absl::NotFoundError(absl::StrCat("item ", item.fqn(), ": ", why, " in ",
                                              index.job(), "/", index.checkpoint()));
    };
    if (chunks == by_fqn.end()) {
      RETURN_IF_ERROR(missing("not stored"));
      continue;
    }
    const v1::StoredTensor& first = index.tensors(chunks->second.front());
    if (first.dtype() != item.dtype() || !SameDims(first.global_shape(), item.global_shape())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "item ", item.fqn(), ": requested ", v1::DType_Name(item.dtype()), " [",
          absl::StrJoin(item.global_shape(), ","), "] but stored ",
          v1::DType_Name(first.dtype()), " [", absl::StrJoin(first.global_shape(), ","),
          "]"));
    }
    uint64_t covered = 0;
    for (int t : chunks->second) {
      const v1::StoredTensor& c = index.tensors(t);
      covered += OverlapElements(BoxOf(c.offsets(), c.local_shape()), want);
    }
    if (covered != BoxElements(want)) {
      RETURN_IF_ERROR(missing(absl::StrCat("stored chunks cover ", covered, " of the ",
                                           BoxElements(want), " elements requested")));
      continue;
    }
    ASSIGN_OR_RETURN(uint64_t element_bytes, DTypeSize(item.dtype()));
    std::vector<std::pair<uint64_t, uint64_t>> filled;  // [dst, dst + length)
    for (int t : chunks->second) {
      const v1::StoredTensor& c = index.tensors(t);
      RETURN_IF_ERROR(plan->Add(CountCopyRuns(BoxOf(c.offsets(), c.local_shape()), want),
                                item.fqn()));
      for (const CopyRun& run :
           IntersectBoxes(BoxOf(c.offsets(), c.local_shape()), want, element_bytes)) {
        planned[t].push_back(
            {run.src, run.src + run.length, session.memory(), *remote + run.dst});
        if (run.length > 0) filled.emplace_back(run.dst, run.dst + run.length);
      }
    }
    RETURN_IF_ERROR(CheckFilledOnce(std::move(filled), item.memory().length(), item.fqn(),
                                    index));
  }
  response->set_checkpoint(index.checkpoint());
  for (const std::string& fqn : request.byte_items()) {
    // Which copy, checked (restore/byte_items.h).
    absl::StatusOr<const v1::StoredBytes*> found =
        FindByteItem(index, fqn, session.rank());
    if (absl::IsNotFound(found.status()) && request.allow_missing()) {
      response->add_missing(fqn);
      continue;
    }
    RETURN_IF_ERROR(found.status());
    v1::ByteItem* out = response->add_byte_items();
    out->set_fqn(fqn);
    out->set_data((*found)->data());
  }
  for (auto& [t, list] : planned) {
    auto& into = (*deliveries)[t];
    into.insert(into.end(), list.begin(), list.end());
  }
  return absl::OkStatus();
}


}  // namespace ckpt
