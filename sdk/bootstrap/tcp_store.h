// The TCP store: a single-threaded server that rank 0 hosts, and a client every rank uses.
// open_store() (store.h) is the usual way in; these classes are exposed for tests and tools.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "bootstrap/net.h"
#include "bootstrap/store.h"

namespace mncl::bootstrap {

// Serves the store on every address host resolves to (never a wildcard unless host is one), or
// with TcpListen::kEveryAddress on the wildcard address, from one thread that poll()s the
// listening sockets, the clients and a shutdown eventfd.
// Waiting GETs and WAITs are parked and answered as soon as their keys are set, or with "not
// yet" when their slice (at most wire::kMaxWaitSliceMs) runs out.
// Limits: a connection that has not sent HELLO within 5 s is closed (and, past 1024 of them, the
// oldest makes room for a new one); a client's replies are queued up to 16 MiB or 4096 of them,
// then its requests are not read until it reads the replies; a WAIT names at most
// wire::kMaxWaitKeys keys, none empty. The constructor raises the process's soft descriptor
// limit (RLIMIT_NOFILE) to the hard one, as every rank holds a connection; if descriptors still
// run out, accepting pauses for 100 ms at a time.
class TcpStoreServer {
 public:
  // Binds and starts the thread. port 0 picks a free port (see port()). A non-empty token is
  // required from every client. Throws MNCL_ERR_BOOTSTRAP naming the address if it cannot bind
  // ("Address already in use" where another process listens on the port: for kEveryAddress, on
  // any address of this host). host names the store in messages (and is resolved only to check
  // that it resolves, with kEveryAddress).
  TcpStoreServer(const std::string &host, uint16_t port, std::string token,
                 TcpListen listen = TcpListen::kNamedHost);
  // Stops the thread and closes every socket; clients see MNCL_ERR_REMOTE on their next call.
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer &) = delete;
  TcpStoreServer &operator=(const TcpStoreServer &) = delete;

  uint16_t port() const;
  // Whether every address it listens on is a loopback one (127.0.0.0/8, ::1): no other host
  // can connect. A host name does that where /etc/hosts maps it to 127.0.1.1 (Debian, Ubuntu),
  // with kNamedHost; never with kEveryAddress.
  bool loopback_only() const;
  // The addresses it listens on, for messages: "127.0.1.1:29500, [::1]:29500", or "[::]:29500"
  // (every address).
  std::string listening_on() const;
  // Closes the listening sockets; connected clients keep being served. Used when the job's
  // last communicator on rank 0 is being destroyed, so that a rank that already re-creates one
  // on the same address waits for the next server instead of joining this dying one.
  void stop_accepting();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  bool registered_ = false;  // among this process's serving addresses (under their mutex)
};

// A client of a TcpStoreServer, thread-safe. Each request runs on a connection of its own for
// its whole length: an idle one from a small pool, or a new one when every pooled connection is
// busy (the pool grows to the number of threads that ever had requests in flight at once). So a
// thread parked in a waiting GET — a receive waiting for its message — never delays another
// thread's SET, which might be the very contribution everybody waits for.
class TcpStore final : public Store {
 public:
  // Connects to host:port, retrying (10 ms doubling to 200 ms) until opts.timeout, then sends
  // HELLO with token. An answer that is no frame of the protocol (another program on the port:
  // an SSH banner, an HTTP error) fails at once with MNCL_ERR_BOOTSTRAP "the service at ... is
  // not an MNCL store". server, if given, is kept alive as long as this object (rank 0's case).
  // opts.timeout also bounds any later wait for the server to make progress on a request.
  TcpStore(const std::string &host, uint16_t port, const std::string &token,
           const WaitOptions &opts, std::shared_ptr<TcpStoreServer> server = nullptr);
  ~TcpStore() override;

  void set(const std::string &key, const void *data, size_t len) override;
  Bytes get(const std::string &key, const WaitOptions &opts) override;
  int64_t add(const std::string &key, int64_t delta) override;
  // Throws MNCL_ERR_INVALID_ARGUMENT for an empty key or more than wire::kMaxWaitKeys keys.
  std::vector<std::string> wait(const std::vector<std::string> &keys,
                                const WaitOptions &opts) override;
  bool erase(const std::string &key) override;
  size_t erase_prefix(const std::string &prefix) override;
  std::string describe() const override { return url_; }
  void stop_accepting() override {
    if (server_) server_->stop_accepting();
  }
  // On a connection of its own, opened with the first and held open (idle) until this object
  // goes: the server acts when that connection ends. False on the store's own host (server
  // given), whose end is the store's, or where that connection could not be opened or was lost.
  bool set_on_close(const std::string &key, const void *data, size_t len) override;
  bool cancel_on_close(const std::string &key) override;

  // Connections opened so far (for tests): 1 until requests overlapped.
  size_t connections_opened() const;

 private:
  struct Reply;
  class Lease;
  // Sends head (then value_size bytes at value) on socket and reads the reply.
  Reply call(net::UniqueFd &socket, const std::vector<uint8_t> &head, const void *value = nullptr,
             size_t value_size = 0);
  // Takes an idle connection, or opens one; throws if the store was lost.
  net::UniqueFd acquire();
  // call() on will_socket_ (will_mutex_ held), with the process's fork guard: see
  // will_fds_mutex in tcp_store.cpp.
  Reply call_will(const std::vector<uint8_t> &head, const void *value = nullptr,
                  size_t value_size = 0);
  // A new connection for the pool (counted in connections_opened).
  net::UniqueFd open_connection();
  // Connects and says HELLO (retrying a closed handshake until the I/O timeout).
  net::UniqueFd connect_and_greet();
  void release(net::UniqueFd socket);
  void receive_all(net::UniqueFd &socket, void *data, size_t size);
  [[noreturn]] void fail_connection(net::UniqueFd &socket, const std::string &why);
  // A reply that breaks the protocol (header: its first bytes): during the handshake, throws
  // MNCL_ERR_BOOTSTRAP "the service at ... is not an MNCL store", not retried; else as
  // fail_connection.
  [[noreturn]] void invalid_reply(net::UniqueFd &socket, const std::string &why,
                                  const uint8_t (&header)[5]);
  net::UniqueFd connect_with_retry(const WaitOptions &opts);
  // false if the connection was lost before an answer, or none came within 10 s or by
  // deadline (retryable, warned about once); throws if refused.
  bool handshake(net::UniqueFd &socket, std::chrono::steady_clock::time_point deadline);
  // What a handshake met with silence says (the warning, and the final error).
  std::string silence_text() const;

  // Declared first so it is destroyed last: rank 0's own client disconnects before its server.
  std::shared_ptr<TcpStoreServer> server_;
  std::string host_;
  uint16_t port_;
  std::string token_;
  std::string url_;
  std::chrono::milliseconds io_timeout_;
  std::atomic<bool> warned_silence_{false};
  mutable std::mutex mutex_;         // guards the three below
  std::vector<net::UniqueFd> idle_;  // connected, authenticated, no request in flight
  size_t opened_ = 0;
  std::string broken_;  // why a connection was lost; every later call fails with it
  // The connection that carries the last wills (set_on_close), never pooled: opened by the
  // constructor (clients only), closed with this object or when a call on it fails.
  std::mutex will_mutex_;
  net::UniqueFd will_socket_;
};

}  // namespace mncl::bootstrap
