// HTTP requests over libcurl's easy interface, with every request bounded
// in time and memory.
//
// libcurl does HTTP/1.1, TLS (OpenSSL), connection reuse and proxies; this
// file only bounds what it does:
//   - a deadline per request (CURLOPT_TIMEOUT_MS), a connect timeout, and
//     stall detection (fewer than low_speed_bytes_per_second for
//     low_speed_seconds: CURLOPT_LOW_SPEED_LIMIT/TIME), so a server that
//     accepts a connection and never answers fails within a bound;
//   - request bodies are read from the caller's memory as they are sent
//     (CURLOPT_READFUNCTION): no copy of a 64 MiB part;
//   - response bodies go to a buffer capped at max_response_bytes, or,
//     for a successful GET given one, straight into the caller's memory
//     (ranged reads into pinned buffers); an error answer always goes to
//     the capped buffer, never into the caller's;
//   - idle easy handles (each keeps its connection alive) are pooled, at
//     most max_idle_handles of them.
//
// Failures of the transport itself come back as a Status: kUnavailable for
// connection-level failures (refused, reset, DNS, a response cut short),
// kDeadlineExceeded for the deadline or a stall: both retryable
// (retry_policy.h); anything else (a TLS certificate error, an over-long
// response) is not. An HTTP error status is not a transport failure: the
// caller reads HttpResponse::status.
//
// Thread-safety: Perform may be called from any number of threads at once;
// each call holds its own easy handle.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace ckpt::s3 {

struct HttpTransportOptions {
  absl::Duration connect_timeout = absl::Seconds(10);
  // A transfer slower than this for that long is a stall.
  int64_t low_speed_bytes_per_second = 1024;
  absl::Duration low_speed_time = absl::Seconds(30);
  size_t max_idle_handles = 16;
  // Cap on a response body read into memory (XML answers, error bodies).
  size_t max_response_bytes = 16 << 20;
  // A CA bundle for https:// endpoints; empty: the system's.
  std::string ca_file = {};
  // libcurl's buffers per handle (CURLOPT_BUFFERSIZE, CURLOPT_UPLOAD_
  // BUFFERSIZE). Its defaults (16 KiB down, 64 KiB up) cost a recv or send
  // and a callback per 16 or 64 KiB of a 16 MiB part; larger ones move a
  // part in a few dozen. Memory: both per handle in use or idle (at most
  // the requests in flight plus max_idle_handles).
  long receive_buffer_bytes = 512 << 10;
  long send_buffer_bytes = 2 << 20;
};

struct HttpRequest {
  std::string method;  // GET, HEAD, PUT, POST, DELETE
  std::string url;
  std::vector<std::pair<std::string, std::string>> headers = {};
  // Sent from this memory, which must outlive Perform (PUT and POST; may
  // be empty).
  absl::string_view body = {};
  // A 2xx answer's body is written here instead of into response.body
  // (more than fits is an error); empty: into response.body.
  absl::Span<char> body_into = {};
  absl::Duration timeout = absl::Minutes(1);
};

struct HttpResponse {
  int status = 0;
  std::string body;           // unless it went to body_into
  size_t bytes_into = 0;      // bytes written to body_into
  // Response headers, names lower-cased (the last of a repeated name).
  std::vector<std::pair<std::string, std::string>> headers = {};
  absl::string_view Header(absl::string_view lower_case_name) const;
};

class HttpTransport {
 public:
  // Fails if libcurl cannot be initialized.
  static absl::StatusOr<std::unique_ptr<HttpTransport>> Create(HttpTransportOptions options);
  ~HttpTransport();
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  absl::StatusOr<HttpResponse> Perform(const HttpRequest& request);

  const HttpTransportOptions& options() const { return options_; }

 private:
  explicit HttpTransport(HttpTransportOptions options) : options_(std::move(options)) {}
  void* AcquireHandle();
  void ReleaseHandle(void* handle);

  const HttpTransportOptions options_;
  absl::Mutex mutex_;
  std::vector<void*> idle_ ABSL_GUARDED_BY(mutex_);  // CURL* easy handles
};

}  // namespace ckpt::s3
