#include "format/block_hasher.h"

// libxxhash's runtime-dispatched XXH3 uses AVX2/AVX-512 where the CPU has
// them (~1.5x the baseline build here); the digests are the same.
#include <xxh_x86dispatch.h>

#include <algorithm>
#include <cstdlib>
#include <utility>

namespace ckpt {

BlockHasher::BlockHasher(uint64_t block_bytes)
    : block_bytes_(block_bytes), state_(XXH3_createState()) {
  // XXH3_createState only fails when malloc does; treat it like operator new.
  if (state_ == nullptr) std::abort();
  XXH3_64bits_reset(state_);
}

BlockHasher::~BlockHasher() { XXH3_freeState(state_); }

void BlockHasher::Update(const char* data, uint64_t length) {
  while (length > 0) {
    const uint64_t take = std::min(length, block_bytes_ - in_block_);
    XXH3_64bits_update_dispatch(state_, data, take);
    in_block_ += take;
    data += take;
    length -= take;
    if (in_block_ == block_bytes_) {
      digests_.push_back(XXH3_64bits_digest(state_));
      XXH3_64bits_reset(state_);
      in_block_ = 0;
    }
  }
}

std::vector<uint64_t> BlockHasher::Finish() {
  // An empty item still gets one digest (of zero bytes) so every item has
  // at least one checksum.
  if (in_block_ > 0 || digests_.empty()) {
    digests_.push_back(XXH3_64bits_digest(state_));
  }
  XXH3_64bits_reset(state_);
  in_block_ = 0;
  return std::exchange(digests_, {});
}

}  // namespace ckpt
