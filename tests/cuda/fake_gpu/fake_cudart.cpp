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
  char *view;  // the read-write mapping the fake's kernels use
};
enum Registry { kAllocs, kStreams, kEvents };  // forever<>'s tags: one mutex per table
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

cudaError_t allocate(void **ptr, size_t bytes) {
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
      Alloc{bytes, mapped, t_device, static_cast<char *>(view)};
  *ptr = guarded;
  return cudaSuccess;
}

cudaError_t release(void *ptr) {
  if (ptr == nullptr) return cudaSuccess;
  Alloc a;
  {
    std::lock_guard<std::mutex> lock(alloc_mutex());
    auto it = allocs().find(reinterpret_cast<uintptr_t>(ptr));
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
  void synchronize() {
    std::unique_lock<std::mutex> lock(mutex_);
    idle_cv_.wait(lock, [&] { return queue_.empty() && !running_; });
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

// ---- events -------------------------------------------------------------------------------------

struct Event {
  std::atomic<uint64_t> recorded{0}, completed{0};
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
  Stream *s = find_stream(stream);
  if (s == nullptr) return false;
  s->push(std::move(fn));
  return true;
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
  return allocate(ptr, bytes);
}

// Allocated at once (valid for any later work in stream order), freed in stream order.
FAKE_CUDART cudaError_t cudaMallocAsync(void **ptr, size_t bytes, cudaStream_t stream) {
  FAKE_ENTER;
  if (find_stream(stream) == nullptr) return fail(cudaErrorInvalidResourceHandle);
  return allocate(ptr, bytes);
}

FAKE_CUDART cudaError_t cudaFree(void *ptr) {
  FAKE_ENTER;
  synchronize_all();  // cudaFree waits for the device, so work in flight never loses memory
  return release(ptr);
}

FAKE_CUDART cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream) {
  FAKE_ENTER;
  if (ptr != nullptr && !is_device(ptr, 1)) return fail(cudaErrorInvalidValue);
  if (!fake_gpu::enqueue(stream, [ptr] { release(ptr); })) {
    return fail(cudaErrorInvalidResourceHandle);
  }
  return cudaSuccess;
}

FAKE_CUDART cudaError_t cudaMemset(void *ptr, int value, size_t bytes) {
  FAKE_ENTER;
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
  std::function<void()> copy;
  if (!src_dev) {
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
  Stream *s = find_stream(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  s->push(std::move(copy));
  // Into pageable host memory the runtime returns only once the copy is done.
  if (!dst_dev) s->synchronize();
  return cudaSuccess;
}

FAKE_CUDART cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
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
  delete s;  // runs what is queued first, as the runtime does
  return cudaSuccess;
}

FAKE_CUDART cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  FAKE_ENTER;
  Stream *s = find_stream(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  s->synchronize();
  return static_cast<cudaError_t>(g_sticky.load());
}

FAKE_CUDART cudaError_t cudaDeviceSynchronize(void) {
  FAKE_ENTER;
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
  // Not a sticky error: cudaErrorNotReady does not set the last error in the runtime either.
  return e->completed.load() >= e->recorded.load() ? cudaSuccess : cudaErrorNotReady;
}
