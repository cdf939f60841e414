// Fuzz target: what a trainer asks to load, against what the storage root
// says was stored: restore/load_plan.h PlanLoadRequest (each tensor item
// validated, resolved in the session's memory, matched with the stored
// chunks of its fqn, turned into deliveries) on an index that passed
// ValidateManifest, as every COMMIT's index has.
//
// Input: one byte choosing the session's world size (1 to 8) and rank; a
// u16 LE length L; L bytes of a serialized LoadRequest; the rest a
// serialized Manifest, the COMMIT's index. A plan that comes back must
// deliver only bytes inside the stored chunks, only into live registered
// memory, and fill each requested item's memory exactly once: every byte
// of it, none twice (no trainer memory left stale, none written twice).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"
#include "ckpt/v1/control.pb.h"
#include "ckpt/v1/manifest.pb.h"
#include "format/manifest_check.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_session.h"
#include "restore/load_plan.h"

namespace ckpt::fuzz {
namespace {

using Deliveries = std::map<int, std::vector<Delivery>>;

void CheckDeliveries(Session& session, const v1::Manifest& index,
                     const Deliveries& deliveries) {
  for (const auto& [t, list] : deliveries) {
    FUZZ_CHECK(t >= 0 && t < index.tensors_size(), std::to_string(t));
    for (const Delivery& d : list) {
      FUZZ_CHECK(d.begin <= d.end && d.end <= index.tensors(t).length(),
                 index.tensors(t).fqn());
      FUZZ_CHECK(d.destination == session.memory(), "destination");
      FUZZ_CHECK(InsideLiveRegion(d.remote, d.end - d.begin), index.tensors(t).fqn());
    }
  }
}

// The daemon's bound on plans, smaller: a hostile slice of a huge tensor
// is refused before its runs are made, so an input cannot exhaust the
// fuzzer's memory either.
LoadPlanBudget& PlanBudget() {
  static const std::shared_ptr<LoadPlanBudget> budget = LoadPlanBudget::Create(64ull << 20);
  return *budget;
}

// Plans each tensor item alone: its deliveries must tile its memory.
void CheckEachItemFilledOnce(Session& session, const v1::LoadRequest& request,
                             const v1::Manifest& index,
                             const std::map<std::string, std::vector<int>>& by_fqn) {
  for (const v1::TensorItem& item : request.tensors()) {
    v1::LoadRequest one;
    *one.add_tensors() = item;
    one.set_allow_missing(request.allow_missing());
    Deliveries deliveries;
    v1::LoadResponse response;
    LoadPlanBudget::Reservation plan = PlanBudget().Open();
    const absl::Status planned =
        PlanLoadRequest(session, one, index, by_fqn, &plan, &deliveries, &response);
    FUZZ_CHECK(planned.ok(), planned.ToString());  // it passed with the others
    if (response.missing_size() > 0) {
      FUZZ_CHECK(deliveries.empty(), item.fqn());
      continue;
    }
    std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [begin, end) in memory
    for (const auto& [t, list] : deliveries) {
      for (const Delivery& d : list) {
        if (d.end > d.begin) ranges.emplace_back(d.remote, d.remote + (d.end - d.begin));
      }
    }
    std::sort(ranges.begin(), ranges.end());
    absl::StatusOr<uint64_t> at = session.Resolve(item.memory());
    FUZZ_CHECK(at.ok(), at.status().ToString());
    uint64_t next = *at;
    for (const auto& [begin, end] : ranges) {
      FUZZ_CHECK(begin == next,
                 absl::StrCat(item.fqn(), ": byte ", begin - *at, " delivered where byte ",
                              next - *at, " was expected (a hole or an overlap)"));
      next = end;
    }
    FUZZ_CHECK(next == *at + item.memory().length(), absl::StrCat(item.fqn(), ": not filled"));
  }
}

void Load(uint8_t shape, const v1::LoadRequest& request, const v1::Manifest& index) {
  const uint32_t world = 1 + (shape & 7);
  const uint32_t rank = (shape >> 3) % world;
  std::shared_ptr<Session> session = OpenFuzzSession(rank, world);
  // As the loader builds it from the COMMIT's index.
  std::map<std::string, std::vector<int>> by_fqn;
  for (int t = 0; t < index.tensors_size(); ++t) by_fqn[index.tensors(t).fqn()].push_back(t);
  Deliveries deliveries;
  v1::LoadResponse response;
  LoadPlanBudget::Reservation plan = PlanBudget().Open();
  if (!PlanLoadRequest(*session, request, index, by_fqn, &plan, &deliveries, &response)
           .ok()) {
    return;
  }
  CheckDeliveries(*session, index, deliveries);
  // Each item alone must plan within the budget the whole request did.
  plan = LoadPlanBudget::Reservation();
  CheckEachItemFilledOnce(*session, request, index, by_fqn);
}

}  // namespace
}  // namespace ckpt::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ckpt::fuzz::QuietProtobufLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const size_t length = std::min<size_t>(absl::little_endian::Load16(data + 1), size - 3);
  ckpt::v1::LoadRequest request;
  if (!request.ParseFromArray(data + 3, static_cast<int>(length))) return 0;
  ckpt::v1::Manifest index;
  if (!index.ParseFromArray(data + 3 + length, static_cast<int>(size - 3 - length))) {
    return 0;
  }
  if (!ckpt::ValidateManifest(index, "COMMIT").ok()) return 0;
  ckpt::fuzz::Load(data[0], request, index);
  return 0;
}
