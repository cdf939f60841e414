#include <sys/syscall.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "session/session.h"

namespace ckpt::testing {
namespace {

std::unique_ptr<Session> OwnSession() {
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0)));
  REQUIRE(pidfd.valid());
  return std::make_unique<Session>(1, "token", ::getpid(), ::getuid(),
                                   std::move(pidfd));
}

v1::OpenSessionRequest Request() {
  v1::OpenSessionRequest request;
  request.set_job("job");
  request.set_rank(5);
  request.set_world_size(8);
  request.set_node(1);
  request.set_local_world_size(4);
  return request;
}

TEST_CASE(
    "Session::Open refuses a trainer whose rank, node, local world or local "
    "rank do not fit, says which, and opens nothing",
    "[session]") {
  struct Case {
    const char* what;
    void (*edit)(v1::OpenSessionRequest&);
    uint32_t nodes;
    const char* message;
  };
  const Case cases[] = {
      {"rank outside the world", [](v1::OpenSessionRequest& r) { r.set_rank(8); },
       2, "rank 8 is not inside world size 8"},
      {"empty world", [](v1::OpenSessionRequest& r) { r.set_world_size(0); }, 2,
       "is not inside world size 0"},
      {"another node", [](v1::OpenSessionRequest& r) { r.set_node(0); }, 2,
       "session declares node 0 but this daemon is node 1 of 2"},
      {"no local world on a daemon of several nodes",
       [](v1::OpenSessionRequest& r) { r.set_local_world_size(0); }, 2,
       "local_world_size is required: this daemon is one of 2 nodes"},
      {"local world larger than the world",
       [](v1::OpenSessionRequest& r) { r.set_local_world_size(9); }, 2,
       "local world size 9 exceeds world size 8"},
      {"local rank outside the local world",
       [](v1::OpenSessionRequest& r) { r.set_local_rank(4); }, 2,
       "local rank 4 is not inside local world size 4"},
      {"bad job name", [](v1::OpenSessionRequest& r) { r.set_job("../x"); }, 2,
       "job"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    auto session = OwnSession();
    v1::OpenSessionRequest request = Request();
    c.edit(request);
    const absl::Status status = session->Open(request, /*node_id=*/1, c.nodes);
    INFO(status.ToString());
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(status.message(), c.message));
    CHECK_FALSE(session->opened());
  }
}

TEST_CASE(
    "Session::Open keeps the rank, worlds and the local rank the trainer "
    "gave, and opens once",
    "[session]") {
  auto session = OwnSession();
  v1::OpenSessionRequest request = Request();
  REQUIRE(session->Open(request, 1, 2).ok());
  CHECK(session->rank() == 5);
  CHECK(session->world_size() == 8);
  CHECK(session->local_world_size() == 4);
  CHECK_FALSE(session->local_rank().has_value());
  CHECK(session->Open(request, 1, 2).code() == absl::StatusCode::kFailedPrecondition);

  auto with_local = OwnSession();
  request.set_local_rank(3);
  REQUIRE(with_local->Open(request, 1, 2).ok());
  CHECK(with_local->local_rank() == std::optional<uint32_t>(3));
  // A one-node daemon takes a missing local world as the whole world.
  auto one_node = OwnSession();
  request.set_node(0);
  request.set_local_world_size(0);
  request.set_local_rank(7);
  REQUIRE(one_node->Open(request, 0, 1).ok());
  CHECK(one_node->local_world_size() == 8);
}

}  // namespace
}  // namespace ckpt::testing
