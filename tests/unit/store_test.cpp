// Tests of the bootstrap store (sdk/bootstrap): the behaviour every store shares, run against
// both the TCP and the file store, then what is specific to each, then the wire parser.
#include "bootstrap/store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../common/expect_error.h"
#include "bootstrap/file_store.h"
#include "bootstrap/memory_store.h"
#include "bootstrap/net.h"
#include "bootstrap/tcp_store.h"
#include "bootstrap/wire.h"
#include "common/error.h"
#include "common/free_port.h"
#include "common/log.h"
#include "core/comm.h"

namespace mncl::bootstrap {
namespace {

using Clock = std::chrono::steady_clock;
using mncl::testing::error_of;
using std::chrono::milliseconds;
using std::chrono::seconds;

// Generous bounds for "returns promptly": the machine running the tests may be busy.
constexpr auto kPromptly = seconds(2);

WaitOptions wait_for(milliseconds timeout, const std::atomic<bool> *aborted = nullptr) {
  WaitOptions opts;
  opts.timeout = timeout;
  opts.aborted = aborted;
  return opts;
}

std::string text_of(const Bytes &bytes) {
  return std::string(bytes.begin(), bytes.end());
}

void set_text(Store &store, const std::string &key, const std::string &value) {
  store.set(key, value.data(), value.size());
}

// A socket bound to a free port of 127.0.0.1 (*port), listening when backlog > 0.
net::UniqueFd bound_on_loopback(uint16_t *port, int backlog) {
  net::UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  EXPECT_TRUE(fd);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd.get(), reinterpret_cast<sockaddr *>(&address), sizeof address), 0);
  if (backlog > 0) {
    EXPECT_EQ(listen(fd.get(), backlog), 0);
  }
  socklen_t length = sizeof address;
  EXPECT_EQ(getsockname(fd.get(), reinterpret_cast<sockaddr *>(&address), &length), 0);
  *port = ntohs(address.sin_port);
  return fd;
}

// A port nothing listens on right now, from outside the ephemeral range (see there).
uint16_t free_port() {
  return static_cast<uint16_t>(mncl::free_loopback_port());
}

// Connects a plain socket, waiting at most 2 s; returns the errno (0: connected).
int try_connect(const sockaddr *address, socklen_t length, net::UniqueFd *out = nullptr) {
  net::UniqueFd fd(socket(address->sa_family, SOCK_STREAM | SOCK_NONBLOCK, 0));
  int error = connect(fd.get(), address, length) == 0 ? 0 : errno;
  if (error == EINPROGRESS) {
    pollfd p{fd.get(), POLLOUT, 0};
    if (poll(&p, 1, 2000) <= 0) return ETIMEDOUT;
    socklen_t size = sizeof error;
    getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &size);
  }
  if (error == 0 && out != nullptr) {
    net::set_nonblocking(fd.get(), false);
    *out = std::move(fd);
  }
  return error;
}

// Forks n processes running body(i) and expects each to exit 0.
void run_in_children(int n, const std::function<void(int)> &body) {
  std::vector<pid_t> children;
  for (int i = 0; i < n; ++i) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int code = 0;
      try {
        body(i);
      } catch (const std::exception &e) {
        fprintf(stderr, "child %d: %s\n", i, e.what());
        code = 1;
      }
      _exit(code);
    }
    children.push_back(pid);
  }
  for (const pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  }
}

std::string make_temp_dir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "mncl-store-XXXXXX").string();
  EXPECT_NE(mkdtemp(pattern.data()), nullptr);
  return pattern;
}

// ---------------------------------------------------------------------------------------------
// Behaviour every store shares, for tcp and file.
// ---------------------------------------------------------------------------------------------

class StoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "tcp") {
      url_ = "tcp://127.0.0.1:" + std::to_string(free_port());
    } else {
      dir_ = make_temp_dir();
      url_ = "file://" + dir_;
    }
    store_ = open_rank(0);
  }
  void TearDown() override {
    store_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  // Another rank's view of the same store (for tcp, another client connection).
  std::shared_ptr<Store> open_rank(int rank) {
    return open_store(url_, rank, kRanks, wait_for(seconds(20)));
  }

  static constexpr int kRanks = 8;
  std::string url_;
  std::string dir_;
  std::shared_ptr<Store> store_;  // rank 0: for tcp, it hosts the server
};

TEST_P(StoreTest, SetGetRoundtripIncludingEmptyAndLargeValues) {
  auto other = open_rank(1);
  set_text(*store_, "small", "hello");
  store_->set("empty", nullptr, 0);
  Bytes large(8 << 20);
  for (size_t i = 0; i < large.size(); ++i) large[i] = static_cast<uint8_t>(i * 131 + (i >> 13));
  store_->set("large", large.data(), large.size());

  EXPECT_EQ(text_of(other->get("small", wait_for(seconds(5)))), "hello");
  EXPECT_TRUE(other->get("empty", wait_for(seconds(5))).empty());
  EXPECT_EQ(other->get("large", wait_for(seconds(5))), large);
  // Overwrite replaces.
  set_text(*other, "small", "again");
  EXPECT_EQ(text_of(store_->get("small", wait_for(seconds(5)))), "again");
}

TEST_P(StoreTest, KeysMayHoldAnyBytes) {
  const std::string key = std::string("a/b c%..\n\x01", 11) + std::string(300, 'x');
  set_text(*store_, key, "v");
  EXPECT_EQ(text_of(open_rank(1)->get(key, wait_for(seconds(5)))), "v");
  EXPECT_EQ(store_->wait({key, key + "y"}, wait_for(milliseconds(0))),
            std::vector<std::string>{key + "y"});
}

TEST_P(StoreTest, GetWaitsForALaterSetFromAnotherThread) {
  auto other = open_rank(1);
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(150));
    set_text(*other, "late", "here");
  });
  EXPECT_EQ(text_of(store_->get("late", wait_for(seconds(20)))), "here");
  setter.join();
}

TEST_P(StoreTest, GetTimeoutNamesTheKey) {
  const auto start = Clock::now();
  const auto message =
      error_of([&] { store_->get("w/join/2", wait_for(milliseconds(300))); }, MNCL_ERR_TIMEOUT);
  EXPECT_NE(message.find("store key 'w/join/2' not set within 0.3 s"), std::string::npos)
      << message;
  EXPECT_LT(Clock::now() - start, kPromptly);
  // A zero timeout is a single check.
  error_of([&] { store_->get("absent", wait_for(milliseconds(0))); }, MNCL_ERR_TIMEOUT);
}

TEST_P(StoreTest, WaitReturnsExactlyTheMissingKeys) {
  set_text(*store_, "a", "1");
  set_text(*store_, "c", "3");
  EXPECT_EQ(store_->wait({"a", "b", "c", "d"}, wait_for(milliseconds(200))),
            (std::vector<std::string>{"b", "d"}));
  EXPECT_TRUE(store_->wait({"a", "c"}, wait_for(milliseconds(0))).empty());
  EXPECT_TRUE(store_->wait({}, wait_for(milliseconds(0))).empty());

  auto other = open_rank(1);
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(100));
    set_text(*other, "b", "2");
    std::this_thread::sleep_for(milliseconds(100));
    set_text(*other, "d", "4");
  });
  EXPECT_TRUE(store_->wait({"a", "b", "c", "d"}, wait_for(seconds(20))).empty());
  setter.join();
}

TEST_P(StoreTest, AddIsAtomicAcrossThreads) {
  constexpr int kThreads = 6;
  constexpr int kAdds = 100;
  std::vector<std::shared_ptr<Store>> clients = {store_,       store_,       open_rank(1),
                                                 open_rank(2), open_rank(3), store_};
  std::vector<std::vector<int64_t>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kAdds; ++i) seen[t].push_back(clients[t]->add("counter", 1));
    });
  }
  for (auto &thread : threads) thread.join();
  std::set<int64_t> all;
  for (const auto &values : seen) all.insert(values.begin(), values.end());
  // Every add saw a distinct value: none was lost or duplicated.
  EXPECT_EQ(all.size(), size_t{kThreads * kAdds});
  EXPECT_EQ(store_->add("counter", 0), kThreads * kAdds);
  EXPECT_EQ(store_->add("counter", -5), kThreads * kAdds - 5);
  EXPECT_EQ(text_of(store_->get("counter", wait_for(seconds(1)))),
            std::to_string(kThreads * kAdds - 5));
}

TEST_P(StoreTest, AddIsAtomicAcrossProcesses) {
  constexpr int kProcesses = 4;
  constexpr int kAdds = 50;
  const std::string url = url_;
  run_in_children(kProcesses, [&](int i) {
    auto store = open_store(url, i + 1, kRanks, wait_for(seconds(20)));
    for (int n = 0; n < kAdds; ++n) store->add("counter", 1);
  });
  EXPECT_EQ(store_->add("counter", 0), kProcesses * kAdds);
}

TEST_P(StoreTest, AddRefusesANonIntegerValue) {
  set_text(*store_, "text", "abc");
  const auto message = error_of([&] { store_->add("text", 1); }, MNCL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(message.find("'text'"), std::string::npos) << message;
  EXPECT_EQ(store_->add("fresh", 7), 7);  // absent counts as 0
}

TEST_P(StoreTest, EraseRemovesAndReportsWhetherTheKeyExisted) {
  set_text(*store_, "k", "v");
  EXPECT_TRUE(store_->erase("k"));
  EXPECT_FALSE(store_->erase("k"));
  error_of([&] { store_->get("k", wait_for(milliseconds(50))); }, MNCL_ERR_TIMEOUT);
  EXPECT_EQ(store_->wait({"k"}, wait_for(milliseconds(0))), std::vector<std::string>{"k"});
}

TEST_P(StoreTest, PrefixStoresAreIsolated) {
  auto a = make_prefix_store(store_, "a/");
  auto b = make_prefix_store(open_rank(1), "b/");
  set_text(*a, "k", "from a");
  EXPECT_EQ(text_of(store_->get("a/k", wait_for(seconds(1)))), "from a");
  const auto message =
      error_of([&] { b->get("k", wait_for(milliseconds(100))); }, MNCL_ERR_TIMEOUT);
  EXPECT_NE(message.find("'b/k'"), std::string::npos) << message;
  EXPECT_EQ(a->wait({"k", "x"}, wait_for(milliseconds(50))), std::vector<std::string>{"x"});
  EXPECT_EQ(a->add("n", 2), 2);
  EXPECT_EQ(b->add("n", 5), 5);
  EXPECT_FALSE(b->erase("k"));
  EXPECT_TRUE(a->erase("k"));
  EXPECT_EQ(a->describe(), store_->describe());
}

// A communicator's destroy erases its keys ("<id>/...") in one request, and no other's: not
// its children's ("<id>.s0.0/..."), nor those of one whose id begins like it ("<id>x/...").
void expect_erase_prefix_erases_only_its_keys(const std::shared_ptr<Store> &store,
                                              const std::shared_ptr<Store> &other_rank) {
  for (const char *key : {"c/join/0", "c/p/3/r0", "c/", "c.s0.0/join/0", "cx/a", "d/c/a"}) {
    set_text(*other_rank, key, "v");
  }
  EXPECT_EQ(store->erase_prefix("c/"), 3u);
  EXPECT_EQ(store->wait({"c/join/0", "c/p/3/r0", "c/"}, wait_for(milliseconds(0))).size(), 3u);
  EXPECT_TRUE(store->wait({"c.s0.0/join/0", "cx/a", "d/c/a"}, wait_for(milliseconds(0))).empty());
  EXPECT_EQ(store->erase_prefix("c/"), 0u);
  // Through a communicator's view: "" is every key of the view.
  EXPECT_EQ(make_prefix_store(store, "c.s0.0/")->erase_prefix(""), 1u);
  EXPECT_EQ(store->erase_prefix("cx/"), 1u);
  EXPECT_EQ(store->erase_prefix("d/"), 1u);
  const auto message = error_of([&] { store->erase_prefix(""); }, MNCL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(message.find("every key"), std::string::npos) << message;
}

TEST_P(StoreTest, ErasePrefixErasesOnlyThePrefixedKeys) {
  expect_erase_prefix_erases_only_its_keys(store_, open_rank(1));
}

TEST(MemoryStore, ErasePrefixErasesOnlyThePrefixedKeys) {
  const auto store = make_memory_store();
  expect_erase_prefix_erases_only_its_keys(store, store);
}

TEST_P(StoreTest, AbortInterruptsWaitingCalls) {
  std::atomic<bool> aborted{false};
  std::thread aborter([&] {
    std::this_thread::sleep_for(milliseconds(200));
    aborted = true;
  });
  const auto start = Clock::now();
  error_of([&] { store_->get("never", wait_for(seconds(60), &aborted)); }, MNCL_ERR_ABORTED);
  EXPECT_LT(Clock::now() - start, kPromptly);
  aborter.join();
  // Already aborted: wait() throws too, rather than returning the missing keys.
  error_of([&] { store_->wait({"never"}, wait_for(seconds(60), &aborted)); }, MNCL_ERR_ABORTED);
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreTest, ::testing::Values("tcp", "file"),
                         [](const auto &info) { return info.param; });

// ---------------------------------------------------------------------------------------------
// open_store urls.
// ---------------------------------------------------------------------------------------------

TEST(OpenStore, MalformedUrlsAreInvalidArguments) {
  for (const std::string url :
       {"", "tcp://", "tcp://host", "tcp://host:", "tcp://host:0", "tcp://host:65536",
        "tcp://host:12a", "tcp://:29500", "tcp://::1:29500", "tcp://[::1]29500", "tcp://[::1:29500",
        "file://relative/dir", "file://", "http://host:80", "host:29500"}) {
    const auto message = error_of([&] { open_store(url, 0, 1, wait_for(milliseconds(100))); },
                                  MNCL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(message.find("'" + url + "'"), std::string::npos) << message;
    EXPECT_NE(message.find("tcp://host:port"), std::string::npos) << message;
  }
}

TEST(OpenStore, RankMustBeInRange) {
  error_of([] { open_store("file:///tmp/x", 2, 2, wait_for(milliseconds(10))); },
           MNCL_ERR_INVALID_ARGUMENT);
}

// ---------------------------------------------------------------------------------------------
// The TCP store.
// ---------------------------------------------------------------------------------------------

TEST(TcpStore, ClientWithoutServerTimesOutNamingRankZero) {
  const std::string url = "tcp://127.0.0.1:" + std::to_string(free_port());
  const auto start = Clock::now();
  const auto message =
      error_of([&] { open_store(url, 1, 2, wait_for(milliseconds(300))); }, MNCL_ERR_BOOTSTRAP);
  EXPECT_NE(message.find("cannot reach the store at " + url + " within 0.3 s"), std::string::npos)
      << message;
  EXPECT_NE(message.find("rank 0"), std::string::npos) << message;
  EXPECT_LT(Clock::now() - start, kPromptly);
}

TEST(TcpStore, ClientsRetryUntilTheServerStarts) {
  const uint16_t port = free_port();
  const std::string url = "tcp://127.0.0.1:" + std::to_string(port);
  std::shared_ptr<Store> client;
  std::thread late_rank([&] { client = open_store(url, 1, 2, wait_for(seconds(20))); });
  std::this_thread::sleep_for(milliseconds(300));
  auto host = open_store(url, 0, 2, wait_for(seconds(20)));
  late_rank.join();
  set_text(*client, "k", "v");
  EXPECT_EQ(text_of(host->get("k", wait_for(seconds(5)))), "v");
}

// Threads parked in waiting GETs (receives waiting for their messages) must not hold up another
// thread's SET on the same client: each request gets a connection of its own from the pool,
// which grows no further than the number of requests in flight at once.
TEST(TcpStore, ParkedWaitsNeverHoldUpOtherThreadsRequests) {
  TcpStoreServer server("127.0.0.1", 0, "secret");
  TcpStore client("127.0.0.1", server.port(), "secret", wait_for(seconds(20)));
  EXPECT_EQ(client.connections_opened(), 1u);
  constexpr int kWaiters = 6;
  std::vector<std::string> got(kWaiters);
  std::vector<std::thread> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&, i] {
      got[i] = text_of(client.get("late/" + std::to_string(i), wait_for(seconds(60))));
    });
  }
  std::this_thread::sleep_for(milliseconds(200));  // let them park
  for (int i = kWaiters - 1; i >= 0; --i)
    set_text(client, "late/" + std::to_string(i), "v" + std::to_string(i));
  for (auto &t : waiters) t.join();
  for (int i = 0; i < kWaiters; ++i) EXPECT_EQ(got[i], "v" + std::to_string(i));
  EXPECT_LE(client.connections_opened(), static_cast<size_t>(kWaiters + 1));
  // Sequential use afterwards reuses the pool.
  const size_t opened = client.connections_opened();
  for (int i = 0; i < 20; ++i) set_text(client, "again", "x");
  EXPECT_EQ(client.connections_opened(), opened);
}

TEST(TcpStore, BindFailureNamesTheAddress) {
  // Another program's socket on the port.
  const int taken = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(taken, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  ASSERT_EQ(bind(taken, reinterpret_cast<sockaddr *>(&address), sizeof address), 0);
  ASSERT_EQ(listen(taken, 1), 0);
  ASSERT_EQ(getsockname(taken, reinterpret_cast<sockaddr *>(&address), &length), 0);
  const uint16_t port = ntohs(address.sin_port);
  const auto message =
      error_of([&] { TcpStoreServer second("127.0.0.1", port, ""); }, MNCL_ERR_BOOTSTRAP);
  close(taken);
  EXPECT_NE(message.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << message;
  EXPECT_NE(message.find("Address already in use"), std::string::npos) << message;
}

// This process's own server on the address (two job-wide communicators alive on one TCP
// address): said so, rather than blamed on another program or another rank 0. Once the first
// stops accepting (its job closing), the next may take the address.
TEST(TcpStore, SecondServerOfThisProcessOnOneAddressIsNamed) {
  TcpStoreServer first("127.0.0.1", 0, "");
  const auto message =
      error_of([&] { TcpStoreServer second("127.0.0.1", first.port(), ""); }, MNCL_ERR_BOOTSTRAP);
  EXPECT_NE(message.find("this process serves a store there already"), std::string::npos)
      << message;
  first.stop_accepting();
  std::unique_ptr<TcpStoreServer> next;
  for (int i = 0; i < 200 && !next; ++i) {  // the listening sockets close on the server thread
    try {
      next = std::make_unique<TcpStoreServer>("127.0.0.1", first.port(), "");
    } catch (const Error &) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  EXPECT_NE(next, nullptr) << "the address stayed taken after stop_accepting";
}

TEST(TcpStore, WrongOrMissingTokenIsRefused) {
  auto server = std::make_shared<TcpStoreServer>("127.0.0.1", 0, "s3cret");
  for (const std::string token : {"wrong", "", "s3cret-and-more", "s3cre"}) {
    const auto message =
        error_of([&] { TcpStore("127.0.0.1", server->port(), token, wait_for(seconds(5))); },
                 MNCL_ERR_BOOTSTRAP);
    EXPECT_NE(message.find("refused this rank's token (MNCL_STORE_TOKEN"), std::string::npos)
        << message;
  }
  TcpStore good("127.0.0.1", server->port(), "s3cret", wait_for(seconds(5)));
  set_text(good, "k", "v");
  EXPECT_EQ(text_of(good.get("k", wait_for(seconds(1)))), "v");
}

TEST(TcpStore, TokenComesFromTheEnvironment) {
  const std::string url = "tcp://127.0.0.1:" + std::to_string(free_port());
  setenv("MNCL_STORE_TOKEN", "one", 1);
  auto host = open_store(url, 0, 2, wait_for(seconds(5)));
  setenv("MNCL_STORE_TOKEN", "two", 1);
  error_of([&] { open_store(url, 1, 2, wait_for(seconds(5))); }, MNCL_ERR_BOOTSTRAP);
  unsetenv("MNCL_STORE_TOKEN");
  error_of([&] { open_store(url, 1, 2, wait_for(seconds(5))); }, MNCL_ERR_BOOTSTRAP);
  setenv("MNCL_STORE_TOKEN", "one", 1);
  EXPECT_NO_THROW(open_store(url, 1, 2, wait_for(seconds(5))));
  unsetenv("MNCL_STORE_TOKEN");
}

// Another address of this machine than 127.0.0.1, or none.
std::optional<sockaddr_in> other_local_ipv4() {
  ifaddrs *list = nullptr;
  std::optional<sockaddr_in> found;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs *i = list; i != nullptr && !found; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
      const auto *address = reinterpret_cast<const sockaddr_in *>(i->ifa_addr);
      if (address->sin_addr.s_addr != htonl(INADDR_LOOPBACK)) found = *address;
    }
    freeifaddrs(list);
  }
  if (found) return found;
  // Linux routes all of 127/8 to the loopback device: 127.0.0.2 is local but not 127.0.0.1.
  sockaddr_in alias{};
  alias.sin_family = AF_INET;
  alias.sin_addr.s_addr = htonl(0x7f000002);
  net::UniqueFd probe(socket(AF_INET, SOCK_STREAM, 0));
  if (bind(probe.get(), reinterpret_cast<sockaddr *>(&alias), sizeof alias) == 0) return alias;
  return std::nullopt;
}

TEST(TcpStore, ServerOnLoopbackIsNotReachableOnAnotherAddress) {
  auto other = other_local_ipv4();
  if (!other) GTEST_SKIP() << "this machine has no IPv4 address besides 127.0.0.1";
  TcpStoreServer server("127.0.0.1", 0, "");
  other->sin_port = htons(server.port());
  char name[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &other->sin_addr, name, sizeof name);
  EXPECT_NE(try_connect(reinterpret_cast<sockaddr *>(&*other), sizeof *other), 0)
      << "the store bound to 127.0.0.1 answered on " << name;
  // ... while it is reachable where it was asked to listen.
  sockaddr_in loopback{};
  loopback.sin_family = AF_INET;
  loopback.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  loopback.sin_port = htons(server.port());
  EXPECT_EQ(try_connect(reinterpret_cast<sockaddr *>(&loopback), sizeof loopback), 0);
}

// Whether a socket can be bound to ::1 here (no IPv6 in the kernel, or ipv6.disable=1: none).
bool has_ipv6_loopback() {
  net::UniqueFd probe(socket(AF_INET6, SOCK_STREAM, 0));
  sockaddr_in6 address{};
  address.sin6_family = AF_INET6;
  address.sin6_addr = in6addr_loopback;
  return probe && bind(probe.get(), reinterpret_cast<sockaddr *>(&address), sizeof address) == 0;
}

std::string numeric_host(const sockaddr_in &address) {
  char name[INET_ADDRSTRLEN] = "";
  inet_ntop(AF_INET, &address.sin_addr, name, sizeof name);
  return name;
}

// torchrun's MASTER_ADDR (TcpListen::kEveryAddress): rank 0 may resolve the name to loopback
// (127.0.1.1, from Debian's /etc/hosts) where the other hosts resolve it to its network
// address, so the server listens on every address of this host, as PyTorch's TCPStore does:
// one started for "localhost" answers on 127.0.0.1, on ::1 where this host has IPv6, and on
// another address of this host, where a server for the named host (above) does not.
TEST(TcpStore, ServerOnEveryAddressIsReachableOnEachAddressOfThisHost) {
  TcpStoreServer server("localhost", 0, "", TcpListen::kEveryAddress);
  EXPECT_FALSE(server.loopback_only());
  const std::string port = std::to_string(server.port());
  EXPECT_TRUE(server.listening_on() == "[::]:" + port || server.listening_on() == "0.0.0.0:" + port)
      << server.listening_on();
  sockaddr_in loopback{};
  loopback.sin_family = AF_INET;
  loopback.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  loopback.sin_port = htons(server.port());
  EXPECT_EQ(try_connect(reinterpret_cast<sockaddr *>(&loopback), sizeof loopback), 0);
  if (has_ipv6_loopback()) {
    sockaddr_in6 loopback6{};
    loopback6.sin6_family = AF_INET6;
    loopback6.sin6_addr = in6addr_loopback;
    loopback6.sin6_port = htons(server.port());
    EXPECT_EQ(try_connect(reinterpret_cast<sockaddr *>(&loopback6), sizeof loopback6), 0)
        << "the store on every address did not answer on [::1]";
  }
  auto other = other_local_ipv4();
  if (!other) GTEST_SKIP() << "this machine has no IPv4 address besides 127.0.0.1";
  other->sin_port = htons(server.port());
  EXPECT_EQ(try_connect(reinterpret_cast<sockaddr *>(&*other), sizeof *other), 0)
      << "the store on every address did not answer on " << numeric_host(*other);
  // A rank that resolved the name to that other address is served like any other.
  TcpStore client(numeric_host(*other), server.port(), "", wait_for(seconds(5)));
  set_text(client, "k", "from afar");
  EXPECT_EQ(text_of(client.get("k", wait_for(seconds(1)))), "from afar");
}

// A second rank 0 on the port of a store on every address (another process given rank 0, or
// another job on the same MASTER_PORT) cannot listen there, whatever address it asks for: its
// error says "Address already in use", which mncl_comm_create takes for the address taken (it
// then asks whether another process is rank 0 too). In this process, the registry says so first.
TEST(TcpStore, SecondServerOnThePortOfAServerOnEveryAddressIsRefused) {
  // The other process is forked before the first server exists, so that it does not inherit
  // this process's registry of served addresses: only the bind can stop it.
  int port_pipe[2];
  ASSERT_EQ(pipe(port_pipe), 0);
  std::fflush(nullptr);
  const pid_t other = fork();
  ASSERT_GE(other, 0);
  if (other == 0) {
    close(port_pipe[1]);
    uint16_t port = 0;
    if (read(port_pipe[0], &port, sizeof port) != sizeof port) _exit(2);
    int code = 0;
    for (const TcpListen listen : {TcpListen::kEveryAddress, TcpListen::kNamedHost}) {
      try {
        TcpStoreServer second("localhost", port, "", listen);
        fprintf(stderr, "a second server listened on the port of the first\n");
        code = 1;
      } catch (const Error &e) {
        if (e.status() != MNCL_ERR_BOOTSTRAP || std::strstr(e.what(), "in use") == nullptr) {
          fprintf(stderr, "wrong error: %s\n", e.what());
          code = 1;
        }
      }
    }
    _exit(code);
  }
  close(port_pipe[0]);
  TcpStoreServer first("localhost", 0, "", TcpListen::kEveryAddress);
  const uint16_t port = first.port();
  ASSERT_EQ(write(port_pipe[1], &port, sizeof port), ssize_t(sizeof port));
  close(port_pipe[1]);
  int status = 0;
  ASSERT_EQ(waitpid(other, &status, 0), other);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  for (const TcpListen listen : {TcpListen::kEveryAddress, TcpListen::kNamedHost}) {
    const auto message =
        error_of([&] { TcpStoreServer second("127.0.0.1", port, "", listen); }, MNCL_ERR_BOOTSTRAP);
    EXPECT_NE(message.find("this process serves a store there already"), std::string::npos)
        << message;
  }
}

// The other way round: where another program (or a rank 0 that listens on one address) holds
// the port on 127.0.0.1, a store on every address cannot take the port and says why.
TEST(TcpStore, ServerOnEveryAddressCannotTakeAPortHeldOnOneAddress) {
  uint16_t port = 0;
  const net::UniqueFd taken = bound_on_loopback(&port, 1);
  ASSERT_TRUE(taken);
  const auto message =
      error_of([&] { TcpStoreServer second("localhost", port, "", TcpListen::kEveryAddress); },
               MNCL_ERR_BOOTSTRAP);
  EXPECT_NE(message.find("tcp://localhost:" + std::to_string(port)), std::string::npos) << message;
  EXPECT_NE(message.find("Address already in use"), std::string::npos) << message;
}

TEST(TcpStore, Ipv6Loopback) {
  if (!has_ipv6_loopback()) GTEST_SKIP() << "this machine has no IPv6 loopback (::1)";
  TcpStoreServer server("::1", 0, "");
  const std::string url = "tcp://[::1]:" + std::to_string(server.port());
  auto store = open_store(url, 1, 2, wait_for(seconds(5)));
  EXPECT_EQ(store->describe(), url);
  set_text(*store, "k", "v6");
  EXPECT_EQ(text_of(store->get("k", wait_for(seconds(1)))), "v6");
}

TEST(TcpStore, LostServerIsARemoteErrorNamingTheStore) {
  const std::string url = "tcp://127.0.0.1:" + std::to_string(free_port());
  auto host = open_store(url, 0, 2, wait_for(seconds(5)));
  auto client = open_store(url, 1, 2, wait_for(seconds(5)));
  set_text(*client, "k", "v");
  host.reset();  // rank 0 leaves: its server stops
  const auto message = error_of([&] { client->get("k2", wait_for(seconds(5))); }, MNCL_ERR_REMOTE);
  EXPECT_NE(message.find(url), std::string::npos) << message;
  // And it stays lost.
  error_of([&] { client->add("k", 1); }, MNCL_ERR_REMOTE);
}

// A last will (SET_ON_CLOSE): how the ranks of other hosts learn that a rank's process ended.
TEST(TcpStore, WillIsSetWhenItsClientEndsAndOnlyThen) {
  TcpStoreServer server("127.0.0.1", 0, "");
  TcpStore watcher("127.0.0.1", server.port(), "", wait_for(seconds(5)));
  auto rank = std::make_unique<TcpStore>("127.0.0.1", server.port(), "", wait_for(seconds(5)));
  ASSERT_TRUE(rank->set_on_close("gone/1", "old", 3));
  ASSERT_TRUE(rank->set_on_close("gone/1", "rank 1 ended", 12));  // replaces the value
  ASSERT_TRUE(rank->set_on_close("cause", "rank 1 ended", 12));
  set_text(watcher, "cause", "rank 2 aborted");  // set first: the first cause stays
  ASSERT_TRUE(rank->set_on_close("taken back", "x", 1));
  EXPECT_TRUE(rank->cancel_on_close("taken back"));
  EXPECT_FALSE(rank->cancel_on_close("never registered"));
  // While its client lives nothing is set, and its other requests go on.
  set_text(*rank, "work", "done");
  EXPECT_EQ(text_of(watcher.get("work", wait_for(seconds(1)))), "done");
  EXPECT_EQ(watcher.wait({"gone/1"}, wait_for(milliseconds(0))).size(), 1u);
  rank.reset();  // its connections close, as at its process's end
  EXPECT_EQ(text_of(watcher.get("gone/1", wait_for(seconds(5)))), "rank 1 ended");
  EXPECT_EQ(text_of(watcher.get("cause", wait_for(seconds(1)))), "rank 2 aborted");
  EXPECT_EQ(watcher.wait({"taken back"}, wait_for(milliseconds(0))).size(), 1u);
}

TEST(TcpStore, WillOfAKilledProcessIsSetAndWakesAWaiter) {
  const std::string url = "tcp://127.0.0.1:" + std::to_string(free_port());
  auto host = open_store(url, 0, 2, wait_for(seconds(5)));
  // The store's host cannot leave one (its end is the store's), nor can a file store.
  EXPECT_FALSE(host->set_on_close("k", "v", 1));
  const std::string dir = make_temp_dir();
  EXPECT_FALSE(open_store("file://" + dir, 1, 2, wait_for(seconds(5)))->set_on_close("k", "v", 1));
  std::filesystem::remove_all(dir);

  // The rank forks a process of its own (a DataLoader worker), which outlives it: its copy of
  // the will's connection must not keep the connection open (it once did, so the will came
  // only when that process ended too).
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(ready[0]);
    try {
      auto store = make_prefix_store(open_store(url, 1, 2, wait_for(seconds(5))), "c/");
      const char will[] = "rank 1 was killed";
      if (store->set_on_close("failed", will, sizeof will - 1)) {
        const pid_t worker = fork();
        if (worker == 0) {
          for (;;) pause();
        }
        (void)!write(ready[1], &worker, sizeof worker);
        for (;;) pause();
      }
    } catch (...) {
    }
    _exit(1);
  }
  close(ready[1]);
  pid_t worker = -1;
  ASSERT_EQ(read(ready[0], &worker, sizeof worker), ssize_t(sizeof worker))
      << "the child could not leave its will";
  close(ready[0]);
  // A waiter parked on the key is answered when the child dies, well before its 20 s.
  std::thread killer([child] {
    std::this_thread::sleep_for(milliseconds(200));
    kill(child, SIGKILL);
  });
  std::string value;
  try {
    value = text_of(host->get("c/failed", wait_for(seconds(20))));
  } catch (const Error &e) {
    value = e.what();
  }
  killer.join();
  if (worker > 0) kill(worker, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_EQ(value, "rank 1 was killed");
}

TEST(TcpStore, GarbageClosesOnlyThatConnection) {
  TcpStoreServer server("127.0.0.1", 0, "");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(server.port());
  const std::vector<std::vector<uint8_t>> garbage = {
      {0xff, 0xff, 0xff, 0xff, 1},           // length over the limit
      {0, 0, 0, 1, 0x99},                    // unknown opcode
      {0, 0, 0, 0},                          // empty frame
      {'G', 'E', 'T', ' ', '/', '\r', '\n'}  // someone else's protocol
  };
  for (const auto &bytes : garbage) {
    net::UniqueFd fd;
    ASSERT_EQ(try_connect(reinterpret_cast<sockaddr *>(&address), sizeof address, &fd), 0);
    ASSERT_EQ(send(fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL), ssize_t(bytes.size()));
    char buffer[16];
    pollfd p{fd.get(), POLLIN, 0};
    ASSERT_EQ(poll(&p, 1, 5000), 1) << "the server did not close the connection";
    EXPECT_LE(recv(fd.get(), buffer, sizeof buffer, 0), 0);
  }
  // A request before HELLO is refused the same way, a truncated HELLO just waits.
  {
    net::UniqueFd fd;
    ASSERT_EQ(try_connect(reinterpret_cast<sockaddr *>(&address), sizeof address, &fd), 0);
    const auto frame = wire::encode_get("k", 0);
    ASSERT_EQ(send(fd.get(), frame.data(), frame.size(), MSG_NOSIGNAL), ssize_t(frame.size()));
    char buffer[16];
    EXPECT_LE(recv(fd.get(), buffer, sizeof buffer, 0), 0);
  }
  TcpStore client("127.0.0.1", server.port(), "", wait_for(seconds(5)));
  set_text(client, "still", "serving");
  EXPECT_EQ(text_of(client.get("still", wait_for(seconds(1)))), "serving");
}

// Another program on the store's port: each connection gets `reply` (after reading what the
// client sent first, if read_first), then is held open.
class OtherService {
 public:
  OtherService(std::string reply, bool read_first)
      : reply_(std::move(reply)), read_first_(read_first) {
    listener_ = bound_on_loopback(&port_, 16);
    thread_ = std::thread([this] { serve(); });
  }
  ~OtherService() {
    stop_ = true;
    thread_.join();
  }
  uint16_t port() const { return port_; }
  int connections() const { return connections_; }

 private:
  void serve() {
    std::vector<net::UniqueFd> held;
    while (!stop_) {
      pollfd p{listener_.get(), POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      net::UniqueFd fd(accept(listener_.get(), nullptr, nullptr));
      if (!fd) continue;
      ++connections_;
      if (read_first_) {
        char buffer[256];
        pollfd in{fd.get(), POLLIN, 0};
        if (poll(&in, 1, 5000) == 1) (void)recv(fd.get(), buffer, sizeof buffer, 0);
      }
      (void)send(fd.get(), reply_.data(), reply_.size(), MSG_NOSIGNAL);
      held.push_back(std::move(fd));
    }
  }

  std::string reply_;
  bool read_first_;
  net::UniqueFd listener_;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::thread thread_;
};

// An SSH server (it speaks first) or an HTTP server (it answers the HELLO with an error page) on
// the port: the first answer says so, rather than retrying until the timeout and then blaming
// the connection.
TEST(TcpStore, AnotherProgramOnThePortIsNamedAtOnce) {
  for (const bool ssh : {true, false}) {
    OtherService service(
        ssh ? "SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n" : "HTTP/1.1 400 Bad Request\r\n\r\n", !ssh);
    const std::string url = "tcp://127.0.0.1:" + std::to_string(service.port());
    const auto message =
        error_of([&] { open_store(url, 1, 2, wait_for(seconds(20))); }, MNCL_ERR_BOOTSTRAP);
    EXPECT_NE(message.find("the service at " + url + " is not an MNCL store (invalid reply: "),
              std::string::npos)
        << message;
    EXPECT_NE(message.find(ssh ? "\"SSH-2\"" : "\"HTTP/\""), std::string::npos) << message;
    EXPECT_EQ(message.find("kept closing"), std::string::npos) << message;
    EXPECT_EQ(service.connections(), 1) << "the client retried";
  }
}

// A program that accepts the connection and then waits for a request of its own protocol (an
// HTTP server waits for a line) answers nothing: the handshake's error names the address and
// the silence (a warning says so after 10 s, and it is retried until the timeout, here 2 s:
// a store's host stopped for a moment also answers nothing), where it used to say that the
// store "kept closing the connection".
TEST(TcpStore, AServiceThatAnswersNothingIsNamed) {
  OtherService service("", true);
  const std::string url = "tcp://127.0.0.1:" + std::to_string(service.port());
  const auto message =
      error_of([&] { open_store(url, 1, 2, wait_for(seconds(2))); }, MNCL_ERR_BOOTSTRAP);
  EXPECT_NE(message.find("the service at " + url +
                         " accepted the connection but did not answer MNCL's handshake"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("kept closing"), std::string::npos) << message;
  EXPECT_EQ(service.connections(), 1) << "the client retried";
}

// Whether every address host resolves to is a loopback one (and it resolves at all).
bool resolves_to_loopback_only(const std::string &host) {
  std::string error;
  const auto endpoints = net::resolve(host, 1, error);
  for (const auto &endpoint : endpoints) {
    const auto *address = reinterpret_cast<const sockaddr *>(&endpoint.address);
    if (address->sa_family != AF_INET ||
        (ntohl(reinterpret_cast<const sockaddr_in *>(address)->sin_addr.s_addr) >> 24) != 127) {
      return false;
    }
  }
  return !endpoints.empty();
}

// What open_store logs for rank 0 of a job of `size` on url.
std::string logged_by_rank_zero(const std::string &url, int size,
                                TcpListen listen = TcpListen::kNamedHost) {
  ::testing::internal::CaptureStderr();
  { auto host = open_store(url, 0, size, wait_for(seconds(5)), listen); }
  return ::testing::internal::GetCapturedStderr();
}

// MNCL_STORE=tcp://$(hostname):port where /etc/hosts maps the name to 127.0.1.1 (Debian): the
// store listens on loopback only, where no other host can reach it. Rank 0 says so, and binds
// as asked.
TEST(TcpStore, StoreOnLoopbackOnlyForSeveralRanksIsWarnedAbout) {
  if (log::level() < log::kWarn) GTEST_SKIP() << "warnings are not logged (MNCL_DEBUG)";
  {
    TcpStoreServer server("127.0.0.1", 0, "");
    EXPECT_TRUE(server.loopback_only());
    EXPECT_EQ(server.listening_on(), "127.0.0.1:" + std::to_string(server.port()));
  }
  // An address written as loopback (mncl-run's store), or a job of one rank: nothing to say.
  const std::string literal = "tcp://127.0.0.1:" + std::to_string(free_port());
  EXPECT_EQ(logged_by_rank_zero(literal, 2).find("cannot connect"), std::string::npos);

  char name[256] = "";
  ASSERT_EQ(gethostname(name, sizeof name - 1), 0);
  const std::string host = name;
  if (!resolves_to_loopback_only(host)) {
    GTEST_SKIP() << "this host's name (" << host << ") resolves to a non-loopback address";
  }
  const std::string url = "tcp://" + host + ":" + std::to_string(free_port());
  EXPECT_EQ(logged_by_rank_zero(url, 1).find("cannot connect"), std::string::npos);
  const std::string text = logged_by_rank_zero(url, 2);
  EXPECT_NE(text.find("WARN"), std::string::npos) << text;
  EXPECT_NE(text.find("listens only on loopback addresses"), std::string::npos) << text;
  EXPECT_NE(text.find("ranks on other hosts cannot connect"), std::string::npos) << text;
  EXPECT_NE(text.find("MNCL_STORE=tcp://<address>:"), std::string::npos) << text;
  EXPECT_NE(text.find("MASTER_ADDR"), std::string::npos) << text;
  // torchrun's MASTER_ADDR: the store listens on every address, so the other hosts reach it
  // whatever this host resolves the name to. Nothing to warn about.
  const std::string every = logged_by_rank_zero(url, 2, TcpListen::kEveryAddress);
  EXPECT_EQ(every.find("cannot connect"), std::string::npos) << every;
}

TEST(TcpStore, ValuesOfHundredsOfMegabytes) {
  // Generous bounds: under ThreadSanitizer on a loaded 2-core CI machine, moving 300 MB through
  // the server took more than 20 s (the bound is a hang guard, not a speed requirement).
  TcpStoreServer server("127.0.0.1", 0, "");
  TcpStore writer("127.0.0.1", server.port(), "", wait_for(seconds(180)));
  TcpStore reader("127.0.0.1", server.port(), "", wait_for(seconds(180)));
  Bytes value(300u << 20);
  for (size_t i = 0; i < value.size(); i += 4096) value[i] = static_cast<uint8_t>(i >> 12);
  value.back() = 0x5a;
  std::string set_error;
  std::thread set_later([&] {
    try {
      writer.set("big", value.data(), value.size());
    } catch (const std::exception &e) {
      set_error = e.what();  // reported below: an exception must not end the test process
    }
  });
  Bytes received;
  try {
    received = reader.get("big", wait_for(seconds(180)));
  } catch (const std::exception &e) {
    ADD_FAILURE() << "get: " << e.what();
  }
  set_later.join();
  EXPECT_EQ(set_error, "");
  EXPECT_TRUE(received == value);
}

TEST(TcpStore, ThreadsShareOneClient) {
  TcpStoreServer server("127.0.0.1", 0, "");
  TcpStore client("127.0.0.1", server.port(), "", wait_for(seconds(5)));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const std::string mine = "t" + std::to_string(t);
      const std::string next = "t" + std::to_string((t + 1) % 4);
      set_text(client, mine, mine);
      // Each waits for a key another thread sets, through the same connection.
      EXPECT_EQ(text_of(client.get(next, wait_for(seconds(20)))), next);
    });
  }
  for (auto &thread : threads) thread.join();
}

// ---------------------------------------------------------------------------------------------
// The TCP store a communicator starts (core/comm.cpp), for ranks in processes of their own.
// ---------------------------------------------------------------------------------------------

// Forks rank `rank` of a job of two on the naive backend, with `env` set over the caller's
// environment less every store and launcher variable; it creates one communicator, destroys
// it, and exits 0 if both succeeded.
pid_t start_rank(int rank, const std::vector<std::pair<std::string, std::string>> &env) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid != 0) return pid;
  int code = 0;
  try {
    for (const char *name : {"MNCL_STORE", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                             "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_USE_AGENT_STORE"}) {
      unsetenv(name);
    }
    setenv("MNCL_RANK", std::to_string(rank).c_str(), 1);
    setenv("MNCL_SIZE", "2", 1);
    setenv("MNCL_BACKEND", "naive", 1);
    for (const auto &[name, value] : env) setenv(name.c_str(), value.c_str(), 1);
    const auto comm = core::Comm::create(nullptr);
    comm->destroy();
  } catch (const std::exception &e) {
    fprintf(stderr, "rank %d: %s\n", rank, e.what());
    code = 1;
  }
  _exit(code);
}

// The exit code of a process start_rank forked, or -1 if it did not exit.
int exit_code(pid_t pid) {
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

// This host's name, where it resolves to loopback addresses only (as Debian's /etc/hosts maps
// it to 127.0.1.1); nullopt where it resolves to a network address too, or not at all.
std::optional<std::string> host_name_on_loopback() {
  char name[256] = "";
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return std::nullopt;
  addrinfo hints{}, *found = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(name, nullptr, &hints, &found) != 0) return std::nullopt;
  bool loopback_only = true;
  for (addrinfo *a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      const auto *v4 = reinterpret_cast<const sockaddr_in *>(a->ai_addr);
      loopback_only = loopback_only && (ntohl(v4->sin_addr.s_addr) >> 24) == 127;
    } else if (a->ai_family == AF_INET6) {
      const auto *v6 = reinterpret_cast<const sockaddr_in6 *>(a->ai_addr);
      loopback_only = loopback_only && IN6_IS_ADDR_LOOPBACK(&v6->sin6_addr);
    }
  }
  freeaddrinfo(found);
  if (!loopback_only) return std::nullopt;
  return std::string(name);
}

// Starts rank 0 with rank0_env, waits until its store answers at 127.0.0.1:port, checks
// whether it answers on this host's other address too, then lets rank 1 join with rank1_env.
void expect_master_store(const std::vector<std::pair<std::string, std::string>> &rank0_env,
                         const std::vector<std::pair<std::string, std::string>> &rank1_env,
                         uint16_t port, sockaddr_in other, bool answers_on_other) {
  const pid_t rank0 = start_rank(0, rank0_env);
  sockaddr_in loopback{};
  loopback.sin_family = AF_INET;
  loopback.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  loopback.sin_port = htons(port);
  bool up = false;  // once rank 0's store is up (the bound only keeps a failure from hanging)
  for (int i = 0; i < 3000 && !up; ++i) {
    up = try_connect(reinterpret_cast<sockaddr *>(&loopback), sizeof loopback) == 0;
    if (!up) std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_TRUE(up) << "rank 0's store never answered at 127.0.0.1:" << port;
  other.sin_port = htons(port);
  EXPECT_EQ(try_connect(reinterpret_cast<sockaddr *>(&other), sizeof other) == 0, answers_on_other)
      << "rank 0's store on " << numeric_host(other) << ":" << port;
  const pid_t rank1 = start_rank(1, rank1_env);
  EXPECT_EQ(exit_code(rank0), 0) << "rank 0 failed (its error is above)";
  EXPECT_EQ(exit_code(rank1), 0) << "rank 1 failed (its error is above)";
}

// torchrun's MASTER_ADDR=$(hostname), where rank 0's /etc/hosts maps the name to loopback only
// (127.0.1.1 on Debian) and the other hosts resolve it to its network address: the store
// listens on every address of rank 0's host, so that they can connect, as PyTorch's does.
TEST(CommStore, MasterAddrHostNameOnLoopbackIsServedOnEveryAddress) {
  const auto other = other_local_ipv4();
  if (!other) GTEST_SKIP() << "this machine has no IPv4 address besides 127.0.0.1";
  const auto name = host_name_on_loopback();
  if (!name) GTEST_SKIP() << "this host's name does not resolve to loopback addresses only";
  const uint16_t port = free_port();
  const std::string port_text = std::to_string(port);
  expect_master_store({{"MASTER_ADDR", *name}, {"MASTER_PORT", port_text}},
                      {{"MASTER_ADDR", numeric_host(*other)}, {"MASTER_PORT", port_text}}, port,
                      *other, true);
  // Every rank on this host (LOCAL_WORLD_SIZE = WORLD_SIZE): no other host needs the store.
  const uint16_t one_host_port = free_port();
  const std::string one_host = std::to_string(one_host_port);
  expect_master_store({{"MASTER_ADDR", *name}, {"MASTER_PORT", one_host}, {"MNCL_LOCAL_SIZE", "2"}},
                      {{"MASTER_ADDR", *name}, {"MASTER_PORT", one_host}, {"MNCL_LOCAL_SIZE", "2"}},
                      one_host_port, *other, false);
}

// MASTER_ADDR=127.0.0.1 (or localhost): one host, and the store stays off the network. The
// same for an address the user named (MNCL_STORE, over MASTER_ADDR; mncl-run's
// tcp://127.0.0.1:port).
TEST(CommStore, LoopbackMasterAddrAndNamedStoresListenOnlyWhereNamed) {
  const auto other = other_local_ipv4();
  if (!other) GTEST_SKIP() << "this machine has no IPv4 address besides 127.0.0.1";
  uint16_t port = free_port();
  std::string port_text = std::to_string(port);
  expect_master_store({{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port_text}},
                      {{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port_text}}, port, *other,
                      false);
  port = free_port();
  port_text = std::to_string(port);
  const std::string url = "tcp://127.0.0.1:" + port_text;
  expect_master_store(
      {{"MNCL_STORE", url}, {"MASTER_ADDR", numeric_host(*other)}, {"MASTER_PORT", port_text}},
      {{"MNCL_STORE", url}}, port, *other, false);
}

// A MASTER_ADDR that is no address of rank 0's host fails at once, naming it, instead of rank 0
// waiting out the timeout as a client of a store that is not there (or of another job's).
TEST(CommStore, MasterAddrOfAnotherHostFailsAtOnceOnRankZero) {
  const std::string url = "tcp://198.51.100.254:" + std::to_string(free_port());  // TEST-NET-2
  const std::string message = error_of(
      [&] {
        open_store(url, 0, 2, wait_for(seconds(60)),
                   TcpListen::kEveryAddressForAHostNameOnLoopback);
      },
      MNCL_ERR_BOOTSTRAP);
  EXPECT_NE(message.find("cannot listen on 198.51.100.254"), std::string::npos) << message;
}

// ---------------------------------------------------------------------------------------------
// The file store.
// ---------------------------------------------------------------------------------------------

TEST(FileStore, CreatesMissingDirectories) {
  const std::string root = make_temp_dir();
  const std::string dir = root + "/a/b/c";
  auto store = open_store("file://" + dir + "/", 0, 1, wait_for(seconds(1)));
  EXPECT_EQ(store->describe(), "file://" + dir);
  set_text(*store, "k", "v");
  EXPECT_TRUE(std::filesystem::is_directory(dir));
  std::filesystem::remove_all(root);
}

// A lock file someone holds and never releases (a stopped process, a stale NFS lock): add fails
// at the store's timeout naming the lock file, instead of blocking in flock() for ever. Run in a
// child that an alarm ends, so a hang fails this test instead of the whole suite.
TEST(FileStore, AddFailsAtTheTimeoutWhileTheLockIsHeld) {
  const std::string dir = make_temp_dir();
  const std::string lock_path = dir + "/.lock";
  run_in_children(1, [&](int) {
    alarm(120);
    net::UniqueFd holder(open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (!holder || flock(holder.get(), LOCK_EX) != 0) throw std::runtime_error("cannot lock");
    auto store = open_store("file://" + dir, 0, 2, wait_for(milliseconds(200)));
    try {
      store->add("counter", 1);
    } catch (const Error &e) {
      const std::string message = e.what();
      if (e.status() != MNCL_ERR_TIMEOUT || message.find(lock_path) == std::string::npos ||
          message.find("'counter'") == std::string::npos) {
        throw std::runtime_error("wrong error: " + message);
      }
      // Released, the lock is taken again.
      holder.reset();
      if (store->add("counter", 5) != 5) throw std::runtime_error("add after the release");
      return;
    }
    throw std::runtime_error("add succeeded while another descriptor held the lock");
  });
  std::filesystem::remove_all(dir);
}

TEST(FileStore, KeyFileNamesAreSafe) {
  EXPECT_EQ(key_file_name("w/join/2"), "k_w%2Fjoin%2F2");
  EXPECT_EQ(key_file_name(""), "k_");
  EXPECT_EQ(key_file_name(".."), "k_..");
  const std::string long_a = std::string(500, 'a') + "1";
  const std::string long_b = std::string(500, 'a') + "2";
  EXPECT_LE(key_file_name(long_a).size(), 200u);
  EXPECT_NE(key_file_name(long_a), key_file_name(long_b));
}

// The permission bits of path (lstat: a link's own).
mode_t mode_of(const std::string &path) {
  struct stat info {};
  EXPECT_EQ(lstat(path.c_str(), &info), 0) << path << ": " << std::strerror(errno);
  return info.st_mode & 07777;
}

// Sets the process's umask for a scope.
class UmaskFor {
 public:
  explicit UmaskFor(mode_t mask) : old_(umask(mask)) {}
  ~UmaskFor() { umask(old_); }

 private:
  mode_t old_;
};

// The keys name the job's hosts and processes: the folder the store makes is 0700 and its files
// 0600, even under umask 0. Parents are made as mkdir -p makes them.
TEST(FileStore, FolderAndFilesArePrivateWhateverTheUmask) {
  const std::string root = make_temp_dir();
  const std::string dir = root + "/parent/store";
  {
    UmaskFor permissive(0);
    auto store = open_store("file://" + dir, 0, 1, wait_for(seconds(1)));
    set_text(*store, "k", "v");
    EXPECT_EQ(store->add("counter", 2), 2);
  }
  EXPECT_EQ(mode_of(root + "/parent"), 0777u);
  EXPECT_EQ(mode_of(dir), 0700u);
  EXPECT_EQ(mode_of(dir + "/" + key_file_name("k")), 0600u);
  EXPECT_EQ(mode_of(dir + "/" + key_file_name("counter")), 0600u);
  EXPECT_EQ(mode_of(dir + "/.lock"), 0600u);
  std::filesystem::remove_all(root);
}

// A folder of this user's that it made itself (a rerun, a shared file system): its mode is left
// alone. Readable by others is not worth a word on every job's start; writable by others (they
// could plant keys) is warned about, once per folder and process.
TEST(FileStore, OwnFolderIsKeptAndWarnedAboutOnlyWhenOthersMayWriteToIt) {
  if (log::level() < log::kWarn) GTEST_SKIP() << "warnings are not logged (MNCL_DEBUG)";
  const std::string dir = make_temp_dir();
  ASSERT_EQ(chmod(dir.c_str(), 0755), 0);
  ::testing::internal::CaptureStderr();
  { set_text(*open_store("file://" + dir, 0, 1, wait_for(seconds(1))), "k", "v"); }
  std::string text = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(text.find("WARN"), std::string::npos) << text;
  EXPECT_EQ(mode_of(dir), 0755u);

  ASSERT_EQ(chmod(dir.c_str(), 0777), 0);
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 2; ++i) {
    auto store = open_store("file://" + dir, 0, 1, wait_for(seconds(1)));
    EXPECT_EQ(text_of(store->get("k", wait_for(seconds(1)))), "v");
  }
  text = ::testing::internal::GetCapturedStderr();
  const std::string warning = "file store: every user may write to '" + dir + "'";
  const size_t at = text.find(warning);
  EXPECT_NE(at, std::string::npos) << text;
  EXPECT_EQ(text.find(warning, at + 1), std::string::npos) << "warned twice: " << text;
  EXPECT_NE(text.find("mode 777"), std::string::npos) << text;
  std::filesystem::remove_all(dir);
}

// A store folder that is another user's symbolic link (planted under a name someone could guess)
// is refused: its maker would choose where the keys go. This user's own link to a folder of its
// own (scratch space linked from $HOME) is followed.
TEST(FileStore, FolderThatIsASymbolicLinkIsRefused) {
  const std::string real = make_temp_dir();
  const std::string link = real + "-link";
  ASSERT_EQ(symlink(real.c_str(), link.c_str()), 0);
  { set_text(*open_store("file://" + link, 0, 1, wait_for(seconds(1))), "k", "v"); }
  EXPECT_FALSE(std::filesystem::is_empty(real)) << "the key did not land in the link's folder";
  if (geteuid() == 0) {  // another user's link: lchown
    ASSERT_EQ(lchown(link.c_str(), 65534, 65534), 0);
    const std::string message = error_of(
        [&] { open_store("file://" + link, 0, 1, wait_for(seconds(1))); }, MNCL_ERR_BOOTSTRAP);
    EXPECT_NE(message.find("'" + link + "' is another user's symbolic link"), std::string::npos)
        << message;
    EXPECT_NE(message.find("to '" + real + "'"), std::string::npos) << message;
    EXPECT_NE(message.find("use a folder of your own"), std::string::npos) << message;
  }
  // Refused a dangling link too, with nothing created where it points.
  const std::string missing = real + "/missing";
  ASSERT_EQ(unlink(link.c_str()), 0);
  ASSERT_EQ(symlink(missing.c_str(), link.c_str()), 0);
  error_of([&] { open_store("file://" + link, 0, 1, wait_for(seconds(1))); }, MNCL_ERR_BOOTSTRAP);
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(missing)));
  unlink(link.c_str());
  std::filesystem::remove_all(real);
}

// Another user made the folder first and anyone may write to it (0777): anyone could read or
// plant the job's keys, so it is refused. Another user's folder that only its owner (root's
// folders on an NFS export that maps root to nobody) or its group (a setgid project folder) may
// write to is kept. Root only (chown).
TEST(FileStore, AnotherUsersFolderThatOthersMayWriteToIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root, to give a folder to uid 65534";
  const std::string dir = make_temp_dir();
  ASSERT_EQ(chown(dir.c_str(), 65534, 65534), 0);
  for (const mode_t mode : {0777, 0757, 01777}) {
    ASSERT_EQ(chmod(dir.c_str(), mode), 0);
    const std::string message = error_of(
        [&] { open_store("file://" + dir, 0, 1, wait_for(seconds(1))); }, MNCL_ERR_BOOTSTRAP);
    EXPECT_NE(message.find("'" + dir + "' belongs to uid 65534"), std::string::npos) << message;
    EXPECT_NE(message.find("every user may write"), std::string::npos) << message;
    EXPECT_NE(message.find("use a folder of your own"), std::string::npos) << message;
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  // Writable by its owner, or its group (a setgid project folder): kept.
  for (const mode_t mode : {0755, 02775}) {
    ASSERT_EQ(chmod(dir.c_str(), mode), 0);
    { set_text(*open_store("file://" + dir, 0, 1, wait_for(seconds(1))), "k", "v"); }
  }
  std::filesystem::remove_all(dir);
}

// A .lock planted as a symbolic link: add() fails naming it, and neither creates nor writes
// the file it points to (root's, say, when root runs the job).
TEST(FileStore, LockFileThatIsASymbolicLinkIsRefusedNotFollowed) {
  const std::string dir = make_temp_dir();
  const std::string elsewhere = make_temp_dir();
  const std::string target = elsewhere + "/created-through-the-link";
  const std::string lock_path = dir + "/.lock";
  ASSERT_EQ(symlink(target.c_str(), lock_path.c_str()), 0);
  auto store = open_store("file://" + dir, 0, 1, wait_for(seconds(1)));
  const std::string message = error_of([&] { store->add("counter", 1); }, MNCL_ERR_BOOTSTRAP);
  EXPECT_NE(message.find("'" + lock_path + "' is a symbolic link"), std::string::npos) << message;
  EXPECT_FALSE(std::filesystem::exists(target));
  // Nor is an existing file it points to touched.
  { std::ofstream(target) << "mine"; }
  const mode_t before = mode_of(target);
  error_of([&] { store->add("counter", 1); }, MNCL_ERR_BOOTSTRAP);
  EXPECT_EQ(mode_of(target), before);
  std::string content;
  std::getline(std::ifstream(target), content);
  EXPECT_EQ(content, "mine");
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(elsewhere);
}

// A key file planted as a symbolic link is not read through (get would hand the job another
// file's content) but is refused naming it; set replaces the link, not the file it points to.
TEST(FileStore, KeyFileThatIsASymbolicLinkIsRefusedNotFollowed) {
  const std::string dir = make_temp_dir();
  const std::string elsewhere = make_temp_dir();
  const std::string secret = elsewhere + "/secret";
  { std::ofstream(secret) << "7"; }
  const std::string key_path = dir + "/" + key_file_name("w/claim/1");
  ASSERT_EQ(symlink(secret.c_str(), key_path.c_str()), 0);
  auto store = open_store("file://" + dir, 0, 1, wait_for(seconds(1)));
  std::string message =
      error_of([&] { store->get("w/claim/1", wait_for(seconds(1))); }, MNCL_ERR_BOOTSTRAP);
  EXPECT_NE(message.find("'" + key_path + "' is a symbolic link"), std::string::npos) << message;
  EXPECT_NE(message.find("use a folder only you can write to"), std::string::npos) << message;
  message = error_of([&] { store->add("w/claim/1", 1); }, MNCL_ERR_BOOTSTRAP);
  EXPECT_NE(message.find("'" + key_path + "' is a symbolic link"), std::string::npos) << message;
  set_text(*store, "w/claim/1", "1");
  EXPECT_EQ(text_of(store->get("w/claim/1", wait_for(seconds(1)))), "1");
  std::string content;
  std::getline(std::ifstream(secret), content);
  EXPECT_EQ(content, "7");
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(elsewhere);
}

// A FIFO planted as a key file would block open() for ever: it is refused at once instead. In a
// child that an alarm ends, so a hang fails this test instead of the whole suite.
TEST(FileStore, KeyFileThatIsAFifoIsRefusedAtOnce) {
  const std::string dir = make_temp_dir();
  const std::string key_path = dir + "/" + key_file_name("k");
  ASSERT_EQ(mkfifo(key_path.c_str(), 0666), 0);
  run_in_children(1, [&](int) {
    alarm(20);
    auto store = open_store("file://" + dir, 0, 1, wait_for(seconds(1)));
    try {
      store->get("k", wait_for(seconds(1)));
    } catch (const Error &e) {
      const std::string message = e.what();
      if (e.status() != MNCL_ERR_BOOTSTRAP ||
          message.find("'" + key_path + "' is not a regular file") == std::string::npos) {
        throw std::runtime_error("wrong error: " + message);
      }
      return;
    }
    throw std::runtime_error("a FIFO was read as a key");
  });
  std::filesystem::remove_all(dir);
}

// ---------------------------------------------------------------------------------------------
// The wire protocol's parser.
// ---------------------------------------------------------------------------------------------

wire::ParseResult parse(const std::vector<uint8_t> &bytes) {
  return wire::parse_frame(bytes.data(), bytes.size());
}

TEST(Wire, OversizeLengthIsRejectedBeforeTheBodyArrives) {
  // 1 GiB + 1: just over the limit.
  auto result = parse({0x40, 0x00, 0x00, 0x01});
  EXPECT_EQ(result.status, wire::ParseStatus::kInvalid);
  EXPECT_NE(result.error.find("length"), std::string::npos);
  EXPECT_EQ(parse({0xff, 0xff, 0xff, 0xff, 2}).status, wire::ParseStatus::kInvalid);
  EXPECT_EQ(parse({0, 0, 0, 0}).status, wire::ParseStatus::kInvalid);
  // Exactly 1 GiB is allowed: more bytes are needed, and no allocation happened.
  result = parse({0x40, 0x00, 0x00, 0x00, 2});
  EXPECT_EQ(result.status, wire::ParseStatus::kNeedMore);
  EXPECT_EQ(result.frame_size, wire::kMaxFrameBytes + 4);
}

TEST(Wire, TruncatedFramesNeedMore) {
  auto frame = wire::encode_set_head("key", 5);
  for (const char ch : std::string("value")) frame.push_back(static_cast<uint8_t>(ch));
  for (size_t size = 0; size < frame.size(); ++size) {
    const auto result = wire::parse_frame(frame.data(), size);
    EXPECT_EQ(result.status, wire::ParseStatus::kNeedMore) << "at " << size << " bytes";
    EXPECT_EQ(result.frame_size, size >= 4 ? frame.size() : 0u);
  }
  const auto result = parse(frame);
  ASSERT_EQ(result.status, wire::ParseStatus::kComplete);
  EXPECT_EQ(result.frame_size, frame.size());
  EXPECT_EQ(result.message.op, wire::Op::kSet);
  EXPECT_EQ(result.message.text, "key");
  EXPECT_EQ(result.message.value, "value");
}

TEST(Wire, GarbageOpcodeIsRejected) {
  for (const uint8_t op : {0, 10, 63, 72, 255}) {
    const auto result = parse({0, 0, 0, 1, op});
    EXPECT_EQ(result.status, wire::ParseStatus::kInvalid) << int(op);
    EXPECT_NE(result.error.find("opcode"), std::string::npos);
  }
}

TEST(Wire, MalformedBodiesAreRejected) {
  // INTEGER with 3 of its 8 bytes.
  EXPECT_EQ(parse({0, 0, 0, 4, 67, 1, 2, 3}).status, wire::ParseStatus::kInvalid);
  // ERASE_PREFIX of the empty prefix (every key of the store).
  EXPECT_EQ(parse({0, 0, 0, 1, 9}).status, wire::ParseStatus::kInvalid);
  // BOOL that is neither 0 nor 1.
  EXPECT_EQ(parse({0, 0, 0, 2, 69, 2}).status, wire::ParseStatus::kInvalid);
  // OK with a body it should not have.
  EXPECT_EQ(parse({0, 0, 0, 2, 64, 0}).status, wire::ParseStatus::kInvalid);
  // WAIT announcing 2^32-1 keys in a 9-byte body.
  EXPECT_EQ(parse({0, 0, 0, 9, 5, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff}).status,
            wire::ParseStatus::kInvalid);
  // SET whose key length runs past the frame.
  EXPECT_EQ(parse({0, 0, 0, 6, 2, 0, 0, 0, 9, 'k'}).status, wire::ParseStatus::kInvalid);
}

// A WAIT of empty keys costs the server dozens of bytes per 4 bytes of frame: the count is
// capped, and checked as soon as it arrives, not after the keys (up to 1 GiB) were buffered.
TEST(Wire, WaitKeyCountIsCheckedBeforeTheKeysArrive) {
  // The start of a frame: length, opcode, then u32 fields.
  const auto header = [](uint32_t length, uint8_t op, const std::vector<uint32_t> &fields) {
    std::vector<uint8_t> bytes;
    const auto put = [&](uint32_t v) {
      for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(uint8_t(v >> shift));
    };
    put(length);
    bytes.push_back(op);
    for (const uint32_t v : fields) put(v);
    return bytes;
  };
  const uint32_t over = wire::kMaxWaitKeys + 1;
  // WAIT (wait_ms, count) and MISSING (count) naming one key too many, in a frame big enough.
  for (const auto &bytes :
       {header(1 + 8 + 4 * over, 5, {0, over}), header(1 + 4 + 4 * over, 68, {over})}) {
    const auto result = parse(bytes);
    EXPECT_EQ(result.status, wire::ParseStatus::kInvalid);
    EXPECT_NE(result.error.find("keys"), std::string::npos) << result.error;
  }
  // A count its frame cannot hold (4 bytes a key at least) is refused just as early.
  EXPECT_EQ(parse(header(1 + 8 + 4 * 9, 5, {0, 10})).status, wire::ParseStatus::kInvalid);
  EXPECT_EQ(parse(header(1 + 8 + 4 * 10, 5, {0, 10})).status, wire::ParseStatus::kNeedMore);
  // The limit itself is allowed; the encoders refuse more.
  const std::vector<std::string> most(wire::kMaxWaitKeys, "k");
  const auto frame = wire::encode_wait(most, 0);
  const auto result = parse(frame);
  ASSERT_EQ(result.status, wire::ParseStatus::kComplete);
  EXPECT_EQ(result.message.keys.size(), wire::kMaxWaitKeys);
  std::vector<std::string> too_many = most;
  too_many.push_back("k");
  error_of([&] { wire::encode_wait(too_many, 0); }, MNCL_ERR_INVALID_ARGUMENT);
}

TEST(Wire, EncodersRoundTrip) {
  // The parsed message points into the frame, so each frame is kept alive while it is checked.
  const std::vector<std::string> keys = {"a", "", "w/join/2"};
  const auto wait = wire::encode_wait(keys, 42);
  auto result = parse(wait);
  ASSERT_EQ(result.status, wire::ParseStatus::kComplete);
  EXPECT_EQ(result.message.op, wire::Op::kWait);
  EXPECT_EQ(result.message.wait_ms, 42u);
  ASSERT_EQ(result.message.keys.size(), 3u);
  EXPECT_EQ(result.message.keys[2], "w/join/2");

  const auto add = wire::encode_add("n", -7);
  result = parse(add);
  ASSERT_EQ(result.status, wire::ParseStatus::kComplete);
  EXPECT_EQ(result.message.integer, -7);
  EXPECT_EQ(result.message.text, "n");

  const auto hello = wire::encode_hello("tok");
  result = parse(hello);
  ASSERT_EQ(result.status, wire::ParseStatus::kComplete);
  EXPECT_EQ(result.message.version, wire::kProtocolVersion);
  EXPECT_EQ(result.message.text, "tok");

  const auto missing = wire::encode_missing({"x"});
  result = parse(missing);
  ASSERT_EQ(result.status, wire::ParseStatus::kComplete);
  EXPECT_EQ(result.message.keys, std::vector<std::string_view>{"x"});

  const auto flag = wire::encode_bool(true);
  result = parse(flag);
  ASSERT_EQ(result.status, wire::ParseStatus::kComplete);
  EXPECT_TRUE(result.message.flag);

  auto will = wire::encode_set_on_close_head("failed/1", 4);
  for (const char c : std::string("gone")) will.push_back(static_cast<uint8_t>(c));
  result = parse(will);
  ASSERT_EQ(result.status, wire::ParseStatus::kComplete);
  EXPECT_EQ(result.message.op, wire::Op::kSetOnClose);
  EXPECT_EQ(result.message.text, "failed/1");
  EXPECT_EQ(result.message.value, "gone");
  EXPECT_TRUE(wire::is_request(wire::Op::kSetOnClose));

  // Requests that carry one key (or prefix) only.
  const auto expect_key_request = [](const std::vector<uint8_t> &frame, wire::Op op,
                                     std::string_view text) {
    const auto parsed = parse(frame);
    ASSERT_EQ(parsed.status, wire::ParseStatus::kComplete) << wire::op_name(op);
    EXPECT_EQ(parsed.message.op, op);
    EXPECT_EQ(parsed.message.text, text);
    EXPECT_TRUE(wire::is_request(op));
  };
  expect_key_request(wire::encode_cancel_on_close("failed/1"), wire::Op::kCancelOnClose,
                     "failed/1");
  expect_key_request(wire::encode_erase_prefix("w.s0.0/"), wire::Op::kErasePrefix, "w.s0.0/");

  // Two frames back to back: the first is parsed, its size says where the second starts.
  auto two = wire::encode_ok();
  const auto second = wire::encode_erase("k");
  two.insert(two.end(), second.begin(), second.end());
  result = parse(two);
  ASSERT_EQ(result.status, wire::ParseStatus::kComplete);
  EXPECT_EQ(result.frame_size, 5u);
  result = wire::parse_frame(two.data() + 5, two.size() - 5);
  ASSERT_EQ(result.status, wire::ParseStatus::kComplete);
  EXPECT_EQ(result.message.op, wire::Op::kErase);
  EXPECT_EQ(result.message.text, "k");
}

TEST(Wire, EncodersRefuseOversizeValues) {
  error_of([] { wire::encode_set_head("k", wire::kMaxFrameBytes); }, MNCL_ERR_INVALID_ARGUMENT);
}

TEST(Wire, RandomBytesNeverCrashTheParser) {
  std::mt19937 random(1234);
  std::vector<uint8_t> bytes;
  for (int round = 0; round < 20000; ++round) {
    bytes.resize(random() % 40);
    for (auto &byte : bytes) byte = static_cast<uint8_t>(random());
    // Plausible lengths, so bodies get decoded and not just rejected by the length check.
    if (bytes.size() >= 4) {
      bytes[0] = bytes[1] = bytes[2] = 0;
      bytes[3] = static_cast<uint8_t>(bytes.size() - 4 + (random() % 3));
    }
    const auto result = wire::parse_frame(bytes.data(), bytes.size());
    if (result.status == wire::ParseStatus::kComplete) {
      EXPECT_LE(result.frame_size, bytes.size());
    }
  }
}

}  // namespace
}  // namespace mncl::bootstrap
