#include "gloo/gloo_transport.h"

#include <gloo/common/error.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/tcp/unbound_buffer.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <system_error>
#include <utility>

#include "common/host.h"

namespace mncl::gloo_plugin {

namespace tcp = gloo::transport::tcp;

void AbortRegistry::add(tcp::UnboundBuffer *buf) {
  std::lock_guard<std::mutex> lock(mutex_);
  live_.insert(buf);
}

void AbortRegistry::remove(tcp::UnboundBuffer *buf) {
  std::lock_guard<std::mutex> lock(mutex_);
  live_.erase(buf);
}

void AbortRegistry::abort_waits() {
  // Holding the lock keeps every buffer alive meanwhile: its destructor deregisters first.
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto *buf : live_) {
    buf->abortWaitRecv();
    buf->abortWaitSend();
  }
}

void AbortRegistry::set_poison(std::function<void(const std::string &)> fn) {
  std::lock_guard<std::mutex> lock(mutex_);
  poison_ = std::move(fn);
}

void AbortRegistry::poison(const std::string &msg) {
  std::function<void(const std::string &)> fn;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fn = poison_;
  }
  if (!fn) return;
  // Outside mutex_ (fn takes pair and buffer locks), but no buffer may be destroyed meanwhile.
  std::lock_guard<std::mutex> teardown(teardown_mutex_);
  fn(msg);
}

std::unique_lock<std::mutex> AbortRegistry::lock_teardown() {
  return std::unique_lock<std::mutex>(teardown_mutex_);
}

namespace {

// The first base of TrackedBuffer, so destroyed after Gloo's buffer: the teardown lock taken
// in ~TrackedBuffer is held until Gloo's part of the buffer is gone.
class RegistryLink {
 protected:
  explicit RegistryLink(std::shared_ptr<AbortRegistry> registry) : registry_(std::move(registry)) {}

  std::shared_ptr<AbortRegistry> registry_;  // declared first: outlives teardown_ below
  std::unique_lock<std::mutex> teardown_;
};

// An unbound buffer that is listed in the registry for as long as it lives, and is never
// destroyed while the context is being poisoned.
class TrackedBuffer : private RegistryLink, public tcp::UnboundBuffer {
 public:
  TrackedBuffer(const std::shared_ptr<tcp::Context> &context, void *ptr, size_t size,
                std::shared_ptr<AbortRegistry> registry)
      : RegistryLink(std::move(registry)), tcp::UnboundBuffer(context, ptr, size) {
    registry_->add(this);
  }
  ~TrackedBuffer() override {
    registry_->remove(this);
    teardown_ = registry_->lock_teardown();
  }
};

class TrackingContext : public tcp::Context {
 public:
  TrackingContext(std::shared_ptr<tcp::Device> device, int rank, int size,
                  std::shared_ptr<AbortRegistry> registry)
      : tcp::Context(std::move(device), rank, size), registry_(std::move(registry)) {}

  std::unique_ptr<gloo::transport::UnboundBuffer> createUnboundBuffer(void *ptr,
                                                                      size_t size) override {
    return std::make_unique<TrackedBuffer>(shared_from_this(), ptr, size, registry_);
  }

  // Gloo's own reaction to a timeout: every pair gets the exception and is closed.
  void poison(const std::string &msg) { signalException(msg); }

 private:
  std::shared_ptr<AbortRegistry> registry_;
};

class TrackingDevice : public tcp::Device {
 public:
  TrackingDevice(const tcp::attr &attr, std::shared_ptr<AbortRegistry> registry)
      : tcp::Device(attr), registry_(std::move(registry)) {}

  std::shared_ptr<gloo::transport::Context> createContext(int rank, int size) override {
    auto context = std::make_shared<TrackingContext>(
        std::static_pointer_cast<tcp::Device>(shared_from_this()), rank, size, registry_);
    // Weak: the context owns the device, the registry must not own the context.
    std::weak_ptr<TrackingContext> weak = context;
    registry_->set_poison([weak](const std::string &msg) {
      if (auto c = weak.lock()) c->poison(msg);
    });
    return context;
  }

 private:
  std::shared_ptr<AbortRegistry> registry_;
};

std::string this_hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

// Why `name` does not resolve to an address gloo could bind ("" when it does). Debian's Gloo
// checks getaddrinfo for -1 only, and on EAI_NONAME (-2) walks an uninitialized result list:
// every rank died of SIGSEGV on a host whose name does not resolve.
std::string resolve_problem(const std::string &name) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo *result = nullptr;
  const int rv = getaddrinfo(name.c_str(), nullptr, &hints, &result);
  if (rv == 0 && result != nullptr) {
    freeaddrinfo(result);
    return "";
  }
  if (result != nullptr) freeaddrinfo(result);
  return rv == EAI_SYSTEM ? std::strerror(errno) : gai_strerror(rv);
}

}  // namespace

mncl_status_t check_transport(const std::string &text, std::string *why) {
  const std::string setting = kit::lower(text);
  if (setting.empty() || setting == "tcp") {
    why->clear();
    return MNCL_OK;
  }
  if (setting == "ibverbs") {
    *why =
        "MNCL_GLOO_TRANSPORT=ibverbs is not supported: this Gloo's ibverbs transport has no "
        "unbound buffers, which every MNCL gloo operation uses; use tcp (IPoIB on InfiniBand "
        "hosts)";
    return MNCL_ERR_NOT_SUPPORTED;
  }
  *why = kit::format(
      "MNCL_GLOO_TRANSPORT='%s' is not a transport (expected tcp; ibverbs is not supported)",
      text.c_str());
  return MNCL_ERR_INVALID_ARGUMENT;
}

std::shared_ptr<gloo::transport::Device> create_device(
    const TransportSettings &settings, const std::shared_ptr<AbortRegistry> &registry) {
  tcp::attr attr;
  std::string what;
  if (!settings.iface.empty()) {
    attr.iface = settings.iface;
    what = "network interface (" + settings.iface_origin + ")";
  } else if (settings.loopback) {
    attr.hostname = "127.0.0.1";  // a single host: no need to trust name resolution
    what = "loopback address";
  } else {
    attr.hostname = this_hostname();
    what = "host name (set MNCL_GLOO_IFACE to choose an interface)";
    if (const std::string why = resolve_problem(attr.hostname); !why.empty()) {
      throw kit::Error(
          MNCL_ERR_SYSTEM,
          kit::format("gloo: this host's name '%s' does not resolve (%s); across hosts gloo "
                      "listens on the address the name resolves to: set MNCL_GLOO_IFACE to the "
                      "network interface to use (e.g. eth0), or make the name resolve "
                      "(/etc/hosts, DNS)",
                      attr.hostname.c_str(), why.c_str()));
    }
  }
  try {
    return std::make_shared<TrackingDevice>(tcp::CreateDeviceAttr(attr), registry);
  } catch (const std::system_error &e) {
    // The device's thread (a limit on threads: ulimit -u, a container's pids limit; memory).
    throw kit::Error(MNCL_ERR_SYSTEM,
                     kit::format("gloo: cannot start its TCP device's thread: %s (the system "
                                 "refused a thread: a limit on processes or threads, ulimit -u "
                                 "or a container's pids limit, or on memory)",
                                 e.what()));
  } catch (const std::exception &e) {
    const std::string &name = attr.iface.empty() ? attr.hostname : attr.iface;
    throw kit::Error(MNCL_ERR_SYSTEM, kit::format("gloo: cannot bind to %s '%s': %s", what.c_str(),
                                                  name.c_str(), e.what()));
  }
}

}  // namespace mncl::gloo_plugin
