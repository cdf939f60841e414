#include "daemon/trimming_message_allocator.h"

#include <malloc.h>

namespace ckpt {

void TrimFreeHeap() {
  // Its result says only whether any memory was released: not an error.
  (void)::malloc_trim(0);
}

}  // namespace ckpt
