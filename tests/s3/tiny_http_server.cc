#include "s3/tiny_http_server.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ckpt::s3::testing {
namespace {

// Reads until `text` holds the end of the headers and then the whole
// Content-Length body; false if the peer went away or 5 s passed.
bool ReadRequest(int connection, std::string* text) {
  size_t body_needed = 0;
  size_t header_end = std::string::npos;
  char buffer[65536];
  while (true) {
    if (header_end != std::string::npos && text->size() >= header_end + 4 + body_needed) {
      return true;
    }
    pollfd ready{.fd = connection, .events = POLLIN, .revents = 0};
    if (poll(&ready, 1, 5000) <= 0) return false;
    const ssize_t got = read(connection, buffer, sizeof(buffer));
    if (got <= 0) return false;
    text->append(buffer, static_cast<size_t>(got));
    if (header_end == std::string::npos) {
      header_end = text->find("\r\n\r\n");
      if (header_end == std::string::npos) continue;
      for (absl::string_view line : absl::StrSplit(text->substr(0, header_end), "\r\n")) {
        if (absl::StartsWithIgnoreCase(line, "content-length:")) {
          absl::string_view value = absl::StripAsciiWhitespace(line.substr(15));
          if (!absl::SimpleAtoi(value, &body_needed)) return false;
        }
      }
    }
  }
}

bool WriteAll(int connection, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t wrote = send(connection, text.data() + done, text.size() - done, MSG_NOSIGNAL);
    if (wrote <= 0) return false;
    done += static_cast<size_t>(wrote);
  }
  return true;
}

}  // namespace

TinyHttpServer::TinyHttpServer(Mode mode, Script script)
    : mode_(mode), script_(std::move(script)) {
  listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(listener_ >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  REQUIRE(listen(listener_, 16) == 0);
  socklen_t size = sizeof(address);
  REQUIRE(getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &size) == 0);
  port_ = ntohs(address.sin_port);
  thread_ = std::thread([this] { Serve(); });
}

TinyHttpServer::~TinyHttpServer() {
  stop_.store(true);
  thread_.join();
  close(listener_);
  absl::MutexLock lock(&mutex_);
  for (int connection : held_) close(connection);
}

std::vector<std::string> TinyHttpServer::requests() const {
  absl::MutexLock lock(&mutex_);
  return requests_;
}

int TinyHttpServer::request_count() const {
  absl::MutexLock lock(&mutex_);
  return static_cast<int>(requests_.size());
}

std::string TinyHttpServer::Response(int status, const std::string& body,
                                     const std::string& extra_headers) {
  return absl::StrCat("HTTP/1.1 ", status, " Status\r\nContent-Length: ", body.size(),
                      "\r\n", extra_headers, "\r\n", body);
}

void TinyHttpServer::Serve() {
  while (!stop_.load()) {
    pollfd ready{.fd = listener_, .events = POLLIN, .revents = 0};
    if (poll(&ready, 1, 50) <= 0) continue;
    const int connection = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (connection < 0) continue;
    if (mode_ == Mode::kSilent) {
      absl::MutexLock lock(&mutex_);
      held_.push_back(connection);  // never read, never answered
      continue;
    }
    Answer(connection);
    close(connection);
  }
}

void TinyHttpServer::Answer(int connection) {
  // Keep-alive: answer requests on this connection until the client
  // closes it or the server stops.
  while (!stop_.load()) {
    std::string request;
    if (!ReadRequest(connection, &request)) return;
    const std::string line = request.substr(0, request.find("\r\n"));
    int index = 0;
    {
      absl::MutexLock lock(&mutex_);
      index = static_cast<int>(requests_.size());
      requests_.push_back(line);
    }
    if (!WriteAll(connection, script_(index, line))) return;
  }
}

}  // namespace ckpt::s3::testing
