// A daemon that stops answering without closing its socket (SIGSTOP here;
// a hung host or a debugger alike): the trainer's waits end, through the
// client's keepalive (common/control_socket.h), instead of lasting as long
// as the daemon stays stopped.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <future>
#include <thread>

#include "absl/status/status.h"
#include "integration/daemon_fixture.h"
#include "integration/test_rank.h"

namespace ckpt::testing {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

TEST_CASE(
    "a daemon that stops answering mid-save fails the trainer's wait within "
    "its keepalive, and the same client saves and loads once it runs again",
    "[integration][keepalive]") {
  // 8 MiB at 1 MiB/s: the save is still writing when the daemon stops.
  DaemonProcess daemon({"--write_rate_limit", "1048576"});
  ConnectOptions connect;
  connect.keepalive_ms = 1'000;
  connect.keepalive_timeout_ms = 1'000;
  TestRank rank(daemon.socket(), "hung", 2, 4 << 20, connect);
  rank.Fill(1);
  auto save = rank.client().Save(rank.SaveRequestFor("step-1"));
  REQUIRE(save.ok());

  REQUIRE(kill(daemon.pid(), SIGSTOP) == 0);
  const Clock::time_point stopped = Clock::now();
  std::promise<absl::Status> waited;
  std::future<absl::Status> result = waited.get_future();
  std::thread waiter([&] { waited.set_value((*save)->WaitCommitted()); });
  // Expected after about keepalive + timeout (2 s); without keepalive the
  // wait lasts until SIGCONT below.
  const bool ended = result.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  const double took = std::chrono::duration<double>(Clock::now() - stopped).count();
  REQUIRE(kill(daemon.pid(), SIGCONT) == 0);
  waiter.join();
  INFO("the wait ended after " << took << " s");
  REQUIRE(ended);
  const absl::Status status = result.get();
  INFO(status.ToString());
  CHECK(absl::IsUnavailable(status));

  // Running again, the daemon finishes the save it had (the trainer's
  // memory was not touched), and the client's next calls reconnect.
  const std::string commit = daemon.root() + "/hung/step-1/COMMIT";
  for (int i = 0; i < 300 && !std::filesystem::exists(commit); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  REQUIRE(std::filesystem::exists(commit));
  rank.Zero();
  const auto loaded = rank.client().Load(rank.LoadRequestFor("step-1"));
  INFO(loaded.status().ToString());
  REQUIRE(loaded.ok());
  CHECK(rank.Holds(1));
}

TEST_CASE("a client may not ping the daemon more often than the daemon accepts",
          "[integration][keepalive]") {
  DaemonProcess daemon;
  ConnectOptions connect{.socket = daemon.socket(), .job = "j"};
  connect.keepalive_ms = kMinKeepaliveMs - 1;
  const auto client = Client::Connect(connect);
  REQUIRE_FALSE(client.ok());
  CHECK(absl::IsInvalidArgument(client.status()));
}

}  // namespace ckpt::testing
