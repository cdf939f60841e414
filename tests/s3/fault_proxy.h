// FaultProxy: a TCP proxy on 127.0.0.1 between a real client (a ckptd
// process) and a real S3 server, injecting the network's and the server's
// faults on demand (tests/integration/remote_faults_test.cc):
//
//   kPass:       bytes relayed both ways, unchanged;
//   kBlackHole:  a network cut: connections are accepted and kept, and
//                nothing is forwarded either way (no reset, no answer);
//                connections that saw the cut are closed when it ends, as
//                a peer's TCP would reset them after it;
//   SlowDownNext(n): the next n requests are answered by the proxy itself
//                with "503 SlowDown" and S3's XML error body (their bodies
//                read and dropped), the connection then closed
//                ("Connection: close"), as a throttling S3 front end does;
//   CutNext(n):  the next n requests are closed mid-transfer: the request
//                is forwarded up to `cut_after_bytes` (its head at least;
//                a shorter request whole) and both connections are then
//                closed, so the client sees its connection drop with no
//                answer.
//
// The proxy understands HTTP/1.1 requests just enough to find where one
// ends (its head and Content-Length body; no chunked bodies, which the
// S3 client never sends) and never looks at responses: a client sends its
// next request on a connection only once it has read the previous answer.
//
// Every syscall's result is checked: a failure at start comes back as a
// Status; one while relaying closes that connection (what a proxy does).
// The accept loop runs on a thread of its own, each connection on one
// more; Stop (or the destructor) ends and joins them all.
//
// Thread-safety: the mode setters and counters may be called from any
// thread while connections are relayed.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace ckpt::s3::testing {

class FaultProxy {
 public:
  enum class Mode { kPass, kBlackHole };

  // Listens on 127.0.0.1 (a free port) and relays to 127.0.0.1:upstream_port.
  static absl::StatusOr<std::unique_ptr<FaultProxy>> Start(uint16_t upstream_port);
  ~FaultProxy();
  FaultProxy(const FaultProxy&) = delete;
  FaultProxy& operator=(const FaultProxy&) = delete;

  uint16_t port() const { return port_; }
  // "http://127.0.0.1:PORT", for --remote_endpoint.
  std::string endpoint() const;

  void SetMode(Mode mode);
  void SlowDownNext(int requests);
  void CutNext(int requests, uint64_t cut_after_bytes = 64 << 10);

  // Requests seen (whole heads read), 503s sent, requests cut.
  int requests() const { return requests_.load(); }
  int slow_downs_sent() const { return slow_downs_sent_.load(); }
  int cuts_done() const { return cuts_done_.load(); }
  // Connections accepted while the mode was kBlackHole.
  int black_holed() const { return black_holed_.load(); }

  // Ends the accept loop and every connection; joins their threads.
  // Idempotent.
  void Stop();

 private:
  FaultProxy() = default;
  void AcceptLoop();
  void Relay(int client);

  int listener_ = -1;
  int wake_ = -1;  // eventfd: written once, at Stop
  uint16_t port_ = 0;
  uint16_t upstream_port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<Mode> mode_{Mode::kPass};
  // Bumped on every change to kBlackHole: a connection that saw a cut
  // (its epoch differs from the current one after it) is closed.
  std::atomic<uint64_t> cut_epoch_{0};
  std::atomic<int> slow_down_next_{0};
  std::atomic<int> cut_next_{0};
  std::atomic<uint64_t> cut_after_bytes_{64 << 10};
  std::atomic<int> requests_{0};
  std::atomic<int> slow_downs_sent_{0};
  std::atomic<int> cuts_done_{0};
  std::atomic<int> black_holed_{0};

  std::thread accept_thread_;
  absl::Mutex mu_;
  std::vector<std::thread> connections_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt::s3::testing
