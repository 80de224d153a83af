// libmncl-fake-cuda.so: see fake_cuda.h. Only what the core's staging path calls, with the
// driver's signatures (the _v2 names are the ABI the driver exports).
#include "fake_cuda.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "fake_pointer_attributes.h"

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using CUresult = int;
constexpr CUresult kSuccess = 0, kInvalidValue = 1, kNotInitialized = 3, kInvalidContext = 201,
                   kNotReady = 600, kLaunchFailed = 719;
struct Ctx;  // a context is just a distinct address: one per device
Ctx *context_of(int ordinal) {
  return reinterpret_cast<Ctx *>(0x1000 + 16 * ordinal);
}

enum Kind { kDevice, kManaged, kPinned };
struct Alloc {
  size_t bytes, mapped;
  Kind kind;
  int ordinal;
};
struct Copy {
  void *dst;
  const void *src;
  size_t bytes;
  bool to_device;
};

std::mutex g_mutex;
bool g_initialized = false;
std::map<uintptr_t, Alloc> g_allocs;                 // by base address
std::map<const void *, std::vector<Copy>> g_queues;  // pending copies per stream
std::set<const void *> g_held;                       // streams whose work never finishes
fake_cuda_counters_t g_counters{};
std::string g_fail_next;
int g_fail_skip = 0;  // calls of g_fail_next that still succeed first
uintptr_t g_next_stream = 0x5000;
thread_local std::vector<Ctx *> t_contexts;
thread_local char t_per_thread_stream;  // its address names this thread's default stream

// The stream a handle names: cudaStreamPerThread (0x2) is the calling thread's own default
// stream, the legacy handle (0x1) the NULL stream. (The fake does not model the legacy
// stream's synchronization with the others.)
const void *stream_of(const void *handle) {
  if (handle == reinterpret_cast<const void *>(0x2)) return &t_per_thread_stream;
  if (handle == reinterpret_cast<const void *>(0x1)) return nullptr;
  return handle;
}

// The allocation containing p, or nullptr. Caller holds g_mutex.
std::pair<const uintptr_t, Alloc> *find(const void *p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  auto it = g_allocs.upper_bound(addr);
  if (it == g_allocs.begin()) return nullptr;
  --it;
  return addr < it->first + it->second.bytes ? &*it : nullptr;
}

bool is_device(const void *p, size_t bytes) {
  auto *a = find(p);
  return a != nullptr && a->second.kind != kPinned &&
         reinterpret_cast<uintptr_t>(p) + bytes <= a->first + a->second.bytes;
}

// Lifts PROT_NONE around a host-side access to fake device memory. Caller holds g_mutex.
void set_access(const void *dev, bool open) {
  auto *a = find(dev);
  if (a == nullptr || a->second.kind == kPinned) return;
  mprotect(reinterpret_cast<void *>(a->first), a->second.mapped,
           open ? PROT_READ | PROT_WRITE : PROT_NONE);
}

void raw_copy(const Copy &c) {
  const void *dev = c.to_device ? c.dst : c.src;
  set_access(dev, true);
  std::memcpy(c.dst, c.src, c.bytes);
  set_access(dev, false);
}

// Shared checks of the entry points: initialized, injected failure, current context.
CUresult enter(const char *name, bool needs_context) {
  if (!g_initialized) return kNotInitialized;
  if (!g_fail_next.empty() && g_fail_next == name && g_fail_skip-- <= 0) {
    g_fail_next.clear();
    return kLaunchFailed;
  }
  if (needs_context && t_contexts.empty()) {
    ++g_counters.bad_context;
    return kInvalidContext;
  }
  return kSuccess;
}

}  // namespace

// ---- driver entry points --------------------------------------------------------------------

FAKE_EXPORT CUresult cuInit(unsigned flags) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (flags != 0) return kInvalidValue;
  g_initialized = true;
  return kSuccess;
}

FAKE_EXPORT CUresult cuDriverGetVersion(int *version) {
  *version = 13000;
  return kSuccess;
}

FAKE_EXPORT CUresult cuGetErrorName(CUresult error, const char **name) {
  switch (error) {
    case kSuccess:
      *name = "CUDA_SUCCESS";
      break;
    case kInvalidValue:
      *name = "CUDA_ERROR_INVALID_VALUE";
      break;
    case kNotInitialized:
      *name = "CUDA_ERROR_NOT_INITIALIZED";
      break;
    case kInvalidContext:
      *name = "CUDA_ERROR_INVALID_CONTEXT";
      break;
    case kNotReady:
      *name = "CUDA_ERROR_NOT_READY";
      break;
    case kLaunchFailed:
      *name = "CUDA_ERROR_LAUNCH_FAILED";
      break;
    default:
      *name = nullptr;
      return kInvalidValue;
  }
  return kSuccess;
}

FAKE_EXPORT CUresult cuGetErrorString(CUresult error, const char **text) {
  switch (error) {
    case kLaunchFailed:
      *text = "unspecified launch failure (injected by the fake)";
      break;
    case kInvalidContext:
      *text = "invalid device context";
      break;
    default:
      return cuGetErrorName(error, text);
  }
  return kSuccess;
}

// Attributes: 1 context, 2 memory type, 8 is managed, 9 device ordinal (cuda.h values).
FAKE_EXPORT CUresult cuPointerGetAttributes(unsigned n, const int *attrs, void **data,
                                            unsigned long long ptr) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (CUresult r = enter("cuPointerGetAttributes", false)) return r;
  ++g_counters.attr_queries;
  const auto *a = find(reinterpret_cast<const void *>(ptr));
  fake_cuda::PointerFacts facts;
  if (a != nullptr) {
    const bool pinned = a->second.kind == kPinned;
    facts.context = pinned ? nullptr : context_of(a->second.ordinal);
    facts.memory_type = pinned ? 1 : 2;
    facts.managed = a->second.kind == kManaged;
    facts.ordinal = a->second.ordinal;
  }
  return fake_cuda::write_pointer_attributes(n, attrs, data, facts) ? kSuccess : kInvalidValue;
}

FAKE_EXPORT CUresult cuDevicePrimaryCtxRetain(Ctx **ctx, int ordinal) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (CUresult r = enter("cuDevicePrimaryCtxRetain", false)) return r;
  if (ordinal < 0 || ordinal > 7) return kInvalidValue;
  *ctx = context_of(ordinal);
  return kSuccess;
}

FAKE_EXPORT CUresult cuCtxPushCurrent_v2(Ctx *ctx) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (CUresult r = enter("cuCtxPushCurrent_v2", false)) return r;
  if (ctx == nullptr) return kInvalidContext;
  t_contexts.push_back(ctx);
  ++g_counters.ctx_depth;
  return kSuccess;
}

FAKE_EXPORT CUresult cuCtxPopCurrent_v2(Ctx **ctx) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (CUresult r = enter("cuCtxPopCurrent_v2", true)) return r;
  if (ctx) *ctx = t_contexts.back();
  t_contexts.pop_back();
  --g_counters.ctx_depth;
  return kSuccess;
}

FAKE_EXPORT CUresult cuMemHostAlloc(void **ptr, size_t bytes, unsigned flags) {
  std::lock_guard<std::mutex> lock(g_mutex);
  (void)flags;
  if (CUresult r = enter("cuMemHostAlloc", true)) return r;
  void *p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (p == nullptr) return 2;  // CUDA_ERROR_OUT_OF_MEMORY
  g_allocs[reinterpret_cast<uintptr_t>(p)] = Alloc{bytes, bytes, kPinned, -1};
  ++g_counters.host_allocs;
  *ptr = p;
  return kSuccess;
}

FAKE_EXPORT CUresult cuMemFreeHost(void *ptr) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (CUresult r = enter("cuMemFreeHost", false)) return r;
  auto it = g_allocs.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == g_allocs.end() || it->second.kind != kPinned) return kInvalidValue;
  g_allocs.erase(it);
  std::free(ptr);
  ++g_counters.host_frees;
  return kSuccess;
}

FAKE_EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, unsigned long long src, size_t bytes,
                                          void *stream) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (CUresult r = enter("cuMemcpyDtoHAsync_v2", true)) return r;
  const auto *s = reinterpret_cast<const void *>(src);
  if (!is_device(s, bytes) || is_device(dst, bytes)) return kInvalidValue;
  g_queues[stream_of(stream)].push_back(Copy{dst, s, bytes, false});
  ++g_counters.d2h_copies;
  return kSuccess;
}

FAKE_EXPORT CUresult cuMemcpyHtoDAsync_v2(unsigned long long dst, const void *src, size_t bytes,
                                          void *stream) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (CUresult r = enter("cuMemcpyHtoDAsync_v2", true)) return r;
  auto *d = reinterpret_cast<void *>(dst);
  if (!is_device(d, bytes) || is_device(src, bytes)) return kInvalidValue;
  g_queues[stream_of(stream)].push_back(Copy{d, src, bytes, true});
  ++g_counters.h2d_copies;
  return kSuccess;
}

// The queued copies happen when a query finds the stream done; a held stream is never done.
FAKE_EXPORT CUresult cuStreamQuery(void *handle) {
  const void *stream = stream_of(handle);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (CUresult r = enter("cuStreamQuery", true)) return r;
  ++g_counters.queries;
  if (g_held.count(stream) != 0) return kNotReady;
  ++g_counters.syncs;
  for (const Copy &c : g_queues[stream]) raw_copy(c);
  g_queues.erase(stream);
  return kSuccess;
}

// Events mark a stream's work so far: done when the stream is (a held stream never is).
struct FakeEvent {
  const void *stream = nullptr;
};

FAKE_EXPORT CUresult cuEventCreate(void **event, unsigned flags) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (CUresult r = enter("cuEventCreate", true)) return r;
  (void)flags;
  *event = new FakeEvent;
  ++g_counters.events;
  return kSuccess;
}

FAKE_EXPORT CUresult cuEventRecord(void *event, void *stream) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (CUresult r = enter("cuEventRecord", true)) return r;
  static_cast<FakeEvent *>(event)->stream = stream_of(stream);
  return kSuccess;
}

FAKE_EXPORT CUresult cuEventQuery(void *event) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (CUresult r = enter("cuEventQuery", true)) return r;
  const void *stream = static_cast<FakeEvent *>(event)->stream;
  if (g_held.count(stream) != 0) return kNotReady;
  for (const Copy &c : g_queues[stream]) raw_copy(c);
  g_queues.erase(stream);
  return kSuccess;
}

FAKE_EXPORT CUresult cuEventDestroy_v2(void *event) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (CUresult r = enter("cuEventDestroy_v2", false)) return r;
  delete static_cast<FakeEvent *>(event);
  --g_counters.events;
  return kSuccess;
}

// ---- test controls --------------------------------------------------------------------------

FAKE_EXPORT int fake_cuda_init(void) {
  return cuInit(0);
}

FAKE_EXPORT void *fake_cuda_malloc(size_t bytes, int ordinal, int managed) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t mapped = (bytes + page - 1) / page * page + page;  // never empty
  void *p = mmap(nullptr, mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  g_allocs[reinterpret_cast<uintptr_t>(p)] =
      Alloc{bytes > 0 ? bytes : 1, mapped, managed ? kManaged : kDevice, ordinal};
  return p;
}

FAKE_EXPORT void fake_cuda_free(void *ptr) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_allocs.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == g_allocs.end() || it->second.kind == kPinned) return;
  munmap(ptr, it->second.mapped);
  g_allocs.erase(it);
}

FAKE_EXPORT void fake_cuda_write(void *dev, const void *src, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (bytes > 0) raw_copy(Copy{dev, src, bytes, true});
}

FAKE_EXPORT void fake_cuda_read(void *dst, const void *dev, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (bytes > 0) raw_copy(Copy{dst, dev, bytes, false});
}

FAKE_EXPORT void *fake_cuda_stream_create(void) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_next_stream += 16;
  return reinterpret_cast<void *>(g_next_stream);
}

FAKE_EXPORT void fake_cuda_get_counters(fake_cuda_counters_t *out) {
  std::lock_guard<std::mutex> lock(g_mutex);
  *out = g_counters;
}

FAKE_EXPORT void fake_cuda_reset_counters(void) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const int64_t depth = g_counters.ctx_depth, events = g_counters.events;
  g_counters = fake_cuda_counters_t{};
  g_counters.ctx_depth = depth;
  g_counters.events = events;
}

FAKE_EXPORT void fake_cuda_hold_stream(void *handle, int held) {
  const void *stream = stream_of(handle);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (held) {
    g_held.insert(stream);
  } else {
    g_held.erase(stream);
  }
}

FAKE_EXPORT void fake_cuda_fail_next(const char *entry_point) {
  fake_cuda_fail_after(entry_point, 0);
}

FAKE_EXPORT void fake_cuda_fail_after(const char *entry_point, int successes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_fail_next = entry_point ? entry_point : "";
  g_fail_skip = successes;
}
