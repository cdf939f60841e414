// TrimmingMessageAllocator: the request and response messages of a unary
// gRPC method whose requests may carry many items (DefineLayout, Save),
// allocated so that the memory of a large request goes back to the OS
// once the call is done.
//
// A parsed request of N tensor items is ~3N small heap blocks (~330 bytes
// an item), and a layout built from it as many again. glibc keeps what a
// thread frees in that thread's arena for later reuse, returning only the
// free top of a heap: measured, four concurrent 60,000-item DefineLayouts
// left ckptd 53 to 110 MB larger once refused (1.17 GB after four 29.5 MB
// requests in issue 33), and a second daemon-wide burst could leave as
// much again in other arenas. So once a large request is freed, the daemon
// calls malloc_trim(0), which gives every arena's free pages back
// (MADV_DONTNEED); the memory of a build that failed or was refused was
// freed before it (the handler has returned), so it goes back too. A trim
// walks the heap (milliseconds), so only requests of at least
// kTrimAfterItems items, which a trainer sends once per state dict, pay
// for it.
//
// Thread-safety: AllocateMessages and each holder's Release may run on any
// gRPC thread concurrently; the allocator holds no state.
#pragma once

#include <cstddef>

#include "grpcpp/support/message_allocator.h"

namespace ckpt {

// Requests of fewer items hold a few MB parsed: glibc's reuse absorbs them.
inline constexpr size_t kTrimAfterItems = 16384;

// Returns the free pages of every malloc arena to the OS (malloc_trim).
void TrimFreeHeap();

// `Request` has repeated `tensors` (v1::DefineLayoutRequest,
// v1::SaveRequest).
template <typename Request, typename Response>
class TrimmingMessageAllocator final
    : public grpc::MessageAllocator<Request, Response> {
 public:
  grpc::MessageHolder<Request, Response>* AllocateMessages() override {
    return new Holder();
  }

 private:
  class Holder final : public grpc::MessageHolder<Request, Response> {
   public:
    Holder() {
      this->set_request(&request_);
      this->set_response(&response_);
    }
    // gRPC calls it once the call is done (after the reactor's OnDone),
    // also when the request failed to parse.
    void Release() override {
      const bool large =
          static_cast<size_t>(request_.tensors_size()) >= kTrimAfterItems;
      delete this;
      if (large) TrimFreeHeap();
    }

   private:
    Request request_;
    Response response_;
  };
};

}  // namespace ckpt
