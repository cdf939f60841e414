// BlockHasher: XXH3-64 of consecutive fixed-size blocks of one item's bytes,
// fed in order in pieces of any size (pieces may straddle staging windows).
//
// Thread-safety: none; one item at a time.
#pragma once

#include <xxhash.h>

#include <cstdint>
#include <vector>

namespace ckpt {

class BlockHasher {
 public:
  explicit BlockHasher(uint64_t block_bytes);
  ~BlockHasher();
  BlockHasher(const BlockHasher&) = delete;
  BlockHasher& operator=(const BlockHasher&) = delete;

  void Update(const char* data, uint64_t length);
  // Closes the last (possibly short) block and returns all digests; the
  // hasher is then ready for the next item.
  std::vector<uint64_t> Finish();

 private:
  const uint64_t block_bytes_;
  XXH3_state_t* state_;
  uint64_t in_block_ = 0;  // bytes fed into the current block
  std::vector<uint64_t> digests_;
};

}  // namespace ckpt
