// open_store(): url parsing and the choice of store; make_prefix_store().
#include "bootstrap/store.h"

#include <cctype>

#include "bootstrap/file_store.h"
#include "bootstrap/tcp_store.h"
#include "common/env.h"
#include "common/error.h"

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
  std::string describe() const override { return base_->describe(); }
  void stop_accepting() override { base_->stop_accepting(); }

 private:
  std::shared_ptr<Store> base_;
  std::string prefix_;
};

}  // namespace

std::shared_ptr<Store> open_store(const std::string &url, int rank, int size,
                                  const WaitOptions &opts) {
  MNCL_CHECK(size >= 1 && rank >= 0 && rank < size, MNCL_ERR_INVALID_ARGUMENT,
             "open_store: rank %d is out of range for %d ranks", rank, size);
  if (starts_with(url, "tcp://")) {
    const TcpAddress address = parse_tcp_url(url);
    const std::string token = env::get("MNCL_STORE_TOKEN").value_or("");
    std::shared_ptr<TcpStoreServer> server;
    if (rank == 0) server = std::make_shared<TcpStoreServer>(address.host, address.port, token);
    return std::make_shared<TcpStore>(address.host, address.port, token, opts, std::move(server));
  }
  if (starts_with(url, "file://")) {
    const std::string dir = url.substr(7);
    if (!starts_with(dir, "/")) bad_url(url, "the directory must be an absolute path");
    return std::make_shared<FileStore>(dir);
  }
  bad_url(url, "unknown scheme");
}

std::shared_ptr<Store> make_prefix_store(std::shared_ptr<Store> base, const std::string &prefix) {
  MNCL_CHECK(base != nullptr, MNCL_ERR_INVALID_ARGUMENT, "make_prefix_store: no base store");
  return std::make_shared<PrefixStore>(std::move(base), prefix);
}

}  // namespace mncl::bootstrap
