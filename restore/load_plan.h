// PlanLoadRequest: one rank's load request checked and planned against a
// committed checkpoint's index, before anything is read.
//
// The request is untrusted (a trainer's) and so is the index (the shared
// storage root's, checked by ValidateCommitRecord): every tensor item is
// validated on its own (plan/tensor_item.h), resolved inside the session's
// registered memory, matched with the stored chunks of its fqn, and turned
// into deliveries (byte ranges of stored chunks to peer addresses) only if
// the stored chunks cover its box. Split out of the loader so that it can be
// tested and fuzzed without storage (fuzz/load_request_fuzzer.cc).
//
// Thread-safety: a function of its arguments; `session` is used through its
// thread-safe methods.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ckpt/v1/control.pb.h"
#include "ckpt/v1/manifest.pb.h"
#include "restore/load_plan_budget.h"
#include "restore/shard_reader.h"
#include "session/session.h"

namespace ckpt {

// Plans `request` against `index` (`by_fqn`: the indexes into
// index.tensors() of each fqn's chunks): its deliveries per stored chunk
// (`*deliveries` is replaced, only if the whole request is valid; each
// list non-empty and exactly as long as it holds) and its byte items and
// missing list (into `response`). Each item's copy runs are counted and
// reserved in `plan` before they are made (restore/load_plan_budget.h): a
// slice that would pass the budget fails RESOURCE_EXHAUSTED without
// growing the daemon.
absl::Status PlanLoadRequest(Session& session, const v1::LoadRequest& request,
                             const v1::Manifest& index,
                             const std::map<std::string, std::vector<int>>& by_fqn,
                             LoadPlanBudget::Reservation* plan,
                             std::map<int, std::vector<Delivery>>* deliveries,
                             v1::LoadResponse* response);

// The deliveries of a round's plans (each from PlanLoadRequest), one list
// per stored chunk so that each chunk is read once. A chunk one plan reads
// moves over whole; the lists of a chunk several plans read are copied into
// one list reserved to their total, each freed once copied, so a run is
// held at most twice and only while copied: the second of the two
// Deliveries the budget charges per run. Leaves `plans`' lists empty.
std::map<int, std::vector<Delivery>> MergeLoadPlans(
    std::vector<std::map<int, std::vector<Delivery>>>* plans);

}  // namespace ckpt
