"""The keyword-only `stream=` of every collective and point-to-point method (run under mncl-run
-n N), without a GPU: the ctypes function object each method calls (mncl.comm.lib.mncl_*) is
replaced by a recorder that keeps its arguments and stops the call, so any stream value can be
checked where the C library would get it, and no CUDA memory or stream is touched. Checked: every
C function with a `void *stream` parameter (parsed from mncl.h) has a method whose signature has
it, keyword-only, default None; None passes what the arrays say (NULL for host arrays, a CUDA
array's __cuda_array_interface__ stream); an int, a torch-like object (`cuda_stream`) and a
CuPy-like one (`ptr`) reach the C call as that address, 0 as 1 (the legacy default stream), and
override the arrays' streams (arrays on two streams included); anything else is a TypeError
naming `stream` before any C call (also before the size exchange of allgatherv/alltoallv),
but the blocking bcast's header (host memory, no stream), which every rank still joins;
addresses beyond a pointer are ctypes.ArgumentError, the per-thread default stream ValueError.
Then real calls on host arrays with an explicit stream (the legacy default: a host backend has
nothing to order) give the same results, and a non-blocking call keeps its stream object alive
until it completes. Exits 77 (ctest: skipped) when NumPy is missing."""

import ctypes
import gc
import inspect
import os
import re
import weakref

from checks import world_and_checks

np, mncl, comm, checks = world_and_checks()
expect, expect_raises = checks.expect, checks.expect_raises
r, n = comm.rank, comm.size
lib = mncl.comm.lib
peer = (r + 1) % n


class TorchStream:
    """What torch.cuda.Stream (and ExternalStream) exposes: the cudaStream_t as cuda_stream."""

    def __init__(self, handle):
        self.cuda_stream = handle


class CupyStream:
    """What cupy.cuda.Stream (and ExternalStream) exposes: the cudaStream_t as ptr."""

    def __init__(self, handle):
        self.ptr = handle


class BothStream(TorchStream, CupyStream):
    def __init__(self, cuda_stream, ptr):
        TorchStream.__init__(self, cuda_stream)
        CupyStream.__init__(self, ptr)


class FakeCudaArray:
    """A __cuda_array_interface__ (version 3) at a made-up address: never dereferenced, as every
    C call it goes to is a recorder here."""

    def __init__(self, size, stream=None, dtype=np.float32):
        self.size, self.stream, self.dtype = size, stream, np.dtype(dtype)

    @property
    def __cuda_array_interface__(self):
        return {"shape": (self.size,), "typestr": self.dtype.str, "version": 3,
                "data": (0x7F0000001000, False), "strides": None, "stream": self.stream}


class Recorded(Exception):
    """Raised by a recorder in place of the C call: the call's arguments, nothing done."""

    def __init__(self, name, args):
        super().__init__(name)
        self.name, self.args_ = name, args


def recorder(name, real, let_through):
    """Raises Recorded in place of the call, after letting the first let_through calls run."""
    calls = [0]

    def record(*args):
        calls[0] += 1
        if calls[0] <= let_through:
            return real(*args)
        raise Recorded(name, args)
    return record


def c_stream(name, args):
    """The stream argument of a recorded call, as an int (None for NULL): the last argument of
    a blocking call, the one before the request of a non-blocking one."""
    value = args[-2] if name.startswith("mncl_i") else args[-1]
    if isinstance(value, ctypes.c_void_p):
        value = value.value
    return value


def stream_reaching_c(name, call):
    """Runs call() with lib.<name> replaced by a recorder; the stream it would have passed, or
    the exception call() raised instead (any other C function runs for real)."""
    real = getattr(lib, name)
    # The blocking bcast broadcasts root's shape and dtype (host memory, no stream) first.
    setattr(lib, name, recorder(name, real, 1 if name == "mncl_bcast" else 0))
    try:
        call()
    except Recorded as e:
        want_args = len(mncl._lib._SIGNATURES[name][1])
        expect(e.name == name and len(e.args_) == want_args,
               f"{name}: recorded {len(e.args_)} arguments, the signature has {want_args}")
        return c_stream(name, e.args_)
    except Exception as e:  # noqa: BLE001 (returned for the caller to judge)
        return e
    finally:
        setattr(lib, name, real)
    expect(False, f"{name}: the method returned without calling it")
    return None


def calls(kw):
    """(method, C function, call) for every method with a stream, on host arrays, each passing
    **kw (stream=... or nothing)."""
    x = np.arange(3, dtype=np.float32)
    blocks = np.arange(2 * n, dtype=np.int64)
    counts = [3] * n
    return [
        ("allreduce", "mncl_allreduce", lambda: comm.allreduce(x, **kw)),
        ("iallreduce", "mncl_iallreduce", lambda: comm.iallreduce(x, **kw)),
        ("reduce", "mncl_reduce", lambda: comm.reduce(x, root=0, **kw)),
        ("ireduce", "mncl_ireduce", lambda: comm.ireduce(x, root=0, **kw)),
        ("bcast", "mncl_bcast", lambda: comm.bcast(x.copy(), **kw)),
        ("ibcast", "mncl_ibcast", lambda: comm.ibcast(x.copy(), **kw)),
        ("allgather", "mncl_allgather", lambda: comm.allgather(x, **kw)),
        ("iallgather", "mncl_iallgather", lambda: comm.iallgather(x, **kw)),
        ("gather", "mncl_gather", lambda: comm.gather(x, **kw)),
        ("igather", "mncl_igather", lambda: comm.igather(x, **kw)),
        ("scatter", "mncl_scatter",
         lambda: comm.scatter(blocks, np.zeros(2, np.int64), **kw)),
        ("iscatter", "mncl_iscatter",
         lambda: comm.iscatter(blocks, np.zeros(2, np.int64), **kw)),
        ("reduce_scatter", "mncl_reduce_scatter", lambda: comm.reduce_scatter(blocks, **kw)),
        ("ireduce_scatter", "mncl_ireduce_scatter", lambda: comm.ireduce_scatter(blocks, **kw)),
        ("alltoall", "mncl_alltoall", lambda: comm.alltoall(blocks, **kw)),
        ("ialltoall", "mncl_ialltoall", lambda: comm.ialltoall(blocks, **kw)),
        ("allgatherv", "mncl_allgatherv", lambda: comm.allgatherv(x, counts, **kw)),
        ("iallgatherv", "mncl_iallgatherv", lambda: comm.iallgatherv(x, counts, **kw)),
        ("alltoallv", "mncl_alltoallv",
         lambda: comm.alltoallv(blocks, [2] * n, [2] * n, **kw)),
        ("ialltoallv", "mncl_ialltoallv",
         lambda: comm.ialltoallv(blocks, [2] * n, [2] * n, **kw)),
        ("gatherv", "mncl_gatherv", lambda: comm.gatherv(x, counts, **kw)),
        ("igatherv", "mncl_igatherv", lambda: comm.igatherv(x, counts, **kw)),
        ("scatterv", "mncl_scatterv",
         lambda: comm.scatterv(np.arange(3 * n, dtype=np.float32), counts,
                               np.zeros(3, np.float32), **kw)),
        ("iscatterv", "mncl_iscatterv",
         lambda: comm.iscatterv(np.arange(3 * n, dtype=np.float32), counts,
                                np.zeros(3, np.float32), **kw)),
        ("barrier", "mncl_barrier", lambda: comm.barrier(**kw)),
        ("ibarrier", "mncl_ibarrier", lambda: comm.ibarrier(**kw)),
        ("send", "mncl_send", lambda: comm.send(x, peer, **kw)),
        ("isend", "mncl_isend", lambda: comm.isend(x, peer, **kw)),
        ("recv", "mncl_recv", lambda: comm.recv(np.zeros(3, np.float32), peer, **kw)),
        ("irecv", "mncl_irecv", lambda: comm.irecv(np.zeros(3, np.float32), peer, **kw)),
        ("sendrecv", "mncl_sendrecv", lambda: comm.sendrecv(x, peer, **kw)),
        ("isendrecv", "mncl_isendrecv", lambda: comm.isendrecv(x, peer, **kw)),
        ("sendrecv_batch", "mncl_sendrecv_batch",
         lambda: comm.sendrecv_batch([mncl.P2POp("send", x, peer),
                                      mncl.P2POp("recv", np.zeros(3, np.float32), peer)], **kw)),
        ("batch_isend_irecv", "mncl_isendrecv_batch",
         lambda: comm.batch_isend_irecv([mncl.P2POp("send", x, peer)], **kw)),
        ("isendrecv_batch", "mncl_isendrecv_batch",
         lambda: comm.isendrecv_batch([mncl.P2POp("recv", np.zeros(3, np.float32), peer)],
                                      **kw)),
        ("allreduce_coalesced", "mncl_allreduce_coalesced",
         lambda: comm.allreduce_coalesced([x, np.ones(5, np.float32)], **kw)),
        ("iallreduce_coalesced", "mncl_iallreduce_coalesced",
         lambda: comm.iallreduce_coalesced([x, np.ones(5, np.float32)], **kw)),
    ]


# Coverage: every function of mncl.h with a stream parameter has a method taking stream=, and
# every one of those methods is in the table above.
header = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../abi/mncl/mncl.h")
with open(header) as f:
    prototypes = re.findall(r"MNCL_API\s[^;(]*?\b(mncl_\w+)\s*\(([^;]*)\)\s*;", f.read())
with_stream = {name for name, params in prototypes if re.search(r"\bvoid\s*\*\s*stream\b", params)}
expect(len(with_stream) >= 36, f"parsed {len(with_stream)} functions with a stream from mncl.h")
table = calls({})
covered = {c_name for _, c_name, _ in table}
expect(with_stream <= covered,
       f"C functions with a stream but no stream= test: {sorted(with_stream - covered)}")
for method, _, _ in table:
    param = inspect.signature(getattr(mncl.Communicator, method)).parameters.get("stream")
    expect(param is not None and param.kind is inspect.Parameter.KEYWORD_ONLY
           and param.default is None, f"{method}: no keyword-only stream=None ({param})")

# None (or no stream= at all) keeps what the arrays say: NULL for host arrays.
for kw in ({}, {"stream": None}):
    for method, c_name, call in calls(kw):
        got = stream_reaching_c(c_name, call)
        expect(got is None, f"{method}(**{kw}) on host arrays passes stream {got!r}, not NULL")

# An explicit stream reaches the C call as its address, whatever its form; 0 is the legacy
# default stream (1, cudaStreamLegacy, as PyTorch's default stream taken from a tensor).
forms = [(0x5000, 0x5000), (np.uint64(0x5010), 0x5010), (np.int64(0x5020), 0x5020), (0, 1),
         (1, 1), (2**64 - 1, 2**64 - 1), (TorchStream(0x6000), 0x6000), (TorchStream(0), 1),
         (CupyStream(0x7000), 0x7000), (CupyStream(0), 1), (BothStream(0x8000, 0x9000), 0x8000)]
for value, want in forms:
    for method, c_name, call in calls({"stream": value}):
        got = stream_reaching_c(c_name, call)
        expect(got == want, f"{method}(stream={value!r}) passes {got!r}, expected {want:#x}")

# CUDA arrays: None takes their interface's stream; an explicit stream overrides it, and also
# lets arrays on different streams through (the caller ordered them).
dev_a, dev_b = FakeCudaArray(4, 0xA000), FakeCudaArray(4, 0xA000)
for method, c_name, call in (
        ("allreduce", "mncl_allreduce", lambda **kw: comm.allreduce(dev_a, dev_b, **kw)),
        ("iallreduce", "mncl_iallreduce", lambda **kw: comm.iallreduce(dev_a, dev_b, **kw)),
        ("bcast", "mncl_bcast", lambda **kw: comm.bcast(dev_a, **kw)),
        ("sendrecv_batch", "mncl_sendrecv_batch",
         lambda **kw: comm.sendrecv_batch([mncl.P2POp("send", dev_a, peer),
                                           mncl.P2POp("recv", dev_b, peer)], **kw)),
        ("iallreduce_coalesced", "mncl_iallreduce_coalesced",
         lambda **kw: comm.iallreduce_coalesced([dev_a], [dev_b], **kw))):
    got = stream_reaching_c(c_name, call)
    expect(got == 0xA000, f"{method}: a CUDA array's stream: {got!r}, expected 0xa000")
    got = stream_reaching_c(c_name, lambda: call(stream=None))
    expect(got == 0xA000, f"{method}(stream=None): {got!r}, expected the array's 0xa000")
    for value, want in ((0xB000, 0xB000), (TorchStream(0xC000), 0xC000), (CupyStream(0), 1)):
        got = stream_reaching_c(c_name, lambda: call(stream=value))
        expect(got == want, f"{method}(stream={value!r}) over the array's stream: {got!r}")
two = (FakeCudaArray(4, 0xA000), FakeCudaArray(4, 0xD000))
got = stream_reaching_c("mncl_allreduce", lambda: comm.allreduce(*two))
expect(isinstance(got, ValueError) and "different streams" in str(got),
       f"arrays on two streams without stream=: {got!r}")
got = stream_reaching_c("mncl_allreduce", lambda: comm.allreduce(*two, stream=0xE000))
expect(got == 0xE000, f"arrays on two streams with stream=0xE000: {got!r}")
got = stream_reaching_c("mncl_allreduce",
                        lambda: comm.allreduce(FakeCudaArray(4), FakeCudaArray(4), stream=0xF000))
expect(got == 0xF000, f"arrays without a stream, stream=0xF000: {got!r}")

# Anything else is refused before any C call (bcast: but its header): a TypeError naming stream=.
bad = ["0x5000", b"\x00", 1.0, 5000.0, True, False, [0x5000], (0x5000,), np.zeros(2, np.int64),
       object(), ctypes.c_void_p(0x5000), FakeCudaArray(4, 0xA000), TorchStream("0x5000"),
       TorchStream(None), TorchStream(1.5), TorchStream(True), CupyStream(None),
       CupyStream(2.0), BothStream(None, 0x9000)]
for value in bad:
    for method, c_name, call in calls({"stream": value}):
        got = stream_reaching_c(c_name, call)
        expect(isinstance(got, TypeError) and "stream" in str(got),
               f"{method}(stream={value!r}): {got!r}, expected a TypeError naming stream")
# Addresses that do not fit a pointer, and the per-thread default stream (2: MNCL's worker
# threads would take it for their own), as for a CUDA array's own stream.
for value, exc, words in ((-1, ctypes.ArgumentError, "does not fit a C pointer"),
                          (2**64, ctypes.ArgumentError, "does not fit a C pointer"),
                          (TorchStream(-5), ctypes.ArgumentError, "stream.cuda_stream"),
                          (2, ValueError, "per-thread"), (CupyStream(2), ValueError, "per-thread")):
    for method, c_name, call in calls({"stream": value}):
        got = stream_reaching_c(c_name, call)
        expect(isinstance(got, exc) and words in str(got),
               f"{method}(stream={value!r}): {got!r}, expected {exc.__name__} ({words})")

# allgatherv/alltoallv without counts exchange them first (a real collective): a bad stream is
# refused before that exchange, on every rank alike, so nothing is left half done.
for method, exchange, call in (
        ("allgatherv", "mncl_allgather",
         lambda: comm.allgatherv(np.ones(2, np.float32), stream="s")),
        ("alltoallv", "mncl_alltoall",
         lambda: comm.alltoallv(np.arange(n, dtype=np.int32), [1] * n, stream="s"))):
    got = stream_reaching_c(exchange, call)
    expect(isinstance(got, TypeError) and "stream" in str(got),
           f"{method}(stream='s') without counts: {got!r}, expected a TypeError first")
# With a good stream the exchange (host arrays: no stream) runs for real, then the call gets it.
got = stream_reaching_c("mncl_allgatherv",
                        lambda: comm.allgatherv(np.ones(r + 1, np.float32), stream=0x5000))
expect(got == 0x5000, f"allgatherv(counts=None, stream=0x5000): {got!r}")
got = stream_reaching_c("mncl_alltoallv",
                        lambda: comm.alltoallv(np.arange(n, dtype=np.int32), [1] * n,
                                               stream=TorchStream(0x6000)))
expect(got == 0x6000, f"alltoallv(recvcounts=None, stream=torch-like): {got!r}")

# Real calls on host arrays with the legacy default stream given explicitly: a host backend has
# nothing to order, and the results are those without stream=.
total = n * (n - 1) // 2
for value in (0, 1, TorchStream(0), CupyStream(0)):
    y = comm.allreduce(np.arange(4, dtype=np.int64) + r, stream=value)
    expect(np.array_equal(y, np.arange(4) * n + total), f"allreduce(stream={value!r}) result")
    y = comm.iallreduce(np.full(3, r, np.int32), stream=value).wait()
    expect(np.array_equal(y, np.full(3, total)), f"iallreduce(stream={value!r}) result")
    comm.barrier(stream=value)
    got = comm.sendrecv(np.full(2, r, np.int64), peer, source=(r - 1) % n, stream=value) \
        if n > 1 else np.zeros(2, np.int64)
    expect(n == 1 or np.array_equal(got, np.full(2, (r - 1) % n)),
           f"sendrecv(stream={value!r}) result")

# A non-blocking call keeps its stream object alive until it completes (the library may still
# queue work on it), then lets it go.
stream_obj = TorchStream(0)
alive = weakref.ref(stream_obj)
req = comm.iallreduce(np.ones(8, np.float32), stream=stream_obj)
del stream_obj
gc.collect()
expect(alive() is not None, "the stream object of a request in flight was freed")
expect(np.all(req.wait() == n), "iallreduce with a stream object: result")
del req
gc.collect()
expect(alive() is None, "the stream object outlived its completed, dropped request")

comm.close()
checks.finish(f"stream= on {n} rank(s) passed")
