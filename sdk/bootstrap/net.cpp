#include "bootstrap/net.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <cstring>

namespace mncl::bootstrap::net {

UniqueFd &UniqueFd::operator=(UniqueFd &&other) noexcept {
  if (this != &other) reset(std::exchange(other.fd_, -1));
  return *this;
}

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string tcp_url(const std::string &host, uint16_t port) {
  const bool ipv6 = host.find(':') != std::string::npos;
  return "tcp://" + (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string to_string(const sockaddr *address, socklen_t length) {
  char host[NI_MAXHOST];
  char port[NI_MAXSERV];
  if (getnameinfo(address, length, host, sizeof host, port, sizeof port,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  return address->sa_family == AF_INET6 ? std::string("[") + host + "]:" + port
                                        : std::string(host) + ":" + port;
}

std::vector<Endpoint> resolve(const std::string &host, uint16_t port, std::string &error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_protocol = IPPROTO_TCP;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo *list = nullptr;
  const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list);
  std::vector<Endpoint> endpoints;
  if (rc != 0) {
    error = rc == EAI_SYSTEM ? error_text(errno) : gai_strerror(rc);
    return endpoints;
  }
  for (const addrinfo *info = list; info != nullptr; info = info->ai_next) {
    if (info->ai_addrlen > sizeof(sockaddr_storage)) continue;
    Endpoint endpoint;
    std::memcpy(&endpoint.address, info->ai_addr, info->ai_addrlen);
    endpoint.length = info->ai_addrlen;
    endpoint.family = info->ai_family;
    endpoints.push_back(endpoint);
  }
  freeaddrinfo(list);
  if (endpoints.empty()) error = "no usable address";
  return endpoints;
}

bool is_loopback(const sockaddr *address) {
  if (address->sa_family == AF_INET) {
    const auto *in = reinterpret_cast<const sockaddr_in *>(address);
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (address->sa_family == AF_INET6) {
    const auto &in6 = reinterpret_cast<const sockaddr_in6 *>(address)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&in6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&in6) && in6.s6_addr[12] == 127;
  }
  return false;
}

std::string error_text(int error) {
  char buffer[256];
  // The GNU strerror_r may return a static string instead of filling buffer.
  return strerror_r(error, buffer, sizeof buffer);
}

bool set_nonblocking(int fd, bool nonblocking) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0) return false;
  return fcntl(fd, F_SETFL, nonblocking ? flags | O_NONBLOCK : flags & ~O_NONBLOCK) == 0;
}

void set_nodelay(int fd) {
  // Requests and replies are small and latency-bound; Nagle would add up to 40 ms each.
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

}  // namespace mncl::bootstrap::net
