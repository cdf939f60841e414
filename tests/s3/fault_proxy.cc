#include "s3/fault_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace ckpt::s3::testing {
namespace {

// How often a connection looks at the mode and at Stop.
constexpr int kPollMs = 20;
// A peer that reads nothing for this long ends its connection (so that a
// write to a client that stopped reading cannot block Stop for ever).
constexpr int kSendTimeoutSeconds = 5;
// A request head longer than this is not HTTP: the connection is closed.
constexpr size_t kMaxHead = 64 << 10;

absl::Status Errno(const std::string& what) {
  return absl::ErrnoToStatus(errno, absl::StrCat("fault proxy: ", what));
}

// Closes `fd` if open. A socket's close fails only with EINTR or EIO, and
// Linux releases the descriptor either way: nothing is lost by going on.
void CloseFd(int& fd) {
  if (fd < 0) return;
  const int closed = ::close(fd);
  fd = -1;
  static_cast<void>(closed);
}

// Sends all of `bytes`; false if the peer is gone or stopped reading.
bool SendAll(int fd, absl::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

bool SetSendTimeout(int fd) {
  timeval timeout{};
  timeout.tv_sec = kSendTimeoutSeconds;
  return ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout)) == 0;
}

// Takes one from `counter` if it is positive.
bool TakeOne(std::atomic<int>& counter) {
  int now = counter.load();
  while (now > 0) {
    if (counter.compare_exchange_weak(now, now - 1)) return true;
  }
  return false;
}

// The request head's method and Content-Length (0 if none); false if the
// head is not one the proxy can frame (chunked, a bad length).
bool ParseHead(absl::string_view head, std::string* method, uint64_t* content_length) {
  *content_length = 0;
  std::vector<absl::string_view> lines = absl::StrSplit(head, "\r\n");
  if (lines.empty()) return false;
  std::vector<absl::string_view> first = absl::StrSplit(lines[0], ' ');
  if (first.size() != 3) return false;
  *method = std::string(first[0]);
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == absl::string_view::npos) continue;
    const absl::string_view name = absl::StripAsciiWhitespace(lines[i].substr(0, colon));
    const absl::string_view value = absl::StripAsciiWhitespace(lines[i].substr(colon + 1));
    if (absl::EqualsIgnoreCase(name, "content-length")) {
      if (!absl::SimpleAtoi(value, content_length)) return false;
    } else if (absl::EqualsIgnoreCase(name, "transfer-encoding")) {
      return false;
    }
  }
  return true;
}

std::string SlowDownResponse(const std::string& method, int id) {
  const std::string body = absl::StrCat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>"
      "<Message>Please reduce your request rate.</Message><RequestId>ckpt-fault-proxy-",
      id, "</RequestId></Error>");
  return absl::StrCat("HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n",
                      "Content-Length: ", body.size(), "\r\nConnection: close\r\n\r\n",
                      method == "HEAD" ? "" : body);
}

}  // namespace

absl::StatusOr<std::unique_ptr<FaultProxy>> FaultProxy::Start(uint16_t upstream_port) {
  std::unique_ptr<FaultProxy> proxy(new FaultProxy());
  proxy->upstream_port_ = upstream_port;
  proxy->listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (proxy->listener_ < 0) return Errno("socket");
  const int one = 1;
  if (::setsockopt(proxy->listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) {
    return Errno("SO_REUSEADDR");
  }
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(proxy->listener_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    return Errno("bind 127.0.0.1:0");
  }
  socklen_t size = sizeof(address);
  if (::getsockname(proxy->listener_, reinterpret_cast<sockaddr*>(&address), &size) != 0) {
    return Errno("getsockname");
  }
  proxy->port_ = ntohs(address.sin_port);
  if (::listen(proxy->listener_, 128) != 0) return Errno("listen");
  proxy->wake_ = ::eventfd(0, EFD_CLOEXEC);
  if (proxy->wake_ < 0) return Errno("eventfd");
  FaultProxy* raw = proxy.get();
  proxy->accept_thread_ = std::thread([raw] { raw->AcceptLoop(); });
  return proxy;
}

FaultProxy::~FaultProxy() {
  Stop();
  CloseFd(listener_);
  CloseFd(wake_);
}

std::string FaultProxy::endpoint() const { return absl::StrCat("http://127.0.0.1:", port_); }

void FaultProxy::SetMode(Mode mode) {
  if (mode == Mode::kBlackHole) cut_epoch_.fetch_add(1);
  mode_.store(mode);
}

void FaultProxy::SlowDownNext(int requests) { slow_down_next_.store(requests); }

void FaultProxy::CutNext(int requests, uint64_t cut_after_bytes) {
  cut_after_bytes_.store(cut_after_bytes);
  cut_next_.store(requests);
}

void FaultProxy::Stop() {
  if (stopping_.exchange(true)) return;
  const uint64_t one = 1;
  if (wake_ >= 0 && ::write(wake_, &one, sizeof(one)) != sizeof(one)) {
    // The loops also look at stopping_ every kPollMs: they end regardless.
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  std::vector<std::thread> connections;
  {
    absl::MutexLock lock(&mu_);
    connections.swap(connections_);
  }
  for (std::thread& t : connections) t.join();
}

void FaultProxy::AcceptLoop() {
  while (!stopping_.load()) {
    pollfd fds[2] = {{listener_, POLLIN, 0}, {wake_, POLLIN, 0}};
    const int ready = ::poll(fds, 2, kPollMs);
    if (ready < 0) {
      if (errno == EINTR) continue;
      return;  // the listener is unusable: no more connections
    }
    if (ready == 0 || (fds[0].revents & POLLIN) == 0) continue;
    const int client = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;  // the peer gave up (ECONNABORTED) or EINTR: next
    absl::MutexLock lock(&mu_);
    connections_.emplace_back([this, client] { Relay(client); });
  }
}

void FaultProxy::Relay(int client) {
  int upstream = -1;
  // The cut epoch this connection last saw relaying; a different one
  // later means a cut happened in between: the connection is dead.
  uint64_t epoch = cut_epoch_.load();
  bool cut = mode_.load() == Mode::kBlackHole;
  if (cut) black_holed_.fetch_add(1);
  if (!SetSendTimeout(client)) cut = true;  // cannot bound its writes: drop it
  if (!cut) {
    upstream = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(upstream_port_);
    if (upstream < 0 || !SetSendTimeout(upstream) ||
        ::connect(upstream, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      // The server is down: the client's connection drops, as a load
      // balancer with no backend would drop it.
      CloseFd(upstream);
      CloseFd(client);
      return;
    }
  }

  // Request framing of the client's bytes.
  std::string head;        // the head being read
  uint64_t body_left = 0;  // body bytes of the current request still to come
  bool in_body = false;
  bool answering = false;  // the current request gets a 503 once its body is read
  std::string method;
  uint64_t forward_left = UINT64_MAX;  // bytes to forward before a cut
  char buffer[64 << 10];

  auto finish = [&] {
    CloseFd(upstream);
    CloseFd(client);
  };
  while (!stopping_.load()) {
    if (mode_.load() == Mode::kBlackHole || cut) {
      // A network cut: nothing moves either way; the sockets stay open
      // until the cut ends, then the connection is dead.
      if (mode_.load() != Mode::kBlackHole) return finish();
      cut = true;
      pollfd wake{wake_, POLLIN, 0};
      if (::poll(&wake, 1, kPollMs) < 0 && errno != EINTR) return finish();
      continue;
    }
    if (cut_epoch_.load() != epoch) return finish();  // a cut came and went
    pollfd fds[3] = {{client, POLLIN, 0}, {upstream, POLLIN, 0}, {wake_, POLLIN, 0}};
    const int ready = ::poll(fds, 3, kPollMs);
    if (ready < 0) {
      if (errno == EINTR) continue;
      return finish();
    }
    if (ready == 0) continue;
    if (mode_.load() == Mode::kBlackHole) continue;  // the cut wins the race
    if ((fds[1].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
      const ssize_t n = ::recv(upstream, buffer, sizeof(buffer), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0 || !SendAll(client, absl::string_view(buffer, static_cast<size_t>(n)))) {
        return finish();
      }
    }
    if ((fds[0].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
    const ssize_t n = ::recv(client, buffer, sizeof(buffer), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return finish();
    absl::string_view data(buffer, static_cast<size_t>(n));
    while (!data.empty()) {
      if (!in_body) {
        // Reading a head: it ends at the blank line.
        const size_t before = head.size();
        head.append(data.data(), data.size());
        const size_t end = head.find("\r\n\r\n");
        if (end == std::string::npos) {
          if (head.size() > kMaxHead) return finish();
          data = {};
          break;
        }
        const size_t head_size = end + 4;
        data.remove_prefix(head_size - before);
        const int id = requests_.fetch_add(1) + 1;
        if (!ParseHead(absl::string_view(head).substr(0, head_size), &method, &body_left)) {
          return finish();
        }
        in_body = true;
        answering = TakeOne(slow_down_next_);
        if (answering) {
          slow_downs_sent_.fetch_add(1);
        } else {
          if (TakeOne(cut_next_)) {
            cuts_done_.fetch_add(1);
            forward_left = std::max<uint64_t>(head_size, cut_after_bytes_.load());
          }
          const size_t send = static_cast<size_t>(std::min<uint64_t>(head_size, forward_left));
          if (!SendAll(upstream, absl::string_view(head).substr(0, send))) return finish();
          if (forward_left != UINT64_MAX) forward_left -= send;
          if (forward_left == 0) return finish();  // cut after the head
          // A request to cut that is shorter than cut_after_bytes: cut once
          // it is sent, before its answer.
          if (forward_left != UINT64_MAX && body_left == 0) return finish();
        }
        head.clear();
        if (answering && body_left == 0) {
          // Answered at once; the connection then closes ("Connection:
          // close"), whether or not the client took the answer.
          if (!SendAll(client, SlowDownResponse(method, id))) return finish();
          return finish();
        }
        if (body_left == 0) in_body = false;
        continue;
      }
      // A body: dropped (answered with 503 at its end) or forwarded.
      const size_t take = static_cast<size_t>(std::min<uint64_t>(body_left, data.size()));
      if (answering) {
        body_left -= take;
        data.remove_prefix(take);
        if (body_left == 0) {
          // Closed after the answer, whether or not the client took it.
          if (!SendAll(client, SlowDownResponse(method, requests_.load()))) return finish();
          return finish();
        }
        continue;
      }
      const size_t send = static_cast<size_t>(std::min<uint64_t>(take, forward_left));
      if (!SendAll(upstream, data.substr(0, send))) return finish();
      if (forward_left != UINT64_MAX) {
        forward_left -= send;
        if (forward_left == 0) return finish();  // closed mid-transfer
      }
      body_left -= take;
      data.remove_prefix(take);
      if (body_left == 0) {
        if (forward_left != UINT64_MAX) return finish();  // sent whole: cut before the answer
        in_body = false;
      }
    }
  }
  finish();
}

}  // namespace ckpt::s3::testing
