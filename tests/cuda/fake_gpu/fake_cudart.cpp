// Fake libcudart.so.13: the CUDA runtime calls the nccl plugin and the GPU tests make, on the
// CPU. See fake_gpu.h for the model. Signatures come from the toolkit's own header.
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fake_gpu.h"

#define FAKE_CUDART extern "C" FAKE_GPU_EXPORT

namespace {

// ---- errors -------------------------------------------------------------------------------------

thread_local cudaError_t t_last_error = cudaSuccess;
std::atomic<int> g_sticky{cudaSuccess};  // a "kernel" fault: the context is unusable

cudaError_t fail(cudaError_t e) {
  t_last_error = e;
  return e;
}
// Every call but the error queries reports a sticky fault first, and makes the device's
// primary context current, as the runtime does on first use.
#define FAKE_ENTER                                                         \
  do {                                                                     \
    if (int s = g_sticky.load()) return fail(static_cast<cudaError_t>(s)); \
    t_context = true;                                                      \
  } while (0)

int device_count() {
  static const int count = [] {
    const char *env = std::getenv("MNCL_FAKE_GPUS");
    return env != nullptr ? std::atoi(env) : 8;
  }();
  return count;
}
thread_local int t_device = 0;
thread_local bool t_context = false;  // a primary context is current on this thread

// The runtime loads the driver, as the real one does: libcuda.so.1 from this library's folder.
__attribute__((constructor)) void load_driver() {
  Dl_info self{};
  if (dladdr(reinterpret_cast<void *>(&load_driver), &self) == 0 || self.dli_fname == nullptr) {
    return;
  }
  std::string path = self.dli_fname;
  path = path.substr(0, path.rfind('/') + 1) + "libcuda.so.1";
  dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);  // missing: no driver API, as without CUDA
}

// ---- device memory ------------------------------------------------------------------------------

struct Alloc {
  size_t bytes, mapped;
  int device;
  char *view;                   // the read-write mapping the fake's kernels use
  const void *graph = nullptr;  // the GraphMemory of the capture that allocated it, if any
};
enum Registry { kAllocs, kStreams, kEvents, kCaptures, kGraphs };  // forever<>'s tags
std::mutex &alloc_mutex() {
  return fake_gpu::forever<std::mutex, kAllocs>();
}
std::map<uintptr_t, Alloc> &allocs() {  // by the caller's (PROT_NONE) address
  return fake_gpu::forever<std::map<uintptr_t, Alloc>>();
}

// The allocation containing p. Caller holds alloc_mutex().
const std::pair<const uintptr_t, Alloc> *find_alloc(const void *p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  auto &m = allocs();
  auto it = m.upper_bound(addr);
  if (it == m.begin()) return nullptr;
  --it;
  return addr < it->first + it->second.bytes ? &*it : nullptr;
}

cudaError_t allocate(void **ptr, size_t bytes, const void *graph = nullptr) {
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t mapped = (bytes + page - 1) / page * page;
  const int fd = memfd_create("fake-gpu", MFD_CLOEXEC);
  if (fd < 0) return fail(cudaErrorMemoryAllocation);
  void *guarded = MAP_FAILED, *view = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(mapped)) == 0) {
    guarded = mmap(nullptr, mapped, PROT_NONE, MAP_SHARED, fd, 0);
    view = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  close(fd);
  if (guarded == MAP_FAILED || view == MAP_FAILED) {
    if (guarded != MAP_FAILED) munmap(guarded, mapped);
    if (view != MAP_FAILED) munmap(view, mapped);
    return fail(cudaErrorMemoryAllocation);
  }
  std::memset(view, 0xa5, bytes);  // like cudaMalloc, not zeroed: uninitialized reads show
  std::lock_guard<std::mutex> lock(alloc_mutex());
  allocs()[reinterpret_cast<uintptr_t>(guarded)] =
      Alloc{bytes, mapped, t_device, static_cast<char *>(view), graph};
  *ptr = guarded;
  return cudaSuccess;
}

// graph: only if ptr is still that graph memory's (it may have been freed, and its address
// reused, since), and silently.
cudaError_t release(void *ptr, const void *graph = nullptr) {
  if (ptr == nullptr) return cudaSuccess;
  Alloc a;
  {
    std::lock_guard<std::mutex> lock(alloc_mutex());
    auto it = allocs().find(reinterpret_cast<uintptr_t>(ptr));
    if (graph != nullptr && (it == allocs().end() || it->second.graph != graph)) {
      return cudaErrorInvalidValue;
    }
    if (it == allocs().end()) return fail(cudaErrorInvalidValue);
    a = it->second;
    allocs().erase(it);
  }
  munmap(ptr, a.mapped);
  munmap(a.view, a.mapped);
  return cudaSuccess;
}

// ---- streams ------------------------------------------------------------------------------------

class Stream {
 public:
  Stream() : worker_([this] { loop(); }) {}
  ~Stream() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    work_cv_.notify_all();
    worker_.join();
  }
  void push(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(fn));
    }
    work_cv_.notify_one();
  }
  void push_all(const std::vector<std::function<void()>> &fns) {  // nothing in between
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.insert(queue_.end(), fns.begin(), fns.end());
    }
    work_cv_.notify_one();
  }
  void synchronize() {
    std::unique_lock<std::mutex> lock(mutex_);
    idle_cv_.wait(lock, [&] { return queue_.empty() && !running_; });
  }
  bool idle() {
    std::lock_guard<std::mutex> lock(mutex_);
    return queue_.empty() && !running_;
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and drained
        fn = std::move(queue_.front());
        queue_.pop_front();
        running_ = true;
      }
      fn();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        running_ = false;
        if (queue_.empty()) idle_cv_.notify_all();
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable work_cv_, idle_cv_;
  std::deque<std::function<void()>> queue_;
  bool running_ = false, stop_ = false;
  std::thread worker_;
};

std::mutex &stream_mutex() {
  return fake_gpu::forever<std::mutex, kStreams>();
}
// Created streams by handle (their workers may be blocked in a kernel at exit).
std::map<cudaStream_t, Stream *> &streams() {
  return fake_gpu::forever<std::map<cudaStream_t, Stream *>>();
}
Stream *default_stream() {
  return &fake_gpu::forever<Stream>();
}

Stream *find_stream(cudaStream_t handle) {
  if (handle == nullptr || handle == cudaStreamLegacy || handle == cudaStreamPerThread) {
    return default_stream();
  }
  std::lock_guard<std::mutex> lock(stream_mutex());
  auto it = streams().find(handle);
  return it == streams().end() ? nullptr : it->second;
}

void synchronize_all() {
  std::vector<Stream *> all{default_stream()};
  {
    std::lock_guard<std::mutex> lock(stream_mutex());
    for (auto &s : streams()) all.push_back(s.second);
  }
  for (Stream *s : all) s->synchronize();
}

// ---- stream capture (CUDA graphs) ---------------------------------------------------------------

// What a captured operation becomes. Each cudaGraphLaunch runs on_launch (if any) on the
// launching thread and queues run on its stream: the fake NCCL counts its kernels in flight so.
struct Node {
  std::function<void()> run, on_launch;
};

// What cudaMallocAsync allocated under capture: the graph's (a captured cudaFreeAsync of it is
// no node, as a graph's memory nodes reuse one address on every launch). Released with the
// last capture, graph, executable graph or launch in flight holding it, so no replay touches
// freed memory and a launch allocates nothing; a plain cudaFree/cudaFreeAsync may release one
// earlier (Alloc::graph then no longer names this).
struct GraphMemory {
  std::vector<void *> ptrs;
  ~GraphMemory() {
    for (void *p : ptrs) release(p, this);
  }
};

struct Capture {
  cudaStreamCaptureMode mode;
  std::thread::id thread;  // the one that began it
  unsigned long long id;   // cudaStreamGetCaptureInfo
  bool invalidated = false;
  std::vector<Node> nodes;
  std::shared_ptr<GraphMemory> memory = std::make_shared<GraphMemory>();
};
std::mutex &capture_mutex() {
  return fake_gpu::forever<std::mutex, kCaptures>();
}
// Ongoing captures (active or invalidated) by stream; only created streams capture.
std::map<cudaStream_t, std::shared_ptr<Capture>> &captures() {
  return fake_gpu::forever<std::map<cudaStream_t, std::shared_ptr<Capture>>>();
}
// cudaThreadExchangeStreamCaptureMode: how this thread's potentially unsafe calls are judged.
thread_local cudaStreamCaptureMode t_capture_mode = cudaStreamCaptureModeGlobal;

cudaStreamCaptureStatus capture_status(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(capture_mutex());
  auto it = captures().find(stream);
  if (it == captures().end()) return cudaStreamCaptureStatusNone;
  return it->second->invalidated ? cudaStreamCaptureStatusInvalidated
                                 : cudaStreamCaptureStatusActive;
}

// For a call that queues work on `stream`: whether it is captured, or the runtime's error for
// an unknown stream or an invalidated capture.
cudaError_t queue_state(cudaStream_t stream, bool *captured) {
  if (find_stream(stream) == nullptr) return fail(cudaErrorInvalidResourceHandle);
  const cudaStreamCaptureStatus status = capture_status(stream);
  if (status == cudaStreamCaptureStatusInvalidated) {
    return fail(cudaErrorStreamCaptureInvalidated);
  }
  *captured = status == cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

void invalidate(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(capture_mutex());
  auto it = captures().find(stream);
  if (it != captures().end()) it->second->invalidated = true;
}

// A potentially unsafe call (a synchronization, a query, a synchronous allocation or copy) by
// this thread, judged as CUDA documents: unless the thread's mode is Relaxed, it is prohibited
// by the thread's own non-Relaxed capture and, in Global mode, by any other thread's Global
// capture; `own` (a stream it synchronizes) prohibits it by capturing, whatever the modes. The
// captures that prohibit it are invalidated, as the runtime does: their cudaStreamEndCapture
// fails (a watchdog thread polling events in Global mode kills the application's capture).
bool prohibited(cudaStream_t own = nullptr) {
  const std::thread::id me = std::this_thread::get_id();
  const cudaStreamCaptureMode mode = t_capture_mode;
  bool hit = false;
  std::lock_guard<std::mutex> lock(capture_mutex());
  for (auto &[stream, c] : captures()) {
    const bool mine = c->thread == me && c->mode != cudaStreamCaptureModeRelaxed;
    const bool global = mode == cudaStreamCaptureModeGlobal && c->thread != me &&
                        c->mode == cudaStreamCaptureModeGlobal;
    if ((mode != cudaStreamCaptureModeRelaxed && (mine || global)) ||
        (own != nullptr && stream == own)) {
      c->invalidated = true;
      hit = true;
    }
  }
  return hit;
}
#define FAKE_UNSAFE_CALL(own) \
  if (prohibited(own)) return fail(cudaErrorStreamCaptureUnsupported)

// Queues the node on the stream, or appends it to the stream's capture. Errors:
// cudaErrorInvalidResourceHandle (unknown stream), cudaErrorStreamCaptureInvalidated (the node
// is dropped).
cudaError_t push(cudaStream_t stream, Node node) {
  Stream *s = find_stream(stream);
  if (s == nullptr) return cudaErrorInvalidResourceHandle;
  {
    std::lock_guard<std::mutex> lock(capture_mutex());
    auto it = captures().find(stream);
    if (it != captures().end()) {
      if (it->second->invalidated) return cudaErrorStreamCaptureInvalidated;
      it->second->nodes.push_back(std::move(node));
      return cudaSuccess;
    }
  }
  if (node.on_launch) node.on_launch();
  s->push(std::move(node.run));
  return cudaSuccess;
}

// Captured graphs and their executable copies (which share the graph's memory).
struct Graph {
  std::vector<Node> nodes;
  std::shared_ptr<GraphMemory> memory;
};
std::mutex &graph_mutex() {
  return fake_gpu::forever<std::mutex, kGraphs>();
}
std::map<cudaGraph_t, std::shared_ptr<Graph>> &graphs() {
  return fake_gpu::forever<std::map<cudaGraph_t, std::shared_ptr<Graph>>>();
}
std::map<cudaGraphExec_t, std::shared_ptr<Graph>> &graph_execs() {
  return fake_gpu::forever<std::map<cudaGraphExec_t, std::shared_ptr<Graph>>>();
}

// Forgets a graph or executable-graph handle. What it held is released after the lock (`held`
// is declared before it): the last holder may free graph memory.
template <typename Handle>
cudaError_t drop(std::map<Handle, std::shared_ptr<Graph>> &table, Handle handle) {
  std::shared_ptr<Graph> held;
  std::lock_guard<std::mutex> lock(graph_mutex());
  auto it = table.find(handle);
  if (it == table.end()) return fail(cudaErrorInvalidResourceHandle);
  held = std::move(it->second);
  table.erase(it);
  return cudaSuccess;
}

// ---- events -------------------------------------------------------------------------------------

struct Event {
  std::atomic<uint64_t> recorded{0}, completed{0};
  std::atomic<bool> captured{false};  // last recorded in a capture: cudaErrorCapturedEvent
};
std::mutex &event_mutex() {
  return fake_gpu::forever<std::mutex, kEvents>();
}
std::map<cudaEvent_t, std::shared_ptr<Event>> &events() {
  return fake_gpu::forever<std::map<cudaEvent_t, std::shared_ptr<Event>>>();
}
std::shared_ptr<Event> find_event(cudaEvent_t handle) {
  std::lock_guard<std::mutex> lock(event_mutex());
  auto it = events().find(handle);
  return it == events().end() ? nullptr : it->second;
}

bool is_device(const void *p, size_t bytes) {
  return fake_gpu::device_view(p, bytes) != nullptr;
}

}  // namespace

// ---- the private interface (fake_gpu.h) ---------------------------------------------------------

namespace fake_gpu {

char *device_view(const void *ptr, size_t bytes, int *device) {
  std::lock_guard<std::mutex> lock(alloc_mutex());
  const auto *a = find_alloc(ptr);
  if (a == nullptr) return nullptr;
  const auto offset = reinterpret_cast<uintptr_t>(ptr) - a->first;
  if (offset + bytes > a->second.bytes) return nullptr;
  if (device != nullptr) *device = a->second.device;
  return a->second.view + offset;
}

bool enqueue(cudaStream_t stream, std::function<void()> fn) {
  return enqueue(stream, std::move(fn), nullptr);
}

bool enqueue(cudaStream_t stream, std::function<void()> fn, std::function<void()> on_launch) {
  return push(stream, Node{std::move(fn), std::move(on_launch)}) != cudaErrorInvalidResourceHandle;
}

bool capturing(cudaStream_t stream) {
  return ::capture_status(stream) == cudaStreamCaptureStatusActive;
}

bool capture_status(cudaStream_t stream, cudaStreamCaptureStatus *status) {
  if (find_stream(stream) == nullptr) return false;
  *status = ::capture_status(stream);
  return true;
}

bool prohibited(cudaStream_t stream) {
  return ::prohibited(stream);
}

int current_device() {
  return t_device;
}

bool synchronize(cudaStream_t stream) {
  Stream *s = find_stream(stream);
  if (s == nullptr) return false;
  s->synchronize();
  return true;
}

bool idle(cudaStream_t stream, bool *idle) {
  Stream *s = find_stream(stream);
  if (s == nullptr) return false;
  *idle = s->idle();
  return true;
}

int runtime_context_device() {
  return t_context ? t_device : -1;
}

void fault(const char *what) {
  std::fprintf(stderr, "fake GPU: kernel fault: %s (cudaErrorIllegalAddress from now on)\n", what);
  int expected = cudaSuccess;
  g_sticky.compare_exchange_strong(expected, cudaErrorIllegalAddress);
}

}  // namespace fake_gpu

// ---- runtime entry points -----------------------------------------------------------------------

FAKE_CUDART cudaError_t cudaGetDeviceCount(int *count) {
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  *count = device_count();
  return *count > 0 ? cudaSuccess : fail(cudaErrorNoDevice);
}

FAKE_CUDART cudaError_t cudaSetDevice(int device) {
  FAKE_ENTER;
  if (device_count() == 0) return fail(cudaErrorNoDevice);
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  t_device = device;
  return cudaSuccess;
}

FAKE_CUDART cudaError_t cudaGetDevice(int *device) {
  FAKE_ENTER;
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  if (device_count() == 0) return fail(cudaErrorNoDevice);
  *device = t_device;
  return cudaSuccess;
}

FAKE_CUDART cudaError_t cudaRuntimeGetVersion(int *version) {
  if (version == nullptr) return fail(cudaErrorInvalidValue);
  *version = 13000;
  return cudaSuccess;
}

FAKE_CUDART cudaError_t cudaGetLastError(void) {
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e != cudaSuccess ? e : static_cast<cudaError_t>(g_sticky.load());
}

namespace {
// The codes the fake returns, with the runtime's names and texts; the last row is the fallback.
struct ErrorText {
  cudaError_t code;
  const char *name, *text;
};
constexpr ErrorText kErrorTexts[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorNoDevice, "cudaErrorNoDevice",
     "no CUDA-capable device is detected (fake: MNCL_FAKE_GPUS=0)"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered"},
    {cudaErrorIllegalState, "cudaErrorIllegalState",
     "the operation cannot be performed in the present state"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorCapturedEvent, "cudaErrorCapturedEvent",
     "operation not permitted on an event last recorded in a capturing stream"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};
const ErrorText &error_text(cudaError_t error) {
  for (const ErrorText &e : kErrorTexts) {
    if (e.code == error) return e;
  }
  return kErrorTexts[sizeof kErrorTexts / sizeof kErrorTexts[0] - 1];
}
}  // namespace

FAKE_CUDART const char *cudaGetErrorName(cudaError_t error) {
  return error_text(error).name;
}

FAKE_CUDART const char *cudaGetErrorString(cudaError_t error) {
  return error_text(error).text;
}

FAKE_CUDART cudaError_t cudaMalloc(void **ptr, size_t bytes) {
  FAKE_ENTER;
  FAKE_UNSAFE_CALL(nullptr);
  return allocate(ptr, bytes);
}

// Allocated at once (valid for any later work in stream order), freed in stream order. Under
// capture the allocation is the graph's (see GraphMemory).
FAKE_CUDART cudaError_t cudaMallocAsync(void **ptr, size_t bytes, cudaStream_t stream) {
  FAKE_ENTER;
  if (find_stream(stream) == nullptr) return fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<Capture> c;
  {
    std::lock_guard<std::mutex> lock(capture_mutex());
    auto it = captures().find(stream);
    if (it != captures().end()) c = it->second;
  }
  if (c == nullptr) return allocate(ptr, bytes);
  if (c->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
  if (cudaError_t e = allocate(ptr, bytes, c->memory.get())) return e;
  std::lock_guard<std::mutex> lock(capture_mutex());  // GraphMemory::ptrs, until captured
  if (*ptr != nullptr) c->memory->ptrs.push_back(*ptr);
  return cudaSuccess;
}

FAKE_CUDART cudaError_t cudaFree(void *ptr) {
  FAKE_ENTER;
  FAKE_UNSAFE_CALL(nullptr);
  synchronize_all();  // cudaFree waits for the device, so work in flight never loses memory
  return release(ptr);
}

// Under capture only the graph's own memory may be freed, and that frees nothing (a replay
// would otherwise free it again, maybe under another allocation by then).
FAKE_CUDART cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream) {
  FAKE_ENTER;
  if (ptr != nullptr && !is_device(ptr, 1)) return fail(cudaErrorInvalidValue);
  bool captured = false;
  if (cudaError_t e = queue_state(stream, &captured)) return e;
  if (captured) {
    if (ptr == nullptr) return cudaSuccess;
    bool graphs = false;
    {
      std::lock_guard<std::mutex> lock(alloc_mutex());
      auto it = allocs().find(reinterpret_cast<uintptr_t>(ptr));
      graphs = it != allocs().end() && it->second.graph != nullptr;
    }
    if (!graphs) {
      std::fprintf(stderr,
                   "fake GPU: cudaFreeAsync of %p under capture: the fake frees only memory "
                   "allocated in a capture there\n",
                   ptr);
      invalidate(stream);
      return fail(cudaErrorStreamCaptureUnsupported);
    }
    if (cudaError_t e = push(stream, Node{[] {}, nullptr})) return fail(e);
    return cudaSuccess;
  }
  if (!fake_gpu::enqueue(stream, [ptr] { release(ptr); })) {
    return fail(cudaErrorInvalidResourceHandle);
  }
  return cudaSuccess;
}

FAKE_CUDART cudaError_t cudaMemset(void *ptr, int value, size_t bytes) {
  FAKE_ENTER;
  FAKE_UNSAFE_CALL(nullptr);
  synchronize_all();
  char *view = fake_gpu::device_view(ptr, bytes);
  if (view == nullptr) return fail(cudaErrorInvalidValue);
  std::memset(view, value, bytes);
  return cudaSuccess;
}

FAKE_CUDART cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes,
                                        cudaMemcpyKind kind, cudaStream_t stream) {
  FAKE_ENTER;
  if (bytes == 0) return cudaSuccess;
  const bool dst_dev = is_device(dst, bytes), src_dev = is_device(src, bytes);
  if (kind == cudaMemcpyDefault) {
    kind = src_dev ? (dst_dev ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                   : (dst_dev ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
  }
  // The kind must match the pointers (the real runtime would copy garbage or fault).
  const bool ok = (kind == cudaMemcpyHostToDevice && dst_dev && !src_dev) ||
                  (kind == cudaMemcpyDeviceToHost && src_dev && !dst_dev) ||
                  (kind == cudaMemcpyDeviceToDevice && src_dev && dst_dev) ||
                  (kind == cudaMemcpyHostToHost && !src_dev && !dst_dev);
  if (!ok) {
    std::fprintf(stderr, "fake GPU: cudaMemcpyAsync: kind %d does not match %p -> %p (%zu B)\n",
                 static_cast<int>(kind), src, dst, bytes);
    return fail(cudaErrorInvalidValue);
  }
  bool captured = false;
  if (cudaError_t e = queue_state(stream, &captured)) return e;
  if (captured && !dst_dev) {
    // Into pageable memory the copy is synchronous, which a capture cannot record.
    invalidate(stream);
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  std::function<void()> copy;
  if (!src_dev && captured) {
    // A graph's copy node reads the host memory each time it runs (as from pinned memory): a
    // copy staged now would replay stale data.
    copy = [dst, src, bytes] {
      char *to = fake_gpu::device_view(dst, bytes);
      if (to == nullptr) return fake_gpu::fault("cudaMemcpyAsync into freed device memory");
      std::memcpy(to, src, bytes);
    };
  } else if (!src_dev) {
    // From host memory the source is read now, as the runtime stages pageable memory.
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char *>(src),
                                                      static_cast<const char *>(src) + bytes);
    copy = [dst, staged, dst_dev] {
      char *to = dst_dev ? fake_gpu::device_view(dst, staged->size()) : static_cast<char *>(dst);
      if (to == nullptr) return fake_gpu::fault("cudaMemcpyAsync into freed device memory");
      std::memcpy(to, staged->data(), staged->size());
    };
  } else {
    copy = [dst, src, bytes, dst_dev] {
      const char *from = fake_gpu::device_view(src, bytes);
      char *to = dst_dev ? fake_gpu::device_view(dst, bytes) : static_cast<char *>(dst);
      if (from == nullptr || to == nullptr) {
        return fake_gpu::fault("cudaMemcpyAsync on freed device memory");
      }
      std::memmove(to, from, bytes);
    };
  }
  if (cudaError_t e = push(stream, Node{std::move(copy), nullptr})) return fail(e);
  // Into pageable host memory the runtime returns only once the copy is done.
  if (!dst_dev) fake_gpu::synchronize(stream);
  return cudaSuccess;
}

FAKE_CUDART cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
  FAKE_ENTER;
  FAKE_UNSAFE_CALL(nullptr);
  if (cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, nullptr)) return e;
  default_stream()->synchronize();
  return static_cast<cudaError_t>(g_sticky.load());
}

FAKE_CUDART cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *attr, const void *ptr) {
  FAKE_ENTER;
  if (attr == nullptr) return fail(cudaErrorInvalidValue);
  std::memset(attr, 0, sizeof *attr);
  int device = -2;
  if (fake_gpu::device_view(ptr, 1, &device) != nullptr) {
    attr->type = cudaMemoryTypeDevice;
    attr->device = device;
    attr->devicePointer = const_cast<void *>(ptr);
  } else {
    attr->type = cudaMemoryTypeUnregistered;  // plain host memory, as CUDA 11+ reports it
    attr->device = -2;
    attr->hostPointer = const_cast<void *>(ptr);
  }
  return cudaSuccess;
}

FAKE_CUDART cudaError_t cudaStreamCreate(cudaStream_t *stream) {
  FAKE_ENTER;
  if (stream == nullptr) return fail(cudaErrorInvalidValue);
  auto *s = new Stream;
  *stream = reinterpret_cast<cudaStream_t>(s);
  std::lock_guard<std::mutex> lock(stream_mutex());
  streams()[*stream] = s;
  return cudaSuccess;
}

FAKE_CUDART cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  FAKE_ENTER;
  Stream *s = nullptr;
  {
    std::lock_guard<std::mutex> lock(stream_mutex());
    auto it = streams().find(stream);
    if (it == streams().end()) return fail(cudaErrorInvalidResourceHandle);
    s = it->second;
    streams().erase(it);
  }
  {
    // Its capture, if any, ends with it (and releases the capture's memory).
    std::lock_guard<std::mutex> lock(capture_mutex());
    captures().erase(stream);
  }
  delete s;  // runs what is queued first, as the runtime does
  return cudaSuccess;
}

FAKE_CUDART cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  FAKE_ENTER;
  Stream *s = find_stream(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  FAKE_UNSAFE_CALL(stream);
  s->synchronize();
  return static_cast<cudaError_t>(g_sticky.load());
}

FAKE_CUDART cudaError_t cudaDeviceSynchronize(void) {
  FAKE_ENTER;
  FAKE_UNSAFE_CALL(nullptr);
  synchronize_all();
  return static_cast<cudaError_t>(g_sticky.load());
}

FAKE_CUDART cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  FAKE_ENTER;
  (void)flags;
  if (event == nullptr) return fail(cudaErrorInvalidValue);
  auto e = std::make_shared<Event>();
  *event = reinterpret_cast<cudaEvent_t>(e.get());
  std::lock_guard<std::mutex> lock(event_mutex());
  events()[*event] = std::move(e);
  return cudaSuccess;
}

FAKE_CUDART cudaError_t cudaEventDestroy(cudaEvent_t event) {
  FAKE_ENTER;
  std::lock_guard<std::mutex> lock(event_mutex());
  // A record still queued keeps its Event alive (shared_ptr), as the runtime defers the free.
  return events().erase(event) == 1 ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

FAKE_CUDART cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  FAKE_ENTER;
  auto e = find_event(event);
  if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
  bool captured = false;
  if (cudaError_t err = queue_state(stream, &captured)) return err;
  if (captured) {
    // Captured, the record is an edge of the graph, not a record that replays complete: the
    // event is a captured one until recorded outside a capture again.
    if (push(stream, Node{[] {}, nullptr}) != cudaSuccess) {
      return fail(cudaErrorStreamCaptureInvalidated);
    }
    e->captured = true;
    return cudaSuccess;
  }
  e->captured = false;
  const uint64_t generation = ++e->recorded;
  auto mark = [e, generation] {
    uint64_t seen = e->completed.load();
    while (seen < generation && !e->completed.compare_exchange_weak(seen, generation)) {
    }
  };
  if (!fake_gpu::enqueue(stream, mark)) return fail(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}

FAKE_CUDART cudaError_t cudaEventQuery(cudaEvent_t event) {
  FAKE_ENTER;
  auto e = find_event(event);
  if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (e->captured) return fail(cudaErrorCapturedEvent);
  FAKE_UNSAFE_CALL(nullptr);
  // Not a sticky error: cudaErrorNotReady does not set the last error in the runtime either.
  return e->completed.load() >= e->recorded.load() ? cudaSuccess : cudaErrorNotReady;
}

// ---- stream capture and graphs ------------------------------------------------------------------

FAKE_CUDART cudaError_t cudaStreamBeginCapture(cudaStream_t stream,
                                               enum cudaStreamCaptureMode mode) {
  FAKE_ENTER;
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed) {
    return fail(cudaErrorInvalidValue);
  }
  // The fake's NULL, legacy and per-thread streams are one stream, which never captures.
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  if (find_stream(stream) == nullptr) return fail(cudaErrorInvalidResourceHandle);
  static unsigned long long last_id = 0;  // under capture_mutex()
  std::lock_guard<std::mutex> lock(capture_mutex());
  auto &c = captures()[stream];
  if (c != nullptr) return fail(cudaErrorIllegalState);
  c = std::make_shared<Capture>();
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->id = ++last_id;
  return cudaSuccess;
}

// Ends the capture, invalidated or not (the stream no longer captures), except from the wrong
// thread.
FAKE_CUDART cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph) {
  FAKE_ENTER;
  if (graph == nullptr) return fail(cudaErrorInvalidValue);
  if (find_stream(stream) == nullptr) return fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<Capture> c;
  {
    std::lock_guard<std::mutex> lock(capture_mutex());
    auto it = captures().find(stream);
    if (it == captures().end()) return fail(cudaErrorIllegalState);
    if (it->second->mode != cudaStreamCaptureModeRelaxed &&
        it->second->thread != std::this_thread::get_id()) {
      return fail(cudaErrorStreamCaptureWrongThread);
    }
    c = std::move(it->second);
    captures().erase(it);
  }
  if (c->invalidated) {
    *graph = nullptr;
    return fail(cudaErrorStreamCaptureInvalidated);  // its memory goes with c
  }
  auto g = std::make_shared<Graph>(Graph{std::move(c->nodes), std::move(c->memory)});
  *graph = reinterpret_cast<cudaGraph_t>(g.get());
  std::lock_guard<std::mutex> lock(graph_mutex());
  graphs()[*graph] = std::move(g);
  return cudaSuccess;
}

// Not a potentially unsafe call: callers ask it during captures.
FAKE_CUDART cudaError_t cudaStreamIsCapturing(cudaStream_t stream,
                                              enum cudaStreamCaptureStatus *status) {
  FAKE_ENTER;
  if (status == nullptr) return fail(cudaErrorInvalidValue);
  if (!fake_gpu::capture_status(stream, status)) return fail(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}

// The status and the capture's id; the graph being built and its dependencies are not
// modelled (NULL, none).
FAKE_CUDART cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream,
                                                 enum cudaStreamCaptureStatus *status,
                                                 unsigned long long *id, cudaGraph_t *graph,
                                                 const cudaGraphNode_t **dependencies,
                                                 const cudaGraphEdgeData **edge_data,
                                                 size_t *num_dependencies) {
  FAKE_ENTER;
  if (status == nullptr) return fail(cudaErrorInvalidValue);
  if (find_stream(stream) == nullptr) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(capture_mutex());
  auto it = captures().find(stream);
  *status = it == captures().end()    ? cudaStreamCaptureStatusNone
            : it->second->invalidated ? cudaStreamCaptureStatusInvalidated
                                      : cudaStreamCaptureStatusActive;
  if (id != nullptr && it != captures().end()) *id = it->second->id;
  if (graph != nullptr) *graph = nullptr;
  if (dependencies != nullptr) *dependencies = nullptr;
  if (edge_data != nullptr) *edge_data = nullptr;
  if (num_dependencies != nullptr) *num_dependencies = 0;
  return cudaSuccess;
}

FAKE_CUDART cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode) {
  if (mode == nullptr ||
      (*mode != cudaStreamCaptureModeGlobal && *mode != cudaStreamCaptureModeThreadLocal &&
       *mode != cudaStreamCaptureModeRelaxed)) {
    return fail(cudaErrorInvalidValue);
  }
  std::swap(*mode, t_capture_mode);
  return cudaSuccess;
}

// The executable graph is a copy of the nodes (later changes to the graph are not modelled
// anyway) sharing the graph's memory. Flags are accepted and ignored.
FAKE_CUDART cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                             unsigned long long flags) {
  FAKE_ENTER;
  (void)flags;
  if (exec == nullptr) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(graph_mutex());
  auto it = graphs().find(graph);
  if (it == graphs().end()) return fail(cudaErrorInvalidValue);
  auto x = std::make_shared<Graph>(*it->second);
  *exec = reinterpret_cast<cudaGraphExec_t>(x.get());
  graph_execs()[*exec] = std::move(x);
  return cudaSuccess;
}

FAKE_CUDART cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *exec, cudaGraph_t graph,
                                                      unsigned long long flags) {
  return cudaGraphInstantiate(exec, graph, flags);
}

// Queues every node, in capture order and with nothing in between, then a marker that holds the
// executable graph (and its memory) until the launch has run. Launching into a capture (a child
// graph) is not modelled.
FAKE_CUDART cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  FAKE_ENTER;
  std::shared_ptr<Graph> x;
  {
    std::lock_guard<std::mutex> lock(graph_mutex());
    auto it = graph_execs().find(exec);
    if (it == graph_execs().end()) return fail(cudaErrorInvalidResourceHandle);
    x = it->second;
  }
  Stream *s = find_stream(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (capture_status(stream) != cudaStreamCaptureStatusNone) {
    invalidate(stream);
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  std::vector<std::function<void()>> work;
  work.reserve(x->nodes.size() + 1);
  for (const Node &n : x->nodes) {
    if (n.on_launch) n.on_launch();
    work.push_back(n.run);
  }
  work.emplace_back([x] {});
  s->push_all(work);
  return cudaSuccess;
}

// A launch in flight keeps running; the memory goes with the last holder (see GraphMemory).
FAKE_CUDART cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  FAKE_ENTER;
  return drop(graph_execs(), exec);
}

FAKE_CUDART cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  FAKE_ENTER;
  return drop(graphs(), graph);
}
