// The bootstrap key-value store: how ranks find each other before any backend exists.
//
//   tcp://host:port  — TcpStore: rank 0 listens on host:port (that address only, or every address
//                      of its host: TcpListen) and every rank, rank 0 included, connects to it as
//                      a client.
//   file:///dir      — FileStore: one file per key in a shared directory (NFS, Lustre, /tmp).
//
// All methods are thread-safe and throw mncl::Error on failure: MNCL_ERR_TIMEOUT (naming the
// key(s) not found), MNCL_ERR_ABORTED (the abort flag was raised while waiting),
// MNCL_ERR_REMOTE (connection to the store lost), MNCL_ERR_BOOTSTRAP (cannot reach or start it).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mncl::bootstrap {

using Bytes = std::vector<uint8_t>;

struct WaitOptions {
  std::chrono::milliseconds timeout{300000};
  // When non-null and raised, a waiting call throws MNCL_ERR_ABORTED within ~50 ms.
  const std::atomic<bool> *aborted = nullptr;
};

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string &key, const void *data, size_t len) = 0;
  // Waits for key; throws MNCL_ERR_TIMEOUT "store key 'k' not set within 3.0 s".
  virtual Bytes get(const std::string &key, const WaitOptions &opts) = 0;
  // Atomic add on a decimal integer value (absent = 0); returns the new value.
  virtual int64_t add(const std::string &key, int64_t delta) = 0;
  // Waits until every key exists. Returns the keys still missing at the deadline (empty on
  // success) instead of throwing, so callers can name the ranks behind them; still throws on
  // abort or a lost connection.
  virtual std::vector<std::string> wait(const std::vector<std::string> &keys,
                                        const WaitOptions &opts) = 0;
  // Deletes key; returns whether it existed.
  virtual bool erase(const std::string &key) = 0;
  // Deletes every key that begins with prefix (non-empty, else MNCL_ERR_INVALID_ARGUMENT);
  // returns how many. A file store passes over keys whose file names were shortened (keys of
  // some 200 bytes and more) where the prefix is longer than the part of the name kept.
  virtual size_t erase_prefix(const std::string &prefix) = 0;
  // "tcp://127.0.0.1:29500" or "file:///shared/dir", for messages.
  virtual std::string describe() const = 0;
  // On the rank hosting a TCP store: accept no new connections (existing ones keep working).
  // Called when that rank starts tearing the job's store down. A no-op for other stores.
  virtual void stop_accepting() {}
  // A last will: if this process ends (exits, is killed) or loses the store before
  // cancel_on_close(key), the store sets key to value, unless key is set by then. How the
  // other ranks learn that a rank's process is gone wherever it ran, within a moment of its
  // end. Registering key again replaces its value. False where the store cannot watch its
  // clients (a file store, a memory store, the TCP store's own host, whose end ends the
  // store, a TCP client that could not open or lost the connection that carries it): nothing
  // is registered then. Throws like set() otherwise.
  virtual bool set_on_close(const std::string & /*key*/, const void * /*data*/, size_t /*len*/) {
    return false;
  }
  // Takes set_on_close(key) back; false if it was not registered (or the store cannot).
  virtual bool cancel_on_close(const std::string & /*key*/) { return false; }
};

// Where rank 0's TCP store server listens; the clients connect to the url's host either way.
enum class TcpListen {
  // On each address the url's host resolves to on rank 0, and only there: an address the user
  // named (MNCL_STORE, mncl-run's tcp://127.0.0.1:port) is kept to, so a store meant for this
  // host alone is not offered to the network.
  kNamedHost,
  // On every address of rank 0's host (the wildcard "::", dual-stack, or 0.0.0.0 where IPv6 is
  // unavailable), on the url's port, as PyTorch's TCPStore does.
  kEveryAddress,
  // torchrun's MASTER_ADDR (open_store only): kNamedHost, except where the name resolves to
  // loopback addresses only on rank 0's host though it names no loopback address (its host
  // name, which Debian's /etc/hosts maps to 127.0.1.1): there the other hosts, which resolve
  // it to the host's network address, could not connect, so the store listens on every address
  // instead. MASTER_ADDR=127.0.0.1 or localhost stays on loopback; an address that is not this
  // host's fails at once.
  kEveryAddressForAHostNameOnLoopback,
};

// Throws MNCL_ERR_INVALID_ARGUMENT ("invalid store url ...", after "<origin>: " when given)
// unless url has one of the accepted forms; opens nothing.
void check_store_url(const std::string &url, const char *origin = nullptr);
// Opens the store named by url for a rank of a job of `size` ranks. For tcp://, rank 0 starts
// the server (listening as `listen` says) before connecting. Clients retry the connection until
// opts.timeout; failing that, MNCL_ERR_BOOTSTRAP names the address and that rank 0 never came
// up; another program on the port fails at once ("not an MNCL store"). Rank 0 of a job of
// several ranks warns when its server listens on loopback addresses only, from a host name that
// resolves to them (no other host could connect), unless it listens on every address instead
// (kEveryAddressForAHostNameOnLoopback; warned about without MNCL_STORE_TOKEN). A file
// store's add() waits for its lock at most opts.timeout. Throws MNCL_ERR_INVALID_ARGUMENT for a
// malformed url.
// A TCP store admits the clients that present its token: MNCL_STORE_TOKEN, else `job_token`
// (the launcher's id of the job, LaunchSettings::job_token), else any.
std::shared_ptr<Store> open_store(const std::string &url, int rank, int size,
                                  const WaitOptions &opts, TcpListen listen = TcpListen::kNamedHost,
                                  const std::string &job_token = std::string());

// A view of another store with every key prefixed ("w/" + key). Shares the underlying store.
std::shared_ptr<Store> make_prefix_store(std::shared_ptr<Store> base, const std::string &prefix);

}  // namespace mncl::bootstrap
