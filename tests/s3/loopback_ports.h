// Free TCP ports on 127.0.0.1 for test servers (and one that is sure to
// refuse connections).
//
// Thread-safety: none needed; each call uses its own sockets.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

namespace ckpt::s3::testing {

// `count` distinct ports, free when this returns: all bound at once (so
// they differ), then closed for a server to take. A port bound and closed
// without listen() also refuses connections until someone takes it.
inline std::vector<uint16_t> FreeLoopbackPorts(int count) {
  std::vector<int> sockets;
  std::vector<uint16_t> ports;
  for (int i = 0; i < count; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
    socklen_t size = sizeof(address);
    REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) == 0);
    sockets.push_back(fd);
    ports.push_back(ntohs(address.sin_port));
  }
  for (int fd : sockets) close(fd);
  return ports;
}

}  // namespace ckpt::s3::testing
