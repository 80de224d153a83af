"""Communicator: the MNCL collectives on NumPy arrays.

Buffers are C-contiguous NumPy arrays in native byte order; their dtype picks the MNCL dtype
(int8, uint8, int32, uint32, int64, uint64, float16, float32, float64). Inputs that are not
arrays (lists, scalars) are converted; outputs are allocated when not given and returned.
Passing the same array as input and output selects the in-place form.
"""

import ctypes

import numpy as np

from . import _lib
from ._lib import check, lib

_DTYPES = {
    np.dtype(np.int8): 0,
    np.dtype(np.uint8): 1,
    np.dtype(np.int32): 2,
    np.dtype(np.uint32): 3,
    np.dtype(np.int64): 4,
    np.dtype(np.uint64): 5,
    np.dtype(np.float16): 6,
    np.dtype(np.float32): 8,
    np.dtype(np.float64): 9,
}
_OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3, "avg": 4}


def _dtype_code(arr):
    code = _DTYPES.get(arr.dtype) if arr.dtype.isnative else None
    if code is None:
        raise TypeError(
            f"mncl: unsupported array dtype {arr.dtype} (use a native-order int8, uint8, int32, "
            "uint32, int64, uint64, float16, float32 or float64 array)"
        )
    return code


def _op_code(op):
    try:
        return _OPS[op.lower()] if isinstance(op, str) else int(op)
    except KeyError:
        raise ValueError(f"mncl: unknown reduction '{op}' (one of {', '.join(_OPS)})") from None


def _input(buf):
    """A C-contiguous array for reading (converted if needed)."""
    arr = np.ascontiguousarray(buf)
    _dtype_code(arr)
    return arr


def _output(buf, name):
    """An array the library writes into: must already be C-contiguous and writeable."""
    if not isinstance(buf, np.ndarray):
        raise TypeError(f"mncl: {name} must be a numpy.ndarray, not {type(buf).__name__}")
    if not buf.flags.c_contiguous or not buf.flags.writeable:
        raise ValueError(f"mncl: {name} must be C-contiguous and writeable")
    _dtype_code(buf)
    return buf


def _same_dtype(a, b, what):
    if a.dtype != b.dtype:
        raise TypeError(f"mncl: {what}: dtypes differ ({a.dtype} and {b.dtype})")


def _ptr(arr):
    return ctypes.c_void_p(arr.ctypes.data) if arr is not None else None


class Request:
    """A non-blocking operation in flight. Keeps its arrays alive until completed."""

    def __init__(self, handle, result, keep):
        self._handle = handle
        self._result = result
        self._keep = keep

    @property
    def done(self):
        return self._handle is None

    def test(self):
        """True when finished (the result is then in place; errors are raised)."""
        if self._handle is None:
            return True
        flag = ctypes.c_int(0)
        check(lib.mncl_test(self._handle, ctypes.byref(flag)))
        if flag.value:
            self._handle, self._keep = None, None
        return bool(flag.value)

    def wait(self, timeout=None):
        """Waits (seconds; None: bounded by the communicator's timeout) and returns the result
        array. A wait that times out raises mncl.TimeoutError and the request stays valid."""
        if self._handle is not None:
            ms = -1 if timeout is None else int(timeout * 1000)
            status = lib.mncl_wait(self._handle, ms)
            if status != 3:  # anything but MNCL_ERR_TIMEOUT completes and frees the request
                self._handle, self._keep = None, None
            check(status)
        return self._result


class Communicator:
    """A group of ranks (mncl_comm_t). Every argument left as None comes from the environment
    (MNCL_BACKEND, MNCL_RANK/MNCL_SIZE or a launcher's variables, MNCL_STORE, MNCL_TIMEOUT...),
    which is what mncl-run sets up. Destroying is collective: call close() on every rank, or use
    the communicator as a context manager."""

    def __init__(self, backend=None, rank=None, size=None, bootstrap=None, timeout=None,
                 device=None, _handle=None):
        if _handle is not None:
            self._handle = _handle
        else:
            cfg = _lib.Config(
                ctypes.sizeof(_lib.Config),
                _lib.CONFIG_MAGIC,
                _lib.HEADER_VERSION,
                backend.encode() if backend else None,
                _lib.FROM_ENV if rank is None else rank,
                _lib.FROM_ENV if size is None else size,
                bootstrap.encode() if bootstrap else None,
                _lib.FROM_ENV if timeout is None else int(timeout * 1000),
                _lib.FROM_ENV if device is None else device,
                0,
            )
            handle = _lib.c_handle()
            check(lib.mncl_comm_create(ctypes.byref(cfg), ctypes.byref(handle)))
            self._handle = handle
        r, s, name = ctypes.c_int(), ctypes.c_int(), ctypes.c_char_p()
        check(lib.mncl_comm_rank(self._handle, ctypes.byref(r)))
        check(lib.mncl_comm_size(self._handle, ctypes.byref(s)))
        check(lib.mncl_comm_backend(self._handle, ctypes.byref(name)))
        self.rank, self.size, self.backend = r.value, s.value, name.value.decode()

    # --- lifetime --------------------------------------------------------------------------

    def close(self):
        """Collective: waits for operations in flight, then frees the communicator."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            check(lib.mncl_comm_destroy(handle))

    def abort(self):
        """Local, any thread: pending and later operations fail with mncl.AbortedError."""
        check(lib.mncl_comm_abort(self._live()))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self._handle is None else f"rank {self.rank} of {self.size}"
        return f"<mncl.Communicator {self.backend} {state}>"

    def _live(self):
        if self._handle is None:
            raise ValueError("mncl: the communicator is closed")
        return self._handle

    def split(self, color, key=0):
        """Collective: ranks with the same color form a new communicator ordered by (key,
        rank); color None (MNCL_SPLIT_NONE) joins none and returns None."""
        handle = _lib.c_handle()
        check(lib.mncl_comm_split(self._live(), -1 if color is None else color, key,
                                  ctypes.byref(handle)))
        return Communicator(_handle=handle) if handle.value else None

    # --- collectives -----------------------------------------------------------------------

    def allreduce(self, sendbuf, recvbuf=None, op="sum"):
        """Element-wise reduction over ranks, on every rank. Returns recvbuf."""
        send = _input(sendbuf)
        recv = np.empty_like(send) if recvbuf is None else _output(recvbuf, "recvbuf")
        self._check_sizes(send, recv, send.size, "allreduce")
        check(lib.mncl_allreduce(self._live(), _ptr(send), _ptr(recv), send.size,
                                 _dtype_code(send), _op_code(op), None))
        return recv

    def iallreduce(self, sendbuf, recvbuf=None, op="sum"):
        """Non-blocking allreduce: a Request whose wait() returns recvbuf."""
        send = _input(sendbuf)
        recv = np.empty_like(send) if recvbuf is None else _output(recvbuf, "recvbuf")
        self._check_sizes(send, recv, send.size, "iallreduce")
        req = _lib.c_handle()
        check(lib.mncl_iallreduce(self._live(), _ptr(send), _ptr(recv), send.size,
                                  _dtype_code(send), _op_code(op), None, ctypes.byref(req)))
        return Request(req, recv, (send, recv))

    def reduce(self, sendbuf, recvbuf=None, op="sum", root=0):
        """Reduction onto root: returns recvbuf there, None elsewhere."""
        send = _input(sendbuf)
        recv = None
        if self.rank == root:
            recv = np.empty_like(send) if recvbuf is None else _output(recvbuf, "recvbuf")
            self._check_sizes(send, recv, send.size, "reduce")
        check(lib.mncl_reduce(self._live(), _ptr(send), _ptr(recv), send.size, _dtype_code(send),
                              _op_code(op), root, None))
        return recv

    def bcast(self, buf, root=0):
        """In place: buf on every rank becomes root's buf. Returns buf."""
        arr = _output(buf, "buf")
        check(lib.mncl_bcast(self._live(), _ptr(arr), arr.size, _dtype_code(arr), root, None))
        return arr

    def ibcast(self, buf, root=0):
        arr = _output(buf, "buf")
        req = _lib.c_handle()
        check(lib.mncl_ibcast(self._live(), _ptr(arr), arr.size, _dtype_code(arr), root, None,
                              ctypes.byref(req)))
        return Request(req, arr, (arr,))

    def allgather(self, sendbuf, recvbuf=None):
        """Every rank's sendbuf, stacked: shape (size,) + sendbuf.shape."""
        send = _input(sendbuf)
        recv = (np.empty((self.size,) + send.shape, send.dtype) if recvbuf is None
                else _output(recvbuf, "recvbuf"))
        self._check_sizes(send, recv, send.size * self.size, "allgather")
        check(lib.mncl_allgather(self._live(), _ptr(send), _ptr(recv), send.size,
                                 _dtype_code(send), None))
        return recv

    def iallgather(self, sendbuf, recvbuf=None):
        send = _input(sendbuf)
        recv = (np.empty((self.size,) + send.shape, send.dtype) if recvbuf is None
                else _output(recvbuf, "recvbuf"))
        self._check_sizes(send, recv, send.size * self.size, "iallgather")
        req = _lib.c_handle()
        check(lib.mncl_iallgather(self._live(), _ptr(send), _ptr(recv), send.size,
                                  _dtype_code(send), None, ctypes.byref(req)))
        return Request(req, recv, (send, recv))

    def gather(self, sendbuf, recvbuf=None, root=0):
        """Every rank's sendbuf onto root, stacked: shape (size,) + sendbuf.shape there; None
        elsewhere."""
        send = _input(sendbuf)
        recv = None
        if self.rank == root:
            recv = (np.empty((self.size,) + send.shape, send.dtype) if recvbuf is None
                    else _output(recvbuf, "recvbuf"))
            self._check_sizes(send, recv, send.size * self.size, "gather")
        check(lib.mncl_gather(self._live(), _ptr(send), _ptr(recv), send.size, _dtype_code(send),
                              root, None))
        return recv

    def scatter(self, sendbuf, recvbuf, root=0):
        """Block r (recvbuf.size elements) of root's sendbuf lands in rank r's recvbuf.
        sendbuf is only read on root (pass None elsewhere). Returns recvbuf."""
        recv = _output(recvbuf, "recvbuf")
        send = None
        if self.rank == root:
            send = _input(sendbuf)
            self._check_sizes(recv, send, recv.size * self.size, "scatter")
        check(lib.mncl_scatter(self._live(), _ptr(send), _ptr(recv), recv.size, _dtype_code(recv),
                               root, None))
        return recv

    def reduce_scatter(self, sendbuf, recvbuf=None, op="sum"):
        """sendbuf holds size blocks; rank r receives the reduction of block r. The default
        recvbuf has shape sendbuf.shape[1:] when sendbuf.shape[0] == size, else is flat."""
        send = _input(sendbuf)
        if send.size % self.size:
            raise ValueError(f"mncl: reduce_scatter: {send.size} elements do not split into "
                             f"{self.size} blocks")
        count = send.size // self.size
        if recvbuf is None:
            shape = send.shape[1:] if send.ndim > 1 and send.shape[0] == self.size else (count,)
            recv = np.empty(shape, send.dtype)
        else:
            recv = _output(recvbuf, "recvbuf")
        self._check_sizes(send, recv, count, "reduce_scatter")
        check(lib.mncl_reduce_scatter(self._live(), _ptr(send), _ptr(recv), count,
                                      _dtype_code(send), _op_code(op), None))
        return recv

    def alltoall(self, sendbuf, recvbuf=None):
        """Block j of rank i's sendbuf lands in block i of rank j's recvbuf (size blocks)."""
        send = _input(sendbuf)
        if send.size % self.size:
            raise ValueError(f"mncl: alltoall: {send.size} elements do not split into "
                             f"{self.size} blocks")
        recv = np.empty_like(send) if recvbuf is None else _output(recvbuf, "recvbuf")
        self._check_sizes(send, recv, send.size, "alltoall")
        check(lib.mncl_alltoall(self._live(), _ptr(send), _ptr(recv), send.size // self.size,
                                _dtype_code(send), None))
        return recv

    def barrier(self):
        check(lib.mncl_barrier(self._live(), None))

    def ibarrier(self):
        req = _lib.c_handle()
        check(lib.mncl_ibarrier(self._live(), None, ctypes.byref(req)))
        return Request(req, None, ())

    def send(self, buf, peer):
        arr = _input(buf)
        check(lib.mncl_send(self._live(), _ptr(arr), arr.size, _dtype_code(arr), peer, None))

    def recv(self, buf, peer):
        """Receives into buf (its size and dtype must match the send). Returns buf."""
        arr = _output(buf, "buf")
        check(lib.mncl_recv(self._live(), _ptr(arr), arr.size, _dtype_code(arr), peer, None))
        return arr

    def allreduce_coalesced(self, sendbufs, recvbufs=None, op="sum"):
        """Several allreduces of one dtype in one call (backends may pack them). Returns the
        list of results."""
        sends = [_input(b) for b in sendbufs]
        recvs = ([np.empty_like(s) for s in sends] if recvbufs is None
                 else [_output(b, "recvbufs[i]") for b in recvbufs])
        if len(recvs) != len(sends):
            raise ValueError("mncl: allreduce_coalesced: as many recvbufs as sendbufs")
        for s, r in zip(sends, recvs):
            self._check_sizes(s, r, s.size, "allreduce_coalesced")
            _same_dtype(s, sends[0], "allreduce_coalesced")
        n = len(sends)
        send_ptrs = (ctypes.c_void_p * n)(*[s.ctypes.data for s in sends])
        recv_ptrs = (ctypes.c_void_p * n)(*[r.ctypes.data for r in recvs])
        counts = (ctypes.c_size_t * n)(*[s.size for s in sends])
        code = _dtype_code(sends[0]) if n else 0
        check(lib.mncl_allreduce_coalesced(self._live(), send_ptrs, recv_ptrs, counts, n, code,
                                           _op_code(op), None))
        return recvs

    @staticmethod
    def _check_sizes(send, recv, want, what):
        _same_dtype(send, recv, what)
        if recv.size != want:
            raise ValueError(f"mncl: {what}: the output has {recv.size} elements, expected {want}")
