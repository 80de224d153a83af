// The TCP store's client: a pool of connections, one request in flight on each. Waiting calls
// ask the server for short slices (kClientWaitSliceMs), so they notice an abort or their
// deadline promptly; between slices their connection goes back to the pool.
#include "bootstrap/tcp_store.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "bootstrap/store_util.h"
#include "bootstrap/wire.h"
#include "common/error.h"
#include "common/log.h"

namespace mncl::bootstrap {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How long one waiting request may park on the server. Bounds how late an abort is noticed.
constexpr uint32_t kClientWaitSliceMs = 50;
// The largest reply other than a value that a client accepts (a WAIT's list of missing keys).
constexpr size_t kMaxControlReply = 256 << 20;
// The largest answer to HELLO (OK, or REFUSED with a reason): whatever listens on the port is
// not trusted before it has answered like an MNCL store.
constexpr size_t kMaxHandshakeReply = 4096;
// A server's text goes into this rank's error message at most this long.
constexpr size_t kMaxServerText = 200;

uint32_t slice_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
  return static_cast<uint32_t>(std::clamp<int64_t>(left, 0, kClientWaitSliceMs));
}

// True if fd is connected to itself: connecting to a free local port in the ephemeral range
// can pick that same port as the source ("TCP simultaneous open").
bool is_self_connection(int fd) {
  sockaddr_storage local{}, peer{};
  socklen_t local_length = sizeof local, peer_length = sizeof peer;
  if (getsockname(fd, reinterpret_cast<sockaddr *>(&local), &local_length) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr *>(&peer), &peer_length) != 0) {
    return false;
  }
  return local_length == peer_length && std::memcmp(&local, &peer, local_length) == 0;
}

// Set while a new connection says HELLO: its failure is that connection's alone, and must not
// mark the whole store as lost (fail_connection).
thread_local bool t_handshaking = false;
// The end of the handshakes' retries (the caller's timeout): a silent attempt waits no longer.
thread_local Clock::time_point t_handshake_deadline = Clock::time_point::max();

// The longest wait for the answer to HELLO in one attempt, which an MNCL store sends at once.
// Silence is retried until the timeout (a store's host stopped in a debugger, or out of
// descriptors, leaves new connections in the kernel's backlog for a while), with a warning
// after the first such wait: it may also be a program that accepts the connection and waits
// for its own protocol's request (an HTTP server, for a line), which the final error names.
constexpr milliseconds kHelloAnswerBound{10000};

// An answer to HELLO that is no frame of this protocol: the address is another program's (an
// SSH server's banner, an HTTP server's error page). Not retried: it will not become a store.
class NotAStore : public Error {
 public:
  using Error::Error;
};

// No answer to HELLO within kHelloAnswerBound (or the I/O timeout, if shorter).
class NoAnswer : public Error {
 public:
  using Error::Error;
};
// Whether this thread's last failed handshake met silence (for the final message).
thread_local bool t_last_handshake_silent = false;

// The first bytes of a reply, printable, for the message ("SSH-2").
std::string printable(const uint8_t *data, size_t size) {
  std::string text;
  for (size_t i = 0; i < size; ++i) {
    const auto c = static_cast<char>(data[i]);
    text += std::isprint(static_cast<unsigned char>(c)) ? std::string(1, c)
                                                        : format("\\x%02x", data[i]);
  }
  return text;
}

// The descriptors of this process's will connections (TcpStore::set_on_close), for fork(): a
// child made without exec (a DataLoader worker, multiprocessing's fork) keeps copies of them,
// and the server would see a killed rank's connection end only when every such child had ended
// too: its will came late, or never. In the child each copy is pointed at /dev/null instead,
// which leaves the parent's connection alone (and the child's store, if it ever closes the
// descriptor, closes that). The mutex is held across every call on a will connection, so a
// fork never copies a descriptor number that a failed call has just closed. Both live until
// the process ends, never destroyed: a store may close after exit() has run the static
// destructors, in the detached thread a destroyed communicator leaves its store from
// (Comm::leave_abandoned), which read the freed vector (ThreadSanitizer, split.destroy_order).
std::mutex &will_fds_mutex() {
  static auto *mutex = new std::mutex;  // never deleted, see above
  return *mutex;
}
std::vector<int> &will_fds() {
  static auto *fds = new std::vector<int>;  // never deleted, see above
  return *fds;
}
void will_fds_before_fork() {
  will_fds_mutex().lock();
}
void will_fds_after_fork_in_parent() {
  will_fds_mutex().unlock();
}
void will_fds_after_fork_in_child() {
  for (const int fd : will_fds()) {
    const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0) continue;
    ::dup3(null, fd, O_CLOEXEC);
    ::close(null);
  }
  will_fds().clear();
  will_fds_mutex().unlock();
}
void watch_will_fd(int fd) {
  static std::once_flag handlers;
  std::call_once(handlers, [] {
    pthread_atfork(will_fds_before_fork, will_fds_after_fork_in_parent,
                   will_fds_after_fork_in_child);
  });
  std::lock_guard<std::mutex> lock(will_fds_mutex());
  will_fds().push_back(fd);
}
// Under will_fds_mutex().
void forget_will_fd(int fd) {
  auto &fds = will_fds();
  fds.erase(std::remove(fds.begin(), fds.end(), fd), fds.end());
}

// A will connection idles for the job's life: keepalive probes keep the state of a firewall or
// NAT on the way from expiring (an idle reset would end the connection, and the will would say
// a live rank is gone). Generous: ten unanswered probes 30 s apart before the kernel gives up.
void keep_alive(int fd) {
  const int on = 1, idle_s = 60, interval_s = 30, probes = 10;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof idle_s);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof interval_s);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
}

}  // namespace

struct TcpStore::Reply {
  wire::Op op = wire::Op::kOk;
  Bytes value;                 // kValue: received straight into here
  std::vector<uint8_t> frame;  // other replies: the whole frame, which message points into
  wire::Message message;
};

// Holds one connection for the length of a request; a connection that failed is not returned.
class TcpStore::Lease {
 public:
  explicit Lease(TcpStore &store) : store_(store), socket_(store.acquire()) {}
  ~Lease() {
    if (socket_) store_.release(std::move(socket_));
  }
  net::UniqueFd &socket() { return socket_; }

 private:
  TcpStore &store_;
  net::UniqueFd socket_;
};

TcpStore::TcpStore(const std::string &host, uint16_t port, const std::string &token,
                   const WaitOptions &opts, std::shared_ptr<TcpStoreServer> server)
    : server_(std::move(server)),
      host_(host),
      port_(port),
      token_(token),
      url_(net::tcp_url(host, port)),
      io_timeout_(std::max(opts.timeout, milliseconds(1000))) {
  const auto deadline = Clock::now() + opts.timeout;
  for (auto backoff = milliseconds(10);; backoff = std::min(backoff * 2, milliseconds(200))) {
    WaitOptions left = opts;
    left.timeout = std::max(milliseconds(1),
                            std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
    net::UniqueFd socket = connect_with_retry(left);
    if (handshake(socket, deadline)) {
      release(std::move(socket));
      opened_ = 1;
      break;
    }
    // A server that is shutting down (the previous communicator on this address) resets the
    // connections still in its backlog: retry until the next server answers.
    MNCL_CHECK(Clock::now() < deadline, MNCL_ERR_BOOTSTRAP, "%s",
               t_last_handshake_silent
                   ? format("%s, within the timeout of %.1f s", silence_text().c_str(),
                            seconds(opts.timeout))
                         .c_str()
                   : format("the store at %s kept closing the connection during the handshake "
                            "for %.1f s",
                            url_.c_str(), seconds(opts.timeout))
                         .c_str());
    std::this_thread::sleep_for(backoff);
  }
  // The connection that will carry the wills (set_on_close), opened now, while the server
  // surely accepts: one opened later could meet a store's host whose destroy has begun (it
  // stops accepting), and a rank once waited out its timeout there. Never pooled: the server
  // ties a will to its connection, which must stay open, idle, as long as the will holds.
  if (!server_) {
    try {
      will_socket_ = connect_and_greet();
      keep_alive(will_socket_.get());
      watch_will_fd(will_socket_.get());
    } catch (const Error &e) {
      MNCL_INFO("the store at %s: no connection for this rank's notes of its end: %s", url_.c_str(),
                e.what());
    }
  }
  MNCL_INFO("connected to the store at %s", url_.c_str());
}

TcpStore::~TcpStore() {
  std::lock_guard<std::mutex> lock(will_fds_mutex());
  if (will_socket_) {
    forget_will_fd(will_socket_.get());
    will_socket_.reset();  // under the mutex: no fork copies the number once it is free
  }
}

TcpStore::Reply TcpStore::call_will(const std::vector<uint8_t> &head, const void *value,
                                    size_t value_size) {
  std::lock_guard<std::mutex> forks(will_fds_mutex());
  const int fd = will_socket_.get();
  try {
    return call(will_socket_, head, value, value_size);
  } catch (...) {
    if (!will_socket_) forget_will_fd(fd);  // the failed call closed it
    throw;
  }
}

size_t TcpStore::connections_opened() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return opened_;
}

net::UniqueFd TcpStore::acquire() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!broken_.empty()) throw Error(MNCL_ERR_REMOTE, broken_);
    if (!idle_.empty()) {
      net::UniqueFd socket = std::move(idle_.back());
      idle_.pop_back();
      return socket;
    }
  }
  // Every pooled connection is in use by another thread: open one more.
  return open_connection();
}

net::UniqueFd TcpStore::open_connection() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!broken_.empty()) throw Error(MNCL_ERR_REMOTE, broken_);
    ++opened_;
  }
  return connect_and_greet();
}

net::UniqueFd TcpStore::connect_and_greet() {
  // The server is up, so
  // the first attempt normally succeeds; a busy one may close a connection whose HELLO it did
  // not read in time (out of descriptors), so a closed handshake is retried within the timeout.
  const auto deadline = Clock::now() + io_timeout_;
  for (auto backoff = milliseconds(10);; backoff = std::min(backoff * 2, milliseconds(200))) {
    WaitOptions opts;
    opts.timeout = std::max(milliseconds(1),
                            std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
    net::UniqueFd socket = connect_with_retry(opts);
    if (handshake(socket, deadline)) {
      MNCL_TRACE("opened connection %zu to the store at %s", connections_opened(), url_.c_str());
      return socket;
    }
    MNCL_CHECK(
        Clock::now() < deadline, MNCL_ERR_REMOTE, "%s",
        t_last_handshake_silent
            ? format("%s, within %.1f s", silence_text().c_str(), seconds(io_timeout_)).c_str()
            : format("the store at %s kept closing new connections during the handshake "
                     "for %.1f s; rank 0, which hosts it, may be shutting down",
                     url_.c_str(), seconds(io_timeout_))
                  .c_str());
    std::this_thread::sleep_for(backoff);
  }
}

void TcpStore::release(net::UniqueFd socket) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (broken_.empty()) idle_.push_back(std::move(socket));
}

net::UniqueFd TcpStore::connect_with_retry(const WaitOptions &opts) {
  const auto deadline = Clock::now() + opts.timeout;
  auto backoff = milliseconds(10);
  std::string last_error = "none";
  for (;;) {
    throw_if_aborted(opts, "connecting to the store at " + url_);
    for (const auto &endpoint : net::resolve(host_, port_, last_error)) {
      const auto *address = reinterpret_cast<const sockaddr *>(&endpoint.address);
      net::UniqueFd fd(socket(endpoint.family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
      if (!fd) {
        last_error = net::error_text(errno);
        continue;
      }
      int error = connect(fd.get(), address, endpoint.length) == 0 ? 0 : errno;
      if (error == EINPROGRESS) {
        // Bounded per attempt so a silent address does not use up the whole timeout.
        const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
        pollfd p{fd.get(), POLLOUT, 0};
        const int wait_ms = static_cast<int>(std::clamp<int64_t>(left.count(), 1, 1000));
        if (poll(&p, 1, wait_ms) <= 0) {
          error = ETIMEDOUT;
        } else {
          socklen_t length = sizeof error;
          getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &length);
        }
      }
      if (error == 0 && is_self_connection(fd.get())) error = ECONNREFUSED;
      if (error == 0) {
        net::set_nodelay(fd.get());
        return fd;
      }
      last_error = net::to_string(address, endpoint.length) + ": " + net::error_text(error);
    }
    const auto now = Clock::now();
    MNCL_CHECK(now < deadline, MNCL_ERR_BOOTSTRAP,
               "cannot reach the store at %s within %.1f s: rank 0 (which hosts it) has not "
               "started it or the address is wrong (last error: %s)",
               url_.c_str(), seconds(opts.timeout), last_error.c_str());
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, milliseconds(200));
  }
}

std::string TcpStore::silence_text() const {
  return format(
      "the service at %s accepted the connection but did not answer MNCL's handshake, which an "
      "MNCL store does at once: check the store's address (MNCL_STORE, or MASTER_ADDR and "
      "MASTER_PORT), which another program (an HTTP server?) may hold, and whether the store's "
      "process is stopped",
      url_.c_str());
}

bool TcpStore::handshake(net::UniqueFd &socket, Clock::time_point deadline) {
  Reply reply;
  try {
    t_handshaking = true;
    t_handshake_deadline = deadline;
    reply = call(socket, wire::encode_hello(token_));
    t_handshaking = false;
  } catch (const NotAStore &) {
    t_handshaking = false;
    throw;
  } catch (const NoAnswer &e) {
    t_handshaking = false;
    t_last_handshake_silent = true;
    if (!warned_silence_.exchange(true)) {
      MNCL_WARN("%s: %s; still trying until the timeout", silence_text().c_str(), e.what());
    }
    return false;
  } catch (const Error &e) {
    t_last_handshake_silent = false;
    t_handshaking = false;
    MNCL_INFO("the store at %s closed the connection during the handshake: %s", url_.c_str(),
              e.what());
    return false;
  }
  if (reply.op == wire::Op::kOk) return true;
  socket.reset();
  MNCL_CHECK(!(reply.op == wire::Op::kRefused && reply.message.text == "token"), MNCL_ERR_BOOTSTRAP,
             "the store at %s refused this rank's token (MNCL_STORE_TOKEN, or where it is unset "
             "the launcher's job id, differs from rank 0's): another job's store may hold this "
             "address (give each job its own port), or the ranks were not all started by one "
             "launch (set MNCL_STORE_TOKEN, the same on every rank)",
             url_.c_str());
  // The server's reason, printable and short: not raw bytes into the caller's terminal.
  const std::string_view text = reply.message.text;
  std::string reason = printable(reinterpret_cast<const uint8_t *>(text.data()),
                                 std::min(text.size(), kMaxServerText));
  if (text.size() > kMaxServerText) reason += "...";
  throw Error(MNCL_ERR_BOOTSTRAP, format("the store at %s refused this client: %s %s", url_.c_str(),
                                         wire::op_name(reply.op), reason.c_str()));
}

TcpStore::Reply TcpStore::call(net::UniqueFd &socket, const std::vector<uint8_t> &head,
                               const void *value, size_t value_size) {
  // One sendmsg for the head and the value: no copy of the value, no extra segment.
  iovec parts[2] = {{const_cast<uint8_t *>(head.data()), head.size()},
                    {const_cast<void *>(value), value_size}};
  size_t total = head.size() + value_size;
  iovec *next = parts;
  int count = value_size > 0 ? 2 : 1;
  while (total > 0) {
    msghdr message{};
    message.msg_iov = next;
    message.msg_iovlen = count;
    const ssize_t n = sendmsg(socket.get(), &message, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) fail_connection(socket, net::error_text(errno));
      pollfd p{socket.get(), POLLOUT, 0};
      const int ready = poll(&p, 1, static_cast<int>(io_timeout_.count()));
      if (ready == 0)
        fail_connection(socket, format("no progress sending for %.1f s", seconds(io_timeout_)));
      continue;
    }
    total -= static_cast<size_t>(n);
    for (size_t done = static_cast<size_t>(n); done > 0 && count > 0;) {
      const size_t step = std::min(done, next->iov_len);
      next->iov_base = static_cast<uint8_t *>(next->iov_base) + step;
      next->iov_len -= step;
      done -= step;
      if (next->iov_len == 0) {
        ++next;
        --count;
      }
    }
  }

  Reply reply;
  uint8_t header[wire::kHeaderBytes];
  receive_all(socket, header, sizeof header);
  const auto parsed = wire::parse_frame(header, sizeof header);
  if (parsed.status == wire::ParseStatus::kInvalid) invalid_reply(socket, parsed.error, header);
  reply.op = static_cast<wire::Op>(header[4]);
  if (wire::is_request(reply.op)) {
    invalid_reply(socket, format("a %s request", wire::op_name(reply.op)), header);
  }
  // The parser has checked the length (at most kMaxFrameBytes) and the opcode.
  const size_t body_size = parsed.frame_size - sizeof header;
  // (FAILED: the server ran out of memory handling HELLO, say.)
  if (t_handshaking && ((reply.op != wire::Op::kOk && reply.op != wire::Op::kRefused &&
                         reply.op != wire::Op::kFailed) ||
                        body_size > kMaxHandshakeReply)) {
    // A program squatting on the port made this rank allocate up to 1 GiB with a 5-byte header.
    invalid_reply(socket,
                  format("a %zu-byte %s answer to HELLO", body_size, wire::op_name(reply.op)),
                  header);
  }
  if (reply.op == wire::Op::kValue) {
    reply.value.resize(body_size);
    receive_all(socket, reply.value.data(), body_size);
    return reply;
  }
  if (body_size > kMaxControlReply) {
    invalid_reply(socket, format("a %zu-byte %s", body_size, wire::op_name(reply.op)), header);
  }
  reply.frame.resize(parsed.frame_size);
  std::memcpy(reply.frame.data(), header, sizeof header);
  receive_all(socket, reply.frame.data() + sizeof header, body_size);
  auto full = wire::parse_frame(reply.frame.data(), reply.frame.size());
  if (full.status != wire::ParseStatus::kComplete) invalid_reply(socket, full.error, header);
  reply.message = std::move(full.message);
  return reply;
}

void TcpStore::receive_all(net::UniqueFd &socket, void *data, size_t size) {
  auto *at = static_cast<uint8_t *>(data);
  while (size > 0) {
    const ssize_t n = recv(socket.get(), at, size, MSG_DONTWAIT);
    if (n > 0) {
      at += n;
      size -= static_cast<size_t>(n);
    } else if (n == 0) {
      fail_connection(socket, "the server closed the connection");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      pollfd p{socket.get(), POLLIN, 0};
      milliseconds bound = io_timeout_;
      if (t_handshaking) {
        // Rounded up: rounded down, the wait ended just before the deadline, and a needless
        // second attempt connected in the last millisecond (TcpStore.AServiceThatAnswers...
        // under ASan in CI).
        const auto left = std::chrono::ceil<milliseconds>(t_handshake_deadline - Clock::now());
        bound = std::max(milliseconds(1), std::min({bound, kHelloAnswerBound, left}));
      }
      if (poll(&p, 1, static_cast<int>(bound.count())) == 0) {
        if (t_handshaking) {
          socket.reset();
          throw NoAnswer(MNCL_ERR_BOOTSTRAP, format("no answer for %.1f s", seconds(bound)));
        }
        fail_connection(socket, format("no answer for %.1f s", seconds(io_timeout_)));
      }
    } else if (errno != EINTR) {
      fail_connection(socket, net::error_text(errno));
    }
  }
}

void TcpStore::invalid_reply(net::UniqueFd &socket, const std::string &why,
                             const uint8_t (&header)[wire::kHeaderBytes]) {
  // The answer to HELLO breaks the protocol: whatever listens there is not an MNCL store, and
  // retrying until the timeout would only end in a vaguer message.
  if (t_handshaking) {
    socket.reset();
    throw NotAStore(MNCL_ERR_BOOTSTRAP,
                    format("the service at %s is not an MNCL store (invalid reply: %s; it began "
                           "\"%s\"): check the store's address (MNCL_STORE, or MASTER_ADDR and "
                           "MASTER_PORT), which another program holds",
                           url_.c_str(), why.c_str(), printable(header, sizeof header).c_str()));
  }
  fail_connection(socket, "invalid reply: " + why);
}

void TcpStore::fail_connection(net::UniqueFd &socket, const std::string &why) {
  // A request cut in the middle leaves the stream out of step: the connection is unusable, and
  // the server is most likely gone, so every later request fails with this message.
  const std::string message = format(
      "lost the connection to the store at %s (%s); rank 0, which hosts it, may "
      "have exited or failed",
      url_.c_str(), why.c_str());
  socket.reset();
  if (!t_handshaking) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (broken_.empty()) broken_ = message;
    idle_.clear();
  }
  throw Error(MNCL_ERR_REMOTE, message);
}

[[noreturn]] static void unexpected_reply(const std::string &url, const char *request,
                                          wire::Op op) {
  throw Error(MNCL_ERR_REMOTE, format("the store at %s answered %s with %s", url.c_str(), request,
                                      wire::op_name(op)));
}

void TcpStore::set(const std::string &key, const void *data, size_t len) {
  const auto head = wire::encode_set_head(key, len);
  Lease lease(*this);
  const auto reply = call(lease.socket(), head, data, len);
  if (reply.op != wire::Op::kOk) unexpected_reply(url_, "SET", reply.op);
}

Bytes TcpStore::get(const std::string &key, const WaitOptions &opts) {
  const auto deadline = Clock::now() + opts.timeout;
  for (;;) {
    throw_if_aborted(opts, "waiting for store key '" + key + "'");
    const bool last_try = Clock::now() >= deadline;
    Reply reply;
    {
      Lease lease(*this);
      reply = call(lease.socket(), wire::encode_get(key, slice_ms(deadline)));
    }
    if (reply.op == wire::Op::kValue) return std::move(reply.value);
    if (reply.op != wire::Op::kNotYet) unexpected_reply(url_, "GET", reply.op);
    MNCL_CHECK(!last_try, MNCL_ERR_TIMEOUT, "store key '%s' not set within %.1f s", key.c_str(),
               seconds(opts.timeout));
  }
}

int64_t TcpStore::add(const std::string &key, int64_t delta) {
  Lease lease(*this);
  const auto reply = call(lease.socket(), wire::encode_add(key, delta));
  if (reply.op == wire::Op::kInteger) return reply.message.integer;
  if (reply.op == wire::Op::kFailed) {
    throw Error(MNCL_ERR_INVALID_ARGUMENT, std::string(reply.message.text));
  }
  unexpected_reply(url_, "ADD", reply.op);
}

std::vector<std::string> TcpStore::wait(const std::vector<std::string> &keys,
                                        const WaitOptions &opts) {
  for (size_t i = 0; i < keys.size(); ++i) {
    MNCL_CHECK(!keys[i].empty(), MNCL_ERR_INVALID_ARGUMENT, "store WAIT: key %zu of %zu is empty",
               i, keys.size());
  }
  const auto deadline = Clock::now() + opts.timeout;
  std::vector<std::string> missing = keys;
  while (!missing.empty()) {
    throw_if_aborted(opts, "waiting for store key '" + missing.front() + "'");
    const bool last_try = Clock::now() >= deadline;
    Reply reply;
    {
      Lease lease(*this);
      reply = call(lease.socket(), wire::encode_wait(missing, slice_ms(deadline)));
    }
    // The server refused the request (out of memory, a limit): not the caller's argument,
    // which was checked before it was sent.
    if (reply.op == wire::Op::kFailed) {
      throw Error(MNCL_ERR_REMOTE,
                  format("the store at %s refused a WAIT: %.*s", url_.c_str(),
                         static_cast<int>(reply.message.text.size()), reply.message.text.data()));
    }
    if (reply.op != wire::Op::kMissing) unexpected_reply(url_, "WAIT", reply.op);
    // Only what is still missing is asked for next time.
    missing.assign(reply.message.keys.begin(), reply.message.keys.end());
    if (last_try) break;
  }
  return missing;
}

bool TcpStore::set_on_close(const std::string &key, const void *data, size_t len) {
  if (server_) return false;
  const auto head = wire::encode_set_on_close_head(key, len);
  std::lock_guard<std::mutex> lock(will_mutex_);
  if (!will_socket_) return false;  // not opened, or lost: no will can be left
  const auto reply = call_will(head, data, len);
  if (reply.op == wire::Op::kFailed) {
    throw Error(MNCL_ERR_REMOTE,
                format("the store at %s refused SET_ON_CLOSE: %.*s", url_.c_str(),
                       static_cast<int>(reply.message.text.size()), reply.message.text.data()));
  }
  if (reply.op != wire::Op::kOk) unexpected_reply(url_, "SET_ON_CLOSE", reply.op);
  return true;
}

bool TcpStore::cancel_on_close(const std::string &key) {
  if (server_) return false;
  std::lock_guard<std::mutex> lock(will_mutex_);
  if (!will_socket_) return false;  // none registered (or its connection was lost)
  const auto reply = call_will(wire::encode_cancel_on_close(key));
  if (reply.op != wire::Op::kBool) unexpected_reply(url_, "CANCEL_ON_CLOSE", reply.op);
  return reply.message.flag;
}

size_t TcpStore::erase_prefix(const std::string &prefix) {
  check_erase_prefix(prefix);
  Lease lease(*this);
  const auto reply = call(lease.socket(), wire::encode_erase_prefix(prefix));
  if (reply.op != wire::Op::kInteger) unexpected_reply(url_, "ERASE_PREFIX", reply.op);
  return static_cast<size_t>(reply.message.integer);
}

bool TcpStore::erase(const std::string &key) {
  Lease lease(*this);
  const auto reply = call(lease.socket(), wire::encode_erase(key));
  if (reply.op != wire::Op::kBool) unexpected_reply(url_, "ERASE", reply.op);
  return reply.message.flag;
}

}  // namespace mncl::bootstrap
