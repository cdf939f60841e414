// systemd notifications (daemon/service_notifier.h): a real daemon started
// with NOTIFY_SOCKET pointing at a datagram socket this test binds.
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "integration/daemon_fixture.h"

namespace ckpt::testing {
namespace {

using Clock = std::chrono::steady_clock;

// The socket systemd would listen on: one datagram per sd_notify call.
class NotifySocket {
 public:
  NotifySocket() {
    std::string tmpl = TempBase() + "/ckptd-notify-XXXXXX";
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/notify.sock";
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    REQUIRE(path_.size() < sizeof(addr.sun_path));
    std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
    REQUIRE(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  }
  ~NotifySocket() {
    close(fd_);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  const std::string& path() const { return path_; }

  // Reads messages until one starts with `prefix` (returned) or `timeout`
  // passes (then what was seen, for the failure's message).
  std::string WaitFor(const std::string& prefix, std::chrono::milliseconds timeout) {
    const auto end = Clock::now() + timeout;
    while (Clock::now() < end) {
      pollfd p{.fd = fd_, .events = POLLIN, .revents = 0};
      const int left = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count());
      if (poll(&p, 1, std::max(left, 1)) <= 0) continue;
      char buf[4096];
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      REQUIRE(n >= 0);
      std::string message(buf, static_cast<size_t>(n));
      seen_.push_back(message);
      if (absl::StartsWith(message, prefix)) return message;
    }
    return "(no " + prefix + " message; seen: " + absl::StrJoin(seen_, " | ") + ")";
  }
 private:
  std::string dir_, path_;
  int fd_ = -1;
  std::vector<std::string> seen_;
};

TEST_CASE("under systemd the daemon reports READY, a STATUS line refreshed while it "
          "runs, and STOPPING on SIGTERM",
          "[integration][notify]") {
  NotifySocket notify;
  DaemonProcess daemon({}, "", {"NOTIFY_SOCKET=" + notify.path()});
  using std::chrono::milliseconds;
  CHECK(notify.WaitFor("READY=1", milliseconds(5'000)) == "READY=1");
  const std::string status = notify.WaitFor("STATUS=", milliseconds(5'000));
  CHECK(status == "STATUS=0 saves in flight, pool 0/64 MiB");
  // Refreshed every few seconds.
  CHECK(absl::StartsWith(notify.WaitFor("STATUS=", milliseconds(10'000)), "STATUS="));
  REQUIRE(kill(daemon.pid(), SIGTERM) == 0);
  CHECK(notify.WaitFor("STOPPING=1", milliseconds(10'000)) == "STOPPING=1");
  CHECK(daemon.WaitForExit(10'000).has_value());
}

}  // namespace
}  // namespace ckpt::testing
