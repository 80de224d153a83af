"""CUDA arrays through the mncl package (run under mncl-run -n N): device buffers exposing
__cuda_array_interface__ (as CuPy arrays and PyTorch CUDA tensors do), allocated with whatever
libcudart.so.13 the loader finds: the fake GPU of tests/cuda/fake_gpu in CI, a real GPU under
tests/gpu/run.sh. On nccl they go to NCCL as they are; on host backends the core stages them.
Exact values for allreduce (out of place, in place, non-blocking), bcast, allgather,
reduce_scatter, allreduce_coalesced, sendrecv and a batch, on a stream of the array's, and on a
stream named by stream= (over the arrays' own, and arrays on two streams; on a host backend a
capturing stream so named is refused); the caller's objects come back; a CUDA input with a host
output works; a CUDA input without an output, a strided array and a read-only output are
refused; multi_node_mean_grad and bcast_data take CUDA arrays, and refuse them on one rank
before anything moves. Exits 77 (ctest: skipped) without NumPy or without a CUDA device."""

import ctypes
import os
import sys

from checks import numpy_or_skip

np = numpy_or_skip()

try:
    cudart = ctypes.CDLL(os.environ.get("MNCL_TEST_CUDART", "libcudart.so.13"),
                         mode=ctypes.RTLD_GLOBAL)
except OSError as e:
    print(f"SKIPPED: no CUDA runtime ({e})")
    sys.exit(77)
cudart.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
cudart.cudaFree.argtypes = [ctypes.c_void_p]
cudart.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
cudart.cudaStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
cudart.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
cudart.cudaStreamDestroy.argtypes = [ctypes.c_void_p]
_H2D, _D2H = 1, 2


def cuda(status, what):
    if status != 0:
        raise RuntimeError(f"{what} failed with CUDA error {status}")


devices = ctypes.c_int(0)
if cudart.cudaGetDeviceCount(ctypes.byref(devices)) != 0 or devices.value == 0:
    print("SKIPPED: no CUDA device")
    sys.exit(77)
local_rank = int(os.environ.get("MNCL_LOCAL_RANK", os.environ.get("MNCL_RANK", "0")))
cuda(cudart.cudaSetDevice(local_rank % devices.value), "cudaSetDevice")

from checks import world_and_checks  # noqa: E402 (the CUDA runtime first, as an application's)

np, mncl, comm, checks = world_and_checks()
expect, expect_raises = checks.expect, checks.expect_raises
r, n = comm.rank, comm.size


class DeviceArray:
    """A minimal CUDA array (what CuPy and PyTorch expose to consumers)."""

    def __init__(self, host, stream=None, readonly=False, strides=None):
        host = np.ascontiguousarray(host)
        self.shape, self.dtype, self.nbytes = host.shape, host.dtype, host.nbytes
        self.stream, self.readonly, self.strides = stream, readonly, strides
        ptr = ctypes.c_void_p()
        cuda(cudart.cudaMalloc(ctypes.byref(ptr), max(1, self.nbytes)), "cudaMalloc")
        self.ptr = ptr.value
        cuda(cudart.cudaMemcpy(self.ptr, host.ctypes.data, self.nbytes, _H2D), "cudaMemcpy")

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "version": 3,
                "data": (self.ptr, self.readonly), "strides": self.strides,
                "stream": self.stream}

    def get(self):
        if self.stream:
            cuda(cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        cuda(cudart.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
        host = np.empty(self.shape, self.dtype)
        cuda(cudart.cudaMemcpy(host.ctypes.data, self.ptr, self.nbytes, _D2H), "cudaMemcpy")
        return host

    def free(self):
        cuda(cudart.cudaFree(self.ptr), "cudaFree")


stream = ctypes.c_void_p()
cuda(cudart.cudaStreamCreate(ctypes.byref(stream)), "cudaStreamCreate")
if r == 0:
    print(f"mncl {mncl.version()}: CUDA arrays on backend {comm.backend}, {n} ranks, "
          f"{devices.value} device(s)", flush=True)

total = n * (n - 1) // 2
# No stream (already synchronized), the legacy default stream (1), a stream of our own.
for on_stream in (None, 1, stream.value):
    where = f"stream {on_stream if on_stream in (None, 1) else 'own'}"
    for dtype in (np.float32, np.int64):
        for count in (1, 7, 1000):
            x = (np.arange(count) % 11 + r).astype(dtype)
            want = (np.arange(count) % 11 * n + total).astype(dtype)
            send = DeviceArray(x, on_stream)
            recv = DeviceArray(np.zeros(count, dtype), on_stream)
            got = comm.allreduce(send, recv)
            expect(got is recv, f"allreduce returns the caller's recvbuf ({where})")
            expect(np.array_equal(recv.get(), want), f"allreduce {np.dtype(dtype).name} x{count}"
                                                     f" ({where})")
            comm.allreduce(send, send)
            expect(np.array_equal(send.get(), want), f"in-place allreduce x{count} ({where})")
            req = comm.iallreduce(DeviceArray(x, on_stream), recv, op="max")
            expect(req.wait() is recv and np.array_equal(recv.get(), x - r + n - 1),
                   f"iallreduce max x{count} ({where})")
            send.free()
            recv.free()

    for root in (0, n - 1):
        buf = DeviceArray(np.full(5, 100 + r, np.int32), on_stream)
        comm.bcast(buf, root=root)
        expect(np.array_equal(buf.get(), np.full(5, 100 + root)), f"bcast root {root} ({where})")
        buf.free()

    mine = DeviceArray(np.full(3, r, np.float32), on_stream)
    everyone = DeviceArray(np.zeros(3 * n, np.float32), on_stream)
    comm.allgather(mine, everyone)
    expect(np.array_equal(everyone.get(), np.repeat(np.arange(n), 3)), f"allgather ({where})")
    block = DeviceArray(np.zeros(2, np.int64), on_stream)
    comm.reduce_scatter(DeviceArray(np.arange(2 * n, dtype=np.int64) + r, on_stream), block)
    expect(np.array_equal(block.get(), np.arange(2 * r, 2 * r + 2) * n + total),
           f"reduce_scatter ({where})")
    a, b = DeviceArray(np.full(4, r, np.int32)), DeviceArray(np.full(6, 2 * r, np.int32))
    outs = comm.allreduce_coalesced([a, b], [a, b])
    expect(outs[0] is a and outs[1] is b and np.array_equal(a.get(), np.full(4, total))
           and np.array_equal(b.get(), np.full(6, 2 * total)), f"allreduce_coalesced ({where})")
    if n > 1:
        right, left = (r + 1) % n, (r - 1) % n
        got = DeviceArray(np.zeros(8, np.int64), on_stream)
        comm.sendrecv(DeviceArray(np.arange(8, dtype=np.int64) * (r + 1), on_stream), right, got,
                      left)
        expect(np.array_equal(got.get(), np.arange(8) * (left + 1)), f"sendrecv ({where})")
        into = DeviceArray(np.zeros(2, np.float32), on_stream)
        results = comm.sendrecv_batch([
            mncl.P2POp("isend", DeviceArray(np.full(2, r, np.float32), on_stream), right),
            mncl.P2POp("irecv", into, left)])
        expect(results[1] is into and np.array_equal(into.get(), np.full(2, left)),
               f"sendrecv_batch ({where})")

# stream=: a stream named by the call (our own, as its address) orders it in place of the arrays'
# (none, or the legacy default stream); stream=0 is the legacy default stream.
for arrays_stream, call_stream in ((None, stream.value), (1, stream.value), (None, 0)):
    where = f"stream={'own' if call_stream else 0} over array stream {arrays_stream}"
    x = np.arange(100, dtype=np.float32) + r
    want = np.arange(100, dtype=np.float32) * n + total
    send = DeviceArray(x, arrays_stream)
    recv = DeviceArray(np.zeros(100, np.float32), arrays_stream)
    expect(comm.allreduce(send, recv, stream=call_stream) is recv, f"allreduce returns recvbuf "
                                                                    f"({where})")
    cuda(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
    expect(np.array_equal(recv.get(), want), f"allreduce ({where})")
    req = comm.iallreduce(send, recv, op="max", stream=call_stream)
    expect(req.wait() is recv, f"iallreduce returns recvbuf ({where})")
    cuda(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
    expect(np.array_equal(recv.get(), x - r + n - 1), f"iallreduce max ({where})")
    buf = DeviceArray(np.full(5, 100 + r, np.int32), arrays_stream)
    comm.bcast(buf, root=n - 1, stream=call_stream)
    cuda(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
    expect(np.array_equal(buf.get(), np.full(5, 100 + n - 1)), f"bcast ({where})")
    if n > 1:
        right, left = (r + 1) % n, (r - 1) % n
        into = DeviceArray(np.zeros(2, np.float32), arrays_stream)
        comm.sendrecv_batch([
            mncl.P2POp("isend", DeviceArray(np.full(2, r, np.float32), arrays_stream), right),
            mncl.P2POp("irecv", into, left)], stream=call_stream)
        cuda(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        expect(np.array_equal(into.get(), np.full(2, left)), f"sendrecv_batch ({where})")
        into.free()
    comm.barrier(stream=call_stream)
    send.free()
    recv.free()
    buf.free()
# Arrays on two streams are refused, unless the call names the stream (the caller ordered them).
on_legacy = DeviceArray(np.full(4, r, np.float32), 1)
on_own = DeviceArray(np.zeros(4, np.float32), stream.value)
comm.allreduce(on_legacy, on_own, stream=stream.value)
expect(np.array_equal(on_own.get(), np.full(4, total)), "arrays on two streams with stream=")
expect_raises(TypeError, lambda: comm.allreduce(on_legacy, on_own, stream="own"),
              "stream='own'", "stream")
on_legacy.free()
on_own.free()
# The stream named reaches the library: on a host backend, a call on a stream that is capturing a
# CUDA graph is refused (NotSupportedError, the capture left intact), though its arrays have none.
if comm.backend != "nccl":
    cudart.cudaStreamBeginCapture.argtypes = [ctypes.c_void_p, ctypes.c_int]
    cudart.cudaStreamEndCapture.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    cudart.cudaGraphDestroy.argtypes = [ctypes.c_void_p]
    a, b = DeviceArray(np.ones(4, np.float32)), DeviceArray(np.zeros(4, np.float32))
    _THREAD_LOCAL = 1  # cudaStreamCaptureModeThreadLocal
    cuda(cudart.cudaStreamBeginCapture(stream, _THREAD_LOCAL), "cudaStreamBeginCapture")
    try:
        expect_raises(mncl.NotSupportedError, lambda: comm.allreduce(a, b, stream=stream.value),
                      "allreduce(stream=a capturing stream) on a host backend",
                      "capturing a CUDA graph")
    finally:
        graph = ctypes.c_void_p()
        cuda(cudart.cudaStreamEndCapture(stream, ctypes.byref(graph)), "cudaStreamEndCapture "
                                                                       "(the capture is intact)")
        if graph.value:
            cuda(cudart.cudaGraphDestroy(graph), "cudaGraphDestroy")
    comm.allreduce(a, b, stream=stream.value)
    expect(np.array_equal(b.get(), np.full(4, n)), "allreduce on the stream after its capture")
    a.free()
    b.free()

# What cannot work is refused before anything moves, on the calling rank.
dev = DeviceArray(np.ones(4, np.float32))
expect_raises(ValueError, lambda: comm.allreduce(dev), "CUDA input without recvbuf",
              "allocates no device memory")
expect_raises(ValueError, lambda: comm.allreduce(dev, DeviceArray(np.ones(4, np.float32),
                                                                  readonly=True)),
              "read-only CUDA output", "writeable")
expect_raises(ValueError, lambda: comm.allreduce(DeviceArray(np.ones(4, np.float32),
                                                             strides=(8,)), dev),
              "strided CUDA input", "C-contiguous")
# A data pointer or stream that does not fit a pointer is refused (ctypes.ArgumentError), not
# cut to its low 64 bits (here the array's own address and our stream: the calls ran).
wide = DeviceArray(np.ones(4, np.float32))
wide.ptr += 2**64
expect_raises(ctypes.ArgumentError, lambda: comm.allreduce(dev, wide),
              "a data pointer of address + 2**64", "does not fit a C pointer")
wide.ptr -= 2**64
wide.free()
far = DeviceArray(np.ones(4, np.float32), stream.value + 2**64)
out = DeviceArray(np.ones(4, np.float32))
expect_raises(ctypes.ArgumentError, lambda: comm.allreduce(far, out), "a stream of ours + 2**64",
              "does not fit a C pointer")
far.free()
out.free()
# One call, one stream: arrays on two different streams are refused.
expect_raises(ValueError, lambda: comm.allreduce(DeviceArray(np.ones(4, np.float32), 1),
                                                 DeviceArray(np.ones(4, np.float32),
                                                             stream.value)),
              "arrays on two streams", "different streams")
expect_raises(ValueError, lambda: comm.allreduce(DeviceArray(np.ones(4, np.float32), 2), dev),
              "the per-thread default stream", "per-thread")
expect_raises(ValueError, lambda: comm.sendrecv(dev, (r + 1) % n) if n > 1 else comm.allreduce(dev),
              "sendrecv of a CUDA input without recvbuf", "allocates no device memory")
# Opaque 2-byte items (PyTorch's CUDA bfloat16 is "<V2") pass as bfloat16 with dtype=.
bits = DeviceArray(mncl.to_bfloat16_bits(np.full(3, 1.5, np.float32)).view("V2"))
comm.allreduce(bits, bits, dtype="bfloat16")
expect(np.array_equal(mncl.from_bfloat16_bits(bits.get().view(np.uint16)),
                      np.full(3, 1.5 * n, np.float32)), "bfloat16 as V2 items")

# Mixed buffers are fine: the backend (nccl) or the core's staging handles each by its kind.
host_out = np.zeros(4, np.float32)
expect(comm.allreduce(dev, host_out) is host_out and np.array_equal(host_out, np.full(4, n)),
       "CUDA input, host output")
expect(np.array_equal(comm.allreduce(np.ones(2, np.int32)), np.full(2, n)),
       "usable afterwards")

cuda(cudart.cudaStreamDestroy(stream), "cudaStreamDestroy")
# The training helpers on CUDA arrays beside host ones: gradients averaged in place (rank q
# gives q + 1: the mean is (n + 1) / 2), parameters from the last rank.
grads = [DeviceArray(np.full(5, r + 1.0, np.float32)), np.full(3, 2.0 * (r + 1))]
comm.multi_node_mean_grad(grads)
expect(np.all(grads[0].get() == np.float32((n + 1) / 2)) and np.all(grads[1] == n + 1.0),
       "multi_node_mean_grad of CUDA and host arrays")
params = [DeviceArray(np.full(4, float(r), np.float32)), np.full(2, r, np.int64)]
comm.bcast_data(params, root=n - 1)
expect(np.all(params[0].get() == n - 1) and np.all(params[1] == n - 1),
       "bcast_data of CUDA and host arrays")
# A CUDA array the library would refuse, on one rank only: refused there before anything
# moves, RemoteError on the others (they once waited for the timeout, or went on alone).
other = n - 1
for what, bad, call in (
        ("a strided gradient", DeviceArray(np.zeros(4, np.float32), strides=(8,)),
         comm.multi_node_mean_grad),
        ("a read-only parameter", DeviceArray(np.zeros(4, np.float32), readonly=True),
         comm.bcast_data)):
    arrays = [bad if r == other else DeviceArray(np.zeros(4, np.float32))]
    if r == other:
        expect_raises(ValueError, lambda: call(arrays), what)
    else:
        expect_raises(mncl.RemoteError, lambda: call(arrays), f"beside {what}",
                      f"rank {other} could not take part")
expect_raises(TypeError, lambda: comm.multi_node_mean_grad(
    [DeviceArray(np.zeros(2, np.float32))], grad_dtype="float16"),
    "grad_dtype with a CUDA gradient", "casts on the host")

comm.close()
checks.finish(f"CUDA arrays on {n} rank(s) passed")
