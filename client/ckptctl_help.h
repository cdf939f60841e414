// ckptctl's manual: the summary `ckptctl --help` prints, one page per
// command (`ckptctl COMMAND --help`, `ckptctl help COMMAND`) laid out as a
// man page, and the exit statuses every command shares. Kept apart from the
// commands so that the text an operator reads is in one place.
//
// Thread-safety: constants and pure functions.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace ckpt::ctl {

// Exit statuses, the same for every command (each page lists them).
inline constexpr int kExitOk = 0;
// The daemon refused or failed the command (NOT_FOUND, PERMISSION_DENIED,
// ...), or a local file could not be written; the message is on stderr.
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;
// verify found damage (each problem is printed).
inline constexpr int kExitDamage = 3;
// No daemon answers at the socket, or it is stopping (UNAVAILABLE).
inline constexpr int kExitUnreachable = 4;

// `ckptctl --help`: every command in a line or two, and the exit statuses.
std::string Summary();

// The manual page of `command`; empty if there is no such command.
std::string CommandPage(absl::string_view command);

}  // namespace ckpt::ctl
