#include "common/handshake_frame.h"

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

constexpr size_t kPidOffset = kSessionTokenBytes;

// The pid field holds a uint32; a pid_t is an int, so the values above
// INT32_MAX would turn negative (and (pid_t)-1 means "any process" to
// PR_SET_PTRACER). Only 1..INT32_MAX names a process.
bool IsProcessId(uint64_t pid) {
  return pid > 0 &&
         pid <= static_cast<uint64_t>(std::numeric_limits<pid_t>::max());
}

}  // namespace

absl::StatusOr<std::string> EncodeHandshakeFrame(const HandshakeFrame& frame) {
  if (frame.session_token.size() != kSessionTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "handshake frame: session token is ", frame.session_token.size(),
        " bytes, expected ", kSessionTokenBytes));
  }
  if (frame.daemon_pid <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("handshake frame: daemon pid ", frame.daemon_pid,
                     " is not a process id"));
  }
  std::string bytes(kHandshakeFrameBytes, '\0');
  std::memcpy(bytes.data(), frame.session_token.data(), kSessionTokenBytes);
  const uint32_t pid = static_cast<uint32_t>(frame.daemon_pid);
  std::memcpy(bytes.data() + kPidOffset, &pid, sizeof(pid));
  return bytes;
}

absl::StatusOr<HandshakeFrame> DecodeHandshakeFrame(absl::string_view bytes) {
  if (bytes.size() != kHandshakeFrameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("handshake frame is ", bytes.size(), " bytes, expected ",
                     kHandshakeFrameBytes, " (session token and daemon pid)"));
  }
  uint32_t pid = 0;
  std::memcpy(&pid, bytes.data() + kPidOffset, sizeof(pid));
  if (!IsProcessId(pid)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "handshake frame: daemon pid ", pid, " is not a process id"));
  }
  HandshakeFrame frame;
  frame.session_token = std::string(bytes.substr(0, kSessionTokenBytes));
  frame.daemon_pid = static_cast<pid_t>(pid);
  return frame;
}

}  // namespace ckpt
