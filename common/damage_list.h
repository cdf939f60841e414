// DamageList: the problems one verify found, bounded so that its reply
// always fits a control-socket message.
//
// A COMMIT may list millions of items, and verify reports every damaged one
// on a line of its own. Unbounded, the reply of a badly damaged checkpoint
// passes the message limit (--max_request_bytes, common/control_socket.h)
// and the operator gets RESOURCE_EXHAUSTED instead of a report. So the list
// keeps the first kMaxListedDamage problems, at most kMaxListedDamageBytes
// of text (each line cut at kMaxDamageLineBytes), and when it dropped any it
// ends with one summary line, "and N more problems not listed: T in all".
// The verdict stays exact: the list is empty exactly when nothing was
// damaged. The reply has no count field of its own (the control API is
// versioned apart from this), so the total travels in that line, readable
// by a person and by DamageTotal; ckptctl prints the total from it.
//
// Thread-safety: a plain value; not for concurrent use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace ckpt {

inline constexpr size_t kMaxListedDamage = 1000;
inline constexpr size_t kMaxDamageLineBytes = 4096;
inline constexpr size_t kMaxListedDamageBytes = 256 << 10;

class DamageList {
 public:
  // Counts a problem; lists it while the list has room.
  void Add(std::string line);

  // Every problem counted, listed or not.
  uint64_t total() const { return total_; }
  // The listed lines, then the summary line if some were not listed.
  std::vector<std::string> Lines() const;

 private:
  std::vector<std::string> listed_;
  size_t listed_bytes_ = 0;
  uint64_t total_ = 0;
};

// The number of problems that `listed` lines stand for, `last` being the
// last of them: the lines, or, when `last` is a summary line, the total it
// states.
uint64_t DamageTotal(size_t listed, absl::string_view last);

// The same for a whole list (a std::vector or a repeated proto field).
template <typename Lines>
uint64_t DamageTotal(const Lines& lines) {
  if (lines.empty()) return 0;
  return DamageTotal(static_cast<size_t>(lines.size()), *std::prev(lines.end()));
}

}  // namespace ckpt
