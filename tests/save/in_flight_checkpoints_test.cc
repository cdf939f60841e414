// Tests of InFlightCheckpoints' transitions, driven by hand as the
// coordinator and its workers would: a part failing ends the attempt for
// every part and retires it once no worker uses it; the node is durable
// when this node's local ranks are; a durable node refuses a cancel; a
// committed attempt leaves the set before anyone hears of it; a failed one
// whose files must go keeps its name until they are gone.
#include "save/in_flight_checkpoints.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/save_phase.h"
#include "plan/tensor_layout.h"
#include "support/own_process_session.h"

namespace ckpt {
namespace {

using ::ckpt::testing::OpenOwnProcessSession;
using Retired = InFlightCheckpoints::Retired;

constexpr char kJob[] = "job";
constexpr char kName[] = "step-1";

// The board, the set, and one session per rank of a job of `world` ranks,
// `local` of them on this node (node 0 of `nodes`).
class Fixture {
 public:
  Fixture(uint32_t world, uint32_t local, uint32_t nodes = 1) {
    for (uint32_t rank = 0; rank < local; ++rank) {
      sessions_.push_back(OpenOwnProcessSession({.session_id = rank + 1,
                                                 .job = kJob,
                                                 .rank = rank,
                                                 .world_size = world,
                                                 .local_world_size = local,
                                                 .node_id = 0,
                                                 .nodes = nodes}));
    }
  }

  InFlightCheckpoints& set() { return set_; }
  SaveProgressBoard& board() { return board_; }
  const Session& session(uint32_t rank) const { return *sessions_[rank]; }

  // Adds `rank`'s part of kJob/kName, planned to write one file.
  // `committed` and `commits_seen` are what Submit would pass: whether
  // COMMIT existed, and the count of retired commits read before looking.
  absl::StatusOr<std::shared_ptr<SavePart>> TryAdd(
      uint32_t rank, bool committed = false,
      std::optional<uint64_t> commits_seen = std::nullopt) {
    auto layout = std::make_shared<TensorLayout>();
    PlannedFile file;
    file.name = absl::StrCat("shard-", rank + 1, ".safetensors");
    file.layout.file_size = 4096;
    layout->plan.files.push_back(file);
    SaveProgressBoard::ListenerCalls calls;
    auto part = set_.Add({.session = sessions_[rank],
                          .job = kJob,
                          .name = kName,
                          .tensors = std::move(layout),
                          .byte_items = {}},
                         committed,
                         commits_seen.value_or(set_.commits_retired()), &calls);
    calls.Run();
    return part;
  }
  std::shared_ptr<SavePart> Add(uint32_t rank) {
    auto part = TryAdd(rank);
    INFO(part.status());
    REQUIRE(part.ok());
    return *part;
  }

  InFlightCheckpoints::PartFinished Finish(const SavePart& part,
                                           const absl::Status& status) {
    SaveProgressBoard::ListenerCalls calls;
    InFlightCheckpoints::PartFinished finished =
        set_.FinishPart(part, status, &calls);
    calls.Run();
    return finished;
  }

  // The part's progress as the board has it now, and its version.
  v1::SaveProgress Progress(const SavePart& part,
                            uint64_t* version = nullptr) {
    v1::SaveProgress out;
    uint64_t seen = 0;
    REQUIRE(board_
                .WatchNext(part.session_id, part.id, 0,
                           [&](const v1::SaveProgress& p, uint64_t v) {
                             out = p;
                             seen = v;
                           })
                .ok());
    REQUIRE(seen > 0);  // called at once
    if (version != nullptr) *version = seen;
    return out;
  }

 private:
  SaveProgressBoard board_;
  InFlightCheckpoints set_{&board_};
  std::vector<std::shared_ptr<Session>> sessions_;
};

TEST_CASE(
    "InFlightCheckpoints ends the checkpoint FAILED for every part when one "
    "part fails, and retires it once the last worker is done",
    "[in_flight_checkpoints]") {
  Fixture f(2, 2);
  const std::shared_ptr<SavePart> p0 = f.Add(0);
  const std::shared_ptr<SavePart> p1 = f.Add(1);

  const auto failed = f.Finish(*p0, absl::InternalError("disk on fire"));
  CHECK_FALSE(failed.node_durable);
  CHECK_FALSE(failed.retired.has_value());  // rank 1's worker still runs
  CHECK(p1->cancelled.load());
  for (const auto& part : {p0, p1}) {
    const v1::SaveProgress progress = f.Progress(*part);
    CHECK(progress.phase() == v1::PHASE_FAILED);
    CHECK(progress.reason() == "rank 0: disk on fire");
  }
  CHECK(f.set().Contains(kJob, kName));

  // Rank 1's worker sees the cancel: the attempt stays FAILED, and leaves.
  const auto last = f.Finish(*p1, absl::CancelledError("save cancelled"));
  REQUIRE(last.retired.has_value());
  CHECK(last.retired->phase == v1::PHASE_FAILED);
  CHECK(last.retired->checkpoint == p0->checkpoint);
  // No worker prepared the directory: nothing to remove.
  CHECK(last.retired->files_action == Retired::Files::kKeep);
  CHECK(last.retired->files ==
        std::vector<std::string>{"shard-1.safetensors", "shard-2.safetensors"});
  CHECK_FALSE(f.set().Contains(kJob, kName));
  CHECK(f.Progress(*p1).phase() == v1::PHASE_FAILED);
}

TEST_CASE(
    "InFlightCheckpoints keeps a failed attempt whose files must be removed "
    "until ForgetRemoved, refusing new saves of its name meanwhile",
    "[in_flight_checkpoints]") {
  Fixture f(1, 1);
  const std::shared_ptr<SavePart> p0 = f.Add(0);
  p0->checkpoint->prepared = true;  // a worker made the directory

  const auto failed = f.Finish(*p0, absl::InternalError("EIO"));
  REQUIRE(failed.retired.has_value());
  CHECK(failed.retired->files_action == Retired::Files::kRemove);
  CHECK(failed.retired->files ==
        std::vector<std::string>{"shard-1.safetensors"});
  CHECK(f.set().Contains(kJob, kName));
  CHECK(f.TryAdd(0).status().code() == absl::StatusCode::kUnavailable);

  f.set().ForgetRemoved(*failed.retired->checkpoint);
  CHECK_FALSE(f.set().Contains(kJob, kName));
  const std::shared_ptr<SavePart> again = f.Add(0);
  CHECK(again->checkpoint != p0->checkpoint);  // a new attempt
}

TEST_CASE(
    "InFlightCheckpoints counts the node durable when this node's local "
    "ranks are, not the job's world, and refuses a cancel from then on",
    "[in_flight_checkpoints]") {
  // Ranks 0 and 1 on this node of a job of 4 on two nodes.
  Fixture f(4, 2, 2);
  const std::shared_ptr<SavePart> p0 = f.Add(0);
  const std::shared_ptr<SavePart> p1 = f.Add(1);
  CHECK(p0->checkpoint->local_ranks == 2);
  CHECK(p0->checkpoint->world_size == 4);

  CHECK_FALSE(f.Finish(*p0, absl::OkStatus()).node_durable);
  const auto second = f.Finish(*p1, absl::OkStatus());
  CHECK(second.node_durable);
  CHECK_FALSE(second.retired.has_value());

  SaveProgressBoard::ListenerCalls calls;
  CHECK(f.set().CancelSave(f.session(0), p0->id, &calls).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(f.set().CancelCheckpoint(kJob, kName, &calls).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(f.set().NodeDurable(*p0->checkpoint, &calls));
  calls.Run();
  CHECK(f.Progress(*p0).phase() == v1::PHASE_DURABLE);
  CHECK(f.Progress(*p1).phase() == v1::PHASE_DURABLE);
  CHECK(f.set().WaitingForNodes(*p0->checkpoint).has_value());
}

TEST_CASE(
    "InFlightCheckpoints cancelled before the node is durable ends CANCELLED "
    "for every part",
    "[in_flight_checkpoints]") {
  Fixture f(2, 2);
  const std::shared_ptr<SavePart> p0 = f.Add(0);
  const std::shared_ptr<SavePart> p1 = f.Add(1);
  CHECK_FALSE(f.Finish(*p0, absl::OkStatus()).node_durable);

  SaveProgressBoard::ListenerCalls calls;
  auto cancelled = f.set().CancelSave(f.session(1), p1->id, &calls);
  calls.Run();
  INFO(cancelled.status());
  REQUIRE(cancelled.ok());
  CHECK(cancelled->saves == 2);
  CHECK_FALSE(cancelled->retired.has_value());  // rank 1's worker runs on
  for (const auto& part : {p0, p1}) {
    CHECK(f.Progress(*part).phase() == v1::PHASE_CANCELLED);
    CHECK(f.Progress(*part).reason() == "cancelled by rank 1");
  }
  const auto last = f.Finish(*p1, absl::CancelledError("save cancelled"));
  REQUIRE(last.retired.has_value());
  CHECK(last.retired->phase == v1::PHASE_CANCELLED);
}

TEST_CASE(
    "InFlightCheckpoints retires a committed attempt before any listener "
    "hears COMMITTED",
    "[in_flight_checkpoints]") {
  Fixture f(1, 1);
  const std::shared_ptr<SavePart> p0 = f.Add(0);
  REQUIRE(f.Finish(*p0, absl::OkStatus()).node_durable);
  SaveProgressBoard::ListenerCalls durable;
  REQUIRE(f.set().NodeDurable(*p0->checkpoint, &durable));
  durable.Run();

  bool heard = false;
  bool still_in_flight = true;
  uint64_t commits_seen = 0;
  uint64_t version = 0;
  const v1::SaveProgress now = f.Progress(*p0, &version);
  REQUIRE(f.board()
              .WatchNext(p0->session_id, p0->id, version,
                         [&](const v1::SaveProgress& p, uint64_t) {
                           heard = p.phase() == v1::PHASE_COMMITTED;
                           still_in_flight = f.set().Contains(kJob, kName);
                           commits_seen = f.set().commits_retired();
                         })
              .ok());
  CHECK(now.phase() == v1::PHASE_DURABLE);
  CHECK_FALSE(heard);

  SaveProgressBoard::ListenerCalls calls;
  const auto retired = f.set().Commit(*p0->checkpoint, /*remote_follows=*/false, &calls);
  REQUIRE(retired.has_value());
  CHECK(retired->phase == v1::PHASE_COMMITTED);
  CHECK(retired->files_action == Retired::Files::kKeep);
  calls.Run();
  CHECK(heard);
  CHECK_FALSE(still_in_flight);
  CHECK(commits_seen == 1);
  CHECK(f.Progress(*p0).remote_phase() == v1::PHASE_UNSPECIFIED);
}

TEST_CASE(
    "InFlightCheckpoints with a remote tier publishes COMMITTED and the remote "
    "phase begun in one message, and the retired attempt names its parts",
    "[in_flight_checkpoints]") {
  Fixture f(2, 2);
  const std::shared_ptr<SavePart> p0 = f.Add(0);
  const std::shared_ptr<SavePart> p1 = f.Add(1);
  REQUIRE_FALSE(f.Finish(*p0, absl::OkStatus()).node_durable);
  REQUIRE(f.Finish(*p1, absl::OkStatus()).node_durable);
  SaveProgressBoard::ListenerCalls durable;
  REQUIRE(f.set().NodeDurable(*p0->checkpoint, &durable));
  durable.Run();

  std::vector<v1::SaveProgress> heard;
  uint64_t version = 0;
  f.Progress(*p0, &version);
  REQUIRE(f.board()
              .WatchNext(p0->session_id, p0->id, version,
                         [&](const v1::SaveProgress& p, uint64_t) { heard.push_back(p); })
              .ok());
  SaveProgressBoard::ListenerCalls calls;
  const auto retired = f.set().Commit(*p0->checkpoint, /*remote_follows=*/true, &calls);
  calls.Run();
  REQUIRE(retired.has_value());
  CHECK(retired->save_ids == std::vector<uint64_t>{p0->id, p1->id});
  REQUIRE(heard.size() == 1);
  CHECK(heard[0].phase() == v1::PHASE_COMMITTED);
  CHECK(heard[0].remote_phase() == v1::PHASE_REMOTE_UPLOADING);
  CHECK(RemotePhasePending(heard[0]));
  CHECK(f.Progress(*p1).remote_phase() == v1::PHASE_REMOTE_UPLOADING);
}

TEST_CASE(
    "InFlightCheckpoints refuses a committed name, and asks to check again "
    "when a commit retired after the caller looked",
    "[in_flight_checkpoints]") {
  Fixture f(1, 1);
  CHECK(f.TryAdd(0, /*committed=*/true).status().code() ==
        absl::StatusCode::kAlreadyExists);
  CHECK_FALSE(f.set().Contains(kJob, kName));

  // A stale count of commits: one retired since the caller looked, and it
  // may have had this name.
  CHECK(f.TryAdd(0, false, f.set().commits_retired() + 1).status().code() ==
        absl::StatusCode::kAborted);
  CHECK_FALSE(f.set().Contains(kJob, kName));
  CHECK(f.TryAdd(0).ok());
  // The attempt in flight now refuses the rank's second part.
  CHECK(f.TryAdd(0).status().code() == absl::StatusCode::kAlreadyExists);
}

TEST_CASE(
    "InFlightCheckpoints fails an attempt still missing local ranks once the "
    "timeout has passed since its first part, naming the missing ranks",
    "[in_flight_checkpoints]") {
  Fixture f(3, 3);
  const std::shared_ptr<SavePart> p0 = f.Add(0);
  const CheckpointAttempt& attempt = *p0->checkpoint;

  SaveProgressBoard::ListenerCalls early;
  // Rank 1's session is open; rank 2 never connected.
  const std::vector<RankSeen> connected = {{.rank = 1}};
  const auto before = f.set().ExpireMissingRanks(
      attempt, std::chrono::hours(1), /*node_id=*/0, connected, &early);
  early.Run();
  CHECK(before.waiting);
  CHECK_FALSE(before.retired.has_value());
  CHECK(f.Progress(*p0).phase() == v1::PHASE_ACCEPTED);

  SaveProgressBoard::ListenerCalls calls;
  const auto expired = f.set().ExpireMissingRanks(
      attempt, std::chrono::milliseconds(0), /*node_id=*/0, connected, &calls);
  calls.Run();
  CHECK_FALSE(expired.waiting);
  CHECK_FALSE(expired.retired.has_value());  // rank 0's worker still runs
  CHECK(p0->cancelled.load());
  const v1::SaveProgress progress = f.Progress(*p0);
  CHECK(progress.phase() == v1::PHASE_FAILED);
  CHECK(progress.reason() ==
        "rank 2 (never connected) and rank 1 (connected) did not submit "
        "within 0 ms of the first part (1 of 3 local ranks submitted: 0)");
  // A rank that comes late finds the attempt ended, not a new one.
  CHECK(f.TryAdd(1).status().code() == absl::StatusCode::kFailedPrecondition);

  const auto last = f.Finish(*p0, absl::CancelledError("save cancelled"));
  REQUIRE(last.retired.has_value());
  CHECK(last.retired->phase == v1::PHASE_FAILED);
  CHECK_FALSE(f.set().Contains(kJob, kName));  // the name is free
  CHECK(f.Add(1)->checkpoint != p0->checkpoint);
}

TEST_CASE(
    "InFlightCheckpoints lets the local-ranks deadline go once every local "
    "rank has submitted, however long the writing takes",
    "[in_flight_checkpoints]") {
  Fixture f(2, 2);
  const std::shared_ptr<SavePart> p0 = f.Add(0);
  const std::shared_ptr<SavePart> p1 = f.Add(1);
  SaveProgressBoard::ListenerCalls calls;
  const auto check = f.set().ExpireMissingRanks(
      *p0->checkpoint, std::chrono::milliseconds(0), /*node_id=*/0, {}, &calls);
  calls.Run();
  CHECK_FALSE(check.waiting);
  CHECK_FALSE(check.retired.has_value());
  CHECK_FALSE(p0->cancelled.load());
  CHECK(f.Progress(*p0).phase() == v1::PHASE_ACCEPTED);
  CHECK_FALSE(f.Finish(*p0, absl::OkStatus()).node_durable);
  CHECK(f.Finish(*p1, absl::OkStatus()).node_durable);
}

std::vector<RankSeen> Submitted(const std::vector<uint32_t>& ranks) {
  std::vector<RankSeen> seen;
  for (uint32_t r : ranks) seen.push_back({.rank = r, .submitted = true});
  return seen;
}

TEST_CASE(
    "MissingLocalRanks names the ranks that never connected when the job runs "
    "on this node alone or follows torchrun's numbering, and counts them "
    "otherwise",
    "[in_flight_checkpoints]") {
  // The whole job on this node: no doubt which ranks are missing.
  CHECK(MissingLocalRanks(4, 4, 0, Submitted({0, 2})) ==
        "ranks 1, 3 (never connected)");
  CHECK(MissingLocalRanks(2, 2, 0, Submitted({0})) == "rank 1 (never connected)");
  CHECK(MissingLocalRanks(100, 100, 0, Submitted({50})) ==
        "ranks 0-49, 51-99 (never connected)");
  // Node 1 of a job of 16 ranks, 4 per node: torchrun gives it ranks 4-7.
  CHECK(MissingLocalRanks(16, 4, 1, Submitted({4, 6})) ==
        "ranks 5, 7 (never connected; node 1's block 4-7 in torchrun's "
        "numbering)");
  // Ranks that submitted outside that block: the others cannot be named.
  CHECK(MissingLocalRanks(16, 4, 1, Submitted({0, 9})) ==
        "2 ranks this node cannot name (never connected; the ranks seen are "
        "not node 1's block 4-7 of torchrun's numbering, and not every rank "
        "gave its local rank)");
  // A long list is cut: every waiter gets the reason in each message.
  std::vector<uint32_t> odd;
  for (uint32_t r = 1; r < 64; r += 2) odd.push_back(r);
  CHECK(MissingLocalRanks(64, 64, 0, Submitted(odd)) ==
        "ranks 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30 and "
        "16 more (never connected)");
}

TEST_CASE(
    "MissingLocalRanks names connected ranks by rank and, once every rank "
    "seen gave its local rank, the ones that never connected by local rank, "
    "whatever the job's numbering",
    "[in_flight_checkpoints]") {
  // Node 1 of 16 ranks, 4 per node, numbered by the job, not by torchrun:
  // local ranks 0-3 are global 7, 2, 11 and 5. 7 submitted, 11 is
  // connected and has not, 2 and 5 never connected.
  const std::vector<RankSeen> seen = {
      {.rank = 7, .local_rank = 0, .submitted = true},
      {.rank = 11, .local_rank = 2},
  };
  CHECK(MissingLocalRanks(16, 4, 1, seen) ==
        "local ranks 1, 3 of node 1 (never connected) and rank 11 (connected)");
  // One rank that did not say its local rank: the others are only counted
  // (11 is outside torchrun's block 4-7).
  std::vector<RankSeen> unsaid = seen;
  unsaid[1].local_rank.reset();
  CHECK(MissingLocalRanks(16, 4, 1, unsaid) ==
        "2 ranks this node cannot name (never connected; the ranks seen are "
        "not node 1's block 4-7 of torchrun's numbering, and not every rank "
        "gave its local rank) and rank 11 (connected)");
  // Every missing rank connected: nothing is unknown.
  CHECK(MissingLocalRanks(2, 2, 0, {{.rank = 0, .submitted = true}, {.rank = 1}}) ==
        "rank 1 (connected)");
  // A rank with a second session open besides the one that submitted is
  // not missing.
  CHECK(MissingLocalRanks(2, 2, 0, {{.rank = 0}, {.rank = 0, .submitted = true}}) ==
        "rank 1 (never connected)");
}

TEST_CASE(
    "InFlightCheckpoints lets go of a part's session once its worker is done, "
    "while the checkpoint still waits, and still knows whose save it is",
    "[in_flight_checkpoints]") {
  Fixture f(2, 1, /*nodes=*/2);
  const std::shared_ptr<SavePart> p0 = f.Add(0);
  REQUIRE(p0->session != nullptr);
  const auto finished = f.Finish(*p0, absl::OkStatus());
  CHECK(finished.node_durable);
  CHECK_FALSE(finished.retired.has_value());  // node 1 is still to come
  // The trainer's pidfd and memory file live in its session: a part that
  // waits for other nodes must not keep them open.
  CHECK(p0->session == nullptr);
  CHECK(p0->session_id == f.session(0).id());
  // Its own session is still told "too late to cancel" (this node is
  // durable), another one that it has no such save.
  SaveProgressBoard::ListenerCalls calls;
  CHECK(f.set().CancelSave(f.session(0), p0->id, &calls).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  const auto stranger = testing::OpenOwnProcessSession(
      {.session_id = 99, .job = kJob, .world_size = 2, .nodes = 2});
  CHECK(f.set().CancelSave(*stranger, p0->id, &calls).status().code() ==
        absl::StatusCode::kNotFound);
  calls.Run();
}

}  // namespace
}  // namespace ckpt
