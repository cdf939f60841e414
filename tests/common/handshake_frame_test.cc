// Tests of the handshake frame, the one message the daemon writes on
// <socket>.session and libckpt reads: both ends use these two functions, so a
// round trip here is the wire contract, and every frame the client must not
// act on is refused with an error that says what is wrong with it.
#include "common/handshake_frame.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "absl/strings/match.h"

namespace ckpt {
namespace {

// A token with a NUL and bytes above 0x7f in it (0x00, 0x11, ... 0xff), as a
// random one may have: the frame must carry it as bytes, not as a string.
std::string SampleToken() {
  std::string token(kSessionTokenBytes, '\0');
  for (size_t i = 0; i < token.size(); ++i) {
    token[i] = static_cast<char>(i * 17);
  }
  return token;
}

void ExpectInvalid(const absl::Status& status, const std::string& text) {
  INFO(status.ToString());
  CHECK(absl::IsInvalidArgument(status));
  CHECK(absl::StrContains(status.message(), text));
}

TEST_CASE("a handshake frame decodes to the token and pid it was encoded from",
          "[handshake]") {
  const pid_t pid = GENERATE(1, 4242, std::numeric_limits<pid_t>::max());
  auto bytes =
      EncodeHandshakeFrame({.session_token = SampleToken(), .daemon_pid = pid});
  REQUIRE(bytes.ok());
  CHECK(bytes->size() == kHandshakeFrameBytes);
  auto frame = DecodeHandshakeFrame(*bytes);
  REQUIRE(frame.ok());
  CHECK(frame->session_token == SampleToken());
  CHECK(frame->daemon_pid == pid);
}

TEST_CASE(
    "a handshake frame is the token followed by the pid as a host-order uint32",
    "[handshake]") {
  auto bytes = EncodeHandshakeFrame(
      {.session_token = SampleToken(), .daemon_pid = 4242});
  REQUIRE(bytes.ok());
  CHECK(bytes->substr(0, kSessionTokenBytes) == SampleToken());
  uint32_t pid = 0;
  std::memcpy(&pid, bytes->data() + kSessionTokenBytes, sizeof(pid));
  CHECK(pid == 4242u);
}

TEST_CASE("a short or long handshake frame is refused, naming both sizes",
          "[handshake]") {
  auto bytes = EncodeHandshakeFrame(
      {.session_token = SampleToken(), .daemon_pid = 4242});
  REQUIRE(bytes.ok());
  ExpectInvalid(DecodeHandshakeFrame("").status(), "is 0 bytes, expected 20");
  ExpectInvalid(
      DecodeHandshakeFrame(bytes->substr(0, kSessionTokenBytes)).status(),
      "is 16 bytes, expected 20");
  ExpectInvalid(
      DecodeHandshakeFrame(bytes->substr(0, kHandshakeFrameBytes - 1)).status(),
      "is 19 bytes, expected 20");
  ExpectInvalid(DecodeHandshakeFrame(*bytes + "x").status(),
                "is 21 bytes, expected 20");
}

TEST_CASE("a handshake frame whose pid is 0 or does not fit pid_t is refused",
          "[handshake]") {
  for (const uint32_t bad : {0u, 0x80000000u, 0xffffffffu}) {
    std::string bytes = SampleToken();
    bytes.append(reinterpret_cast<const char*>(&bad), sizeof(bad));
    REQUIRE(bytes.size() == kHandshakeFrameBytes);
    ExpectInvalid(DecodeHandshakeFrame(bytes).status(),
                  "daemon pid " + std::to_string(bad) + " is not a process id");
  }
}

TEST_CASE(
    "a handshake frame is not encoded from a token of the wrong size or a "
    "pid that is not positive",
    "[handshake]") {
  ExpectInvalid(
      EncodeHandshakeFrame({.session_token = "short", .daemon_pid = 4242})
          .status(),
      "session token is 5 bytes, expected 16");
  ExpectInvalid(
      EncodeHandshakeFrame({.session_token = SampleToken(), .daemon_pid = 0})
          .status(),
      "daemon pid 0 is not a process id");
  ExpectInvalid(
      EncodeHandshakeFrame({.session_token = SampleToken(), .daemon_pid = -1})
          .status(),
      "daemon pid -1 is not a process id");
}

}  // namespace
}  // namespace ckpt
