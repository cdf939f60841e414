// OpenOwnProcessSession: a Session whose trainer is this test process, for
// tests of the save side without a daemon, a handshake or gRPC.
//
// The session is what the handshake would have made for a trainer with
// this process's pid and uid (a pidfd included, so the memory it reads is
// guarded as in the daemon), opened as OpenSession would open it. Memory is
// read through the test process's own /proc/<pid>/mem, which needs no
// ptrace permission. The one place tests construct a Session: if its
// constructor changes, only this file follows.
//
// Thread-safety: the functions are; use them from the test's thread.
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "ckpt/v1/control.pb.h"
#include "common/unique_fd.h"
#include "session/session.h"

namespace ckpt::testing {

struct OwnSessionSpec {
  uint64_t session_id = 1;  // unique per test
  std::string job = "job";
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint32_t local_world_size = 1;
  uint32_t node_id = 0;  // the daemon's node, which the rank declares
  uint32_t nodes = 1;
  // The daemon's layout budget; null: the session's own, default limits.
  std::shared_ptr<LayoutBudget> layouts = nullptr;
  std::optional<uint32_t> local_rank = std::nullopt;  // what the trainer says, if
};

// A session of this process as the handshake makes it, not yet opened.
// `uid`: what the handshake saw; another than this process's makes a
// session that Session::Open refuses (its credentials do not match), for
// tests of what happens before that.
inline std::shared_ptr<Session> OwnProcessSession(const OwnSessionSpec& spec,
                                                  uid_t uid = ::getuid()) {
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0)));
  REQUIRE(pidfd.valid());
  return std::make_shared<Session>(spec.session_id,
                                   absl::StrCat("token-", spec.session_id), ::getpid(),
                                   uid, std::move(pidfd), SessionGpu{}, spec.layouts);
}

// The OpenSession request of `spec`'s trainer.
inline v1::OpenSessionRequest OpenRequestOf(const OwnSessionSpec& spec) {
  v1::OpenSessionRequest request;
  request.set_rank(spec.rank);
  request.set_world_size(spec.world_size);
  request.set_job(spec.job);
  request.set_node(spec.node_id);
  request.set_local_world_size(spec.local_world_size);
  if (spec.local_rank.has_value()) request.set_local_rank(*spec.local_rank);
  return request;
}

// An opened session of this process, or the test fails.
inline std::shared_ptr<Session> OpenOwnProcessSession(
    const OwnSessionSpec& spec) {
  std::shared_ptr<Session> session = OwnProcessSession(spec);
  const absl::Status opened = session->Open(OpenRequestOf(spec), spec.node_id, spec.nodes);
  INFO(opened);
  REQUIRE(opened.ok());
  return session;
}

// Registers [data, data + size) of this process as a host region of
// `session`; returns its region id, or the test fails.
inline uint64_t RegisterHostRegion(Session& session, const void* data,
                                   uint64_t size) {
  google::protobuf::RepeatedPtrField<v1::Region> regions;
  v1::HostRegion* host = regions.Add()->mutable_host();
  host->set_address(reinterpret_cast<uint64_t>(data));
  host->set_length(size);
  absl::StatusOr<std::vector<uint64_t>> ids = session.RegisterRegions(regions);
  INFO(ids.status());
  REQUIRE(ids.ok());
  REQUIRE(ids->size() == 1);
  return ids->front();
}

}  // namespace ckpt::testing
