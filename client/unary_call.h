// Unary: one unary RPC to the daemon, for libckpt's calls (Client's and
// SaveHandle's), with or without a canceller. Internal to the client
// library: not part of libckpt's API.
#pragma once

#include <functional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "ckpt/v1/control.grpc.pb.h"
#include "client/call_canceller.h"
#include "client/ckpt_client.h"
#include "grpcpp/grpcpp.h"

namespace ckpt {

// One unary RPC: the plain blocking call without a canceller (the fastest,
// and what a C++ trainer's save call uses), else through the callback API
// under the canceller (CallCanceller::Run).
template <typename Request, typename Response>
absl::Status Unary(
    v1::Ckptd::Stub* stub, CallCanceller* canceller, absl::string_view what,
    grpc::Status (v1::Ckptd::StubInterface::*sync)(grpc::ClientContext*, const Request&,
                                                   Response*),
    void (v1::Ckptd::StubInterface::async_interface::*async)(
        grpc::ClientContext*, const Request*, Response*, std::function<void(grpc::Status)>),
    const Request& request, Response* response) {
  grpc::ClientContext context;
  if (canceller == nullptr) return FromGrpc((stub->*sync)(&context, request, response), what);
  return FromGrpc(canceller->Run(&context,
                                 [&](CallCanceller::Completion done) {
                                   (stub->async()->*async)(&context, &request, response,
                                                           std::move(done));
                                 }),
                  what);
}

}  // namespace ckpt
