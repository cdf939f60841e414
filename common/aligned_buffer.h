// AlignedBuffer: heap memory aligned to 4096 bytes and sized in whole
// blocks, as O_DIRECT reads and writes need. Move-only; freed when dropped.
#pragma once

#include <cerrno>
#include <cstdint>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"

namespace ckpt {

class AlignedBuffer {
 public:
  static constexpr size_t kAlignment = 4096;

  AlignedBuffer() = default;
  AlignedBuffer(AlignedBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    return *this;
  }
  ~AlignedBuffer() { std::free(data_); }

  // Replaces the buffer with one of at least `size` bytes (rounded up to
  // whole blocks; at least one block).
  absl::Status Allocate(size_t size) {
    std::free(std::exchange(data_, nullptr));
    size_ = 0;
    const size_t rounded = std::max<size_t>((size + kAlignment - 1) / kAlignment, 1) * kAlignment;
    void* memory = nullptr;
    if (int error = ::posix_memalign(&memory, kAlignment, rounded); error != 0) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot allocate an aligned buffer of ", rounded, " bytes: ", std::strerror(error)));
    }
    data_ = static_cast<char*>(memory);
    size_ = rounded;
    return absl::OkStatus();
  }

  char* data() const { return data_; }
  size_t size() const { return size_; }
  absl::Span<char> span() const { return absl::MakeSpan(data_, size_); }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ckpt
