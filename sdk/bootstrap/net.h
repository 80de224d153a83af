// Small POSIX socket helpers shared by the TCP store's server and client.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mncl::bootstrap::net {

// Owns a file descriptor; closes it once.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd &&other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd &operator=(UniqueFd &&other) noexcept;
  UniqueFd(const UniqueFd &) = delete;
  UniqueFd &operator=(const UniqueFd &) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset(int fd = -1);
  // Gives up ownership without closing.
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_ = -1;
};

// One address host:port resolves to.
struct Endpoint {
  sockaddr_storage address{};
  socklen_t length = 0;
  int family = 0;
};

// "tcp://host:port", with brackets around an IPv6 host.
std::string tcp_url(const std::string &host, uint16_t port);
// The numeric form of an address ("127.0.0.1:29500", "[::1]:29500").
std::string to_string(const sockaddr *address, socklen_t length);
// Every TCP address of host:port (getaddrinfo). On failure returns none and sets error.
std::vector<Endpoint> resolve(const std::string &host, uint16_t port, std::string &error);
// 127.0.0.0/8, ::1, or ::ffff:127.x.y.z: an address no other host reaches.
bool is_loopback(const sockaddr *address);
// strerror_r, thread-safe.
std::string error_text(int error);

bool set_nonblocking(int fd, bool nonblocking);
void set_nodelay(int fd);

}  // namespace mncl::bootstrap::net
