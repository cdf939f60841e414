#include "save/open_sessions.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "support/own_process_session.h"

namespace ckpt::testing {
namespace {

std::shared_ptr<Session> Open(uint64_t id, const char* job, uint32_t rank,
                              uint32_t world, std::optional<uint32_t> local) {
  return OpenOwnProcessSession({.session_id = id,
                                .job = job,
                                .rank = rank,
                                .world_size = world,
                                .local_world_size = world,
                                .local_rank = local});
}

std::vector<uint32_t> RanksOf(const std::vector<RankSeen>& seen) {
  std::vector<uint32_t> ranks;
  for (const RankSeen& r : seen) ranks.push_back(r.rank);
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

TEST_CASE(
    "OpenSessions gives the open ranks of one job and world size with their "
    "local ranks, and forgets closed and destroyed sessions",
    "[open_sessions]") {
  OpenSessions open;
  auto r0 = Open(1, "job", 0, 4, 0);
  auto r3 = Open(2, "job", 3, 4, std::nullopt);
  auto other_job = Open(3, "other", 1, 4, 1);
  auto other_world = Open(4, "job", 1, 8, 1);
  for (const auto& s : {r0, r3, other_job, other_world}) open.Opened(s);

  std::vector<RankSeen> seen = open.Ranks("job", 4);
  CHECK(RanksOf(seen) == std::vector<uint32_t>{0, 3});
  for (const RankSeen& r : seen) {
    CHECK_FALSE(r.submitted);
    CHECK(r.local_rank == (r.rank == 0 ? std::optional<uint32_t>(0) : std::nullopt));
  }

  // A hang-up the table was told of, one it was not (the close raced with
  // Opened: MarkClosed came first), and a session already destroyed.
  open.Closed(*r0);
  r3->MarkClosed();
  other_world.reset();
  CHECK(open.Ranks("job", 4).empty());
  CHECK(open.Ranks("job", 8).empty());
  CHECK(RanksOf(open.Ranks("other", 4)) == std::vector<uint32_t>{1});
}

TEST_CASE(
    "OpenSessions keeps a job's open sessions to one user: another uid is "
    "refused before its session opens, until the job's sessions have closed",
    "[open_sessions]") {
  OpenSessions open;
  const OwnSessionSpec rank0{.session_id = 1, .job = "job", .rank = 0, .world_size = 2,
                             .local_world_size = 2};
  std::shared_ptr<Session> mine = OwnProcessSession(rank0);
  REQUIRE(open.Open(mine, "job", [&] { return mine->Open(OpenRequestOf(rank0), 0, 1); })
              .ok());
  CHECK(RanksOf(open.Ranks("job", 2)) == std::vector<uint32_t>{0});

  // Another uid as rank 1 of the same job: refused, its session never
  // opened (so its hang-up cannot touch the job's checkpoints).
  const uid_t other_uid = ::getuid() == 61002 ? 61003 : 61002;
  const OwnSessionSpec rank1{.session_id = 2, .job = "job", .rank = 1, .world_size = 2,
                             .local_world_size = 2};
  std::shared_ptr<Session> theirs = OwnProcessSession(rank1, other_uid);
  bool opened_theirs = false;
  auto open_theirs = [&] {
    opened_theirs = true;
    return absl::OkStatus();
  };
  const absl::Status refused = open.Open(theirs, "job", open_theirs);
  INFO(refused);
  CHECK(absl::IsPermissionDenied(refused));
  CHECK(absl::StrContains(refused.message(), absl::StrCat("uid ", ::getuid())));
  CHECK(absl::StrContains(refused.message(), absl::StrCat("uid ", other_uid)));
  CHECK_FALSE(opened_theirs);
  CHECK_FALSE(theirs->opened());
  CHECK(RanksOf(open.Ranks("job", 2)) == std::vector<uint32_t>{0});

  // Another job is theirs to open; an error of the open itself is returned
  // and nothing recorded.
  const absl::Status failed = open.Open(theirs, "their-job", [] {
    return absl::InvalidArgumentError("bad request");
  });
  CHECK(absl::IsInvalidArgument(failed));
  CHECK(open.Open(theirs, "their-job", open_theirs).ok());
  CHECK(opened_theirs);

  // Once the job's sessions have closed, its name is free again.
  open.Closed(*mine);
  mine->MarkClosed();
  opened_theirs = false;
  CHECK(open.Open(theirs, "job", open_theirs).ok());
  CHECK(opened_theirs);
}

}  // namespace
}  // namespace ckpt::testing
