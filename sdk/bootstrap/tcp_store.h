// The TCP store: a single-threaded server that rank 0 hosts, and a client every rank uses.
// open_store() (store.h) is the usual way in; these classes are exposed for tests and tools.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "bootstrap/net.h"
#include "bootstrap/store.h"

namespace mncl::bootstrap {

// Serves the store on every address host resolves to (never a wildcard unless host is one),
// from one thread that poll()s the listening sockets, the clients and a shutdown eventfd.
// Waiting GETs and WAITs are parked and answered as soon as their keys are set, or with "not
// yet" when their slice (at most wire::kMaxWaitSliceMs) runs out.
class TcpStoreServer {
 public:
  // Binds and starts the thread. port 0 picks a free port (see port()). A non-empty token is
  // required from every client. Throws MNCL_ERR_BOOTSTRAP naming the address if it cannot bind.
  TcpStoreServer(const std::string &host, uint16_t port, std::string token);
  // Stops the thread and closes every socket; clients see MNCL_ERR_REMOTE on their next call.
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer &) = delete;
  TcpStoreServer &operator=(const TcpStoreServer &) = delete;

  uint16_t port() const;
  // Closes the listening sockets; connected clients keep being served. Used when the job's
  // last communicator on rank 0 is being destroyed, so that a rank that already re-creates one
  // on the same address waits for the next server instead of joining this dying one.
  void stop_accepting();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A client connection to a TcpStoreServer. One connection per object, used under a mutex, so
// the object is thread-safe and requests from several threads are served one at a time.
class TcpStore final : public Store {
 public:
  // Connects to host:port, retrying (10 ms doubling to 200 ms) until opts.timeout, then sends
  // HELLO with token. server, if given, is kept alive as long as this object (rank 0's case).
  // opts.timeout also bounds any later wait for the server to make progress on a request.
  TcpStore(const std::string &host, uint16_t port, const std::string &token,
           const WaitOptions &opts, std::shared_ptr<TcpStoreServer> server = nullptr);
  ~TcpStore() override;

  void set(const std::string &key, const void *data, size_t len) override;
  Bytes get(const std::string &key, const WaitOptions &opts) override;
  int64_t add(const std::string &key, int64_t delta) override;
  std::vector<std::string> wait(const std::vector<std::string> &keys,
                                const WaitOptions &opts) override;
  bool erase(const std::string &key) override;
  std::string describe() const override { return url_; }
  void stop_accepting() override {
    if (server_) server_->stop_accepting();
  }

 private:
  struct Reply;
  // Sends head (then value_size bytes at value) and reads the reply. Caller holds mutex_.
  Reply call(const std::vector<uint8_t> &head, const void *value = nullptr, size_t value_size = 0);
  void send_all(const void *data, size_t size);
  void receive_all(void *data, size_t size);
  [[noreturn]] void fail_connection(const std::string &why);
  void connect_with_retry(const std::string &host, uint16_t port, const WaitOptions &opts);
  // false if the connection was lost before an answer (retryable); throws if refused.
  bool handshake(const std::string &token);

  // Declared first so it is destroyed last: rank 0's own client disconnects before its server.
  std::shared_ptr<TcpStoreServer> server_;
  std::string url_;
  std::chrono::milliseconds io_timeout_;
  std::mutex mutex_;
  net::UniqueFd socket_;
  std::string broken_;  // why the connection was lost; every later call fails with it
};

}  // namespace mncl::bootstrap
