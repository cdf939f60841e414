// Deterministic test data: word i of (rank, step) is a SplitMix64 of a seed,
// so a restore can be checked without keeping a copy of what was saved.
#pragma once

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>

namespace ckpt {

inline uint64_t PatternWord(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline uint64_t PatternSeed(uint32_t rank, uint32_t step) {
  return (uint64_t{rank} << 32) ^ (uint64_t{step} * 0x51ed27ull) ^ 0xc0ffeeull;
}

// Fills `words` 8-byte words at `data`.
inline void FillPattern(uint64_t* data, size_t words, uint64_t seed) {
  for (size_t i = 0; i < words; ++i) data[i] = PatternWord(seed, i);
}

// Index of the first word that differs, or `words` if all match.
inline size_t FirstPatternMismatch(const uint64_t* data, size_t words,
                                   uint64_t seed) {
  for (size_t i = 0; i < words; ++i) {
    if (data[i] != PatternWord(seed, i)) return i;
  }
  return words;
}

// Byte-granular versions for chunks whose size is not a multiple of 8:
// byte i is byte (i % 8) of word (i / 8).
inline void FillPatternBytes(char* data, size_t bytes, uint64_t seed) {
  FillPattern(reinterpret_cast<uint64_t*>(data), bytes / 8, seed);
  const uint64_t tail = PatternWord(seed, bytes / 8);
  std::memcpy(data + bytes / 8 * 8, &tail, bytes % 8);
}

inline bool PatternBytesMatch(const char* data, size_t bytes, uint64_t seed) {
  if (FirstPatternMismatch(reinterpret_cast<const uint64_t*>(data), bytes / 8,
                           seed) != bytes / 8) {
    return false;
  }
  const uint64_t tail = PatternWord(seed, bytes / 8);
  return std::memcmp(data + bytes / 8 * 8, &tail, bytes % 8) == 0;
}

// True if data[0, length) equals bytes [offset, offset + length) of the
// byte-granular pattern of `seed` (a piece of a chunk, after a reshard).
inline bool PatternRangeMatches(const char* data, uint64_t offset, uint64_t length,
                                uint64_t seed) {
  char expected[4096 + 16];
  while (length > 0) {
    const uint64_t word = offset / 8, skip = offset % 8;
    const uint64_t take = std::min<uint64_t>(length, 4096);
    const uint64_t words = (skip + take + 7) / 8;
    for (uint64_t i = 0; i < words; ++i) {
      const uint64_t w = PatternWord(seed, word + i);
      std::memcpy(expected + 8 * i, &w, 8);
    }
    if (std::memcmp(data, expected + skip, take) != 0) return false;
    data += take;
    offset += take;
    length -= take;
  }
  return true;
}

}  // namespace ckpt
