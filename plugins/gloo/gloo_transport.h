// Gloo transport devices for the plugin, and the hooks that make a blocked operation abortable.
//
// Abort (mncl_comm_abort from another thread) has to wake a thread that sits inside a Gloo
// collective, waiting on a condition variable of some transport::UnboundBuffer — often a
// temporary one the collective allocated itself. Gloo offers two public levers, neither enough
// alone:
//   - tcp::Context::signalException(msg) (protected; what Gloo itself calls on a timeout) sets
//     an IoException on every pair, wakes every *pending* buffer of every pair and closes the
//     sockets, so peers see the connection drop and fail fast too. A buffer whose transfer is
//     already half-read, or a send queued in the pair's tx queue, is not woken by it.
//   - UnboundBuffer::abortWaitRecv/abortWaitSend make the current wait return false, but only
//     on buffers one can reach.
// So the TCP device here is a thin subclass whose contexts hand out tracked unbound buffers
// (every buffer Gloo creates, internal ones included, is registered while alive). Abort first
// poisons the context, then keeps aborting the waits of all live buffers until the operation
// has left Gloo: any wait returns at once, and the next send/recv in the collective throws the
// poisoned pair's exception. Everything used is public or protected API of libgloo.
//
// TCP is the only transport: Gloo's ibverbs transport (Debian's libgloo 0.5.0) throws "Unbound
// buffers not supported yet for ibverbs transport" from createUnboundBuffer, and every MNCL
// gloo operation, comm_create's closing barrier included, runs on unbound buffers. On
// InfiniBand hosts, TCP runs over IPoIB where the hosts' addresses are on it.
#pragma once

#include <gloo/transport/device.h>
#include <mncl/mncl_plugin.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>

namespace gloo::transport::tcp {
class UnboundBuffer;
}

namespace mncl::gloo_plugin {

// Live unbound buffers of one communicator, and a handle on its transport context.
class AbortRegistry {
 public:
  void add(gloo::transport::tcp::UnboundBuffer *buf);
  void remove(gloo::transport::tcp::UnboundBuffer *buf);
  // Makes the current (and any racing) waitRecv/waitSend on every live buffer return false.
  void abort_waits();
  // Sets an IoException with `msg` on every pair of the context and closes its sockets.
  void poison(const std::string &msg);
  // Held while a tracked buffer is destroyed. Gloo's pairs keep non-owning pointers to pending
  // buffers and signal them from the poisoning thread; a buffer dying meanwhile (its op woken
  // by an earlier pair) would have its condition variables destroyed under that signal.
  std::unique_lock<std::mutex> lock_teardown();

  // Set by the device when the communicator's transport context is created.
  void set_poison(std::function<void(const std::string &)> fn);

 private:
  std::mutex mutex_;
  std::unordered_set<gloo::transport::tcp::UnboundBuffer *> live_;
  std::function<void(const std::string &)> poison_;
  std::mutex teardown_mutex_;  // poison() vs buffer destruction; taken before any Gloo lock
};

// Checks MNCL_GLOO_TRANSPORT ("" or "tcp": TCP). MNCL_OK, or the status with the reason in
// *why: MNCL_ERR_NOT_SUPPORTED for "ibverbs" (see above), MNCL_ERR_INVALID_ARGUMENT for
// anything else. The probe scores 0 with that reason; comm_create refuses with it.
mncl_status_t check_transport(const std::string &setting, std::string *why);

struct TransportSettings {
  std::string iface;                             // MNCL_GLOO_IFACE or GLOO_SOCKET_IFNAME
  std::string iface_origin = "MNCL_GLOO_IFACE";  // which of them (for messages)
  bool loopback = false;                         // every rank on this host: bind 127.0.0.1
};

// Creates the TCP device, throwing kit::Error with a message naming the variable at fault.
// Its contexts register every unbound buffer in `registry`, for abort and the watchdog.
std::shared_ptr<gloo::transport::Device> create_device(
    const TransportSettings &settings, const std::shared_ptr<AbortRegistry> &registry);

}  // namespace mncl::gloo_plugin
