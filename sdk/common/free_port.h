// A TCP port on 127.0.0.1 for a store that a process started next will listen on (mncl-run,
// the tests' launchers). Header-only, libc only: the tests include it too.
//
// Taken from below the kernel's ephemeral range (net.ipv4.ip_local_port_range), at random, and
// free when probed: a port the kernel hands out for bind(0) (as the old way to pick one did) is
// handed out again at once, to any process on the machine that binds 0 or connects (gloo's
// listeners, every client socket), and one of them took the port before rank 0 bound it
// (fault.stalled_rank.flat.np4 in CI: gloo's listener accepted rank 0's connection, and never
// answered). Below that range only explicit binds land, such as another pick like this one.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <random>

namespace mncl {

inline int free_loopback_port() {
  int ephemeral_low = 32768;
  if (FILE *f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d", &ephemeral_low) != 1) ephemeral_low = 32768;
    std::fclose(f);
  }
  const int low = 10000, high = ephemeral_low - 1;
  std::mt19937 pick(
      std::random_device{}() ^ static_cast<unsigned>(::getpid()) ^
      static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
  auto try_bind = [](int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    socklen_t len = sizeof a;
    int got = -1;
    if (::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) == 0) {
      got = ntohs(a.sin_port);
    }
    ::close(fd);
    return got;
  };
  if (high - low >= 1000) {
    std::uniform_int_distribution<int> port(low, high);
    for (int attempt = 0; attempt < 200; ++attempt) {
      const int got = try_bind(port(pick));
      if (got > 0) return got;
    }
  }
  return try_bind(0);  // an unusual range: the kernel's choice, as before
}

}  // namespace mncl
