// Fake libnccl.so.2: NCCL's API on the CPU, across real processes, for testing the nccl plugin
// without a GPU. Signatures come from the toolkit's nccl.h. What it models:
//
//  - Init: ncclGetUniqueId makes a random name; ranks connect over abstract Unix sockets named
//    after it (a full mesh). A non-blocking communicator (config.blocking = 0) returns
//    ncclInProgress and connects on a thread; ncclCommGetAsyncError says when it is ready.
//    Two ranks on one host and one device are refused, as NCCL's duplicate-GPU check does.
//  - Operations check their arguments as NCCL does (a buffer that is not device memory of the
//    communicator's device, a bad root/peer/type/op: ncclInvalidArgument), then run as one
//    "kernel" per group on the caller's stream: every rank sends what the others need, then
//    receives and reduces in rank order, so results are exact and identical on every rank.
//    Sends and receives between two ranks match in call order, as in NCCL. A kernel ends only
//    when all its peers have entered theirs (a send: once its receive is posted), so an
//    ungrouped send/send exchange deadlocks here as it does on NCCL for large messages.
//  - Non-blocking groups: every MNCL_FAKE_NCCL_DEFER_EVERY-th ncclGroupEnd (default 3; 0:
//    never) returns ncclInProgress and enqueues the kernel later from a thread of its own, as
//    NCCL may. Until ncclCommGetAsyncError reports ncclSuccess, other calls on the
//    communicator are ncclInvalidUsage (NCCL requires that poll).
//  - Failures: a peer whose connection closes before ncclCommFinalize is an asynchronous
//    ncclRemoteError, unless MNCL_FAKE_NCCL_SILENT_PEER_LOSS=1, which models transports that
//    never notice (NVLink, shared memory): kernels then wait until ncclCommAbort, which ends
//    them early (their events complete; the output is undefined). A size mismatch between a
//    send and its receive is an asynchronous ncclInternalError.
//  - Finalize flushes the communicator's work and meets every peer (non-blocking: in
//    progress until then); destroy and abort free it. Using a freed communicator is fatal.
//  - CUDA graphs: an operation on a capturing stream (fake_gpu.h) is recorded into the graph as
//    its group's kernel (such a group is never deferred) and runs at each launch. Its matching
//    tags are taken when the kernel runs, from counters apart from the uncaptured calls', so
//    ranks that launch the same graphs in the same order match every launch, whatever their
//    uncaptured calls in between; a kernel is in flight (finalize waits) from its launch. On
//    an invalidated capture an operation fails (ncclUnhandledCudaError), as NCCL's launch does.
//
// Not modelled: performance, user-defined reduction ops, ncclAlltoAll/Gather/Scatter,
// splitting; of graphs, NCCL's own checks (a kernel whose communicator was freed before the
// graph's launch just ends). Reductions accumulate in double (integers natively) and round
// once; with MNCL's exact test data the result is the one NCCL gives, not necessarily with
// other data.
#include <nccl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/half.h"
#include "common/host.h"
#include "fake_gpu.h"

#define FAKE_NCCL extern "C" FAKE_GPU_EXPORT

namespace {

using mncl::kit::format;
namespace kit = mncl::kit;

int env_int(const char *name, int fallback) {
  const char *v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

// Process-wide state is never destroyed (fake_gpu::forever): kernels may still run at exit.
enum Registry { kErrors, kComms };  // forever<>'s tags: one mutex per table
std::mutex &error_mutex() {
  return fake_gpu::forever<std::mutex, kErrors>();
}
std::string &last_error() {  // ncclGetLastError: the last failure of any call, as NCCL's
  return fake_gpu::forever<std::string>();
}
ncclResult_t set_error(ncclResult_t r, const std::string &message) {
  std::lock_guard<std::mutex> lock(error_mutex());
  last_error() = "fake NCCL: " + message;
  return r;
}

size_t type_size(ncclDataType_t t) {
  static const size_t sizes[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return sizes[t];
}

// ---- reductions ---------------------------------------------------------------------------------

template <typename T>
T combine(T a, T b, ncclRedOp_t op) {
  switch (op) {
    case ncclProd:
      return a * b;
    case ncclMin:
      return b < a ? b : a;
    case ncclMax:
      return a < b ? b : a;
    default:  // sum, and avg before its division
      return a + b;
  }
}

// Integers wrap as the GPU's do (no undefined behaviour here: computed unsigned).
template <typename T>
void reduce_integers(const std::vector<const char *> &inputs, char *out, size_t count,
                     ncclRedOp_t op) {
  using U = std::make_unsigned_t<T>;
  for (size_t i = 0; i < count; ++i) {
    T acc;
    std::memcpy(&acc, inputs[0] + i * sizeof(T), sizeof(T));
    for (size_t r = 1; r < inputs.size(); ++r) {
      T x;
      std::memcpy(&x, inputs[r] + i * sizeof(T), sizeof(T));
      if (op == ncclSum || op == ncclAvg) {
        acc = static_cast<T>(static_cast<U>(acc) + static_cast<U>(x));
      } else if (op == ncclProd) {
        acc = static_cast<T>(static_cast<U>(acc) * static_cast<U>(x));
      } else {
        acc = combine(acc, x, op);
      }
    }
    if (op == ncclAvg) acc = static_cast<T>(acc / static_cast<T>(inputs.size()));
    std::memcpy(out + i * sizeof(T), &acc, sizeof(T));
  }
}

// The float formats, read into the double accumulator and rounded back once.
struct Float16 {
  using Bits = uint16_t;
  static double get(Bits b) { return kit::float16_bits_to_float(b); }
  static Bits put(double v) { return kit::float_to_float16_bits(static_cast<float>(v)); }
};
struct Bfloat16 {
  using Bits = uint16_t;
  static double get(Bits b) { return kit::bfloat16_bits_to_float(b); }
  static Bits put(double v) { return kit::float_to_bfloat16_bits(static_cast<float>(v)); }
};
struct Float32 {
  using Bits = float;
  static double get(Bits b) { return b; }
  static Bits put(double v) { return static_cast<float>(v); }
};
struct Float64 {
  using Bits = double;
  static double get(Bits b) { return b; }
  static Bits put(double v) { return v; }
};

template <typename Format>
void reduce_floats(const std::vector<const char *> &inputs, char *out, size_t count,
                   ncclRedOp_t op) {
  using Bits = typename Format::Bits;
  auto load = [](const char *p) {
    Bits b;
    std::memcpy(&b, p, sizeof b);
    return Format::get(b);
  };
  for (size_t i = 0; i < count; ++i) {
    double acc = load(inputs[0] + i * sizeof(Bits));
    for (size_t r = 1; r < inputs.size(); ++r) {
      acc = combine(acc, load(inputs[r] + i * sizeof(Bits)), op);
    }
    if (op == ncclAvg) acc /= static_cast<double>(inputs.size());
    const Bits result = Format::put(acc);
    std::memcpy(out + i * sizeof(Bits), &result, sizeof result);
  }
}

// out[i] = inputs[0][i] op inputs[1][i] op ... in rank order. out may alias no input.
void reduce(const std::vector<const char *> &inputs, char *out, size_t count, ncclDataType_t dt,
            ncclRedOp_t op) {
  switch (dt) {
    case ncclInt8:
      return reduce_integers<int8_t>(inputs, out, count, op);
    case ncclUint8:
      return reduce_integers<uint8_t>(inputs, out, count, op);
    case ncclInt32:
      return reduce_integers<int32_t>(inputs, out, count, op);
    case ncclUint32:
      return reduce_integers<uint32_t>(inputs, out, count, op);
    case ncclInt64:
      return reduce_integers<int64_t>(inputs, out, count, op);
    case ncclUint64:
      return reduce_integers<uint64_t>(inputs, out, count, op);
    case ncclFloat16:
      return reduce_floats<Float16>(inputs, out, count, op);
    case ncclBfloat16:
      return reduce_floats<Bfloat16>(inputs, out, count, op);
    case ncclFloat32:
      return reduce_floats<Float32>(inputs, out, count, op);
    case ncclFloat64:
      return reduce_floats<Float64>(inputs, out, count, op);
    default:  // fp8: not used by MNCL
      std::memset(out, 0, count * type_size(dt));
  }
}

// ---- wire ---------------------------------------------------------------------------------------

// kRecvPosted: a receiver's kernel started (its sender may finish); kArrived: a rank entered a
// broadcast or reduce (every rank waits for all, as NCCL's kernels do).
enum MessageKind : uint32_t {
  kCollective = 1,
  kPointToPoint = 2,
  kFinalize = 3,
  kRecvPosted = 4,
  kArrived = 5
};
struct Header {
  uint32_t kind, from;
  uint64_t tag, bytes;
};
// Tags are per communicator and kind, and per peer for sends and receives; those of captured
// operations are apart, so graph launches and uncaptured calls never take each other's.
constexpr uint64_t kGraphTag = uint64_t{1} << 63;
struct Hello {
  int32_t rank, device;
  char host[64];
};

bool write_all(int fd, const void *data, size_t bytes) {
  const char *p = static_cast<const char *>(data);
  while (bytes > 0) {
    const ssize_t n = send(fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

bool read_all(int fd, void *data, size_t bytes) {
  char *p = static_cast<char *>(data);
  while (bytes > 0) {
    const ssize_t n = recv(fd, p, bytes, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

sockaddr_un socket_name(const ncclUniqueId &id, int rank, socklen_t *len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  // Abstract namespace (leading NUL): nothing on disk, gone with the process.
  const std::string name = format("mncl-fake-nccl-%.32s-%d", id.internal + 8, rank);
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return addr;
}

// ---- communicators ------------------------------------------------------------------------------

struct Comm {
  int rank = 0, nranks = 1, device = 0;
  bool blocking = true;
  ncclUniqueId id{};
  const bool silent_peer_loss = env_int("MNCL_FAKE_NCCL_SILENT_PEER_LOSS", 0) != 0;

  std::mutex mutex;  // everything below
  std::condition_variable cv;
  ncclResult_t state = ncclInProgress;  // ncclCommGetAsyncError
  std::string error;
  bool aborted = false, closing = false;
  std::map<std::tuple<int, uint32_t, uint64_t>, std::vector<char>> mailbox;  // (from, kind, tag)
  std::vector<char> fin_from;                                                // per peer
  uint64_t coll_seq = 0, groups = 0;
  std::vector<uint64_t> send_seq, recv_seq;  // per peer
  // Tags of captured operations (kGraphTag set), taken as their kernels run: every launch of
  // a graph needs fresh ones, in the order the ranks run their graphs.
  uint64_t graph_coll_seq = 0;
  std::vector<uint64_t> graph_send_seq, graph_recv_seq;  // per peer
  int running = 0;                                       // kernels queued or running

  std::vector<int> fds;  // per peer; -1 for self
  std::vector<std::unique_ptr<std::mutex>> write_mutex;
  std::vector<std::thread> threads;  // readers, init, deferred launches

  // Records an asynchronous error (the first one) and wakes every waiter.
  void fail(ncclResult_t r, const std::string &message) {
    std::lock_guard<std::mutex> lock(mutex);
    if (state == ncclSuccess || state == ncclInProgress) {
      state = r;
      error = message;
      set_error(r, message);
    }
    cv.notify_all();
  }
  // An operation in progress (init, a deferred group, finalize) is done, unless it failed.
  // Caller holds mutex.
  void ready() {
    if (state == ncclInProgress) state = ncclSuccess;
    cv.notify_all();
  }
  // Kernels end early only once aborted (or freed): after an asynchronous error they wait, as
  // NCCL's do, until the application aborts the communicator.
  bool ended() const { return aborted || closing; }
  bool broken() const { return ended() || (state != ncclSuccess && state != ncclInProgress); }

  void send_to(int peer, uint32_t kind, uint64_t tag, const char *data, size_t bytes) {
    const Header h{kind, static_cast<uint32_t>(rank), tag, bytes};
    bool ok;
    {
      std::lock_guard<std::mutex> lock(*write_mutex[peer]);
      ok = write_all(fds[peer], &h, sizeof h) && write_all(fds[peer], data, bytes);
    }
    if (!ok && !aborted && !silent_peer_loss) {
      fail(ncclRemoteError,
           format("rank %d: sending to rank %d failed: %s", rank, peer, std::strerror(errno)));
    }
  }

  // Waits for the message; false if the communicator was aborted first (the kernel then ends
  // early) or the message has the wrong size.
  bool take(int from, uint32_t kind, uint64_t tag, size_t bytes, std::vector<char> *out) {
    std::unique_lock<std::mutex> lock(mutex);
    const auto key = std::make_tuple(from, kind, tag);
    cv.wait(lock, [&] { return ended() || mailbox.count(key) > 0; });
    if (ended()) return false;
    auto it = mailbox.find(key);
    *out = std::move(it->second);
    mailbox.erase(it);
    if (out->size() != bytes) {
      lock.unlock();
      fail(ncclInternalError,
           format("rank %d received %zu bytes from rank %d where it expected %zu (counts or "
                  "types differ between the ranks)",
                  rank, out->size(), from, bytes));
      return false;
    }
    return true;
  }

  void reader(int peer) {
    for (;;) {
      Header h{};
      std::vector<char> data;
      bool ok = read_all(fds[peer], &h, sizeof h);
      if (ok) {
        data.resize(h.bytes);
        ok = read_all(fds[peer], data.data(), h.bytes);
      }
      std::unique_lock<std::mutex> lock(mutex);
      if (!ok) {
        const bool expected = aborted || closing || fin_from[peer];
        lock.unlock();
        if (!expected && !silent_peer_loss) {
          fail(ncclRemoteError,
               format("rank %d: rank %d closed its connection (a process exited?)", rank, peer));
        }
        return;
      }
      if (h.kind == kFinalize) {
        fin_from[peer] = 1;
      } else {
        mailbox[std::make_tuple(peer, h.kind, h.tag)] = std::move(data);
      }
      cv.notify_all();
    }
  }

  ncclResult_t connect_all();
};

ncclResult_t Comm::connect_all() {
  Hello me{rank, device, {}};
  gethostname(me.host, sizeof me.host - 1);
  socklen_t len = 0;
  const sockaddr_un own = socket_name(id, rank, &len);
  const int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0 || bind(listener, reinterpret_cast<const sockaddr *>(&own), len) != 0 ||
      listen(listener, nranks) != 0) {
    if (listener >= 0) close(listener);
    return set_error(ncclSystemError,
                     format("rank %d: cannot listen: %s", rank, std::strerror(errno)));
  }
  auto stop = [&] {
    std::lock_guard<std::mutex> lock(mutex);
    return aborted || closing;
  };
  std::vector<Hello> hellos(static_cast<size_t>(nranks));
  ncclResult_t result = ncclSuccess;
  // Lower ranks: connect (retrying until they listen) and say hello.
  for (int p = 0; p < rank && result == ncclSuccess; ++p) {
    socklen_t plen = 0;
    const sockaddr_un addr = socket_name(id, p, &plen);
    for (;;) {
      const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (connect(fd, reinterpret_cast<const sockaddr *>(&addr), plen) == 0) {
        fds[p] = fd;
        break;
      }
      close(fd);
      if (stop()) {
        result = set_error(ncclSystemError, format("rank %d: aborted while connecting", rank));
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (result == ncclSuccess && !write_all(fds[p], &me, sizeof me)) {
      result = set_error(ncclSystemError, format("rank %d: hello to rank %d failed", rank, p));
    }
  }
  // Higher ranks: accept, read their hello, answer.
  for (int accepted = rank + 1; accepted < nranks && result == ncclSuccess;) {
    pollfd pfd{listener, POLLIN, 0};
    if (poll(&pfd, 1, 10) <= 0) {
      if (stop()) result = set_error(ncclSystemError, format("rank %d: aborted in init", rank));
      continue;
    }
    const int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    Hello h{};
    if (fd < 0 || !read_all(fd, &h, sizeof h) || h.rank <= rank || h.rank >= nranks ||
        fds[h.rank] >= 0 || !write_all(fd, &me, sizeof me)) {
      if (fd >= 0) close(fd);
      result = set_error(ncclSystemError, format("rank %d: a bad connection in init", rank));
      break;
    }
    fds[h.rank] = fd;
    hellos[h.rank] = h;
    ++accepted;
  }
  close(listener);
  for (int p = 0; p < rank && result == ncclSuccess; ++p) {
    if (!read_all(fds[p], &hellos[p], sizeof(Hello))) {
      result = set_error(ncclSystemError, format("rank %d: no hello from rank %d", rank, p));
    }
  }
  for (int p = 0; p < nranks && result == ncclSuccess; ++p) {
    if (p != rank && std::strcmp(hellos[p].host, me.host) == 0 && hellos[p].device == device) {
      result = set_error(ncclInvalidUsage,
                         format("Duplicate GPU detected: rank %d and rank %d both on CUDA device "
                                "%d of host %s",
                                rank, p, device, me.host));
    }
  }
  if (result == ncclSuccess) {
    std::lock_guard<std::mutex> lock(mutex);
    if (closing) return set_error(ncclSystemError, format("rank %d: freed during init", rank));
    for (int p = 0; p < nranks; ++p) {
      if (p != rank) threads.emplace_back([this, p] { reader(p); });
    }
  }
  return result;
}

// Handles the application holds; a call with any other is a use after free.
std::mutex &comms_mutex() {
  return fake_gpu::forever<std::mutex, kComms>();
}
std::map<ncclComm_t, std::shared_ptr<Comm>> &comms() {
  return fake_gpu::forever<std::map<ncclComm_t, std::shared_ptr<Comm>>>();
}

std::shared_ptr<Comm> lookup(ncclComm_t handle, const char *call) {
  std::lock_guard<std::mutex> lock(comms_mutex());
  auto it = comms().find(handle);
  if (it == comms().end()) {
    if (handle == nullptr) return nullptr;
    std::fprintf(stderr,
                 "fake NCCL: %s on communicator %p, which was destroyed or never "
                 "created (a use after free on a real NCCL)\n",
                 call, static_cast<void *>(handle));
    std::abort();
  }
  return it->second;
}

// Stops the communicator's threads and connections; every waiter wakes and gives up.
void shut_down(const std::shared_ptr<Comm> &c, bool abort) {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    if (abort) c->aborted = true;
    c->closing = true;
    c->cv.notify_all();
  }
  for (int fd : c->fds) {
    if (fd >= 0) shutdown(fd, SHUT_RDWR);
  }
  {
    std::unique_lock<std::mutex> lock(c->mutex);
    c->cv.wait(lock, [&] { return c->running == 0; });  // kernels end early once aborted
    threads.swap(c->threads);
  }
  for (auto &t : threads) t.join();
  for (int &fd : c->fds) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
}

// ---- operations ---------------------------------------------------------------------------------

enum class Kind { kAllReduce, kReduce, kBroadcast, kAllGather, kReduceScatter, kSend, kRecv };
struct Item {
  Kind kind;
  const void *send;
  void *recv;
  size_t count;
  ncclDataType_t dt;
  ncclRedOp_t op;
  int root;      // or the peer
  uint64_t tag;  // 0 while captured: taken when the kernel runs (see Comm::graph_coll_seq)
  std::shared_ptr<Comm> comm;
  cudaStream_t stream;
  bool captured;
};

// One group's kernel on one rank: first everything the others need from this rank goes out
// (read from device memory now), then the receives and reductions. No order inside a group is
// promised by NCCL, and no send waits for its receive before every receive of the group has
// run, so no group can deadlock. Like NCCL's, a kernel finishes only once every rank it works
// with has entered its part: a send waits for its receive to be posted, and broadcast and
// reduce wait for every rank (so ungrouped sends that NCCL would hang on hang here too).
void run_kernel(const std::shared_ptr<Comm> &c, const std::vector<Item> &items) {
  const int me = c->rank, n = c->nranks;
  auto rendezvous = [](Kind k) { return k == Kind::kBroadcast || k == Kind::kReduce; };
  for (const Item &it : items) {  // "entered": before anything here can block
    if (it.kind == Kind::kRecv) c->send_to(it.root, kRecvPosted, it.tag, nullptr, 0);
    if (!rendezvous(it.kind)) continue;
    for (int p = 0; p < n; ++p) {
      if (p != me) c->send_to(p, kArrived, it.tag, nullptr, 0);
    }
  }
  auto view = [&](const void *p, size_t bytes) -> char * {
    char *v = fake_gpu::device_view(p, bytes);
    if (v == nullptr) fake_gpu::fault(format("NCCL kernel on freed memory %p", p).c_str());
    return v;
  };
  std::vector<std::vector<char>> own(items.size());  // this rank's input, read before writes
  for (size_t i = 0; i < items.size(); ++i) {
    const Item &it = items[i];
    const size_t bytes = it.count * type_size(it.dt);
    const char *send = nullptr;
    if (it.kind != Kind::kRecv && (it.kind != Kind::kBroadcast || me == it.root)) {
      const size_t in_bytes = it.kind == Kind::kReduceScatter ? bytes * n : bytes;
      if ((send = view(it.send, in_bytes)) == nullptr) return;
    }
    auto out = [&](int p, const char *data) { c->send_to(p, kCollective, it.tag, data, bytes); };
    switch (it.kind) {
      case Kind::kAllReduce:
      case Kind::kAllGather:
        for (int p = 0; p < n; ++p) {
          if (p != me) out(p, send);
        }
        own[i].assign(send, send + bytes);
        break;
      case Kind::kReduce:
        if (me != it.root) out(it.root, send);
        own[i].assign(send, send + bytes);
        break;
      case Kind::kBroadcast:
        if (me == it.root) {
          for (int p = 0; p < n; ++p) {
            if (p != me) out(p, send);
          }
          own[i].assign(send, send + bytes);
        }
        break;
      case Kind::kReduceScatter:
        for (int p = 0; p < n; ++p) {
          if (p != me) out(p, send + static_cast<size_t>(p) * bytes);
        }
        own[i].assign(send + static_cast<size_t>(me) * bytes,
                      send + static_cast<size_t>(me + 1) * bytes);
        break;
      case Kind::kSend:
        c->send_to(it.root, kPointToPoint, it.tag, send, bytes);
        break;
      case Kind::kRecv:
        break;
    }
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const Item &it = items[i];
    const size_t bytes = it.count * type_size(it.dt);
    std::vector<std::vector<char>> from(static_cast<size_t>(n));
    auto gather = [&]() {  // every rank's contribution, in rank order; empty: ended early
      std::vector<const char *> inputs;
      for (int p = 0; p < n; ++p) {
        if (p != me && !c->take(p, kCollective, it.tag, bytes, &from[p])) {
          inputs.clear();
          break;
        }
        inputs.push_back(p == me ? own[i].data() : from[p].data());
      }
      return inputs;
    };
    char *recv = nullptr;
    const bool writes = it.kind != Kind::kSend && (it.kind != Kind::kReduce || me == it.root);
    if (writes) {
      const size_t out_bytes = it.kind == Kind::kAllGather ? bytes * n : bytes;
      if ((recv = view(it.recv, out_bytes)) == nullptr) return;
    }
    switch (it.kind) {
      case Kind::kAllReduce:
      case Kind::kReduceScatter:
      case Kind::kReduce: {
        if (!writes) break;
        const auto inputs = gather();
        if (inputs.empty()) return;
        std::vector<char> result(bytes);
        reduce(inputs, result.data(), it.count, it.dt, it.op);
        std::memcpy(recv, result.data(), bytes);
        break;
      }
      case Kind::kAllGather: {
        const auto inputs = gather();
        if (inputs.empty()) return;
        for (int p = 0; p < n; ++p)
          std::memcpy(recv + static_cast<size_t>(p) * bytes, inputs[p], bytes);
        break;
      }
      case Kind::kBroadcast:
        if (me == it.root) {
          std::memcpy(recv, own[i].data(), bytes);
        } else {
          if (!c->take(it.root, kCollective, it.tag, bytes, &from[0])) return;
          std::memcpy(recv, from[0].data(), bytes);
        }
        break;
      case Kind::kRecv:
        if (!c->take(it.root, kPointToPoint, it.tag, bytes, &from[0])) return;
        std::memcpy(recv, from[0].data(), bytes);
        break;
      case Kind::kSend:
        break;
    }
  }
  std::vector<char> none;
  for (const Item &it : items) {
    if (it.kind == Kind::kSend && !c->take(it.root, kRecvPosted, it.tag, 0, &none)) return;
    if (!rendezvous(it.kind)) continue;
    for (int p = 0; p < n; ++p) {
      if (p != me && !c->take(p, kArrived, it.tag, 0, &none)) return;
    }
  }
}

// Queues one kernel per (communicator, stream) of the group, in call order.
void launch(const std::vector<Item> &items) {
  std::vector<std::pair<std::pair<Comm *, cudaStream_t>, std::vector<Item>>> kernels;
  for (const Item &it : items) {
    const auto key = std::make_pair(it.comm.get(), it.stream);
    auto k = std::find_if(kernels.begin(), kernels.end(), [&](auto &e) { return e.first == key; });
    if (k == kernels.end()) k = kernels.insert(kernels.end(), {key, {}});
    k->second.push_back(it);
    // A capture begun since the call still records the kernel: its tags must be per run.
    if (fake_gpu::capturing(it.stream)) k->second.back().captured = true;
  }
  for (auto &k : kernels) {
    std::shared_ptr<Comm> c = k.second.front().comm;
    // Counted in flight as it is queued: now, or by each launch of the graph capturing it.
    auto queued = [c] {
      std::lock_guard<std::mutex> lock(c->mutex);
      ++c->running;
    };
    fake_gpu::enqueue(
        k.first.second,
        [c, items = std::move(k.second)] {
          std::vector<Item> run = items;  // a graph's node runs again: its tags are per run
          bool skip;
          {
            std::lock_guard<std::mutex> lock(c->mutex);
            skip = c->ended();
            for (Item &it : run) {
              if (skip || !it.captured) continue;
              if (it.kind == Kind::kSend) {
                it.tag = kGraphTag | ++c->graph_send_seq[it.root];
              } else if (it.kind == Kind::kRecv) {
                it.tag = kGraphTag | ++c->graph_recv_seq[it.root];
              } else {
                it.tag = kGraphTag | ++c->graph_coll_seq;
              }
            }
          }
          if (!skip) run_kernel(c, run);
          std::lock_guard<std::mutex> lock(c->mutex);
          --c->running;
          c->cv.notify_all();
        },
        queued);
  }
}

// The calling thread's group (ncclGroupStart / ncclGroupEnd).
thread_local int t_group_depth = 0;
thread_local std::vector<Item> t_group;
thread_local ncclResult_t t_group_error = ncclSuccess;

// The checks every call on a communicator makes: a usable comm (not still in progress).
ncclResult_t check_comm(const std::shared_ptr<Comm> &c, const char *call) {
  if (c == nullptr) return set_error(ncclInvalidArgument, format("%s: comm is NULL", call));
  std::lock_guard<std::mutex> lock(c->mutex);
  if (c->aborted) return set_error(ncclInvalidUsage, format("%s: the comm was aborted", call));
  if (c->state == ncclInProgress) {
    return set_error(ncclInvalidUsage, format("%s on a communicator still in progress: poll "
                                              "ncclCommGetAsyncError until ncclSuccess first",
                                              call));
  }
  if (c->state != ncclSuccess) {
    return set_error(c->state, format("%s: the comm has failed: %s", call, c->error.c_str()));
  }
  return ncclSuccess;
}

ncclResult_t check_buffer(const Comm &c, const char *call, const char *which, const void *p,
                          size_t bytes) {
  if (bytes == 0) return ncclSuccess;
  int device = -1;
  if (fake_gpu::device_view(p, bytes, &device) == nullptr) {
    return set_error(ncclInvalidArgument,
                     format("%s: %s %p (%zu bytes) is not device memory", call, which, p, bytes));
  }
  if (device != c.device) {
    return set_error(ncclInvalidArgument,
                     format("%s: %s is on device %d, the communicator on device %d", call, which,
                            device, c.device));
  }
  return ncclSuccess;
}

// Validates one operation and adds it to the group (or runs a group of one).
ncclResult_t submit(const char *call, Kind kind, const void *send, void *recv, size_t count,
                    ncclDataType_t dt, ncclRedOp_t op, int root, ncclComm_t handle,
                    cudaStream_t stream) {
  std::shared_ptr<Comm> c = lookup(handle, call);
  ncclResult_t r = check_comm(c, call);
  const bool reduces =
      kind == Kind::kAllReduce || kind == Kind::kReduce || kind == Kind::kReduceScatter;
  if (r == ncclSuccess && (dt < 0 || dt >= ncclNumTypes)) {
    r = set_error(ncclInvalidArgument, format("%s: invalid type %d", call, dt));
  }
  if (r == ncclSuccess && reduces && (op < 0 || op >= ncclNumOps)) {
    r = set_error(ncclInvalidArgument, format("%s: invalid op %d", call, op));
  }
  const bool rooted = kind == Kind::kReduce || kind == Kind::kBroadcast || kind == Kind::kSend ||
                      kind == Kind::kRecv;
  if (r == ncclSuccess && rooted && (root < 0 || root >= c->nranks)) {
    r = set_error(ncclInvalidArgument, format("%s: invalid root/peer %d", call, root));
  }
  if (r == ncclSuccess && (kind == Kind::kSend || kind == Kind::kRecv) && root == c->rank) {
    // NCCL allows a send to self only with its matching receive in the group; MNCL never needs
    // it, and the fake does not model it.
    r = set_error(ncclInvalidUsage, format("%s to self is not modelled by the fake", call));
  }
  if (r == ncclSuccess) {
    const size_t bytes = count * type_size(dt);
    const size_t in = kind == Kind::kReduceScatter ? bytes * c->nranks : bytes;
    const size_t out = kind == Kind::kAllGather ? bytes * c->nranks : bytes;
    const bool reads = kind != Kind::kRecv && (kind != Kind::kBroadcast || root == c->rank);
    const bool writes = kind != Kind::kSend && (kind != Kind::kReduce || root == c->rank);
    if (reads) r = check_buffer(*c, call, "sendbuff", send, in);
    if (r == ncclSuccess && writes) r = check_buffer(*c, call, "recvbuff", recv, out);
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (r == ncclSuccess && !fake_gpu::capture_status(stream, &capture)) {
    r = set_error(ncclInvalidArgument, format("%s: invalid stream", call));
  }
  if (r == ncclSuccess && capture == cudaStreamCaptureStatusInvalidated) {
    // NCCL's launch into it fails with cudaErrorStreamCaptureInvalidated.
    r = set_error(ncclUnhandledCudaError, format("%s: stream %p is in an invalidated capture", call,
                                                 static_cast<void *>(stream)));
  }
  if (r != ncclSuccess) {
    if (t_group_depth > 0 && t_group_error == ncclSuccess) t_group_error = r;
    return r;
  }
  if (count == 0) return ncclSuccess;  // NCCL returns at once
  const bool captured = capture == cudaStreamCaptureStatusActive;
  Item item{kind, send, recv, count, dt, op, root, 0, c, stream, captured};
  if (!captured) {
    std::lock_guard<std::mutex> lock(c->mutex);
    if (kind == Kind::kSend) {
      item.tag = ++c->send_seq[root];
    } else if (kind == Kind::kRecv) {
      item.tag = ++c->recv_seq[root];
    } else {
      item.tag = ++c->coll_seq;
    }
  }
  if (t_group_depth > 0) {
    t_group.push_back(std::move(item));
    return ncclSuccess;
  }
  launch({item});
  return ncclSuccess;
}

// Runs fn on a thread of the communicator's (joined at destroy/abort); not once it is being
// freed.
void in_background(const std::shared_ptr<Comm> &c, std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(c->mutex);
  if (!c->closing) c->threads.emplace_back(std::move(fn));
}

// A step that ends in Comm::ready() or an error: run here on a blocking communicator (its
// result returned), else on a thread of the communicator's, answering ncclInProgress.
ncclResult_t run_step(const std::shared_ptr<Comm> &c, std::function<void()> step) {
  if (!c->blocking) {
    in_background(c, std::move(step));
    return ncclInProgress;
  }
  step();
  std::lock_guard<std::mutex> lock(c->mutex);
  return c->state;
}

}  // namespace

// ---- API ----------------------------------------------------------------------------------------

FAKE_NCCL ncclResult_t ncclGetVersion(int *version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

FAKE_NCCL const char *ncclGetErrorString(ncclResult_t result) {
  static const char *const kTexts[ncclNumResults] = {
      "no error",
      "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
      "unhandled system error (run with NCCL_DEBUG=INFO for details)",
      "internal error - please report this issue to the NCCL developers",
      "invalid argument (run with NCCL_DEBUG=WARN for details)",
      "invalid usage (run with NCCL_DEBUG=WARN for details)",
      "remote process exited or there was a network error",
      "NCCL operation in progress"};
  return result >= 0 && result < ncclNumResults ? kTexts[result] : "unknown result code";
}

FAKE_NCCL const char *ncclGetLastError(ncclComm_t) {
  static thread_local std::string copy;
  std::lock_guard<std::mutex> lock(error_mutex());
  copy = last_error();
  return copy.c_str();
}

FAKE_NCCL ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  if (id == nullptr) return ncclInvalidArgument;
  std::memset(id, 0, sizeof *id);
  std::random_device random;
  std::snprintf(id->internal, sizeof id->internal, "fakenccl%08x%08x%08x%08x", random(), random(),
                random(), static_cast<unsigned>(getpid()));
  return ncclSuccess;
}

FAKE_NCCL ncclResult_t ncclCommInitRankConfig(ncclComm_t *handle, int nranks, ncclUniqueId id,
                                              int rank, ncclConfig_t *config) {
  if (handle == nullptr) return set_error(ncclInvalidArgument, "ncclCommInitRankConfig: comm NULL");
  *handle = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return set_error(ncclInvalidArgument,
                     format("ncclCommInitRankConfig: rank %d of %d", rank, nranks));
  }
  if (std::strncmp(id.internal, "fakenccl", 8) != 0) {
    return set_error(ncclInvalidArgument, "ncclCommInitRankConfig: not an id of ncclGetUniqueId");
  }
  if (config != nullptr && (config->magic != 0xcafebeef || config->size != sizeof(ncclConfig_t))) {
    return set_error(ncclInvalidArgument,
                     "ncclCommInitRankConfig: config not initialized with "
                     "NCCL_CONFIG_INITIALIZER");
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    return set_error(ncclUnhandledCudaError, "ncclCommInitRankConfig: no CUDA device");
  }
  auto c = std::make_shared<Comm>();
  c->rank = rank;
  c->nranks = nranks;
  c->device = fake_gpu::current_device();
  c->blocking = config == nullptr || config->blocking != 0;  // UNDEF (INT_MIN) is blocking
  c->id = id;
  c->fin_from.assign(static_cast<size_t>(nranks), 0);
  c->send_seq.assign(static_cast<size_t>(nranks), 0);
  c->recv_seq.assign(static_cast<size_t>(nranks), 0);
  c->graph_send_seq.assign(static_cast<size_t>(nranks), 0);
  c->graph_recv_seq.assign(static_cast<size_t>(nranks), 0);
  c->fds.assign(static_cast<size_t>(nranks), -1);
  for (int p = 0; p < nranks; ++p) c->write_mutex.push_back(std::make_unique<std::mutex>());
  *handle = reinterpret_cast<ncclComm_t>(c.get());
  {
    std::lock_guard<std::mutex> lock(comms_mutex());
    comms()[*handle] = c;
  }
  auto init = [c] {
    const ncclResult_t r = c->connect_all();
    if (r != ncclSuccess) {
      std::string message;
      {
        std::lock_guard<std::mutex> lock(error_mutex());
        message = last_error().substr(std::strlen("fake NCCL: "));
      }
      c->fail(r, message);
      return;
    }
    std::lock_guard<std::mutex> lock(c->mutex);
    c->ready();
  };
  return run_step(c, init);
}

FAKE_NCCL ncclResult_t ncclCommInitRank(ncclComm_t *handle, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(handle, nranks, id, rank, nullptr);  // blocking
}

FAKE_NCCL ncclResult_t ncclCommGetAsyncError(ncclComm_t handle, ncclResult_t *state) {
  std::shared_ptr<Comm> c = lookup(handle, "ncclCommGetAsyncError");
  if (c == nullptr || state == nullptr) return ncclInvalidArgument;
  std::lock_guard<std::mutex> lock(c->mutex);
  *state = c->state;
  return ncclSuccess;
}

FAKE_NCCL ncclResult_t ncclGroupStart() {
  if (t_group_depth++ == 0) {
    t_group.clear();
    t_group_error = ncclSuccess;
  }
  return ncclSuccess;
}

FAKE_NCCL ncclResult_t ncclGroupEnd() {
  if (t_group_depth == 0) return set_error(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--t_group_depth > 0) return ncclSuccess;
  std::vector<Item> items;
  items.swap(t_group);
  if (t_group_error != ncclSuccess) {
    // A failed group is dropped; a non-blocking comm keeps the error as its asynchronous one.
    for (const Item &it : items) {
      if (!it.comm->blocking) it.comm->fail(t_group_error, "a call in the group failed");
    }
    return t_group_error;
  }
  if (items.empty()) return ncclSuccess;
  const std::shared_ptr<Comm> c = items.front().comm;
  const bool captured = std::any_of(items.begin(), items.end(), [](const Item &it) {
    return it.captured || fake_gpu::capturing(it.stream);
  });
  bool defer = false;
  if (!c->blocking && !captured) {  // a captured kernel goes into the capture now
    const int every = env_int("MNCL_FAKE_NCCL_DEFER_EVERY", 3);
    std::lock_guard<std::mutex> lock(c->mutex);
    defer = every > 0 && ++c->groups % static_cast<uint64_t>(every) == 0;
    if (defer) c->state = ncclInProgress;
  }
  if (!defer) {
    launch(items);
    return ncclSuccess;
  }
  // As NCCL may: the kernels are enqueued later, by another thread, and the comm is in
  // progress until then.
  in_background(c, [c, items] {
    std::this_thread::sleep_for(std::chrono::microseconds(300));
    launch(items);
    std::lock_guard<std::mutex> lock(c->mutex);
    c->ready();
  });
  return ncclInProgress;
}

#define FAKE_NCCL_OP(name, kind, send, recv, count, dt, op, root) \
  return submit(#name, Kind::kind, send, recv, count, dt, op, root, comm, stream)

FAKE_NCCL ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                     ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                     cudaStream_t stream) {
  FAKE_NCCL_OP(ncclAllReduce, kAllReduce, sendbuff, recvbuff, count, datatype, op, 0);
}

FAKE_NCCL ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                                  ncclDataType_t datatype, ncclRedOp_t op, int root,
                                  ncclComm_t comm, cudaStream_t stream) {
  FAKE_NCCL_OP(ncclReduce, kReduce, sendbuff, recvbuff, count, datatype, op, root);
}

FAKE_NCCL ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                     ncclDataType_t datatype, int root, ncclComm_t comm,
                                     cudaStream_t stream) {
  FAKE_NCCL_OP(ncclBroadcast, kBroadcast, sendbuff, recvbuff, count, datatype, ncclSum, root);
}

FAKE_NCCL ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                     ncclDataType_t datatype, ncclComm_t comm,
                                     cudaStream_t stream) {
  FAKE_NCCL_OP(ncclAllGather, kAllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0);
}

FAKE_NCCL ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                         cudaStream_t stream) {
  FAKE_NCCL_OP(ncclReduceScatter, kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0);
}

FAKE_NCCL ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype,
                                int peer, ncclComm_t comm, cudaStream_t stream) {
  FAKE_NCCL_OP(ncclSend, kSend, sendbuff, nullptr, count, datatype, ncclSum, peer);
}

FAKE_NCCL ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                ncclComm_t comm, cudaStream_t stream) {
  FAKE_NCCL_OP(ncclRecv, kRecv, nullptr, recvbuff, count, datatype, ncclSum, peer);
}

// Flushes this rank's work, then meets every peer, so that no rank closes a connection another
// still reads from. Non-blocking: in progress until then.
FAKE_NCCL ncclResult_t ncclCommFinalize(ncclComm_t handle) {
  std::shared_ptr<Comm> c = lookup(handle, "ncclCommFinalize");
  if (ncclResult_t r = check_comm(c, "ncclCommFinalize")) return r;
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    c->state = ncclInProgress;
  }
  auto finalize = [c] {
    std::unique_lock<std::mutex> lock(c->mutex);
    c->cv.wait(lock, [&] { return c->running == 0 || c->broken(); });
    lock.unlock();
    for (int p = 0; p < c->nranks; ++p) {
      if (p != c->rank) c->send_to(p, kFinalize, 0, nullptr, 0);
    }
    lock.lock();
    c->cv.wait(lock, [&] {
      if (c->broken()) return true;
      for (int p = 0; p < c->nranks; ++p) {
        if (p != c->rank && !c->fin_from[p]) return false;
      }
      return true;
    });
    c->ready();
  };
  return run_step(c, finalize);
}

namespace {
ncclResult_t free_comm(ncclComm_t handle, const char *call, bool abort) {
  std::shared_ptr<Comm> c = lookup(handle, call);
  if (c == nullptr) return set_error(ncclInvalidArgument, format("%s: comm is NULL", call));
  shut_down(c, abort);
  std::lock_guard<std::mutex> lock(comms_mutex());
  comms().erase(handle);
  return ncclSuccess;
}
}  // namespace

FAKE_NCCL ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  return free_comm(comm, "ncclCommDestroy", false);
}

FAKE_NCCL ncclResult_t ncclCommAbort(ncclComm_t comm) {
  return free_comm(comm, "ncclCommAbort", true);
}
