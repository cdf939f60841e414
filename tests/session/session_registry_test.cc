// SessionRegistry's handshake, from a client's side of the real socket: the
// token a client reads is one the daemon already knows, so the client's
// first call (OpenSession, right after it read the frame) is never refused
// as UNAUTHENTICATED. The daemon once sent the frame, logged, and only then
// registered the token; a client that called at once lost that race now
// and then. The test hammers handshake -> lookup from several threads, the
// lookup made the moment the frame is read, which is as early as any
// client can present the token.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/handshake_frame.h"
#include "common/socket_access.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "session/session.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

using ::ckpt::testing::TempDir;

// Connects to the handshake socket at `path` and reads the daemon's frame.
// The socket is returned too: closing it ends the session.
absl::StatusOr<HandshakeFrame> Handshake(const std::string& path,
                                         UniqueFd* socket) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("path too long: ", path));
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoToStatus(errno, "socket");
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) !=
      0) {
    return ErrnoToStatus(errno, absl::StrCat("connect ", path));
  }
  char bytes[kHandshakeFrameBytes];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = ::recv(fd.get(), bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, "recv");
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  *socket = std::move(fd);
  return DecodeHandshakeFrame(absl::string_view(bytes, got));
}

TEST_CASE(
    "SessionRegistry knows a session's token before the client can read it, "
    "however many clients hand-shake at once",
    "[session_registry]") {
  TempDir dir;
  const std::string path = dir.File("ckptd.sock.session");
  // Room for every session at once: closed sockets are noticed
  // asynchronously, and a refused handshake would be a different failure.
  constexpr int kThreads = 4;
  constexpr int kHandshakesPerThread = 150;
  absl::StatusOr<std::unique_ptr<SessionRegistry>> started =
      SessionRegistry::Start(path, SocketAccess{}, kThreads * kHandshakesPerThread,
                             SessionGpu{}, nullptr);
  INFO(started.status());
  REQUIRE(started.ok());
  SessionRegistry& registry = **started;
  REQUIRE(registry.Publish().ok());

  struct Outcome {
    absl::Mutex mu;
    std::vector<std::string> failures ABSL_GUARDED_BY(mu);
    int found ABSL_GUARDED_BY(mu) = 0;
  } outcome;
  std::vector<std::thread> clients;
  for (int t = 0; t < kThreads; ++t) {
    clients.emplace_back([&, t] {
      for (int i = 0; i < kHandshakesPerThread; ++i) {
        UniqueFd socket;
        absl::StatusOr<HandshakeFrame> frame = Handshake(path, &socket);
        // The lookup is the very next thing: no later than a client's
        // first RPC could reach the daemon.
        absl::Status known = frame.status();
        if (frame.ok()) known = registry.Find(frame->session_token).status();
        absl::MutexLock lock(&outcome.mu);
        if (known.ok()) {
          ++outcome.found;
        } else {
          outcome.failures.push_back(absl::StrCat("client ", t, " handshake ", i,
                                          ": ", known.ToString()));
        }
      }
    });
  }
  for (std::thread& client : clients) client.join();

  absl::MutexLock lock(&outcome.mu);
  INFO((outcome.failures.empty() ? std::string() : outcome.failures.front()));
  CHECK(outcome.failures.empty());
  CHECK(outcome.found == kThreads * kHandshakesPerThread);
}

}  // namespace
}  // namespace ckpt
