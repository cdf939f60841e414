// The access rules (daemon/access_policy.h), one by one.
#include <unistd.h>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "daemon/access_policy.h"
#include "support/skip.h"

namespace ckpt {
namespace {

constexpr gid_t kOperators = 61010;
constexpr uid_t kAlice = 61001;
constexpr uid_t kBob = 61002;

Caller User(uid_t uid, std::vector<gid_t> groups = {}) {
  return Caller{.pid = 1234, .uid = uid, .gid = uid, .groups = std::move(groups)};
}

TEST_CASE("access policy: operators are root, the daemon's user and the "
          "operator group") {
  const AccessPolicy policy(kOperators);
  CHECK(policy.IsOperator(User(0)));
  CHECK(policy.IsOperator(User(::geteuid())));
  CHECK(policy.IsOperator(User(kBob, {5, kOperators})));
  CHECK(policy.IsOperator(Caller{.pid = 1, .uid = kBob, .gid = kOperators, .groups = {}}));
  if (::geteuid() != kBob) {
    CHECK_FALSE(policy.IsOperator(User(kBob, {5})));
    CHECK_FALSE(AccessPolicy(std::nullopt).IsOperator(User(kBob, {kOperators})));
  }
}

TEST_CASE("access policy: operator calls on a job are its owner's or an "
          "operator's") {
  // The daemon's own user is an operator: the rules below need the test to
  // run as neither made-up user.
  if (::geteuid() == kBob || ::geteuid() == kAlice) {
    CKPT_SKIP("the test runs as uid " << ::geteuid()
                                      << ", one of the made-up users it checks");
  }
  const AccessPolicy policy(kOperators);
  CHECK(policy.MayOperate(User(kAlice), "verify", "a", kAlice).ok());
  CHECK(policy.MayOperate(User(kBob, {kOperators}), "verify", "a", kAlice).ok());
  // No such job: the call itself says NotFound.
  CHECK(policy.MayOperate(User(kBob), "verify", "a", std::nullopt).ok());
  absl::Status refused = policy.MayOperate(User(kBob), "verify", "a", kAlice);
  CHECK(absl::IsPermissionDenied(refused));
  CHECK(absl::StrContains(refused.message(), "belongs to uid 61001"));
  CHECK(absl::IsPermissionDenied(policy.MayOperateOnAll(User(kAlice), "gc")));
  CHECK(policy.MayOperateOnAll(User(kBob, {kOperators}), "gc").ok());
}

TEST_CASE("access policy: a trainer saves into and loads from its own uid's "
          "jobs, root into any") {
  CHECK(AccessPolicy::MayUseJob(kAlice, "a", kAlice).ok());
  CHECK(AccessPolicy::MayUseJob(kAlice, "new", std::nullopt).ok());
  CHECK(AccessPolicy::MayUseJob(0, "a", kAlice).ok());
  CHECK(absl::IsPermissionDenied(AccessPolicy::MayUseJob(kBob, "a", kAlice)));
}

TEST_CASE("access policy: a session token counts only from its own process") {
  CHECK(AccessPolicy::MayActFor(Caller{.pid = 42, .uid = 0, .gid = 0, .groups = {}}, 42).ok());
  absl::Status other = AccessPolicy::MayActFor(Caller{.pid = 43, .uid = 0, .gid = 0, .groups = {}}, 42);
  CHECK(absl::IsPermissionDenied(other));
  CHECK(absl::StrContains(other.message(), "used by pid 43"));
}

}  // namespace
}  // namespace ckpt
