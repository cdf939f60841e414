// Choice between the IoQueue implementations.
#include "io/io_queue.h"

#include <cstdint>
#include <memory>
#include <mutex>

#include "absl/types/span.h"
#include "common/log.h"

namespace ckpt {

std::unique_ptr<IoQueue> CreateBestIoQueue(uint32_t depth,
                                           absl::Span<const iovec> registered) {
  auto uring = CreateUringQueue(depth, registered);
  if (uring.ok()) return *std::move(uring);
  if (!registered.empty()) {
    auto plain = CreateUringQueue(depth, {});
    if (plain.ok()) {
      static std::once_flag logged_plain;
      std::call_once(logged_plain, [&] {
        LogWarning("io_uring buffer registration failed, using io_uring "
                   "without registered buffers: ",
                   uring.status().ToString());
      });
      return *std::move(plain);
    }
  }
  // Every I/O worker creates a queue; the reason is the same for all of
  // them, so it is logged once rather than once per worker.
  static std::once_flag logged;
  std::call_once(logged, [&] {
    LogWarning("io_uring unavailable, falling back to pread/pwrite: ",
               uring.status().ToString());
  });
  return CreatePwriteQueue(depth);
}

}  // namespace ckpt
