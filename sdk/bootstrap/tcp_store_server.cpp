// The TCP store's server: one thread, one poll() loop, no locks (only this thread touches the
// data). Requests on a connection are served in order; a GET or WAIT whose keys are missing
// parks its connection until the keys are set or its slice runs out.
//
// What a client can make it hold is bounded: a connection must say HELLO within kHelloTimeout,
// at most kMaxPendingConnections may be waiting to, a connection whose replies pile up unread is
// not read from until they drain, and a WAIT names at most wire::kMaxWaitKeys keys. Running out
// of file descriptors pauses accepting instead of spinning on the listening socket.
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

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
// A client sends HELLO as soon as it connects. One that has not within this long is closed, so
// connections that never speak (port scanners, a flood) cannot hold descriptors forever.
constexpr auto kHelloTimeout = std::chrono::seconds(5);
// At most this many connections may be waiting for their HELLO at once. Past it, the oldest one
// is closed if it has waited kEvictAfter (a real client is long past HELLO by then), else
// accepting pauses: a burst of real clients is accepted in turns, not turned away.
constexpr size_t kMaxPendingConnections = 1024;
constexpr auto kEvictAfter = std::chrono::seconds(1);
// After accept() fails (out of descriptors: the connection stays in the backlog, so the
// listening socket stays readable), the listening sockets are not polled for this long.
constexpr auto kAcceptPause = std::chrono::milliseconds(100);
// A warning that a misbehaving peer could trigger in a loop is logged at most this often.
constexpr auto kWarnInterval = std::chrono::seconds(10);
// A connection whose unsent replies reach either bound is not read from until they drain: a
// client that sends requests without reading the replies cannot make the server queue them
// without limit. A real client has one request in flight per connection.
constexpr size_t kMaxQueuedReplyBytes = 16 << 20;
constexpr size_t kMaxQueuedReplies = 4096;
// The most keys one connection may ask to have set when it ends (SET_ON_CLOSE): a rank
// registers one per live communicator.
constexpr size_t kMaxOnCloseKeys = 65536;

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

// A listening socket on address, or none with *error set to the errno of the step that failed.
// ipv6_only: an IPv6 socket takes IPv6 connections only; else IPv4 ones too (as
// ::ffff:a.b.c.d), which is how "::" covers every address of both families.
net::UniqueFd listen_on(const sockaddr *address, socklen_t length, bool ipv6_only, int *error) {
  net::UniqueFd fd(socket(address->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  // SO_REUSEADDR lets a new server take a port whose last connections linger in TIME_WAIT; it
  // never lets two sockets listen on one address and port (the second fails: EADDRINUSE).
  const int one = 1;
  const int v6only = ipv6_only ? 1 : 0;
  bool ok = bool(fd) && setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0;
  if (ok && address->sa_family == AF_INET6) {
    ok = setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof v6only) == 0;
  }
  ok = ok && bind(fd.get(), address, length) == 0 && listen(fd.get(), SOMAXCONN) == 0;
  if (ok) return fd;
  *error = errno;
  return net::UniqueFd();
}

struct OutChunk {
  std::vector<uint8_t> head;
  Value value;  // sent after head, straight from the map's copy
  size_t sent = 0;
  size_t size() const { return head.size() + (value ? value->size() : 0); }
};

// A parked GET (one key) or WAIT (up to wire::kMaxWaitKeys). The keys are copied into one
// buffer, not a string each: a parked key costs its bytes plus about 32 (two views).
struct Waiter {
  bool is_get = false;
  std::unique_ptr<char[]> bytes;       // the keys, back to back; the views below point here
  std::vector<std::string_view> keys;  // as asked, in order (the reply lists them in order)
  // Those missing when it parked, sorted and unique, and which of them were set since.
  std::vector<std::string_view> missing;
  std::vector<bool> arrived;
  size_t still_missing = 0;
  Clock::time_point deadline;
};

struct Connection {
  net::UniqueFd socket;
  std::string peer;
  bool authenticated = false;
  Clock::time_point hello_deadline;  // closed then if still not authenticated
  InBuffer in;
  std::deque<OutChunk> out;
  size_t out_bytes = 0;             // of the chunks in out, counted whole until sent
  std::unique_ptr<Waiter> waiter;   // never moves, so its views stay valid
  bool close_when_flushed = false;  // after a refusal: send it, then close
  bool dead = false;                // closed at the end of this loop iteration
  // SET_ON_CLOSE: set when the connection ends (unless already set), in the order registered.
  std::vector<std::pair<std::string, Value>> on_close;
};

// True while c's unsent replies are over the bounds: its requests wait in the socket.
bool backlogged(const Connection &c) {
  return c.out_bytes >= kMaxQueuedReplyBytes || c.out.size() >= kMaxQueuedReplies;
}

// Says when a repeatable warning may be logged again.
class WarningThrottle {
 public:
  // Counts n more occurrences; true if a warning may be logged now, with total: how many
  // occurred since the last one (these n included).
  bool allow(Clock::time_point now, size_t n, size_t &total) {
    held_ += n;
    if (now < next_) return false;
    next_ = now + kWarnInterval;
    total = std::exchange(held_, 0);
    return true;
  }

 private:
  Clock::time_point next_{};
  size_t held_ = 0;
};

// Every rank keeps a connection or more to the server: a job of more ranks than the usual soft
// limit (1024 descriptors) needs the hard one, which any process may raise its soft limit to.
void raise_descriptor_limit(const std::string &url) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  const rlim_t before = limit.rlim_cur;
  // An unlimited hard limit still stops at fs.nr_open (2^20 by default).
  limit.rlim_cur = limit.rlim_max == RLIM_INFINITY ? rlim_t{1} << 20 : limit.rlim_max;
  if (limit.rlim_cur <= before) return;
  if (setrlimit(RLIMIT_NOFILE, &limit) == 0) {
    MNCL_INFO("store server at %s: raised this process's descriptor limit from %llu to %llu",
              url.c_str(), static_cast<unsigned long long>(before),
              static_cast<unsigned long long>(limit.rlim_cur));
  } else {
    MNCL_INFO("store server at %s: cannot raise this process's descriptor limit from %llu: %s",
              url.c_str(), static_cast<unsigned long long>(before), net::error_text(errno).c_str());
  }
}

unsigned long long descriptor_limit() {
  rlimit limit{};
  return getrlimit(RLIMIT_NOFILE, &limit) == 0 ? static_cast<unsigned long long>(limit.rlim_cur)
                                               : 0;
}

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

// A store this process serves: a second store asked for one of its addresses is this process's
// own mistake (two job-wide communicators alive on one address), not another program's or
// another rank 0's. A server on every address holds its port on all of them, so it and any
// other server of that port share an address.
struct Serving {
  std::string url;
  uint16_t port = 0;
  bool every_address = false;
  bool operator==(const Serving &other) const {
    return url == other.url && port == other.port && every_address == other.every_address;
  }
  bool overlaps(const Serving &other) const {
    return url == other.url || (port == other.port && (every_address || other.every_address));
  }
};

}  // namespace

struct TcpStoreServer::Impl {
  std::string url;
  std::string token;
  uint16_t port = 0;
  std::vector<net::UniqueFd> listeners;
  // Set by bind_all: whether every address listened on is a loopback one, and which they are.
  bool loopback_only = true;
  std::string listening_on;
  bool every_address = false;  // TcpListen::kEveryAddress
  Serving registration() const { return {url, port, every_address}; }
  net::UniqueFd wakeup;  // an eventfd written to wake the loop: to stop, or to stop accepting
  std::atomic<bool> stopping{false};
  std::atomic<bool> refuse_new{false};
  std::unordered_map<std::string, Value> data;
  std::vector<std::unique_ptr<Connection>> connections;
  size_t pending = 0;  // connections not dead and not authenticated yet
  // The listening sockets are not polled before this (accept() failed, or too many pending).
  Clock::time_point accept_resume{};
  WarningThrottle accept_warnings;
  WarningThrottle hello_warnings;
  // Connections refused or dropped before HELLO succeeded: probes, scanners, other jobs. Each
  // was a warning line, so anyone who reaches the port could flood the job's log.
  WarningThrottle stranger_warnings;
  // Connections whose wait ended, or whose replies drained: their buffered requests are served
  // at the end of the loop.
  std::vector<Connection *> resumable;
  std::thread thread;

  void bind_all(const std::string &host, uint16_t requested_port, TcpListen listen);
  // Listens on the wildcard address at `port` (0: a free one); returns why it could not.
  std::string listen_on_every_address();
  // Sets port from the first listening socket, when it was 0 (a free port was asked for).
  void take_bound_port(int fd);
  void wake(const char *why);
  void run();
  void loop_once(std::vector<pollfd> &fds, size_t polled_listeners, Clock::time_point now);
  void accept_all(int listener, Clock::time_point now);
  bool evict_oldest_pending(Clock::time_point now);
  void pause_accepting(Clock::time_point now, const std::string &why);
  void expire_handshakes(Clock::time_point now);
  void read_from(Connection &c);
  void process(Connection &c);
  void handle(Connection &c, const wire::Message &m);
  void handle_wait(Connection &c, const wire::Message &m);
  void handle_hello(Connection &c, const wire::Message &m);
  void park(Connection &c, bool is_get, const std::vector<std::string_view> &keys,
            uint32_t wait_ms);
  void notify(const std::string &key);
  void finish_wait(Connection &c);
  void expire_waiters(Clock::time_point now);
  int poll_timeout_ms(Clock::time_point now) const;
  bool has(std::string_view key) const { return data.count(std::string(key)) > 0; }
  std::vector<std::string_view> missing_keys(const std::vector<std::string_view> &keys) const;
  void reply(Connection &c, std::vector<uint8_t> head, Value value = nullptr);
  void flush(Connection &c);
  void drop(Connection &c, const std::string &why, bool warn);
  // A warning about a connection not (yet) of this job, at most one per kWarnInterval (the
  // others traced), counting those held back.
  void warn_stranger(const std::string &what);
};

namespace {
// The stores this process's servers serve (Serving), until they stop accepting. Never
// destroyed: a destroyed communicator's detached thread (Comm::leave_abandoned) may stop or
// close a server after exit() ran the static destructors.
std::mutex &g_serving_mutex = *new std::mutex;
std::vector<Serving> &g_serving = *new std::vector<Serving>;

// Registers entry (yes) or takes this server's registration back, once (*registered).
void serving(const Serving &entry, bool yes, bool *registered) {
  std::lock_guard<std::mutex> lock(g_serving_mutex);
  if (yes) {
    g_serving.push_back(entry);
    *registered = true;
  } else if (*registered) {
    g_serving.erase(std::find(g_serving.begin(), g_serving.end(), entry));
    *registered = false;
  }
}
}  // namespace

TcpStoreServer::TcpStoreServer(const std::string &host, uint16_t port, std::string token,
                               TcpListen listen)
    : impl_(std::make_unique<Impl>()) {
  impl_->token = std::move(token);
  const bool every_address = listen == TcpListen::kEveryAddress;
  if (port != 0) {
    const Serving asked{net::tcp_url(host, port), port, every_address};
    std::lock_guard<std::mutex> lock(g_serving_mutex);
    const auto found = std::find_if(g_serving.begin(), g_serving.end(),
                                    [&](const Serving &s) { return s.overlaps(asked); });
    MNCL_CHECK(found == g_serving.end(), MNCL_ERR_BOOTSTRAP,
               "cannot start the store at %s: this process serves a store there already (%s%s), "
               "for a live job-wide communicator; two cannot share the address at a time "
               "(destroy the first one, split it with mncl_comm_split, or give the second "
               "another address)",
               asked.url.c_str(), found == g_serving.end() ? "" : found->url.c_str(),
               found != g_serving.end() && found->every_address ? ", on every address" : "");
  }
  impl_->bind_all(host, port, listen);
  raise_descriptor_limit(impl_->url);
  impl_->wakeup.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  MNCL_CHECK(impl_->wakeup, MNCL_ERR_SYSTEM, "cannot start the store at %s: eventfd: %s",
             impl_->url.c_str(), net::error_text(errno).c_str());
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
  // Last: a constructor that throws never deregisters.
  serving(impl_->registration(), true, &registered_);
  MNCL_INFO("store server listening at %s (on %s)%s", impl_->url.c_str(),
            impl_->listening_on.c_str(), impl_->token.empty() ? "" : " (token required)");
}

TcpStoreServer::~TcpStoreServer() {
  serving(impl_->registration(), false, &registered_);
  impl_->stopping = true;
  impl_->wake("stop it");
  impl_->thread.join();
}

void TcpStoreServer::stop_accepting() {
  if (impl_->refuse_new.exchange(true)) return;
  serving(impl_->registration(), false, &registered_);  // the next server may take the address
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

bool TcpStoreServer::loopback_only() const {
  return impl_->loopback_only;
}

std::string TcpStoreServer::listening_on() const {
  return impl_->listening_on;
}

void TcpStoreServer::Impl::bind_all(const std::string &host, uint16_t requested_port,
                                    TcpListen listen) {
  url = net::tcp_url(host, requested_port);
  every_address = listen == TcpListen::kEveryAddress;
  std::string error;
  // Resolved with kEveryAddress too: a name this host cannot resolve, its own client could not
  // connect to either, and saying so now is clearer than its connection timing out.
  const auto endpoints = net::resolve(host, requested_port, error);
  MNCL_CHECK(!endpoints.empty(), MNCL_ERR_BOOTSTRAP,
             "cannot start the store at %s: cannot resolve '%s': %s", url.c_str(), host.c_str(),
             error.c_str());
  std::string failures;
  port = requested_port;
  if (every_address) {
    failures = listen_on_every_address();
  } else {
    // Listen on each address the host resolves to ("localhost" may be ::1 and 127.0.0.1), and
    // only there: clients of a store bound to 127.0.0.1 must not find it on another address.
    std::unordered_set<std::string> seen;
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
      int failure = 0;
      // IPv6-only: otherwise an IPv6 socket would also take the IPv4 addresses of the port.
      net::UniqueFd fd = listen_on(address, endpoint.length, true, &failure);
      if (!fd) {
        failures += (failures.empty() ? "" : "; ") + name + ": " + net::error_text(failure);
        continue;
      }
      take_bound_port(fd.get());
      listeners.push_back(std::move(fd));
    }
  }
  MNCL_CHECK(!listeners.empty(), MNCL_ERR_BOOTSTRAP,
             "cannot start the store at %s: cannot listen on %s", url.c_str(), failures.c_str());
  url = net::tcp_url(host, port);
  for (const auto &listener : listeners) {
    sockaddr_storage bound{};
    socklen_t length = sizeof bound;
    if (getsockname(listener.get(), reinterpret_cast<sockaddr *>(&bound), &length) != 0) continue;
    const auto *address = reinterpret_cast<const sockaddr *>(&bound);
    loopback_only = loopback_only && net::is_loopback(address);
    listening_on += (listening_on.empty() ? "" : ", ") + net::to_string(address, length);
  }
  if (!failures.empty()) {
    MNCL_WARN("the store at %s listens on only some addresses of '%s'; failed: %s", url.c_str(),
              host.c_str(), failures.c_str());
  }
}

std::string TcpStoreServer::Impl::listen_on_every_address() {
  // "::" with IPV6_V6ONLY off takes IPv4 connections too: one socket for every address of both
  // families, as PyTorch's TCPStore listens.
  sockaddr_in6 any6{};
  any6.sin6_family = AF_INET6;
  any6.sin6_addr = in6addr_any;
  any6.sin6_port = htons(port);
  int failure = 0;
  net::UniqueFd fd = listen_on(reinterpret_cast<sockaddr *>(&any6), sizeof any6, false, &failure);
  if (!fd && failure == EADDRINUSE) {
    // Another socket holds the port (another rank 0, another program): the caller says so. Not
    // a reason to try 0.0.0.0, which would at best take the port for IPv4 alone.
    return format("[::]:%u: %s", static_cast<unsigned>(port), net::error_text(failure).c_str());
  }
  if (!fd) {
    // No IPv6 here (a kernel without it, ipv6.disable=1) or no dual-stack socket: IPv4's
    // wildcard, which covers every address this host can be reached on.
    const std::string ipv6_failure = net::error_text(failure);
    sockaddr_in any4{};
    any4.sin_family = AF_INET;
    any4.sin_addr.s_addr = htonl(INADDR_ANY);
    any4.sin_port = htons(port);
    fd = listen_on(reinterpret_cast<sockaddr *>(&any4), sizeof any4, false, &failure);
    if (!fd) {
      return format("[::]:%u: %s; 0.0.0.0:%u: %s", static_cast<unsigned>(port),
                    ipv6_failure.c_str(), static_cast<unsigned>(port),
                    net::error_text(failure).c_str());
    }
    MNCL_INFO("a store server listens on 0.0.0.0, IPv4 addresses only: [::] (IPv6): %s",
              ipv6_failure.c_str());
  }
  take_bound_port(fd.get());
  listeners.push_back(std::move(fd));
  return {};
}

void TcpStoreServer::Impl::take_bound_port(int fd) {
  if (port != 0) return;
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  getsockname(fd, reinterpret_cast<sockaddr *>(&bound), &length);
  port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6 *>(&bound)->sin6_port
                                           : reinterpret_cast<sockaddr_in *>(&bound)->sin_port);
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
      // One instant for both: with two, a pause could end between them, leaving the listeners
      // unpolled and the pause's end uncounted (poll(-1): no accepting while the store idles).
      const Clock::time_point polled_at = Clock::now();
      const size_t polled_listeners = polled_at >= accept_resume ? listeners.size() : 0;
      for (size_t i = 0; i < polled_listeners; ++i) fds.push_back({listeners[i].get(), POLLIN, 0});
      for (const auto &c : connections) {
        // A parked connection sends nothing more, but its peer may still hang up. A backlogged
        // one is not read from: its requests stay in the socket until its replies drain; nor
        // is a refused one (whatever else it sent would wake poll() on every pass).
        short events = c->waiter ? POLLRDHUP : backlogged(*c) || c->close_when_flushed ? 0 : POLLIN;
        if (!c->out.empty()) events |= POLLOUT;
        fds.push_back({c->socket.get(), events, 0});
      }
      const int ready = poll(fds.data(), fds.size(), poll_timeout_ms(polled_at));
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
      if (ready > 0) loop_once(fds, polled_listeners, Clock::now());
      expire_waiters(Clock::now());
      expire_handshakes(Clock::now());
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

void TcpStoreServer::Impl::loop_once(std::vector<pollfd> &fds, size_t polled_listeners,
                                     Clock::time_point now) {
  const size_t first_connection = 1 + polled_listeners;
  // Connections accepted below are not in fds yet; they are polled from the next iteration.
  const size_t polled = fds.size() - first_connection;
  for (size_t i = 0; i < polled_listeners; ++i) {
    if (fds[1 + i].revents & POLLIN) accept_all(listeners[i].get(), now);
  }
  for (size_t i = 0; i < polled; ++i) {
    Connection &c = *connections[i];
    const short revents = fds[first_connection + i].revents;
    if (revents == 0 || c.dead) continue;
    if (revents & POLLOUT) {
      const bool was_backlogged = backlogged(c);
      flush(c);
      // Its replies drained: serve the requests it has buffered (more are read once polled).
      if (was_backlogged && !c.dead && !backlogged(c)) resumable.push_back(&c);
    }
    if (c.dead) continue;
    if (revents & POLLIN) {
      read_from(c);
    } else if (revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL)) {
      drop(c, c.waiter ? "disconnected while waiting" : "disconnected", false);
    }
  }
}

void TcpStoreServer::Impl::accept_all(int listener, Clock::time_point now) {
  for (;;) {
    if (pending >= kMaxPendingConnections && !evict_oldest_pending(now)) {
      pause_accepting(now, format("%zu connections have not sent HELLO yet", pending));
      return;
    }
    sockaddr_storage address{};
    socklen_t length = sizeof address;
    const int fd = accept4(listener, reinterpret_cast<sockaddr *>(&address), &length,
                           SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int error = errno;
      if (error == EINTR || error == ECONNABORTED) continue;
      if (error == EAGAIN || error == EWOULDBLOCK) return;
      // Out of descriptors: a connection that never said HELLO makes room for this one.
      if ((error == EMFILE || error == ENFILE) && evict_oldest_pending(now)) continue;
      std::string why = "accept: " + net::error_text(error);
      if (error == EMFILE) why += format(" (limit %llu)", descriptor_limit());
      pause_accepting(now, why);
      return;
    }
    net::set_nodelay(fd);
    auto c = std::make_unique<Connection>();
    c->socket.reset(fd);
    c->peer = net::to_string(reinterpret_cast<sockaddr *>(&address), length);
    c->hello_deadline = now + kHelloTimeout;
    MNCL_TRACE("store server at %s: connection from %s", url.c_str(), c->peer.c_str());
    connections.push_back(std::move(c));
    ++pending;
  }
}

// Closes the connection that has waited longest for its HELLO, if it has waited kEvictAfter.
bool TcpStoreServer::Impl::evict_oldest_pending(Clock::time_point now) {
  Connection *oldest = nullptr;
  for (const auto &c : connections) {
    if (c->dead || c->authenticated) continue;
    if (!oldest || c->hello_deadline < oldest->hello_deadline) oldest = c.get();
  }
  if (!oldest || oldest->hello_deadline - kHelloTimeout + kEvictAfter > now) return false;
  // Its HELLO may be waiting in the socket (a server loop that stalled on a large value): a
  // rank signing in is not the connection to drop.
  if (!oldest->close_when_flushed) read_from(*oldest);
  if (oldest->authenticated) return evict_oldest_pending(now);
  if (oldest->dead) {
    oldest->socket.reset();
    return true;
  }
  drop(*oldest, "no HELLO yet, and a new connection needs its place", false);
  oldest->socket.reset();  // now, not at the end of the iteration: its descriptor is needed
  return true;
}

// Stops polling the listening sockets for kAcceptPause: the connections waiting in the backlog
// keep them readable, and polling them would spin.
void TcpStoreServer::Impl::pause_accepting(Clock::time_point now, const std::string &why) {
  accept_resume = now + kAcceptPause;
  size_t times = 0;
  if (accept_warnings.allow(now, 1, times)) {
    MNCL_WARN("store server at %s: not accepting connections for %lld ms: %s%s", url.c_str(),
              static_cast<long long>(kAcceptPause.count()), why.c_str(),
              times > 1 ? format(" (%zu times since the last warning)", times).c_str() : "");
  }
}

void TcpStoreServer::Impl::expire_handshakes(Clock::time_point now) {
  size_t closed = 0;
  for (const auto &c : connections) {
    if (c->dead || c->authenticated || c->hello_deadline > now) continue;
    // Its HELLO may have arrived since poll() returned: read what is there first.
    if (!c->close_when_flushed) read_from(*c);
    if (c->dead || c->authenticated) continue;
    drop(*c, "no HELLO within the time allowed", false);
    ++closed;
  }
  size_t total = 0;
  if (closed > 0 && hello_warnings.allow(now, closed, total)) {
    MNCL_WARN(
        "store server at %s: closed %zu connection%s (since the last such warning) that did "
        "not send HELLO within %lld s",
        url.c_str(), total, total == 1 ? "" : "s", static_cast<long long>(kHelloTimeout.count()));
  }
}

void TcpStoreServer::Impl::read_from(Connection &c) {
  size_t budget = kReadBudgetPerWakeup;
  while (!c.dead && !c.waiter && !c.close_when_flushed && !backlogged(c) && budget > 0) {
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
  while (!c.dead && !c.waiter && !c.close_when_flushed && !backlogged(c) && c.in.size() > 0) {
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
        park(c, true, {m.text}, m.wait_ms);
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
    case wire::Op::kWait:
      handle_wait(c, m);
      break;
    case wire::Op::kErase:
      reply(c, wire::encode_bool(data.erase(key) > 0));
      break;
    case wire::Op::kErasePrefix: {
      int64_t erased = 0;
      for (auto it = data.begin(); it != data.end();) {
        if (it->first.compare(0, key.size(), key) == 0) {
          it = data.erase(it);
          ++erased;
        } else {
          ++it;
        }
      }
      reply(c, wire::encode_integer(erased));
      break;
    }
    case wire::Op::kSetOnClose: {
      auto &wills = c.on_close;
      const auto found = std::find_if(wills.begin(), wills.end(),
                                      [&](const auto &will) { return will.first == key; });
      if (found != wills.end()) {
        found->second = make_value(m.value);
      } else if (wills.size() >= kMaxOnCloseKeys) {
        reply(c, wire::encode_failed(format("a connection may register at most %zu keys to be "
                                            "set when it ends",
                                            kMaxOnCloseKeys)));
        break;
      } else {
        wills.emplace_back(key, make_value(m.value));
      }
      reply(c, wire::encode_ok());
      break;
    }
    case wire::Op::kCancelOnClose: {
      auto &wills = c.on_close;
      const auto found = std::find_if(wills.begin(), wills.end(),
                                      [&](const auto &will) { return will.first == key; });
      const bool registered = found != wills.end();
      if (registered) wills.erase(found);
      reply(c, wire::encode_bool(registered));
      break;
    }
    default:
      drop(c, format("sent an unexpected %s", wire::op_name(m.op)), true);
  }
}

void TcpStoreServer::Impl::handle_wait(Connection &c, const wire::Message &m) {
  // No real key is empty, and a list of them is the cheapest way to make the server work.
  for (size_t i = 0; i < m.keys.size(); ++i) {
    if (m.keys[i].empty()) {
      reply(c, wire::encode_failed(format("store wait: key %zu of %zu is empty (store keys must "
                                          "not be empty)",
                                          i, m.keys.size())));
      return;
    }
  }
  // The keys are looked at in the frame; only a parked wait copies them.
  const bool all_set =
      std::all_of(m.keys.begin(), m.keys.end(), [&](auto key) { return has(key); });
  if (all_set || m.wait_ms == 0) {
    reply(c, wire::encode_missing(missing_keys(m.keys)));
  } else {
    park(c, false, m.keys, m.wait_ms);
  }
}

void TcpStoreServer::Impl::handle_hello(Connection &c, const wire::Message &m) {
  if (m.op != wire::Op::kHello || c.authenticated) {
    drop(c, format("sent %s %s HELLO", wire::op_name(m.op), c.authenticated ? "after" : "before"),
         true);
    return;
  }
  // Versions 1 (before SET_ON_CLOSE) and 2 (before ERASE_PREFIX) are subsets of this one:
  // their clients are served.
  if (m.version < 1 || m.version > wire::kProtocolVersion) {
    warn_stranger(format("refused %s: protocol version %u, this server speaks %u", c.peer.c_str(),
                         m.version, wire::kProtocolVersion));
    reply(c, wire::encode_refused(format("protocol version %u, the server speaks %u", m.version,
                                         wire::kProtocolVersion)));
    c.close_when_flushed = true;
    flush(c);
    return;
  }
  if (!token.empty() && !same_token(token, m.text)) {
    warn_stranger(
        format("refused %s: %s token (MNCL_STORE_TOKEN, or the launcher's job id): "
               "another job's rank, or not a rank",
               c.peer.c_str(), m.text.empty() ? "no" : "a wrong"));
    reply(c, wire::encode_refused("token"));
    c.close_when_flushed = true;
    flush(c);
    return;
  }
  c.authenticated = true;
  --pending;
  reply(c, wire::encode_ok());
}

// Parks c until every one of keys (some missing) is set or the slice ends. keys point into the
// request's frame, which is consumed after this: the waiter keeps a copy.
void TcpStoreServer::Impl::park(Connection &c, bool is_get,
                                const std::vector<std::string_view> &keys, uint32_t wait_ms) {
  auto waiter = std::make_unique<Waiter>();
  waiter->is_get = is_get;
  size_t total = 0;
  for (const auto key : keys) total += key.size();
  waiter->bytes.reset(new char[std::max<size_t>(total, 1)]);
  waiter->keys.reserve(keys.size());
  char *at = waiter->bytes.get();
  for (const auto key : keys) {
    std::memcpy(at, key.data(), key.size());
    waiter->keys.emplace_back(at, key.size());
    at += key.size();
  }
  for (const auto key : waiter->keys) {
    if (!has(key)) waiter->missing.push_back(key);
  }
  std::sort(waiter->missing.begin(), waiter->missing.end());
  waiter->missing.erase(std::unique(waiter->missing.begin(), waiter->missing.end()),
                        waiter->missing.end());
  waiter->missing.shrink_to_fit();
  waiter->arrived.assign(waiter->missing.size(), false);
  waiter->still_missing = waiter->missing.size();
  waiter->deadline =
      Clock::now() + std::chrono::milliseconds(std::min(wait_ms, wire::kMaxWaitSliceMs));
  c.waiter = std::move(waiter);
}

void TcpStoreServer::Impl::notify(const std::string &set_key) {
  const std::string_view key(set_key);
  for (const auto &c : connections) {
    if (c->dead || !c->waiter) continue;
    Waiter &waiter = *c->waiter;
    const auto found = std::lower_bound(waiter.missing.begin(), waiter.missing.end(), key);
    if (found == waiter.missing.end() || *found != key) continue;
    const size_t index = static_cast<size_t>(found - waiter.missing.begin());
    if (waiter.arrived[index]) continue;
    waiter.arrived[index] = true;
    if (--waiter.still_missing == 0) finish_wait(*c);
  }
}

// Answers a parked connection with what it waits for (or what is still missing).
void TcpStoreServer::Impl::finish_wait(Connection &c) {
  const std::unique_ptr<Waiter> waiter = std::move(c.waiter);
  if (waiter->is_get) {
    const auto found = data.find(std::string(waiter->keys.front()));
    if (found != data.end()) {
      reply(c, wire::encode_value_head(found->second->size()), found->second);
    } else {
      reply(c, wire::encode_not_yet());
    }
  } else {
    reply(c, wire::encode_missing(missing_keys(waiter->keys)));
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
  const auto consider = [&](Clock::time_point t) {
    if (!earliest || t < *earliest) earliest = t;
  };
  for (const auto &c : connections) {
    if (c->dead) continue;
    if (c->waiter) consider(c->waiter->deadline);
    if (!c->authenticated) consider(c->hello_deadline);
  }
  if (!listeners.empty() && accept_resume > now) consider(accept_resume);
  if (!earliest) return -1;
  if (*earliest <= now) return 0;
  // Rounded up, so the loop never wakes just before a deadline and spins.
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(*earliest - now).count();
  return static_cast<int>((us + 999) / 1000);
}

std::vector<std::string_view> TcpStoreServer::Impl::missing_keys(
    const std::vector<std::string_view> &keys) const {
  std::vector<std::string_view> missing;
  for (const auto key : keys) {
    if (!has(key)) missing.push_back(key);
  }
  return missing;
}

void TcpStoreServer::Impl::reply(Connection &c, std::vector<uint8_t> head, Value value) {
  c.out.push_back(OutChunk{std::move(head), std::move(value), 0});
  c.out_bytes += c.out.back().size();
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
    if (chunk.sent >= chunk.size()) {
      c.out_bytes -= chunk.size();
      c.out.pop_front();
    }
  }
  if (c.out.empty() && c.close_when_flushed) drop(c, "refused", false);
}

void TcpStoreServer::Impl::warn_stranger(const std::string &what) {
  size_t times = 0;
  if (stranger_warnings.allow(Clock::now(), 1, times)) {
    MNCL_WARN("store server at %s: %s%s", url.c_str(), what.c_str(),
              times > 1 ? format(" (and %zu more connections refused or closed before HELLO since "
                                 "the last such warning)",
                                 times - 1)
                              .c_str()
                        : "");
  } else {
    MNCL_TRACE("store server at %s: %s", url.c_str(), what.c_str());
  }
}

void TcpStoreServer::Impl::drop(Connection &c, const std::string &why, bool warn) {
  if (c.dead) return;
  if (warn && !c.authenticated) {
    warn_stranger(format("closing the connection from %s: %s", c.peer.c_str(), why.c_str()));
  } else if (warn) {
    MNCL_WARN("store server at %s: closing the connection from %s: %s", url.c_str(), c.peer.c_str(),
              why.c_str());
  } else {
    MNCL_TRACE("store server at %s: connection from %s closed: %s", url.c_str(), c.peer.c_str(),
               why.c_str());
  }
  c.dead = true;
  if (!c.authenticated) --pending;
  c.waiter.reset();
  c.out.clear();
  c.out_bytes = 0;
  // The connection's last will (SET_ON_CLOSE): how the other ranks learn that this one's
  // process ended without taking it back, wherever it ran. Not at the server's own shutdown,
  // which drops no connection.
  auto wills = std::move(c.on_close);
  c.on_close.clear();
  for (auto &[key, value] : wills) {
    if (!data.emplace(key, value).second) continue;  // the first cause stays
    MNCL_INFO("store server at %s: the connection from %s ended (%s): set '%s'", url.c_str(),
              c.peer.c_str(), why.c_str(), key.c_str());
    notify(key);
  }
  // The socket itself is closed when the loop sweeps dead connections.
}

}  // namespace mncl::bootstrap
