// The transport's bounds: response caps, the caller's buffer, and refused
// connections classified for retry.
#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "s3/loopback_ports.h"
#include "s3/tiny_http_server.h"
#include "storage/s3/http_transport.h"
#include "storage/s3/retry_policy.h"

namespace ckpt::s3 {
namespace {

using testing::TinyHttpServer;

std::string Url(uint16_t port) { return "http://127.0.0.1:" + std::to_string(port) + "/b/k"; }

TEST_CASE("transport: a body over the cap or the caller's buffer is an error, not a retry",
          "[server]") {
  TinyHttpServer server(TinyHttpServer::Mode::kScripted, [](int index, const std::string&) {
    return index == 2 ? TinyHttpServer::Response(404, "<Error><Code>NoSuchKey</Code></Error>")
                      : TinyHttpServer::Response(200, std::string(4096, 'b'));
  });
  auto transport = HttpTransport::Create(HttpTransportOptions{.max_response_bytes = 1000});
  REQUIRE(transport.ok());
  HttpRequest request{.method = "GET", .url = Url(server.port())};
  auto capped = (*transport)->Perform(request);
  CHECK(absl::IsResourceExhausted(capped.status()));
  CHECK(absl::StrContains(capped.status().message(), "larger than the 1000-byte cap"));
  CHECK_FALSE(IsRetryableTransportError(capped.status()));

  std::string small(100, '\0');
  request.body_into = absl::MakeSpan(small);
  auto overflow = (*transport)->Perform(request);
  CHECK(absl::IsResourceExhausted(overflow.status()));
  CHECK(absl::StrContains(overflow.status().message(), "100-byte buffer"));

  // An error answer goes to the capped body, never into the caller's memory.
  std::string untouched(100, 'u');
  request.body_into = absl::MakeSpan(untouched);
  auto not_found = (*transport)->Perform(request);
  REQUIRE(not_found.ok());
  CHECK(not_found->status == 404);
  CHECK(absl::StrContains(not_found->body, "NoSuchKey"));
  CHECK(untouched == std::string(100, 'u'));
}

TEST_CASE("transport: a refused connection is retryable and names the URL", "[server]") {
  // A port nobody listens on.
  const uint16_t port = testing::FreeLoopbackPorts(1)[0];
  auto transport = HttpTransport::Create(HttpTransportOptions{});
  REQUIRE(transport.ok());
  const std::string url = Url(port);
  auto refused = (*transport)->Perform(HttpRequest{.method = "GET", .url = url});
  INFO(refused.status());
  CHECK(absl::IsUnavailable(refused.status()));
  CHECK(IsRetryableTransportError(refused.status()));
  CHECK(absl::StrContains(refused.status().message(), url));
}

}  // namespace
}  // namespace ckpt::s3
