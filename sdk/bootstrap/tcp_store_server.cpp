// The TCP store's server: one thread, one poll() loop, no locks (only this thread touches the
// data). Requests on a connection are served in order; a GET or WAIT whose keys are missing
// parks its connection until the keys are set or its slice runs out.
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstring>
#include <deque>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "bootstrap/tcp_store.h"
#include "bootstrap/wire.h"
#include "common/error.h"
#include "common/log.h"

namespace mncl::bootstrap {

namespace {

using Clock = std::chrono::steady_clock;
// Values are shared between the map and replies in flight, so a GET never copies one.
using Value = std::shared_ptr<const Bytes>;

constexpr size_t kReadChunk = 64 * 1024;
// Before HELLO succeeds a connection may not make the server buffer more than this.
constexpr size_t kMaxUnauthenticatedFrame = 64 * 1024;
// Bytes read from one connection per wakeup, so one large sender cannot starve the others.
constexpr size_t kReadBudgetPerWakeup = 16 << 20;
// An idle connection's read buffer larger than this is freed (it held a large value).
constexpr size_t kKeepBufferBytes = 1 << 20;

// Incoming bytes of one connection. Grows without zero-filling, and toward the size of the
// frame being received only as its bytes arrive, so a forged length cannot make it allocate.
class InBuffer {
 public:
  const uint8_t *data() const { return storage_.get() + begin_; }
  size_t size() const { return end_ - begin_; }

  void consume(size_t n) {
    begin_ += n;
    if (begin_ == end_) {
      begin_ = end_ = 0;
      if (capacity_ > kKeepBufferBytes) {
        storage_.reset();
        capacity_ = 0;
      }
    }
  }

  // Room to receive into; frame_size is the size of the frame in progress, if known.
  std::pair<uint8_t *, size_t> space(size_t frame_size) {
    const size_t used = size();
    size_t goal = used + kReadChunk;
    if (frame_size > goal) goal = std::min(frame_size, std::max(goal, 2 * capacity_));
    if (goal > capacity_) {
      std::unique_ptr<uint8_t[]> bigger(new uint8_t[goal]);
      if (used > 0) std::memcpy(bigger.get(), data(), used);
      storage_ = std::move(bigger);
      capacity_ = goal;
      begin_ = 0;
      end_ = used;
    } else if (capacity_ - end_ < goal - used) {
      std::memmove(storage_.get(), data(), used);
      begin_ = 0;
      end_ = used;
    }
    return {storage_.get() + end_, capacity_ - end_};
  }
  void commit(size_t n) { end_ += n; }

 private:
  std::unique_ptr<uint8_t[]> storage_;
  size_t capacity_ = 0;
  size_t begin_ = 0;
  size_t end_ = 0;
};

struct OutChunk {
  std::vector<uint8_t> head;
  Value value;  // sent after head, straight from the map's copy
  size_t sent = 0;
  size_t size() const { return head.size() + (value ? value->size() : 0); }
};

// A parked GET (one key) or WAIT (several).
struct Waiter {
  bool is_get = false;
  std::vector<std::string> keys;
  std::unordered_set<std::string> missing;
  Clock::time_point deadline;
};

struct Connection {
  net::UniqueFd socket;
  std::string peer;
  bool authenticated = false;
  InBuffer in;
  std::deque<OutChunk> out;
  std::optional<Waiter> waiter;
  bool close_when_flushed = false;  // after a refusal: send it, then close
  bool dead = false;                // closed at the end of this loop iteration
};

// Constant time in the contents, so timing does not reveal how much of a guess was right.
bool same_token(std::string_view expected, std::string_view given) {
  size_t diff = expected.size() ^ given.size();
  for (size_t i = 0; i < expected.size(); ++i) {
    const char other = i < given.size() ? given[i] : '\0';
    diff |= static_cast<uint8_t>(expected[i] ^ other);
  }
  return diff == 0;
}

std::optional<int64_t> parse_integer(const Bytes &value) {
  const char *begin = reinterpret_cast<const char *>(value.data());
  const char *end = begin + value.size();
  int64_t result = 0;
  const auto [stop, error] = std::from_chars(begin, end, result);
  if (error != std::errc() || stop != end || value.empty()) return std::nullopt;
  return result;
}

Value make_value(std::string_view bytes) {
  return std::make_shared<const Bytes>(bytes.begin(), bytes.end());
}

}  // namespace

struct TcpStoreServer::Impl {
  std::string url;
  std::string token;
  uint16_t port = 0;
  std::vector<net::UniqueFd> listeners;
  net::UniqueFd wakeup;  // an eventfd written to wake the loop: to stop, or to stop accepting
  std::atomic<bool> stopping{false};
  std::atomic<bool> refuse_new{false};
  std::unordered_map<std::string, Value> data;
  std::vector<std::unique_ptr<Connection>> connections;
  // Connections whose wait ended: their buffered requests are served at the end of the loop.
  std::vector<Connection *> resumable;
  std::thread thread;

  void bind_all(const std::string &host, uint16_t requested_port);
  void wake(const char *why);
  void run();
  void loop_once(std::vector<pollfd> &fds);
  void accept_all(int listener);
  void read_from(Connection &c);
  void process(Connection &c);
  void handle(Connection &c, const wire::Message &m);
  void handle_hello(Connection &c, const wire::Message &m);
  void park(Connection &c, Waiter waiter, uint32_t wait_ms);
  void notify(const std::string &key);
  void finish_wait(Connection &c);
  void expire_waiters(Clock::time_point now);
  int poll_timeout_ms(Clock::time_point now) const;
  std::vector<std::string_view> missing_keys(const std::vector<std::string> &keys) const;
  void reply(Connection &c, std::vector<uint8_t> head, Value value = nullptr);
  void flush(Connection &c);
  void drop(Connection &c, const std::string &why, bool warn);
};

TcpStoreServer::TcpStoreServer(const std::string &host, uint16_t port, std::string token)
    : impl_(std::make_unique<Impl>()) {
  impl_->token = std::move(token);
  impl_->bind_all(host, port);
  impl_->wakeup.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  MNCL_CHECK(impl_->wakeup, MNCL_ERR_SYSTEM, "cannot start the store at %s: eventfd: %s",
             impl_->url.c_str(), net::error_text(errno).c_str());
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
  MNCL_INFO("store server listening at %s%s", impl_->url.c_str(),
            impl_->token.empty() ? "" : " (token required)");
}

TcpStoreServer::~TcpStoreServer() {
  impl_->stopping = true;
  impl_->wake("stop it");
  impl_->thread.join();
}

void TcpStoreServer::stop_accepting() {
  if (impl_->refuse_new.exchange(true)) return;
  impl_->wake("close its listening sockets");
}

void TcpStoreServer::Impl::wake(const char *why) {
  const uint64_t one = 1;
  if (write(wakeup.get(), &one, sizeof one) != sizeof one) {
    MNCL_ERROR("cannot wake the store server at %s to %s: %s", url.c_str(), why,
               net::error_text(errno).c_str());
  }
}

uint16_t TcpStoreServer::port() const {
  return impl_->port;
}

void TcpStoreServer::Impl::bind_all(const std::string &host, uint16_t requested_port) {
  url = net::tcp_url(host, requested_port);
  std::string error;
  const auto endpoints = net::resolve(host, requested_port, error);
  MNCL_CHECK(!endpoints.empty(), MNCL_ERR_BOOTSTRAP,
             "cannot start the store at %s: cannot resolve '%s': %s", url.c_str(), host.c_str(),
             error.c_str());
  // Listen on each address the host resolves to ("localhost" may be ::1 and 127.0.0.1), and
  // only there: clients of a store bound to 127.0.0.1 must not find it on another address.
  std::string failures;
  std::unordered_set<std::string> seen;
  port = requested_port;
  for (auto endpoint : endpoints) {
    auto *address = reinterpret_cast<sockaddr *>(&endpoint.address);
    // With port 0, the first bind picks the port and the other addresses reuse it.
    if (endpoint.family == AF_INET) {
      reinterpret_cast<sockaddr_in *>(address)->sin_port = htons(port);
    } else if (endpoint.family == AF_INET6) {
      reinterpret_cast<sockaddr_in6 *>(address)->sin6_port = htons(port);
    }
    const std::string name = net::to_string(address, endpoint.length);
    if (!seen.insert(name).second) continue;

    net::UniqueFd fd(socket(endpoint.family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    const int one = 1;
    bool ok = bool(fd) && setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0;
    // Otherwise an IPv6 socket would also take the IPv4 addresses of the port.
    if (ok && endpoint.family == AF_INET6) {
      ok = setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one) == 0;
    }
    ok = ok && bind(fd.get(), address, endpoint.length) == 0 && listen(fd.get(), SOMAXCONN) == 0;
    if (!ok) {
      failures += (failures.empty() ? "" : "; ") + name + ": " + net::error_text(errno);
      continue;
    }
    if (port == 0) {
      sockaddr_storage bound{};
      socklen_t length = sizeof bound;
      getsockname(fd.get(), reinterpret_cast<sockaddr *>(&bound), &length);
      port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6 *>(&bound)->sin6_port
                                               : reinterpret_cast<sockaddr_in *>(&bound)->sin_port);
    }
    listeners.push_back(std::move(fd));
  }
  MNCL_CHECK(!listeners.empty(), MNCL_ERR_BOOTSTRAP,
             "cannot start the store at %s: cannot listen on %s", url.c_str(), failures.c_str());
  url = net::tcp_url(host, port);
  if (!failures.empty()) {
    MNCL_WARN("the store at %s listens on only some addresses of '%s'; failed: %s", url.c_str(),
              host.c_str(), failures.c_str());
  }
}

void TcpStoreServer::Impl::run() {
  std::vector<pollfd> fds;
  for (;;) {
    try {
      if (refuse_new.load() && !listeners.empty()) {
        // New clients now get "connection refused" and retry until the next server is up.
        listeners.clear();
        MNCL_INFO("store server at %s: no longer accepting connections", url.c_str());
      }
      fds.clear();
      fds.push_back({wakeup.get(), POLLIN, 0});
      for (const auto &listener : listeners) fds.push_back({listener.get(), POLLIN, 0});
      for (const auto &c : connections) {
        // A parked connection sends nothing more, but its peer may still hang up.
        short events = c->waiter ? POLLRDHUP : POLLIN;
        if (!c->out.empty()) events |= POLLOUT;
        fds.push_back({c->socket.get(), events, 0});
      }
      const int ready = poll(fds.data(), fds.size(), poll_timeout_ms(Clock::now()));
      if (ready < 0 && errno != EINTR) {
        MNCL_ERROR("store server at %s: poll: %s", url.c_str(), net::error_text(errno).c_str());
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      if (ready > 0 && fds[0].revents != 0) {
        uint64_t count = 0;
        if (read(wakeup.get(), &count, sizeof count) < 0 && errno != EAGAIN) {
          MNCL_ERROR("store server at %s: eventfd read: %s", url.c_str(),
                     net::error_text(errno).c_str());
        }
        if (stopping.load()) break;
        continue;  // only asked to stop accepting: the top of the loop does that
      }
      if (ready > 0) loop_once(fds);
      expire_waiters(Clock::now());
      // Serving a resumed connection may resume others (it may set what they wait for).
      while (!resumable.empty()) {
        auto batch = std::move(resumable);
        resumable.clear();
        for (Connection *c : batch) process(*c);
      }
      connections.erase(std::remove_if(connections.begin(), connections.end(),
                                       [](const auto &c) { return c->dead; }),
                        connections.end());
    } catch (const std::exception &e) {
      // Never let an exception end the thread (std::terminate); the clients would hang.
      MNCL_ERROR("store server at %s: %s", url.c_str(), e.what());
    }
  }
  MNCL_INFO("store server at %s stopped (%zu connections, %zu keys)", url.c_str(),
            connections.size(), data.size());
}

void TcpStoreServer::Impl::loop_once(std::vector<pollfd> &fds) {
  const size_t first_connection = 1 + listeners.size();
  // Connections accepted below are not in fds yet; they are polled from the next iteration.
  const size_t polled = fds.size() - first_connection;
  for (size_t i = 0; i < listeners.size(); ++i) {
    if (fds[1 + i].revents & POLLIN) accept_all(listeners[i].get());
  }
  for (size_t i = 0; i < polled; ++i) {
    Connection &c = *connections[i];
    const short revents = fds[first_connection + i].revents;
    if (revents == 0 || c.dead) continue;
    if (revents & POLLOUT) flush(c);
    if (c.dead) continue;
    if (revents & POLLIN) {
      read_from(c);
    } else if (revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL)) {
      drop(c, c.waiter ? "disconnected while waiting" : "disconnected", false);
    }
  }
}

void TcpStoreServer::Impl::accept_all(int listener) {
  for (;;) {
    sockaddr_storage address{};
    socklen_t length = sizeof address;
    const int fd = accept4(listener, reinterpret_cast<sockaddr *>(&address), &length,
                           SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        MNCL_WARN("store server at %s: accept: %s", url.c_str(), net::error_text(errno).c_str());
      }
      return;
    }
    net::set_nodelay(fd);
    auto c = std::make_unique<Connection>();
    c->socket.reset(fd);
    c->peer = net::to_string(reinterpret_cast<sockaddr *>(&address), length);
    MNCL_TRACE("store server at %s: connection from %s", url.c_str(), c->peer.c_str());
    connections.push_back(std::move(c));
  }
}

void TcpStoreServer::Impl::read_from(Connection &c) {
  size_t budget = kReadBudgetPerWakeup;
  while (!c.dead && !c.waiter && !c.close_when_flushed && budget > 0) {
    const size_t frame_size = wire::parse_frame(c.in.data(), c.in.size()).frame_size;
    auto [room, room_size] = c.in.space(frame_size);
    const ssize_t n = recv(c.socket.get(), room, room_size, MSG_DONTWAIT);
    if (n > 0) {
      c.in.commit(static_cast<size_t>(n));
      budget -= std::min(budget, static_cast<size_t>(n));
      process(c);
    } else if (n == 0) {
      // A clean close between frames is how clients leave; mid-frame it is a truncated frame.
      if (c.in.size() == 0) {
        drop(c, "closed by the client", false);
      } else {
        drop(c, format("closed in the middle of a frame (%zu bytes buffered)", c.in.size()), true);
      }
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return;
    } else if (errno != EINTR) {
      drop(c, net::error_text(errno), false);
    }
  }
}

void TcpStoreServer::Impl::process(Connection &c) {
  while (!c.dead && !c.waiter && !c.close_when_flushed && c.in.size() > 0) {
    const auto parsed = wire::parse_frame(c.in.data(), c.in.size());
    if (parsed.status == wire::ParseStatus::kInvalid) {
      drop(c, "sent an invalid frame: " + parsed.error, true);
      return;
    }
    if (!c.authenticated && parsed.frame_size > kMaxUnauthenticatedFrame) {
      drop(c, format("sent a %zu-byte frame before HELLO", parsed.frame_size), true);
      return;
    }
    if (parsed.status == wire::ParseStatus::kNeedMore) return;
    if (!wire::is_request(parsed.message.op)) {
      drop(c, format("sent a %s reply as a request", wire::op_name(parsed.message.op)), true);
      return;
    }
    try {
      handle(c, parsed.message);
    } catch (const std::bad_alloc &) {
      reply(c, wire::encode_failed("the store server ran out of memory"));
    }
    c.in.consume(parsed.frame_size);
  }
}

void TcpStoreServer::Impl::handle(Connection &c, const wire::Message &m) {
  if (!c.authenticated || m.op == wire::Op::kHello) {
    handle_hello(c, m);
    return;
  }
  const std::string key(m.text);
  switch (m.op) {
    case wire::Op::kSet:
      data[key] = make_value(m.value);
      reply(c, wire::encode_ok());
      notify(key);
      break;
    case wire::Op::kGet: {
      const auto found = data.find(key);
      if (found != data.end()) {
        reply(c, wire::encode_value_head(found->second->size()), found->second);
      } else if (m.wait_ms == 0) {
        reply(c, wire::encode_not_yet());
      } else {
        Waiter waiter;
        waiter.is_get = true;
        waiter.keys = {key};
        waiter.missing = {key};
        park(c, std::move(waiter), m.wait_ms);
      }
      break;
    }
    case wire::Op::kAdd: {
      int64_t value = 0;
      const auto found = data.find(key);
      if (found != data.end()) {
        const auto current = parse_integer(*found->second);
        if (!current) {
          reply(c, wire::encode_failed(format("store key '%s' holds a %zu-byte value that is not "
                                              "a decimal integer, so it cannot be added to",
                                              key.c_str(), found->second->size())));
          break;
        }
        value = *current;
      }
      if (__builtin_add_overflow(value, m.integer, &value)) {
        reply(c, wire::encode_failed(format("adding %lld to store key '%s' overflows int64",
                                            static_cast<long long>(m.integer), key.c_str())));
        break;
      }
      data[key] = make_value(std::to_string(value));
      reply(c, wire::encode_integer(value));
      notify(key);
      break;
    }
    case wire::Op::kWait: {
      Waiter waiter;
      waiter.keys.assign(m.keys.begin(), m.keys.end());
      const auto missing = missing_keys(waiter.keys);
      if (missing.empty() || m.wait_ms == 0) {
        reply(c, wire::encode_missing(missing));
      } else {
        for (const auto key_view : missing) waiter.missing.emplace(key_view);
        park(c, std::move(waiter), m.wait_ms);
      }
      break;
    }
    case wire::Op::kErase:
      reply(c, wire::encode_bool(data.erase(key) > 0));
      break;
    default:
      drop(c, format("sent an unexpected %s", wire::op_name(m.op)), true);
  }
}

void TcpStoreServer::Impl::handle_hello(Connection &c, const wire::Message &m) {
  if (m.op != wire::Op::kHello || c.authenticated) {
    drop(c, format("sent %s %s HELLO", wire::op_name(m.op), c.authenticated ? "after" : "before"),
         true);
    return;
  }
  if (m.version != wire::kProtocolVersion) {
    MNCL_WARN("store server at %s: refused %s: protocol version %u, this server speaks %u",
              url.c_str(), c.peer.c_str(), m.version, wire::kProtocolVersion);
    reply(c, wire::encode_refused(format("protocol version %u, the server speaks %u", m.version,
                                         wire::kProtocolVersion)));
    c.close_when_flushed = true;
    flush(c);
    return;
  }
  if (!token.empty() && !same_token(token, m.text)) {
    MNCL_WARN("store server at %s: refused %s: %s MNCL_STORE_TOKEN", url.c_str(), c.peer.c_str(),
              m.text.empty() ? "no" : "a wrong");
    reply(c, wire::encode_refused("token"));
    c.close_when_flushed = true;
    flush(c);
    return;
  }
  c.authenticated = true;
  reply(c, wire::encode_ok());
}

void TcpStoreServer::Impl::park(Connection &c, Waiter waiter, uint32_t wait_ms) {
  waiter.deadline =
      Clock::now() + std::chrono::milliseconds(std::min(wait_ms, wire::kMaxWaitSliceMs));
  c.waiter = std::move(waiter);
}

void TcpStoreServer::Impl::notify(const std::string &key) {
  for (const auto &c : connections) {
    if (c->dead || !c->waiter || c->waiter->missing.erase(key) == 0) continue;
    if (c->waiter->missing.empty()) finish_wait(*c);
  }
}

// Answers a parked connection with what it waits for (or what is still missing).
void TcpStoreServer::Impl::finish_wait(Connection &c) {
  const Waiter waiter = std::move(*c.waiter);
  c.waiter.reset();
  if (waiter.is_get) {
    const auto found = data.find(waiter.keys.front());
    if (found != data.end()) {
      reply(c, wire::encode_value_head(found->second->size()), found->second);
    } else {
      reply(c, wire::encode_not_yet());
    }
  } else {
    reply(c, wire::encode_missing(missing_keys(waiter.keys)));
  }
  resumable.push_back(&c);
}

void TcpStoreServer::Impl::expire_waiters(Clock::time_point now) {
  for (const auto &c : connections) {
    if (!c->dead && c->waiter && c->waiter->deadline <= now) finish_wait(*c);
  }
}

int TcpStoreServer::Impl::poll_timeout_ms(Clock::time_point now) const {
  std::optional<Clock::time_point> earliest;
  for (const auto &c : connections) {
    if (c->waiter && (!earliest || c->waiter->deadline < *earliest)) earliest = c->waiter->deadline;
  }
  if (!earliest) return -1;
  if (*earliest <= now) return 0;
  // Rounded up, so the loop never wakes just before a deadline and spins.
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(*earliest - now).count();
  return static_cast<int>((us + 999) / 1000);
}

std::vector<std::string_view> TcpStoreServer::Impl::missing_keys(
    const std::vector<std::string> &keys) const {
  std::vector<std::string_view> missing;
  for (const auto &key : keys) {
    if (data.count(key) == 0) missing.push_back(key);
  }
  return missing;
}

void TcpStoreServer::Impl::reply(Connection &c, std::vector<uint8_t> head, Value value) {
  c.out.push_back(OutChunk{std::move(head), std::move(value), 0});
  flush(c);
}

void TcpStoreServer::Impl::flush(Connection &c) {
  while (!c.dead && !c.out.empty()) {
    OutChunk &chunk = c.out.front();
    iovec parts[2];
    int count = 0;
    const size_t head_size = chunk.head.size();
    if (chunk.sent < head_size) {
      parts[count++] = {chunk.head.data() + chunk.sent, head_size - chunk.sent};
    }
    if (chunk.value) {
      const size_t value_sent = chunk.sent > head_size ? chunk.sent - head_size : 0;
      if (value_sent < chunk.value->size()) {
        // iovec wants a non-const pointer; sendmsg only reads it.
        parts[count++] = {const_cast<uint8_t *>(chunk.value->data()) + value_sent,
                          chunk.value->size() - value_sent};
      }
    }
    msghdr message{};
    message.msg_iov = parts;
    message.msg_iovlen = count;
    const ssize_t n =
        count == 0 ? 0 : sendmsg(c.socket.get(), &message, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;  // poll() says when to go on
      if (errno == EINTR) continue;
      drop(c, net::error_text(errno), false);
      return;
    }
    chunk.sent += static_cast<size_t>(n);
    if (chunk.sent >= chunk.size()) c.out.pop_front();
  }
  if (c.out.empty() && c.close_when_flushed) drop(c, "refused", false);
}

void TcpStoreServer::Impl::drop(Connection &c, const std::string &why, bool warn) {
  if (c.dead) return;
  if (warn) {
    MNCL_WARN("store server at %s: closing the connection from %s: %s", url.c_str(), c.peer.c_str(),
              why.c_str());
  } else {
    MNCL_TRACE("store server at %s: connection from %s closed: %s", url.c_str(), c.peer.c_str(),
               why.c_str());
  }
  c.dead = true;
  c.waiter.reset();
  c.out.clear();
  // The socket itself is closed when the loop sweeps dead connections.
}

}  // namespace mncl::bootstrap
