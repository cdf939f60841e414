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
  // Two passes, so that the plan holds what the budget charged and no more
  // (restore/load_plan_budget.h): the first checks every item and counts
  // (and reserves) its runs without making any, the second makes them into
  // lists reserved to their exact length, so no list grows by doubling.
  struct Accepted {
    const v1::TensorItem* item;
    const std::vector<int>* chunks;
    uint64_t remote;
    uint64_t element_bytes;
    uint64_t runs;
  };
  std::vector<Accepted> accepted;
  std::map<int, uint64_t> runs_per_chunk;
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
    uint64_t item_runs = 0;
    for (int t : chunks->second) {
      const v1::StoredTensor& c = index.tensors(t);
      const uint64_t runs = CountCopyRuns(BoxOf(c.offsets(), c.local_shape()), want);
      // Once reserved, the sums below cannot wrap: the budget holds them.
      RETURN_IF_ERROR(plan->Add(runs, item.fqn()));
      // A chunk that does not overlap gets no list: the reader refuses an
      // item with no deliveries.
      if (runs > 0) runs_per_chunk[t] += runs;
      item_runs += runs;
    }
    accepted.push_back({&item, &chunks->second, *remote, element_bytes, item_runs});
  }
  response->set_checkpoint(index.checkpoint());
  // Which copy, checked (restore/byte_items.h), all names in one pass.
  const ByteItemFinder byte_items(index, session.rank(), request.byte_items());
  for (const std::string& fqn : request.byte_items()) {
    absl::StatusOr<const v1::StoredBytes*> found = byte_items.Find(fqn);
    if (absl::IsNotFound(found.status()) && request.allow_missing()) {
      response->add_missing(fqn);
      continue;
    }
    RETURN_IF_ERROR(found.status());
    v1::ByteItem* out = response->add_byte_items();
    out->set_fqn(fqn);
    out->set_data((*found)->data());
  }
  std::map<int, std::vector<Delivery>> planned;
  for (const auto& [t, runs] : runs_per_chunk) planned[t].reserve(runs);
  for (const Accepted& a : accepted) {
    const Box want = BoxOf(a.item->offsets(), a.item->local_shape());
    // The tiling check's ranges live only while this item is checked; the
    // budget's second slot per run covers them.
    std::vector<std::pair<uint64_t, uint64_t>> filled;  // [dst, dst + length)
    filled.reserve(a.runs);
    for (int t : *a.chunks) {
      auto list = planned.find(t);
      if (list == planned.end()) continue;  // no overlap with any item
      const v1::StoredTensor& c = index.tensors(t);
      ForEachCopyRun(BoxOf(c.offsets(), c.local_shape()), want, a.element_bytes,
                     [&](const CopyRun& run) {
                       list->second.push_back({run.src, run.src + run.length, session.memory(),
                                       a.remote + run.dst});
                       if (run.length > 0) filled.emplace_back(run.dst, run.dst + run.length);
                     });
    }
    RETURN_IF_ERROR(CheckFilledOnce(std::move(filled), a.item->memory().length(),
                                    a.item->fqn(), index));
  }
  // Handed over whole: a copy would hold the plan twice.
  *deliveries = std::move(planned);
  return absl::OkStatus();
}

std::map<int, std::vector<Delivery>> MergeLoadPlans(
    std::vector<std::map<int, std::vector<Delivery>>>* plans) {
  std::map<int, uint64_t> total;
  for (const auto& plan : *plans) {
    for (const auto& [t, list] : plan) total[t] += list.size();
  }
  std::map<int, std::vector<Delivery>> merged;
  for (auto& plan : *plans) {
    for (auto& [t, list] : plan) {
      std::vector<Delivery>& into = merged[t];
      if (into.empty() && list.size() == total[t]) {
        into = std::move(list);  // the chunk's only reader: no copy at all
        continue;
      }
      if (into.capacity() == 0) into.reserve(total[t]);
      into.insert(into.end(), list.begin(), list.end());
      // Freed at once, so a run is held at most twice, only while copied.
      std::vector<Delivery>().swap(list);
    }
  }
  return merged;
}

}  // namespace ckpt
