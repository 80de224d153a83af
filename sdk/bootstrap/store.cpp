// open_store(): url parsing and the choice of store; make_prefix_store().
#include "bootstrap/store.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>

#include "bootstrap/file_store.h"
#include "bootstrap/net.h"
#include "bootstrap/tcp_store.h"
#include "common/env.h"
#include "common/error.h"
#include "common/log.h"

namespace mncl::bootstrap {

namespace {

constexpr const char *kAcceptedForms =
    "expected tcp://host:port, tcp://[ipv6-address]:port (port 1..65535) or file:///absolute/dir";

[[noreturn]] void bad_url(const std::string &url, const char *why) {
  throw Error(MNCL_ERR_INVALID_ARGUMENT,
              format("invalid store url '%s': %s; %s", url.c_str(), why, kAcceptedForms));
}

bool starts_with(const std::string &text, const char *prefix) {
  return text.rfind(prefix, 0) == 0;
}

// A host that says outright it is this host only: a loopback address written as one
// (127.0.0.1, ::1; mncl-run's store) or a localhost name. A job given one means to stay here.
bool names_loopback(const std::string &host) {
  in6_addr scratch{};
  if (inet_pton(AF_INET, host.c_str(), &scratch) == 1 ||
      inet_pton(AF_INET6, host.c_str(), &scratch) == 1) {
    return true;
  }
  std::string name = env::lower(host);
  if (!name.empty() && name.back() == '.') name.pop_back();
  const auto ends_with = [&](const std::string &suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return name == "localhost" || ends_with(".localhost") || starts_with(name, "localhost.") ||
         name == "ip6-localhost" || name == "ip6-loopback";
}

struct TcpAddress {
  std::string host;
  uint16_t port = 0;
};

TcpAddress parse_tcp_url(const std::string &url) {
  const std::string rest = url.substr(6);  // after "tcp://"
  TcpAddress address;
  std::string port;
  if (starts_with(rest, "[")) {
    const size_t close = rest.find(']');
    if (close == std::string::npos) bad_url(url, "'[' without ']'");
    address.host = rest.substr(1, close - 1);
    if (rest.compare(close + 1, 1, ":") != 0) bad_url(url, "no ':port' after ']'");
    port = rest.substr(close + 2);
  } else {
    const size_t colon = rest.rfind(':');
    if (colon == std::string::npos) bad_url(url, "no port");
    address.host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
    if (address.host.find(':') != std::string::npos) {
      bad_url(url, "an IPv6 address must be in brackets");
    }
  }
  if (address.host.empty()) bad_url(url, "no host");
  if (address.host.find_first_of("/[]@ ") != std::string::npos) bad_url(url, "bad host");
  if (port.empty() || port.size() > 5) bad_url(url, "bad port");
  unsigned long number = 0;
  for (const char ch : port) {
    if (!std::isdigit(static_cast<unsigned char>(ch))) bad_url(url, "bad port");
    number = number * 10 + static_cast<unsigned long>(ch - '0');
  }
  if (number < 1 || number > 65535) bad_url(url, "port out of range");
  address.port = static_cast<uint16_t>(number);
  return address;
}

// Forwards every call with the prefix put on (and taken off the keys wait() returns).
class PrefixStore final : public Store {
 public:
  PrefixStore(std::shared_ptr<Store> base, std::string prefix)
      : base_(std::move(base)), prefix_(std::move(prefix)) {}

  void set(const std::string &key, const void *data, size_t len) override {
    base_->set(prefix_ + key, data, len);
  }
  Bytes get(const std::string &key, const WaitOptions &opts) override {
    return base_->get(prefix_ + key, opts);
  }
  int64_t add(const std::string &key, int64_t delta) override {
    return base_->add(prefix_ + key, delta);
  }
  std::vector<std::string> wait(const std::vector<std::string> &keys,
                                const WaitOptions &opts) override {
    std::vector<std::string> prefixed;
    prefixed.reserve(keys.size());
    for (const auto &key : keys) prefixed.push_back(prefix_ + key);
    auto missing = base_->wait(prefixed, opts);
    for (auto &key : missing) key.erase(0, prefix_.size());
    return missing;
  }
  bool erase(const std::string &key) override { return base_->erase(prefix_ + key); }
  // An empty prefix here is every key of this view (the base's prefix is never empty).
  size_t erase_prefix(const std::string &prefix) override {
    return base_->erase_prefix(prefix_ + prefix);
  }
  std::string describe() const override { return base_->describe(); }
  void stop_accepting() override { base_->stop_accepting(); }
  bool set_on_close(const std::string &key, const void *data, size_t len) override {
    return base_->set_on_close(prefix_ + key, data, len);
  }
  bool cancel_on_close(const std::string &key) override {
    return base_->cancel_on_close(prefix_ + key);
  }

 private:
  std::shared_ptr<Store> base_;
  std::string prefix_;
};

}  // namespace

void check_store_url(const std::string &url, const char *origin) {
  try {
    if (starts_with(url, "tcp://")) {
      parse_tcp_url(url);
    } else if (!starts_with(url, "file://")) {
      bad_url(url, "unknown scheme");
    } else if (!starts_with(url.substr(7), "/")) {
      bad_url(url, "the directory must be an absolute path");
    }
  } catch (const Error &e) {
    if (origin == nullptr) throw;
    throw Error(e.status(), format("%s: %s", origin, e.what()));
  }
}

std::shared_ptr<Store> open_store(const std::string &url, int rank, int size,
                                  const WaitOptions &opts, TcpListen listen,
                                  const std::string &job_token) {
  MNCL_CHECK(size >= 1 && rank >= 0 && rank < size, MNCL_ERR_INVALID_ARGUMENT,
             "open_store: rank %d is out of range for %d ranks", rank, size);
  check_store_url(url);
  if (starts_with(url, "tcp://")) {
    const TcpAddress address = parse_tcp_url(url);
    std::string token = env::get("MNCL_STORE_TOKEN").value_or("");
    if (token.empty()) token = job_token;
    std::shared_ptr<TcpStoreServer> server;
    if (rank == 0) {
      // Decided before anything listens: a server started and then replaced would take the
      // connections of this host's ranks with it. A name resolving to addresses that are not
      // all loopback gets kNamedHost, where one that is not this host's fails at once.
      TcpListen how = listen;
      std::string was;  // the loopback addresses the name resolves to, when widened
      if (listen == TcpListen::kEveryAddressForAHostNameOnLoopback) {
        how = TcpListen::kNamedHost;
        std::string error;
        const auto endpoints = size > 1 && !names_loopback(address.host)
                                   ? net::resolve(address.host, address.port, error)
                                   : std::vector<net::Endpoint>{};
        const bool loopback_only =
            !endpoints.empty() &&
            std::all_of(endpoints.begin(), endpoints.end(), [](const net::Endpoint &e) {
              return net::is_loopback(reinterpret_cast<const sockaddr *>(&e.address));
            });
        if (loopback_only) {
          how = TcpListen::kEveryAddress;
          for (const auto &e : endpoints) {
            was += (was.empty() ? "" : ", ") +
                   net::to_string(reinterpret_cast<const sockaddr *>(&e.address), e.length);
          }
        }
      }
      server = std::make_shared<TcpStoreServer>(address.host, address.port, token, how);
      if (!was.empty()) {
        const char *const text =
            "the store at %s listens on every address of this host (%s), as PyTorch's "
            "TCPStore does: '%s' resolves to loopback addresses only here (%s), where the "
            "other hosts could not connect%s";
        // A launcher's job id (the token where MNCL_STORE_TOKEN is unset) is no secret: it
        // keeps other jobs out, not strangers.
        if (env::get("MNCL_STORE_TOKEN").value_or("").empty()) {
          MNCL_WARN(text, url.c_str(), server->listening_on().c_str(), address.host.c_str(),
                    was.c_str(),
                    "; any host that reaches this one can join the job: set MNCL_STORE_TOKEN, "
                    "the same on every rank, to admit only its ranks");
        } else {
          MNCL_INFO(text, url.c_str(), server->listening_on().c_str(), address.host.c_str(),
                    was.c_str(), "");
        }
      } else if (size > 1 && server->loopback_only() && !names_loopback(address.host)) {
        // A host name that resolves to loopback on this host (MNCL_STORE=tcp://$(hostname):port
        // where /etc/hosts maps it to 127.0.1.1): what it binds is kept, since all ranks may be
        // here.
        MNCL_WARN(
            "the store at %s listens only on loopback addresses (%s), which '%s' resolves "
            "to on this host: ranks on other hosts cannot connect to it. For a job across "
            "hosts, name an address they reach (MNCL_STORE=tcp://<address>:%u, or the "
            "config's bootstrap): this host's network address, or a name that resolves to it "
            "(not to 127.x, as /etc/hosts maps the host name to 127.0.1.1 on Debian); or name "
            "none, for MASTER_ADDR:MASTER_PORT, whose store then listens on every address",
            url.c_str(), server->listening_on().c_str(), address.host.c_str(),
            static_cast<unsigned>(address.port));
      }
    }
    return std::make_shared<TcpStore>(address.host, address.port, token, opts, std::move(server));
  }
  return std::make_shared<FileStore>(url.substr(7), opts.timeout);  // file:///dir (checked)
}

std::shared_ptr<Store> make_prefix_store(std::shared_ptr<Store> base, const std::string &prefix) {
  MNCL_CHECK(base != nullptr, MNCL_ERR_INVALID_ARGUMENT, "make_prefix_store: no base store");
  return std::make_shared<PrefixStore>(std::move(base), prefix);
}

}  // namespace mncl::bootstrap
