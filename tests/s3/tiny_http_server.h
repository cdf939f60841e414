// A tiny HTTP/1.1 responder on 127.0.0.1 for fault tests: the server
// behaviours a real S3 server will not show on demand.
//
//   kScripted:     reads each request (headers and Content-Length body) and
//                  answers with what the script returns for it;
//   kSilent:       accepts connections and never reads or answers (a hung
//                  server, a half-dead load balancer).
//
// Every request's first line ("PUT /b/k?partNumber=1&uploadId=x HTTP/1.1")
// is recorded. One connection at a time, one thread; stopped and joined by
// the destructor.
//
// Thread-safety: requests() and request_count() may be called from the test
// thread while the server thread runs.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ckpt::s3::testing {

class TinyHttpServer {
 public:
  enum class Mode { kScripted, kSilent };
  // Given the request's index (0-based) and first line, the raw response
  // (status line, headers, body).
  using Script = std::function<std::string(int index, const std::string& request_line)>;

  TinyHttpServer(Mode mode, Script script = nullptr);
  ~TinyHttpServer();

  uint16_t port() const { return port_; }
  std::vector<std::string> requests() const;
  int request_count() const;

  // A response with `status`, a reason and `body` (Content-Length set).
  static std::string Response(int status, const std::string& body,
                              const std::string& extra_headers = "");

 private:
  void Serve();
  void Answer(int connection);

  const Mode mode_;
  const Script script_;
  int listener_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  mutable absl::Mutex mutex_;
  std::vector<std::string> requests_ ABSL_GUARDED_BY(mutex_);
  std::vector<int> held_ ABSL_GUARDED_BY(mutex_);  // kSilent's connections
  std::thread thread_;
};

}  // namespace ckpt::s3::testing
