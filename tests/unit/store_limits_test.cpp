// The TCP store server against clients that misbehave (sdk/bootstrap/tcp_store_server.cpp):
// connections that never say HELLO, running out of file descriptors, replies never read, and
// WAITs of empty keys or too many keys. What it may hold for them is bounded, it neither spins
// nor floods its log, and real clients keep being served.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "../common/expect_error.h"
#include "bootstrap/net.h"
#include "bootstrap/tcp_store.h"
#include "bootstrap/wire.h"
#include "common/error.h"
#include "common/log.h"

namespace mncl::bootstrap {
namespace {

using Clock = std::chrono::steady_clock;
using mncl::testing::error_of;
using std::chrono::milliseconds;
using std::chrono::seconds;

WaitOptions wait_for(milliseconds timeout) {
  WaitOptions opts;
  opts.timeout = timeout;
  return opts;
}

// A plain blocking connection to 127.0.0.1:port; invalid if connecting failed.
net::UniqueFd connect_raw(uint16_t port) {
  net::UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  if (connect(fd.get(), reinterpret_cast<sockaddr *>(&address), sizeof address) != 0) {
    ADD_FAILURE() << "connect: " << strerror(errno);
    fd.reset();
  }
  return fd;
}

bool send_all(int fd, const std::vector<uint8_t> &bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// Reads exactly size bytes (into data, or discarded if null), each wait bounded by timeout.
bool receive_exactly(int fd, void *data, size_t size, milliseconds timeout) {
  std::vector<uint8_t> scratch(data ? 0 : std::min<size_t>(size, 1 << 20));
  auto *at = static_cast<uint8_t *>(data);
  while (size > 0) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(timeout.count())) != 1) return false;
    uint8_t *into = at ? at : scratch.data();
    const ssize_t n = recv(fd, into, at ? size : std::min(size, scratch.size()), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    if (at) at += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// Reads one reply frame; its body is kept only if keep_body (else just skipped).
bool receive_frame(int fd, wire::Op &op, std::vector<uint8_t> &body, bool keep_body = true) {
  uint8_t header[wire::kHeaderBytes];
  if (!receive_exactly(fd, header, sizeof header, milliseconds(30000))) return false;
  const auto parsed = wire::parse_frame(header, sizeof header);
  if (parsed.status == wire::ParseStatus::kInvalid) return false;
  op = static_cast<wire::Op>(header[4]);
  const size_t body_size = parsed.frame_size - sizeof header;
  body.assign(keep_body ? body_size : 0, 0);
  return receive_exactly(fd, keep_body ? body.data() : nullptr, body_size, milliseconds(30000));
}

// Sends HELLO (no token) and expects OK.
void say_hello(int fd) {
  ASSERT_TRUE(send_all(fd, wire::encode_hello("")));
  wire::Op op{};
  std::vector<uint8_t> body;
  ASSERT_TRUE(receive_frame(fd, op, body));
  ASSERT_EQ(op, wire::Op::kOk);
}

// Waits until every socket in fds sees the server close it (EOF or reset); returns how many
// did before the deadline.
size_t wait_until_closed(const std::vector<net::UniqueFd> &fds, Clock::time_point deadline) {
  std::vector<bool> closed(fds.size(), false);
  size_t count = 0;
  while (count < fds.size() && Clock::now() < deadline) {
    std::vector<pollfd> polled;
    std::vector<size_t> which;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (closed[i]) continue;
      polled.push_back({fds[i].get(), POLLIN, 0});
      which.push_back(i);
    }
    if (poll(polled.data(), polled.size(), 100) <= 0) continue;
    for (size_t j = 0; j < polled.size(); ++j) {
      if (polled[j].revents == 0) continue;
      char byte;
      const ssize_t n = recv(polled[j].fd, &byte, 1, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        closed[which[j]] = true;
        ++count;
      }
    }
  }
  return count;
}

size_t open_descriptors() {
  size_t count = 0;
  for ([[maybe_unused]] const auto &entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    ++count;
  }
  return count;
}

// A job of more ranks than the usual soft limit of 1024 descriptors needs the hard one.
TEST(TcpStoreLimits, ServerRaisesTheSoftDescriptorLimitToTheHardOne) {
  rlimit original{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &original), 0);
  constexpr rlim_t kLowered = 512;
  if (original.rlim_max <= kLowered) GTEST_SKIP() << "the hard descriptor limit is too low";
  if (open_descriptors() + 64 > kLowered) GTEST_SKIP() << "too many descriptors open already";
  rlimit lowered = original;
  lowered.rlim_cur = kLowered;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lowered), 0);
  rlimit raised{};
  {
    TcpStoreServer server("127.0.0.1", 0, "");
    ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &raised), 0);
  }
  setrlimit(RLIMIT_NOFILE, &original);
  EXPECT_GT(raised.rlim_cur, kLowered);
  if (original.rlim_max != RLIM_INFINITY) {
    EXPECT_EQ(raised.rlim_cur, original.rlim_max);
  }
}

// Connections that never complete HELLO are closed after a few seconds; authenticated idle ones
// are kept (ranks may be idle for hours between collectives).
TEST(TcpStoreLimits, ConnectionsThatNeverSayHelloAreClosed) {
  TcpStoreServer server("127.0.0.1", 0, "");
  const auto start = Clock::now();
  std::vector<net::UniqueFd> silent;
  for (int i = 0; i < 3; ++i) silent.push_back(connect_raw(server.port()));
  // One sends the first bytes of a HELLO and stops there.
  silent.push_back(connect_raw(server.port()));
  const auto hello = wire::encode_hello("");
  ASSERT_TRUE(send_all(silent.back().get(), {hello.begin(), hello.begin() + 6}));
  net::UniqueFd idle = connect_raw(server.port());
  say_hello(idle.get());

  // A hang guard, not a speed requirement: the server allows a few seconds.
  EXPECT_EQ(wait_until_closed(silent, start + seconds(60)), silent.size());
  EXPECT_GE(Clock::now() - start, seconds(2)) << "closed before a slow client could say HELLO";
  // The authenticated one is still open and served.
  pollfd p{idle.get(), POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 0), 0) << "the server closed an authenticated idle connection";
  ASSERT_TRUE(send_all(idle.get(), wire::encode_get("k", 0)));
  wire::Op op{};
  std::vector<uint8_t> body;
  ASSERT_TRUE(receive_frame(idle.get(), op, body));
  EXPECT_EQ(op, wire::Op::kNotYet);
}

// At most 1024 connections may be waiting for their HELLO at once: past that, the server
// accepts no more (or closes the oldest), so a flood holds a bounded number of descriptors.
TEST(TcpStoreLimits, ConnectionsWaitingForHelloAreCapped) {
  constexpr size_t kCap = 1024;
  constexpr size_t kFlood = kCap + 100;
  TcpStoreServer server("127.0.0.1", 0, "");  // raises the soft limit to the hard one
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  if (limit.rlim_cur < 2 * kFlood + 256) GTEST_SKIP() << "the descriptor limit is too low";
  const size_t before = open_descriptors();
  std::vector<net::UniqueFd> flood;
  for (size_t i = 0; i < kFlood; ++i) {
    flood.push_back(connect_raw(server.port()));
    ASSERT_TRUE(flood.back());
  }
  // The descriptors the server holds for them: all it accepted and has not closed.
  size_t most_held = 0;
  for (int i = 0; i < 40; ++i) {
    const size_t now = open_descriptors();
    most_held = std::max(most_held, now > before + kFlood ? now - before - kFlood : 0);
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_GT(most_held, kCap / 2) << "the server did not accept the flood at all";
  EXPECT_LE(most_held, kCap + 8);
  // A real client still gets in (once the oldest silent one may be closed for it).
  TcpStore client("127.0.0.1", server.port(), "", wait_for(seconds(60)));
  client.set("k", "v", 1);
  EXPECT_EQ(client.add("n", 2), 2);
}

// With its descriptors used up, the server used to spin on the listening socket (the pending
// connection stays in the backlog), logging a warning each time, and never serve anyone again.
// Run in a child process whose hard descriptor limit is lowered for good.
TEST(TcpStoreLimits, RunningOutOfDescriptorsNeitherSpinsNorLocksClientsOut) {
  int port_pipe[2], log_pipe[2], hold_pipe[2];
  ASSERT_EQ(pipe(port_pipe), 0);
  ASSERT_EQ(pipe(log_pipe), 0);
  ASSERT_EQ(pipe(hold_pipe), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    dup2(log_pipe[1], STDERR_FILENO);
    close(log_pipe[0]);
    close(log_pipe[1]);
    close(port_pipe[0]);
    close(hold_pipe[1]);
    // Room for the server's own sockets and a few dozen connections.
    const rlim_t n = static_cast<rlim_t>(open_descriptors() + 40);
    const rlimit limit{n, n};
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) _exit(2);
    try {
      TcpStoreServer server("127.0.0.1", 0, "");
      const uint16_t port = server.port();
      if (write(port_pipe[1], &port, sizeof port) != sizeof port) _exit(3);
      char byte;
      while (read(hold_pipe[0], &byte, 1) < 0 && errno == EINTR) {
      }  // until the parent closes its end
    } catch (const std::exception &e) {
      fprintf(stderr, "child: %s\n", e.what());
      _exit(1);
    }
    _exit(0);
  }
  close(port_pipe[1]);
  close(log_pipe[1]);
  close(hold_pipe[0]);
  net::UniqueFd hold(hold_pipe[1]);
  // Counts the child's warnings about accept() while the test runs.
  std::atomic<size_t> accept_warnings{0};
  std::string log_head;
  std::thread reader([&, fd = log_pipe[0]] {
    std::string line;
    char buffer[4096];
    ssize_t n;
    while ((n = read(fd, buffer, sizeof buffer)) > 0 || (n < 0 && errno == EINTR)) {
      for (ssize_t i = 0; i < n; ++i) {
        if (buffer[i] != '\n') {
          line += buffer[i];
          continue;
        }
        if (line.find("accept") != std::string::npos) ++accept_warnings;
        if (log_head.size() < 2000) log_head += line + "\n";
        line.clear();
      }
    }
    close(fd);
  });
  uint16_t port = 0;
  const bool started = read(port_pipe[0], &port, sizeof port) == sizeof port;
  close(port_pipe[0]);

  std::string client_error;
  if (started) {
    // Three times what the child may open, none of which ever says HELLO.
    std::vector<net::UniqueFd> silent;
    for (int i = 0; i < 120; ++i) silent.push_back(connect_raw(port));
    std::this_thread::sleep_for(milliseconds(500));
    try {
      // A hang guard: silent connections are closed after a second or so to make room.
      TcpStore client("127.0.0.1", port, "", wait_for(seconds(30)));
      client.set("k", "v", 1);
      EXPECT_EQ(client.add("n", 3), 3);
    } catch (const std::exception &e) {
      client_error = e.what();
    }
  }
  hold.reset();  // the child exits
  int status = 0;
  waitpid(child, &status, 0);
  reader.join();
  ASSERT_TRUE(started) << log_head;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << log_head;
  EXPECT_EQ(client_error, "") << "a real client was not served";
  // The warning is rate-limited (the old server logged one per spin: ~100k a second).
  if (log::level() >= log::kWarn && getenv("MNCL_DEBUG_FILE") == nullptr) {
    EXPECT_GE(accept_warnings.load(), 1u) << "the child never ran out of descriptors";
  }
  EXPECT_LE(accept_warnings.load(), 20u) << log_head;
}

// Connections refused or dropped before HELLO (other jobs' ranks, port scanners, a health
// check's HTTP GET) draw at most a warning per interval: each drew one, so anyone who reaches
// the port could flood the job's log (240 thousand lines in 10 s). The job's own clients are
// still served.
TEST(TcpStoreLimits, StrangersDoNotFloodTheLog) {
  if (log::level() < log::kWarn || getenv("MNCL_DEBUG_FILE") != nullptr) {
    GTEST_SKIP() << "warnings do not go to stderr here";
  }
  char path[] = "/tmp/mncl-store-log-XXXXXX";
  const int log_fd = mkstemp(path);
  ASSERT_GE(log_fd, 0);
  std::fflush(stderr);
  const int saved_stderr = dup(2);
  ASSERT_EQ(dup2(log_fd, 2), 2);
  {
    TcpStoreServer server("127.0.0.1", 0, "the-job's-token");
    for (int i = 0; i < 100; ++i) {
      net::UniqueFd other_job = connect_raw(server.port());
      ASSERT_TRUE(send_all(other_job.get(), wire::encode_hello("another-job's-token")));
      wire::Op op{};
      std::vector<uint8_t> body;
      ASSERT_TRUE(receive_frame(other_job.get(), op, body));
      EXPECT_EQ(op, wire::Op::kRefused);
      std::vector<net::UniqueFd> probe;
      probe.push_back(connect_raw(server.port()));
      const std::string get = "GET / HTTP/1.0\r\n\r\n";
      ASSERT_TRUE(send_all(probe.back().get(), {get.begin(), get.end()}));
      EXPECT_EQ(wait_until_closed(probe, Clock::now() + seconds(30)), 1u);
    }
    TcpStore client("127.0.0.1", server.port(), "the-job's-token", wait_for(seconds(30)));
    client.set("k", "v", 1);
    EXPECT_EQ(client.add("n", 3), 3);
  }
  std::fflush(stderr);
  dup2(saved_stderr, 2);
  close(saved_stderr);
  std::string logged(static_cast<size_t>(lseek(log_fd, 0, SEEK_END)), '\0');
  ASSERT_EQ(pread(log_fd, logged.data(), logged.size(), 0), static_cast<ssize_t>(logged.size()));
  close(log_fd);
  unlink(path);
  size_t warnings = 0;
  for (size_t at = logged.find("store server at"); at != std::string::npos;
       at = logged.find("store server at", at + 1)) {
    ++warnings;
  }
  EXPECT_GE(warnings, 1u) << "nothing said about 200 strangers";
  EXPECT_LE(warnings, 6u) << logged.substr(0, 4000);
  EXPECT_NE(logged.find("another job's rank, or not a rank"), std::string::npos) << logged;
}

// The client against whatever answers on the port before it is known to be an MNCL store (a
// program squatting on it): a 5-byte header declaring a 1 GiB value once made the rank allocate
// 1 GiB, and a REFUSED reason went raw (32 MiB, terminal escapes) into its error message.
// Answers to HELLO are now at most 4 KiB of OK or REFUSED, the reason printable and short.
TEST(TcpStoreLimits, TheClientTrustsNoAnswerToHelloButAShortOne) {
  const std::string escapes = "\x1b[2J\x1b[31mFAKE: run this";
  const std::vector<std::vector<uint8_t>> answers = {
      wire::encode_value_head((size_t{1} << 30) - 16),
      wire::encode_refused(escapes + std::string(3000, 'x')),
  };
  for (const auto &answer : answers) {
    net::UniqueFd listener(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(listener.get(), reinterpret_cast<sockaddr *>(&address), sizeof address), 0);
    ASSERT_EQ(listen(listener.get(), 4), 0);
    socklen_t length = sizeof address;
    getsockname(listener.get(), reinterpret_cast<sockaddr *>(&address), &length);
    std::thread squatter([&] {
      net::UniqueFd peer(accept(listener.get(), nullptr, nullptr));
      char hello[64];
      if (recv(peer.get(), hello, sizeof hello, 0) <= 0) return;
      send_all(peer.get(), answer);
      std::this_thread::sleep_for(milliseconds(500));  // holds the connection open a little
    });
    const std::string what =
        error_of([&] { TcpStore("127.0.0.1", ntohs(address.sin_port), "", wait_for(seconds(5))); },
                 MNCL_ERR_BOOTSTRAP);
    squatter.join();
    EXPECT_LT(what.size(), 1000u) << what.substr(0, 1000);
    EXPECT_EQ(what.find('\x1b'), std::string::npos) << "raw escapes in: " << what.substr(0, 300);
    if (answer[4] == static_cast<uint8_t>(wire::Op::kRefused)) {
      EXPECT_NE(what.find("\\x1b[2J"), std::string::npos) << what;  // shown, escaped
    } else {
      EXPECT_NE(what.find("answer to HELLO"), std::string::npos) << what;
    }
  }
}

// A client that sends requests but never reads the replies: the server stops reading its
// requests once 16 MiB of replies are queued, serves it again once it reads them, and keeps
// serving the others meanwhile. It used to queue replies without limit.
TEST(TcpStoreLimits, UnreadRepliesStopTheServerReadingThatClient) {
  TcpStoreServer server("127.0.0.1", 0, "");
  TcpStore other("127.0.0.1", server.port(), "", wait_for(seconds(60)));
  const std::vector<uint8_t> big(1 << 20, 0x5a);
  other.set("big", big.data(), big.size());

  net::UniqueFd greedy = connect_raw(server.port());
  say_hello(greedy.get());
  // Each pair: a 1 MiB reply, then one that counts how many pairs were served.
  constexpr int kPairs = 500;
  std::vector<uint8_t> requests;
  for (int i = 0; i < kPairs; ++i) {
    const auto get = wire::encode_get("big", 0);
    const auto add = wire::encode_add("served", 1);
    requests.insert(requests.end(), get.begin(), get.end());
    requests.insert(requests.end(), add.begin(), add.end());
  }
  ASSERT_TRUE(send_all(greedy.get(), requests));  // 12 KB: the socket buffers take it

  // Until the count has not moved for a second. 16 MiB queued and what the socket buffers hold
  // (a few MiB each way, tens on tuned hosts) are a few dozen pairs; the old server did all.
  int64_t served = -1;
  for (auto stable_since = Clock::now(), start = Clock::now();
       Clock::now() - stable_since < seconds(1) && Clock::now() - start < seconds(30);) {
    std::this_thread::sleep_for(milliseconds(100));
    const int64_t now = other.add("served", 0);  // the other client is served meanwhile
    if (now != served) stable_since = Clock::now();
    served = now;
  }
  EXPECT_LT(served, kPairs / 2) << "the server kept reading requests whose replies pile up";

  // Reading the replies resumes it: every request is answered, in order.
  for (int i = 1; i <= kPairs; ++i) {
    wire::Op op{};
    std::vector<uint8_t> body;
    ASSERT_TRUE(receive_frame(greedy.get(), op, body, false)) << "pair " << i;
    ASSERT_EQ(op, wire::Op::kValue) << "pair " << i;
    ASSERT_TRUE(receive_frame(greedy.get(), op, body)) << "pair " << i;
    ASSERT_EQ(op, wire::Op::kInteger) << "pair " << i;
    const auto expected = wire::encode_integer(i);
    EXPECT_TRUE(
        std::equal(body.begin(), body.end(), expected.begin() + wire::kHeaderBytes, expected.end()))
        << "pair " << i;
  }
  EXPECT_EQ(other.add("served", 0), kPairs);
}

// No real key is empty; a WAIT of empty keys was the cheapest way to make the server allocate.
TEST(TcpStoreLimits, WaitOnAnEmptyKeyIsRefusedClearly) {
  TcpStoreServer server("127.0.0.1", 0, "");
  TcpStore client("127.0.0.1", server.port(), "", wait_for(seconds(20)));
  client.set("a", "1", 1);
  const auto message = error_of(
      [&] {
        client.wait({"a", ""}, wait_for(milliseconds(0)));
      },
      MNCL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(message.find("key 1 of 2 is empty"), std::string::npos) << message;
  error_of([&] { client.wait({"", "b"}, wait_for(seconds(5))); }, MNCL_ERR_INVALID_ARGUMENT);
  // The connection is still good.
  EXPECT_TRUE(client.wait({"a"}, wait_for(milliseconds(0))).empty());

  // The client refuses before sending; the server refuses a WAIT that names one all the same,
  // and keeps the connection.
  net::UniqueFd raw = connect_raw(server.port());
  say_hello(raw.get());
  ASSERT_TRUE(send_all(raw.get(), wire::encode_wait({"a", ""}, 0)));
  wire::Op op{};
  std::vector<uint8_t> body;
  ASSERT_TRUE(receive_frame(raw.get(), op, body));
  EXPECT_EQ(op, wire::Op::kFailed);
  const std::string text(body.begin(), body.end());
  EXPECT_NE(text.find("empty"), std::string::npos) << text;
  ASSERT_TRUE(send_all(raw.get(), wire::encode_wait({"a"}, 0)));
  ASSERT_TRUE(receive_frame(raw.get(), op, body));
  EXPECT_EQ(op, wire::Op::kMissing);
}

// A WAIT names at most wire::kMaxWaitKeys keys: the client refuses more before sending, and the
// server closes a connection that announces more as soon as the count arrives.
TEST(TcpStoreLimits, WaitOnTooManyKeysIsRefused) {
  TcpStoreServer server("127.0.0.1", 0, "");
  TcpStore client("127.0.0.1", server.port(), "", wait_for(seconds(60)));
  client.set("k", "v", 1);
  std::vector<std::string> keys(wire::kMaxWaitKeys, "k");
  EXPECT_TRUE(client.wait(keys, wait_for(seconds(60))).empty());  // the limit itself is fine
  keys.push_back("k");
  const auto message =
      error_of([&] { client.wait(keys, wait_for(seconds(60))); }, MNCL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(message.find(std::to_string(wire::kMaxWaitKeys)), std::string::npos) << message;

  // Just the first 13 bytes of a WAIT of kMaxWaitKeys + 1 empty keys (4 MiB): refused there.
  net::UniqueFd raw = connect_raw(server.port());
  say_hello(raw.get());
  const uint32_t count = wire::kMaxWaitKeys + 1;
  const uint32_t length = 1 + 8 + 4 * count;
  std::vector<uint8_t> start;
  for (const uint32_t v : {length, 0u, count}) {
    for (int shift = 24; shift >= 0; shift -= 8) start.push_back(uint8_t(v >> shift));
  }
  start.insert(start.begin() + 4, static_cast<uint8_t>(wire::Op::kWait));
  ASSERT_TRUE(send_all(raw.get(), start));
  std::vector<net::UniqueFd> one;
  one.push_back(std::move(raw));
  EXPECT_EQ(wait_until_closed(one, Clock::now() + seconds(20)), 1u)
      << "the server waited for the keys of a WAIT over the limit";
  client.set("still", "served", 6);
}

}  // namespace
}  // namespace mncl::bootstrap
