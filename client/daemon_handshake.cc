#include "client/daemon_handshake.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/status.h"

namespace ckpt {
namespace {

constexpr auto kHandshakeRetryFor = std::chrono::seconds(2);

// Whether `canceller` (may be null) is cancelled, polling it first.
bool Interrupted(CallCanceller* canceller) {
  return canceller != nullptr && canceller->Poll();
}

// Waits until `fd` is readable, polling `canceller` between slices.
absl::Status AwaitReadable(int fd, CallCanceller* canceller, absl::string_view what) {
  const int slice_ms =
      canceller == nullptr || canceller->poll_every() == absl::InfiniteDuration()
          ? -1
          : static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(
                                                      canceller->poll_every())));
  for (;;) {
    if (Interrupted(canceller)) return absl::CancelledError(absl::StrCat(what, ": cancelled"));
    pollfd p = {fd, POLLIN, 0};
    const int n = ::poll(&p, 1, slice_ms);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, absl::StrCat("poll(", what, ")"));
    if (n > 0) return absl::OkStatus();
  }
}

}  // namespace

absl::StatusOr<UniqueFd> DialHandshake(const std::string& path, CallCanceller* canceller) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path too long: ", path));
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoToStatus(errno, "socket");
  // A daemon that is starting publishes the handshake socket a moment after
  // its gRPC service answers: a missing or refusing socket is tried again
  // for a short while before it is an error.
  const auto deadline = std::chrono::steady_clock::now() + kHandshakeRetryFor;
  while (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    const bool absent = err == ENOENT || err == ECONNREFUSED;
    if (absent && std::chrono::steady_clock::now() >= deadline) {
      // No daemon there: UNAVAILABLE, as gRPC says of a server that is
      // down, so callers tell it from a refused or malformed request.
      return absl::UnavailableError(absl::StrCat("connect ", path, ": ",
                                                 std::strerror(err),
                                                 "; is ckptd running?"));
    }
    if (!absent && err != EINTR) {
      return Annotate(ErrnoToStatus(err, absl::StrCat("connect ", path)),
                      "is ckptd running?");
    }
    if (Interrupted(canceller)) {
      return absl::CancelledError(absl::StrCat("connect ", path, ": cancelled"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return fd;
}

absl::StatusOr<HandshakeFrame> ReadHandshakeFrame(int fd, CallCanceller* canceller) {
  char bytes[kHandshakeFrameBytes];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    RETURN_IF_ERROR(AwaitReadable(fd, canceller, "handshake"));
    const ssize_t n = ::recv(fd, bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, "handshake recv");
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got == 0) {
    return absl::UnavailableError(
        "ckptd closed the handshake (too many sessions? see its log)");
  }
  // A frame cut short by the daemon closing is refused here, naming its size.
  return DecodeHandshakeFrame(absl::string_view(bytes, got));
}

}  // namespace ckpt
