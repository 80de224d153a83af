"""Communicator: the MNCL collectives on NumPy arrays.

Buffers are C-contiguous NumPy arrays in native byte order; their dtype picks the MNCL dtype
(int8, uint8, int32, uint32, int64, uint64, float16, float32, float64, and bfloat16 as an
`ml_dtypes.bfloat16` array). Every collective also takes a keyword-only `dtype`, an MNCL dtype
name, for arrays holding another dtype's raw bits: ``dtype="bfloat16"`` on a uint16 array of
bfloat16 bit patterns, which is how bfloat16 travels without ml_dtypes. Inputs that are not
arrays (lists, scalars) are converted; outputs are allocated when not given and returned.
Passing the same array as input and output selects the in-place form.

Each collective has a non-blocking twin named with an `i` in front (iallreduce, ...): it takes
the same arguments and returns a Request whose wait() returns what the blocking call returns.
sendrecv_batch's twin is also called batch_isend_irecv, as in PyTorch.

Every collective and point-to-point method (blocking and non-blocking, barrier and the batches
included) also takes a keyword-only `stream`, the CUDA stream the call is ordered on (the C
call's `stream` argument):

- None (the default): the stream of the call's CUDA arrays: the __cuda_array_interface__
  "stream" (version 3), or a PyTorch tensor's current stream; no stream (NULL) for host arrays.
- an int: a cudaStream_t address; 0 (and 1) is the legacy default stream, passed on as 1
  (cudaStreamLegacy).
- a stream object: its `cuda_stream` (torch.cuda.Stream, torch.cuda.ExternalStream) or else its
  `ptr` (cupy.cuda.Stream, cupy.cuda.ExternalStream) attribute, an int as above.

An explicit stream replaces the inferred one: the arrays' own streams are then not looked at
(nor required to agree), so work that produced them on another stream must be ordered before it
by the caller (torch's ``stream.wait_stream(...)``, an event). Anything else (a bool, a float, a
string, a CUDA array) is a TypeError naming `stream`; an address that does not fit a pointer is
a ctypes.ArgumentError; the per-thread default stream (2, CuPy's Stream.ptds) a ValueError. The
stream object is kept alive with a non-blocking call's arrays until its Request completes. With
host arrays only, a host backend (naive, gloo, shm) has nothing to order and the stream changes
nothing.
"""

import ctypes
import math
import operator
import os
import signal
import threading
from decimal import Decimal

import numpy as np

from . import _lib, training
from ._dtypes import CODES, code_of_name, dtype_code, dtype_name, numpy_dtype
from ._cuda import CudaArray, address, call_stream, explicit_stream, is_cuda_array, public
from ._lib import check, lib
from .errors import InvalidArgumentError, NotSupportedError, RemoteError
from ._objects import ObjectCollectives
from ._ops import _OPS, _op_name

_ERR_TIMEOUT = 3  # MNCL_ERR_TIMEOUT
_ERR_INVALID_ARGUMENT = 1  # MNCL_ERR_INVALID_ARGUMENT
# The header of bcast and send_array: a state (_ARRAY_SENT, or _ARRAY_FAILED where the sender
# failed), the array's MNCL dtype, its number of dimensions and its shape (NumPy arrays have at
# most 64 dimensions), zeros after it. The states are words no count or zeroed buffer holds, so
# that a plain message taken for a header is refused rather than read.
_ARRAY_HEADER_WORDS = 3 + 64
_ARRAY_SENT = int.from_bytes(b"MNCLsent", "little")
_ARRAY_FAILED = int.from_bytes(b"MNCLfail", "little")


def _array_header(arr, code, own_error, what):
    """(the header that describes arr, or says the sender failed; the sender's error or None)."""
    header = np.zeros(_ARRAY_HEADER_WORDS, np.int64)
    if own_error is None and arr.ndim > _ARRAY_HEADER_WORDS - 3:
        own_error = ValueError(f"mncl: {what}: the array has {arr.ndim} dimensions, more than "
                               f"{_ARRAY_HEADER_WORDS - 3}")
    if own_error is None:
        header[:3 + arr.ndim] = (_ARRAY_SENT, code, arr.ndim) + tuple(arr.shape)
    else:
        header[0] = _ARRAY_FAILED
    return header, own_error


def _header_layout(header, what, sender):
    """(MNCL dtype, shape) of a header that says the sender succeeded; RemoteError where it
    says the sender failed, or is no such header (a plain send where the peer waits in
    recv_array, say)."""
    if int(header[0]) == _ARRAY_FAILED:
        raise RemoteError(f"mncl: {what}: rank {sender} could not send its array (the cause is "
                          f"raised there)")
    code, ndim = int(header[1]), int(header[2])
    shape = tuple(int(d) for d in header[3:3 + max(ndim, 0)])
    if (int(header[0]) != _ARRAY_SENT or code not in CODES.values()
            or not 0 <= ndim <= _ARRAY_HEADER_WORDS - 3 or min(shape, default=0) < 0
            or np.any(header[3 + ndim:])):
        raise RemoteError(f"mncl: {what}: what rank {sender} sent is no array header: do its "
                          f"calls pair with this rank's?")
    return code, shape

# Requests not completed yet. Holding them here keeps their arrays alive until the operation
# has finished even when the caller drops the Request; a request never waited for or tested to
# completion stays here (with its arrays) for the life of the process.
_IN_FLIGHT = set()


def _op_code(op):
    """The MNCL code of a reduction: a name or enum member (_op_name), or MNCL's own code as a
    plain integer."""
    name = _op_name(op)
    if name is not None:
        return _OPS[name]
    if isinstance(op, bool):
        raise TypeError(f"mncl: a reduction is a name such as 'sum', not {op!r}")
    # Not int(op): 1.5 would become 1. A code goes to the C int argument as it is, which
    # refuses a non-integer or one that does not fit (ctypes.ArgumentError).
    return op


def _input(buf, dtype):
    """A C-contiguous array for reading (converted if needed), or a CUDA array as it is, and its
    MNCL dtype."""
    if isinstance(buf, CudaArray) or is_cuda_array(buf):
        arr = buf if isinstance(buf, CudaArray) else CudaArray(buf, "sendbuf", False)
        return arr, dtype_code(arr, dtype if dtype is not None else arr.default_dtype)
    # Not np.ascontiguousarray: it makes a 0-d input 1-d, and the result's shape with it.
    arr = np.asarray(buf, order="C")
    return arr, dtype_code(arr, dtype)


def _output(buf, name, dtype):
    """An array the library writes into (it must already be C-contiguous and writeable) and its
    MNCL dtype."""
    if isinstance(buf, CudaArray) or is_cuda_array(buf):
        arr = buf if isinstance(buf, CudaArray) else CudaArray(buf, name, True)
        return arr, dtype_code(arr, dtype if dtype is not None else arr.default_dtype)
    if not isinstance(buf, np.ndarray):
        raise TypeError(f"mncl: {name} must be a numpy.ndarray or a CUDA array, not "
                        f"{type(buf).__name__}")
    if not buf.flags.c_contiguous or not buf.flags.writeable:
        raise ValueError(f"mncl: {name} must be C-contiguous and writeable")
    return buf, dtype_code(buf, dtype)


def _matching_output(recvbuf, send, code, dtype, want, what, shape=None):
    """recvbuf checked against the input (same MNCL dtype, `want` elements), or, when None, a
    new array of the input's dtype and `shape` (default: the input's)."""
    if recvbuf is None:
        if isinstance(send, CudaArray):
            raise ValueError(f"mncl: {what}: a CUDA input needs a CUDA recvbuf (or the in-place "
                             f"form): MNCL allocates no device memory")
        return np.empty(send.shape if shape is None else shape, send.dtype)
    recv, recv_code = _output(recvbuf, "recvbuf", dtype)
    if recv_code != code:
        raise TypeError(f"mncl: {what}: dtypes differ ({send.dtype} and {recv.dtype})")
    if recv.size != want:
        raise ValueError(f"mncl: {what}: the output has {recv.size} elements, expected {want}")
    return recv


def _ptr(arr):
    return ctypes.c_void_p(address(arr)) if arr is not None else None


_P2P_KINDS = {"send": _lib.P2P_SEND, "isend": _lib.P2P_SEND,
              "recv": _lib.P2P_RECV, "irecv": _lib.P2P_RECV}


class P2POp:
    """One send or receive of a batch (Communicator.batch_isend_irecv / sendrecv_batch), as
    PyTorch's torch.distributed.P2POp: ``P2POp(comm.isend, buf, peer)`` or
    ``P2POp("recv", buf, peer)``.

    op: "send"/"isend" or "recv"/"irecv", or a function of one of those names (comm.isend,
    mncl.Communicator.irecv, torch.distributed.isend: only its name is used). buf: what to send
    (any array-like, as send() takes) or the array to receive into (C-contiguous, writeable; its
    size and dtype must match the peer's send). dtype: as for every call, an MNCL dtype name for
    arrays holding raw bits.
    """

    def __init__(self, op, buf, peer, *, dtype=None):
        name = op if isinstance(op, str) else getattr(op, "__name__", None)
        kind = _P2P_KINDS.get(name.lower()) if isinstance(name, str) else None
        if kind is None:
            raise ValueError(f"mncl: P2POp: op must be 'send', 'isend', 'recv', 'irecv' or one "
                             f"of those functions, not {op!r}")
        self.kind = kind
        if kind == _lib.P2P_SEND:
            self.buf, self.code = _input(buf, dtype)
        else:
            self.buf, self.code = _output(buf, "buf", dtype)
        # Checked here, where the mistake is made (ctypes would keep the low 32 bits of the
        # struct field), and again when the batch is packed (the attribute may be changed).
        self.peer = _lib.fit(peer, ctypes.c_int32, "P2POp peer")

    @property
    def is_send(self):
        return self.kind == _lib.P2P_SEND

    def __repr__(self):
        kind = "send" if self.is_send else "recv"
        return f"<mncl.P2POp {kind} {self.buf.dtype}[{self.buf.size}] peer {self.peer}>"


class Request:
    """A non-blocking operation in flight (mncl_request_t), from a Communicator's i* methods.

    The arrays it reads and writes are kept alive until it completes, even if the Request itself
    is dropped; they must not be modified (nor the output read) before then. A request completes
    in wait(), or in the test() call that returns True; a failed operation raises its MnclError
    there, and again on any later wait().
    """

    def __init__(self, handle, result, keep):
        self._handle = handle
        self._result = result
        self._keep = keep
        self._error = None
        # One thread at a time in test()/wait(): the library frees the request under the one
        # that completes it (two waiters once crashed the process).
        self._lock = threading.Lock()
        _IN_FLIGHT.add(self)

    def __repr__(self):
        state = "pending" if self._handle is not None else "failed" if self._error else "done"
        return f"<mncl.Request {state}>"

    @property
    def done(self):
        """True once completed (by wait(), or by a test() that returned True)."""
        return self._handle is None

    def _complete(self, status):
        """The C request is freed: drop it and the arrays, keep the outcome."""
        self._handle, self._keep = None, None
        _IN_FLIGHT.discard(self)
        try:
            check(status)
        except Exception as e:
            self._error = e
            raise

    def test(self):
        """True when finished (the result is then in place; a failure is raised). Never
        blocks."""
        with self._lock:
            if self._handle is None:
                return True
            flag = ctypes.c_int(0)
            status = lib.mncl_test(self._handle, ctypes.byref(flag))
            if flag.value:
                self._complete(status)
                return True
            check(status)
            return False

    def wait(self, timeout=None):
        """Waits for completion and returns the result (the blocking call's return value).

        timeout: seconds, or None to wait until the operation ends (itself bounded by the
        communicator's timeout). A wait that runs out of time raises mncl.TimeoutError and the
        request stays pending: wait again, or test().
        """
        with self._lock:
            if self._handle is not None:
                if timeout is not None and not timeout >= 0:  # NaN too
                    raise ValueError(f"mncl: wait: negative timeout {timeout}")
                # Beyond 2^40 ms (inf included) a wait has no limit: as None (ctypes would
                # wrap it). A positive timeout is at least 1 ms (0 ms would only poll).
                ms = -1 if timeout is None else _timeout_ms(timeout, "wait: timeout")
                if ms > _UNBOUNDED_WAIT_MS:
                    ms = -1
                status = lib.mncl_wait(self._handle, ms)
                if status == _ERR_TIMEOUT and ms >= 0:
                    self._timed_out()  # raises, unless the operation completed meanwhile
                else:
                    self._complete(status)
            elif self._error is not None:
                raise self._error
            return self._result

    def _timed_out(self):
        """After MNCL_ERR_TIMEOUT from a bounded wait: either the wait ran out of time (the
        request stays pending: raise, keep it) or the operation itself timed out (the library
        freed the request: complete it with that error). mncl_test tells them apart, since it
        refuses a freed handle (never reused)."""
        try:
            check(_ERR_TIMEOUT)
        except Exception as e:
            timeout_error = e
        flag = ctypes.c_int(0)
        status = lib.mncl_test(self._handle, ctypes.byref(flag))
        if status == _ERR_INVALID_ARGUMENT:  # freed: the operation's own timeout
            self._handle, self._keep = None, None
            _IN_FLIGHT.discard(self)
            self._error = timeout_error
            raise timeout_error
        if flag.value:  # finished just now
            self._complete(status)
            return
        raise timeout_error


class _InterruptWatch:
    """Ctrl-C during a blocking call. Python runs signal handlers on the main thread only, and
    only between bytecodes: a SIGINT that arrives while the main thread is in the library
    raised KeyboardInterrupt when the call returned, at the latest at its timeout. So Python's
    signal wakeup fd (signal.set_wakeup_fd), where no one had set one, is pointed at a pipe that
    this object's thread reads: on a SIGINT while a blocking call of the main thread runs, it
    aborts the call's communicator (mncl_comm_abort, any thread), the call returns at once, and
    the pending KeyboardInterrupt is raised as it returns. The call cannot be taken back (the
    other ranks are in it): later calls on the communicator raise AbortedError, and the other
    ranks' calls fail naming this rank's abort. Only with Python's own SIGINT handler (one of
    the application's may choose not to stop: the call then runs to its end, as before). A
    wakeup fd set by someone else (asyncio's event loop) is left alone, before or after: then
    calls are not ended, as before."""

    def __init__(self):
        """Raises where it cannot watch: another wakeup fd is set (_Taken), no pipe, no thread
        (at interpreter shutdown), not the main thread; nothing is left set then."""
        self.calling = None  # the communicator handle of the main thread's call in progress
        read, write = os.pipe()
        try:
            os.set_blocking(write, False)  # set_wakeup_fd requires it
            previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
            if previous != -1:
                signal.set_wakeup_fd(previous)  # theirs stays
                raise _Taken()
            try:
                threading.Thread(target=self._watch, args=(read,), name="mncl-interrupt",
                                 daemon=True).start()
            except BaseException:
                signal.set_wakeup_fd(-1)
                raise
        except BaseException:
            os.close(read)
            os.close(write)
            raise
        self._read, self._write = read, write

    def _watch(self, read):
        while True:
            try:
                signals = os.read(read, 64)
            except OSError:
                return
            if not signals:  # closed: a forked child's copy, or the process ends
                return
            handle = self.calling
            if signal.SIGINT in signals and handle is not None:
                lib.mncl_comm_abort(handle)

    def forget_in_child(self):
        """After fork, in the child: the wakeup fd still points at the pipe the parent's
        thread reads, which would take the child's SIGINT for the parent's (and abort the
        parent's call): it is let go of, with both ends of the pipe."""
        try:
            current = signal.set_wakeup_fd(-1)
            if current != self._write:
                signal.set_wakeup_fd(current)
        except ValueError:  # not the main thread
            pass
        os.close(self._read)
        os.close(self._write)


class _Taken(Exception):
    """Another wakeup fd is set (asyncio's event loop)."""


try:  # the C function: signal.getsignal wraps it in an enum conversion, 3 us a call
    from _signal import getsignal as _getsignal
except ImportError:  # not CPython
    _getsignal = signal.getsignal

_WATCH = None


def _forget_watch():
    global _WATCH
    watch, _WATCH = _WATCH, None  # its thread did not survive the fork
    if isinstance(watch, _InterruptWatch):
        watch.forget_in_child()


os.register_at_fork(after_in_child=_forget_watch)


def _interruptible(fn, handle, *args):
    """fn(handle, *args), a blocking call on communicator handle: on the main thread, one that
    Ctrl-C ends (see _InterruptWatch); elsewhere, and where that cannot be, as it is."""
    global _WATCH
    if (threading.get_ident() != threading.main_thread().ident
            or _getsignal(signal.SIGINT) is not signal.default_int_handler):
        return fn(handle, *args)
    watch = _WATCH
    if watch is None:  # the main thread only: no race
        try:
            watch = _InterruptWatch()
        except Exception:  # noqa: BLE001 (any reason not to watch: the call goes on as it is)
            watch = False
        _WATCH = watch
    if watch is False:
        return fn(handle, *args)
    watch.calling = handle
    try:
        return fn(handle, *args)
    finally:
        watch.calling = None


_MAX_TIMEOUT_MS = 7 * 24 * 3600 * 1000  # the library's bound (one week), as MNCL_TIMEOUT's
_UNBOUNDED_WAIT_MS = 1 << 40  # mncl_wait: longer waits are waits without a limit (-1)


def _timeout_ms(timeout, what):
    """A timeout in seconds as whole milliseconds, rounded away from zero, as the library's
    MNCL_TIMEOUT parser rounds up: a positive timeout never becomes 0 ms (which a config
    refuses and a wait takes as "only poll"), a negative one never 0 either. Rounded from the
    number's decimal form, so 0.3 s is 300 ms (0.3 * 1000 is 300.00000000000006 in binary).
    An infinite one comes back as a float infinity, for the caller to saturate."""
    if isinstance(timeout, (str, bytes)):
        raise TypeError(f"mncl: {what} must be a number of seconds, not {timeout!r}")
    try:
        seconds = float(timeout)
    except OverflowError:  # an int beyond a float's range
        seconds = math.inf if timeout > 0 else -math.inf
    if math.isnan(seconds):
        raise ValueError(f"mncl: {what} is NaN")
    if math.isinf(seconds):
        return seconds
    ms = math.ceil(abs(Decimal(repr(seconds))) * 1000)
    return ms if seconds >= 0 else -ms


def _config_timeout_ms(timeout, none_means="MNCL_TIMEOUT"):
    """A config's timeout (seconds) in milliseconds for the C API (rounded as _timeout_ms);
    None: from the environment. One that is not > 0 and at most a week is refused here, naming
    the keyword and seconds (the library's message spoke of config->timeout_ms in milliseconds),
    so none reaches ctypes, which would wrap one past int64 into some other timeout."""
    if timeout is None:
        return _lib.FROM_ENV
    ms = _timeout_ms(timeout, "timeout")
    if not 0 < ms <= _MAX_TIMEOUT_MS:
        # Refused here, in the caller's words (seconds), not as the C config's timeout_ms.
        raise InvalidArgumentError(
            f"timeout={timeout!r}: give seconds > 0 and at most one week (604800), or None "
            f"for {none_means}", 1, "MNCL_ERR_INVALID_ARGUMENT")
    return int(ms)


def _split_config(backend, timeout, device):
    """The mncl_config_t of a split: None fields keep the parent's settings."""
    return _lib.Config(
        ctypes.sizeof(_lib.Config), _lib.CONFIG_MAGIC, _lib.HEADER_VERSION,
        backend.encode() if backend else None, _lib.FROM_ENV, _lib.FROM_ENV, None,
        _config_timeout_ms(timeout, "the parent's"), _config_int(device, "device"), 0)


def _config_int(value, what):
    """A config's int32 field: None is MNCL_FROM_ENV; what does not fit is refused
    (ctypes.ArgumentError), as ctypes would keep its low 32 bits (rank 2**32 was rank 0)."""
    return _lib.FROM_ENV if value is None else _lib.fit(value, ctypes.c_int32, f"config {what}")


class Communicator(ObjectCollectives):
    """A group of ranks (mncl_comm_t). Every argument left as None comes from the environment
    (MNCL_BACKEND, MNCL_RANK/MNCL_SIZE or a launcher's variables, MNCL_STORE, MNCL_TIMEOUT...),
    which is what mncl-run sets up. Destroying is collective: call close() on every rank, or use
    the communicator as a context manager (whose block, left by an exception, aborts it
    instead: see _abandon).

    Every collective and point-to-point method takes the keyword-only ``dtype`` (an MNCL dtype
    name for raw-bit arrays) and ``stream``: None orders the call on its CUDA arrays' stream (no
    stream for host arrays); an int (a cudaStream_t address, 0 = the legacy default stream) or
    an object with ``cuda_stream`` (torch.cuda.Stream) or ``ptr`` (cupy.cuda.Stream) overrides
    it. See the module docstring."""

    def __init__(self, backend=None, rank=None, size=None, bootstrap=None, timeout=None,
                 device=None, _handle=None, _group_path=None):
        # Which group of the job this is, as the C++ Communicator::group_path() says it (the
        # checkpointer's file names): "" for the world, the parent's path plus "s<i>c<color>"
        # for its i-th split, None where unknown (split_host, split_cross_host).
        self.group_path, self._splits = "", 0
        if _handle is not None:
            self._handle = _handle
            self.group_path = _group_path
        else:
            cfg = _lib.Config(
                ctypes.sizeof(_lib.Config),
                _lib.CONFIG_MAGIC,
                _lib.HEADER_VERSION,
                backend.encode() if backend else None,
                _config_int(rank, "rank"),
                _config_int(size, "size"),
                bootstrap.encode() if bootstrap else None,
                _config_timeout_ms(timeout),
                _config_int(device, "device"),
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
        # Where this rank runs, by host (mncl_comm_host_info, MNCL_1.5): None with an older
        # library. ChainerMN's names are aliases: intra_rank, intra_size, inter_rank, inter_size.
        self.local_rank = self.local_size = self.host_index = self.num_hosts = None
        info = [ctypes.c_int() for _ in range(4)]
        try:
            check(lib.mncl_comm_host_info(self._handle, *(ctypes.byref(v) for v in info)))
            self.local_rank, self.local_size, self.host_index, self.num_hosts = (
                v.value for v in info)
        except NotSupportedError:
            pass

    intra_rank = property(lambda self: self.local_rank, doc="ChainerMN's name of local_rank")
    intra_size = property(lambda self: self.local_size, doc="ChainerMN's name of local_size")
    inter_rank = property(lambda self: self.host_index, doc="ChainerMN's name of host_index")
    inter_size = property(lambda self: self.num_hosts, doc="ChainerMN's name of num_hosts")

    # --- lifetime --------------------------------------------------------------------------

    def close(self):
        """Collective: waits for operations in flight, then frees the communicator. Their
        requests stay valid: wait() on them returns the recorded outcome."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            check(_interruptible(lib.mncl_comm_destroy, handle))

    def abort(self):
        """Local, any thread: pending and later operations fail with mncl.AbortedError."""
        check(lib.mncl_comm_abort(self._live()))

    def _abandon(self):
        """Local: aborts and frees the communicator without waiting for the other ranks, whose
        pending and next calls on it then fail where the backend passes the abort on (naive,
        shm: AbortedError, gloo: RemoteError) instead of at their timeout. For a rank leaving on an
        exception; the library's statuses are dropped: that exception is the one to see."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            lib.mncl_comm_abort(handle)
            lib.mncl_comm_destroy(handle)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        # Leaving on an exception, this rank may never reach the collective that the others
        # are in (or about to start): a collective close() would wait for them there, and they
        # for it, until the timeout. Abort instead.
        if exc_type is not None:
            self._abandon()
        else:
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
        path = self._split_path(color)
        check(lib.mncl_comm_split(self._live(), -1 if color is None else color, key,
                                  ctypes.byref(handle)))
        return Communicator(_handle=handle, _group_path=path) if handle.value else None

    def _split_path(self, color):
        """The group path of this communicator's next split (counted whether it succeeds or
        not, as the C++ frontends count)."""
        index, self._splits = self._splits, self._splits + 1
        if self.group_path is None or color is None:
            return None
        try:
            color = operator.index(color)  # True is color 1, as the C call takes it
        except TypeError:
            pass  # the C call refuses it
        return f"{self.group_path}s{index}c{color}"

    def split_config(self, color, key=0, backend=None, timeout=None, device=None):
        """split() whose new communicator has its own settings (mncl_comm_split_config):
        backend (a name, a comma list or "auto"; the ranks of a group must pass the same),
        timeout in seconds, device; None keeps the parent's."""
        handle = _lib.c_handle()
        cfg = _split_config(backend, timeout, device)
        path = self._split_path(color)
        check(lib.mncl_comm_split_config(self._live(), -1 if color is None else color, key,
                                         ctypes.byref(cfg), ctypes.byref(handle)))
        return Communicator(_handle=handle, _group_path=path) if handle.value else None

    def split_host(self, key=0, backend=None, timeout=None, device=None):
        """Collective: the ranks on this rank's host (mncl_comm_split_type HOST; hosts are told
        apart by MNCL_HOSTID, default the host name). Settings as split_config()."""
        return self._split_type(_lib.SPLIT_TYPE_HOST, key, backend, timeout, device)

    def split_cross_host(self, key=0, backend=None, timeout=None, device=None):
        """Collective: one rank per host, those at the same position among their host's ranks
        (mncl_comm_split_type CROSS_HOST): group 0 holds every host's first rank."""
        return self._split_type(_lib.SPLIT_TYPE_CROSS_HOST, key, backend, timeout, device)

    def _split_type(self, split_type, key, backend, timeout, device):
        handle = _lib.c_handle()
        cfg = _split_config(backend, timeout, device)
        self._split_path(None)  # counted; the library picks the group, so its path is unknown
        check(lib.mncl_comm_split_type(self._live(), split_type, key, ctypes.byref(cfg),
                                       ctypes.byref(handle)))
        return Communicator(_handle=handle)

    # --- running a prepared call -----------------------------------------------------------
    #
    # Each collective's arguments are prepared once, as (C arguments between the communicator
    # and the stream, the result to return, the objects the C call reads or writes), then run
    # blocking or started as a Request. The stream argument is the caller's stream= when given
    # (explicit_stream), else the CUDA arrays' stream (stream_of; None for host arrays).

    def _run(self, fn, call, stream=None):
        args, result, keep = call
        check(_interruptible(fn, self._live(), *args, call_stream(stream, keep)))
        return public(result)

    def _start(self, fn, call, stream=None):
        args, result, keep = call
        c_stream = call_stream(stream, keep)
        handle = _lib.c_handle()
        check(fn(self._live(), *args, c_stream, ctypes.byref(handle)))
        # The stream object (a torch.cuda.Stream, ...) is kept alive with the arrays: the
        # library may still queue work on it until the request completes.
        return Request(handle, public(result), keep if stream is None else (keep, stream))

    # --- collectives -----------------------------------------------------------------------

    def _allreduce_call(self, sendbuf, recvbuf, op, dtype, what):
        send, code = _input(sendbuf, dtype)
        recv = _matching_output(recvbuf, send, code, dtype, send.size, what)
        return (_ptr(send), _ptr(recv), send.size, code, _op_code(op)), recv, (send, recv)

    def allreduce(self, sendbuf, recvbuf=None, op="sum", *, dtype=None, stream=None):
        """Element-wise reduction over ranks, on every rank. Returns recvbuf."""
        return self._run(lib.mncl_allreduce,
                         self._allreduce_call(sendbuf, recvbuf, op, dtype, "allreduce"),
                         stream=stream)

    def iallreduce(self, sendbuf, recvbuf=None, op="sum", *, dtype=None, stream=None):
        """Non-blocking allreduce: a Request whose wait() returns recvbuf."""
        return self._start(lib.mncl_iallreduce,
                           self._allreduce_call(sendbuf, recvbuf, op, dtype, "iallreduce"),
                           stream=stream)

    def _reduce_call(self, sendbuf, recvbuf, op, root, dtype, what):
        send, code = _input(sendbuf, dtype)
        recv = None
        if self.rank == root:
            recv = _matching_output(recvbuf, send, code, dtype, send.size, what)
        args = (_ptr(send), _ptr(recv), send.size, code, _op_code(op), root)
        return args, recv, (send, recv)

    def reduce(self, sendbuf, recvbuf=None, op="sum", root=0, *, dtype=None, stream=None):
        """Reduction onto root: returns recvbuf there, None elsewhere."""
        return self._run(lib.mncl_reduce,
                         self._reduce_call(sendbuf, recvbuf, op, root, dtype, "reduce"),
                         stream=stream)

    def ireduce(self, sendbuf, recvbuf=None, op="sum", root=0, *, dtype=None, stream=None):
        """Non-blocking reduce: a Request whose wait() returns recvbuf on root, None
        elsewhere."""
        return self._start(lib.mncl_ireduce,
                           self._reduce_call(sendbuf, recvbuf, op, root, dtype, "ireduce"),
                           stream=stream)

    def _bcast_call(self, buf, root, dtype):
        arr, code = _output(buf, "buf", dtype)
        return (_ptr(arr), arr.size, code, root), arr, (arr,)

    def _bcast_in_place(self, buf, root=0, *, dtype=None, stream=None):
        """mncl_bcast as it is: every rank passes an array of root's size and dtype."""
        return self._run(lib.mncl_bcast, self._bcast_call(buf, root, dtype), stream=stream)

    def bcast(self, buf, root=0, *, dtype=None, stream=None):
        """root's buf on every rank, as ChainerMN's bcast: returns buf, written in place, or a
        new host array of root's shape and dtype where buf is None (allowed off the root only).

        root's shape and dtype go first (one small broadcast), so that every rank learns of a
        root that passed no usable array (RemoteError there, the root's own error on the root)
        and a rank whose buf does not hold root's dtype and element count raises there, naming
        both, after receiving root's data elsewhere, instead of reading it as another type.
        ibcast is the single broadcast: every rank passes an array of root's size and dtype.
        On nccl the header's host memory goes through device scratch and waits for the default
        stream (no header inside a CUDA graph capture: use ibcast there).
        """
        own_error, arr, code, c_stream = None, None, None, None
        try:
            if buf is not None or self.rank == root:
                arr, code = _output(buf, "buf", dtype)
            elif dtype is not None:
                code = code_of_name(dtype)
            c_stream = call_stream(stream, () if arr is None else (arr,))
        except Exception as error:  # noqa: BLE001 (raised once the others have taken part)
            own_error = error
        header = np.zeros(_ARRAY_HEADER_WORDS, np.int64)
        if self.rank == root:
            header, own_error = _array_header(arr, code, own_error, "bcast")
        self._bcast_in_place(header, root=root)
        if int(header[0]) == _ARRAY_FAILED:
            if own_error is not None:
                raise own_error
            raise RemoteError(f"mncl: bcast: the root (rank {root}) passed no usable buf (the "
                              f"cause is raised there)")
        root_code, shape = _header_layout(header, "bcast", root)
        root_size = math.prod(shape)
        if own_error is None and code is not None and (
                code != root_code or (arr is not None and arr.size != root_size)):
            mine = (f"buf is {dtype_name(code)} with {arr.size} elements" if arr is not None
                    else f"dtype {dtype!r} was asked for")
            own_error = (TypeError if code != root_code else ValueError)(
                f"mncl: bcast: {mine}; the root (rank {root}) sends {dtype_name(root_code)} "
                f"with {root_size}")
        if arr is None or own_error is not None:
            # A rank that cannot take root's data still receives it, so that the root and the
            # other ranks complete; then it raises.
            received = np.empty(shape, numpy_dtype(root_code))
            self._bcast_in_place(received, root=root, dtype=dtype_name(root_code))
            if own_error is not None:
                raise own_error
            return received
        check(_interruptible(lib.mncl_bcast, self._live(), _ptr(arr), arr.size, code, root,
                             c_stream))
        return public(arr)

    def ibcast(self, buf, root=0, *, dtype=None, stream=None):
        """Non-blocking bcast: a Request whose wait() returns buf."""
        return self._start(lib.mncl_ibcast, self._bcast_call(buf, root, dtype), stream=stream)

    def _allgather_call(self, sendbuf, recvbuf, dtype, what):
        send, code = _input(sendbuf, dtype)
        recv = _matching_output(recvbuf, send, code, dtype, send.size * self.size, what,
                                shape=(self.size,) + send.shape)
        return (_ptr(send), _ptr(recv), send.size, code), recv, (send, recv)

    def allgather(self, sendbuf, recvbuf=None, *, dtype=None, stream=None):
        """Every rank's sendbuf, stacked: shape (size,) + sendbuf.shape."""
        return self._run(lib.mncl_allgather,
                         self._allgather_call(sendbuf, recvbuf, dtype, "allgather"), stream=stream)

    def iallgather(self, sendbuf, recvbuf=None, *, dtype=None, stream=None):
        """Non-blocking allgather: a Request whose wait() returns recvbuf."""
        return self._start(lib.mncl_iallgather,
                           self._allgather_call(sendbuf, recvbuf, dtype, "iallgather"),
                           stream=stream)

    def _gather_call(self, sendbuf, recvbuf, root, dtype, what):
        send, code = _input(sendbuf, dtype)
        recv = None
        if self.rank == root:
            recv = _matching_output(recvbuf, send, code, dtype, send.size * self.size, what,
                                    shape=(self.size,) + send.shape)
        return (_ptr(send), _ptr(recv), send.size, code, root), recv, (send, recv)

    def gather(self, sendbuf, recvbuf=None, root=0, *, dtype=None, stream=None):
        """Every rank's sendbuf onto root, stacked: shape (size,) + sendbuf.shape there; None
        elsewhere."""
        return self._run(lib.mncl_gather,
                         self._gather_call(sendbuf, recvbuf, root, dtype, "gather"), stream=stream)

    def igather(self, sendbuf, recvbuf=None, root=0, *, dtype=None, stream=None):
        """Non-blocking gather: a Request whose wait() returns recvbuf on root, None
        elsewhere."""
        return self._start(lib.mncl_igather,
                           self._gather_call(sendbuf, recvbuf, root, dtype, "igather"),
                           stream=stream)

    def _scatter_call(self, sendbuf, recvbuf, root, dtype, what):
        recv, code = _output(recvbuf, "recvbuf", dtype)
        send = None
        if self.rank == root:
            send, send_code = _input(sendbuf, dtype)
            if send_code != code:
                raise TypeError(f"mncl: {what}: dtypes differ ({send.dtype} and {recv.dtype})")
            if send.size != recv.size * self.size:
                raise ValueError(f"mncl: {what}: the input has {send.size} elements, expected "
                                 f"{recv.size * self.size}")
        return (_ptr(send), _ptr(recv), recv.size, code, root), recv, (send, recv)

    def scatter(self, sendbuf, recvbuf, root=0, *, dtype=None, stream=None):
        """Block r (recvbuf.size elements) of root's sendbuf lands in rank r's recvbuf.
        sendbuf is only read on root (pass None elsewhere). Returns recvbuf."""
        return self._run(lib.mncl_scatter,
                         self._scatter_call(sendbuf, recvbuf, root, dtype, "scatter"),
                         stream=stream)

    def iscatter(self, sendbuf, recvbuf, root=0, *, dtype=None, stream=None):
        """Non-blocking scatter: a Request whose wait() returns recvbuf."""
        return self._start(lib.mncl_iscatter,
                           self._scatter_call(sendbuf, recvbuf, root, dtype, "iscatter"),
                           stream=stream)

    def _reduce_scatter_call(self, sendbuf, recvbuf, op, dtype, what):
        send, code = _input(sendbuf, dtype)
        if send.size % self.size:
            raise ValueError(f"mncl: {what}: {send.size} elements do not split into "
                             f"{self.size} blocks")
        count = send.size // self.size
        shape = send.shape[1:] if send.ndim > 1 and send.shape[0] == self.size else (count,)
        recv = _matching_output(recvbuf, send, code, dtype, count, what, shape=shape)
        return (_ptr(send), _ptr(recv), count, code, _op_code(op)), recv, (send, recv)

    def reduce_scatter(self, sendbuf, recvbuf=None, op="sum", *, dtype=None, stream=None):
        """sendbuf holds size blocks; rank r receives the reduction of block r. The default
        recvbuf has shape sendbuf.shape[1:] when sendbuf.shape[0] == size, else is flat."""
        return self._run(lib.mncl_reduce_scatter,
                         self._reduce_scatter_call(sendbuf, recvbuf, op, dtype,
                                                   "reduce_scatter"), stream=stream)

    def ireduce_scatter(self, sendbuf, recvbuf=None, op="sum", *, dtype=None, stream=None):
        """Non-blocking reduce_scatter: a Request whose wait() returns recvbuf."""
        return self._start(lib.mncl_ireduce_scatter,
                           self._reduce_scatter_call(sendbuf, recvbuf, op, dtype,
                                                     "ireduce_scatter"), stream=stream)

    def _alltoall_call(self, sendbuf, recvbuf, dtype, what):
        send, code = _input(sendbuf, dtype)
        if send.size % self.size:
            raise ValueError(f"mncl: {what}: {send.size} elements do not split into "
                             f"{self.size} blocks")
        recv = _matching_output(recvbuf, send, code, dtype, send.size, what)
        args = (_ptr(send), _ptr(recv), send.size // self.size, code)
        return args, recv, (send, recv)

    def alltoall(self, sendbuf, recvbuf=None, *, dtype=None, stream=None):
        """Block j of rank i's sendbuf lands in block i of rank j's recvbuf (size blocks)."""
        return self._run(lib.mncl_alltoall,
                         self._alltoall_call(sendbuf, recvbuf, dtype, "alltoall"), stream=stream)

    def ialltoall(self, sendbuf, recvbuf=None, *, dtype=None, stream=None):
        """Non-blocking alltoall: a Request whose wait() returns recvbuf."""
        return self._start(lib.mncl_ialltoall,
                           self._alltoall_call(sendbuf, recvbuf, dtype, "ialltoall"), stream=stream)

    def _packed(self, counts, what, name):
        """A size_t array of one count per rank, and its packed displacements (prefix sums).
        Counts (and their sum, the last displacement's bound) beyond size_t are refused with
        ctypes.ArgumentError: the array would keep their low 64 bits."""
        # Not int(c): 4.9 would become 4, "4" would be parsed (ctypes.ArgumentError instead).
        counts = [_lib.integer(c, f"{what}: {name}[{i}]") for i, c in enumerate(counts)]
        if len(counts) != self.size:
            raise ValueError(f"mncl: {what}: {name} has {len(counts)} entries, expected "
                             f"{self.size} (one per rank)")
        if any(c < 0 for c in counts):
            raise ValueError(f"mncl: {what}: {name} has a negative count")
        for i, c in enumerate(counts):
            _lib.fit(c, ctypes.c_size_t, f"{what}: {name}[{i}]")
        total = _lib.fit(sum(counts), ctypes.c_size_t, f"{what}: the sum of {name}")
        displs = [0] * self.size
        for i in range(1, self.size):
            displs[i] = displs[i - 1] + counts[i - 1]
        n = self.size
        return (ctypes.c_size_t * n)(*counts), (ctypes.c_size_t * n)(*displs), total

    def _allgatherv_call(self, sendbuf, counts, recvbuf, dtype, what):
        send, code = _input(sendbuf, dtype)
        c_counts, c_displs, total = self._packed(counts, what, "counts")
        recv = _matching_output(recvbuf, send, code, dtype, total, what, shape=(total,))
        args = (_ptr(send), send.size, _ptr(recv), c_counts, c_displs, code)
        return args, recv, (send, recv, c_counts, c_displs)

    def allgatherv(self, sendbuf, counts=None, recvbuf=None, *, dtype=None, stream=None):
        """Every rank's sendbuf (of any size), concatenated in rank order: a 1-D array of
        sum(counts) elements. counts[i] is rank i's element count; None exchanges the sizes
        first (one more allgather)."""
        send, _ = _input(sendbuf, dtype)
        if counts is None:
            if stream is not None:
                explicit_stream(stream)  # refused before the sizes are exchanged
            counts = self.allgather(np.array([send.size], np.int64)).ravel()
        return self._run(lib.mncl_allgatherv,
                         self._allgatherv_call(send, counts, recvbuf, dtype, "allgatherv"),
                         stream=stream)

    def iallgatherv(self, sendbuf, counts, recvbuf=None, *, dtype=None, stream=None):
        """Non-blocking allgatherv (counts required): a Request whose wait() returns recvbuf."""
        return self._start(lib.mncl_iallgatherv,
                           self._allgatherv_call(sendbuf, counts, recvbuf, dtype, "iallgatherv"),
                           stream=stream)

    def _alltoallv_call(self, sendbuf, sendcounts, recvcounts, recvbuf, dtype, what):
        send, code = _input(sendbuf, dtype)
        c_send, c_sdispls, send_total = self._packed(sendcounts, what, "sendcounts")
        if send_total != send.size:
            raise ValueError(f"mncl: {what}: sendcounts add up to {send_total} elements, "
                             f"sendbuf has {send.size}")
        c_recv, c_rdispls, total = self._packed(recvcounts, what, "recvcounts")
        recv = _matching_output(recvbuf, send, code, dtype, total, what, shape=(total,))
        args = (_ptr(send), c_send, c_sdispls, _ptr(recv), c_recv, c_rdispls, code)
        return args, recv, (send, recv, c_send, c_sdispls, c_recv, c_rdispls)

    def alltoallv(self, sendbuf, sendcounts, recvcounts=None, recvbuf=None,
                  *, dtype=None, stream=None):
        """sendbuf holds one block per rank, in rank order, of sendcounts[j] elements; returns
        the blocks received from every rank, concatenated in rank order (1-D). recvcounts None
        exchanges the counts first (one more alltoall)."""
        if recvcounts is None:
            if stream is not None:
                explicit_stream(stream)  # refused before the counts are exchanged
            # Checked first (negative, or beyond size_t), then exchanged as size_t values.
            sendcounts = [_lib.integer(c, f"alltoallv: sendcounts[{i}]")
                          for i, c in enumerate(sendcounts)]
            self._packed(sendcounts, "alltoallv", "sendcounts")
            recvcounts = self.alltoall(np.asarray(sendcounts, np.uint64))
        return self._run(lib.mncl_alltoallv,
                         self._alltoallv_call(sendbuf, sendcounts, recvcounts, recvbuf, dtype,
                                              "alltoallv"), stream=stream)

    def ialltoallv(self, sendbuf, sendcounts, recvcounts, recvbuf=None, *, dtype=None, stream=None):
        """Non-blocking alltoallv (recvcounts required): a Request whose wait() returns
        recvbuf."""
        return self._start(lib.mncl_ialltoallv,
                           self._alltoallv_call(sendbuf, sendcounts, recvcounts, recvbuf, dtype,
                                                "ialltoallv"), stream=stream)

    def _gatherv_call(self, sendbuf, counts, recvbuf, root, dtype, what):
        send, code = _input(sendbuf, dtype)
        recv = c_counts = c_displs = None
        if self.rank == root:
            if counts is None:
                raise ValueError(f"mncl: {what}: the root needs counts (one per rank; gather the "
                                 f"sizes first if it does not know them)")
            c_counts, c_displs, total = self._packed(counts, what, "counts")
            recv = _matching_output(recvbuf, send, code, dtype, total, what, shape=(total,))
        args = (_ptr(send), send.size, _ptr(recv), c_counts, c_displs, code, root)
        return args, recv, (send, recv, c_counts, c_displs)

    def gatherv(self, sendbuf, counts, recvbuf=None, root=0, *, dtype=None, stream=None):
        """Every rank's sendbuf (of any size) onto root, concatenated in rank order: a 1-D array
        of sum(counts) elements there, None elsewhere. counts[i] is rank i's element count, read
        on root only (pass None elsewhere). A root that does not know them gathers them first:
        ``comm.gather(np.array([x.size]), root=root)`` on every rank."""
        return self._run(lib.mncl_gatherv,
                         self._gatherv_call(sendbuf, counts, recvbuf, root, dtype, "gatherv"),
                         stream=stream)

    def igatherv(self, sendbuf, counts, recvbuf=None, root=0, *, dtype=None, stream=None):
        """Non-blocking gatherv: a Request whose wait() returns recvbuf on root, None
        elsewhere."""
        return self._start(lib.mncl_igatherv,
                           self._gatherv_call(sendbuf, counts, recvbuf, root, dtype, "igatherv"),
                           stream=stream)

    def _scatterv_call(self, sendbuf, counts, recvbuf, root, dtype, what):
        recv, code = _output(recvbuf, "recvbuf", dtype)
        send = c_counts = c_displs = None
        if self.rank == root:
            send, send_code = _input(sendbuf, dtype)
            if send_code != code:
                raise TypeError(f"mncl: {what}: dtypes differ ({send.dtype} and {recv.dtype})")
            if counts is None:
                raise ValueError(f"mncl: {what}: the root needs counts (one per rank)")
            c_counts, c_displs, total = self._packed(counts, what, "counts")
            if total != send.size:
                raise ValueError(f"mncl: {what}: counts add up to {total} elements, sendbuf "
                                 f"has {send.size}")
        args = (_ptr(send), c_counts, c_displs, _ptr(recv), recv.size, code, root)
        return args, recv, (send, recv, c_counts, c_displs)

    def scatterv(self, sendbuf, counts, recvbuf, root=0, *, dtype=None, stream=None):
        """Root's sendbuf holds one block per rank, in rank order, of counts[i] elements; block r
        lands in rank r's recvbuf, which holds exactly counts[r]. sendbuf and counts are read on
        root only (pass None elsewhere). Returns recvbuf."""
        return self._run(lib.mncl_scatterv,
                         self._scatterv_call(sendbuf, counts, recvbuf, root, dtype, "scatterv"),
                         stream=stream)

    def iscatterv(self, sendbuf, counts, recvbuf, root=0, *, dtype=None, stream=None):
        """Non-blocking scatterv: a Request whose wait() returns recvbuf."""
        return self._start(lib.mncl_iscatterv,
                           self._scatterv_call(sendbuf, counts, recvbuf, root, dtype,
                                               "iscatterv"), stream=stream)

    def barrier(self, *, stream=None):
        """Returns once every rank has entered the barrier. stream: as for every collective (None
        passes no stream: a barrier has no arrays to take one from)."""
        self._run(lib.mncl_barrier, ((), None, ()), stream=stream)

    def ibarrier(self, *, stream=None):
        """Non-blocking barrier: a Request whose wait() returns None once every rank has
        entered it."""
        return self._start(lib.mncl_ibarrier, ((), None, ()), stream=stream)

    # --- point to point --------------------------------------------------------------------

    @staticmethod
    def _send_call(buf, peer, dtype):
        arr, code = _input(buf, dtype)
        return (_ptr(arr), arr.size, code, peer), None, (arr,)

    @staticmethod
    def _recv_call(buf, peer, dtype):
        arr, code = _output(buf, "buf", dtype)
        return (_ptr(arr), arr.size, code, peer), arr, (arr,)

    def send(self, buf, peer, *, dtype=None, stream=None):
        """Sends buf to peer (not this rank). Messages between a pair of ranks match their
        receives in issue order."""
        self._run(lib.mncl_send, self._send_call(buf, peer, dtype), stream=stream)

    def isend(self, buf, peer, *, dtype=None, stream=None):
        """Non-blocking send: a Request whose wait() returns None once buf may be reused."""
        return self._start(lib.mncl_isend, self._send_call(buf, peer, dtype), stream=stream)

    def recv(self, buf, peer, *, dtype=None, stream=None):
        """Receives into buf (its size and dtype must match the send). Returns buf."""
        return self._run(lib.mncl_recv, self._recv_call(buf, peer, dtype), stream=stream)

    def irecv(self, buf, peer, *, dtype=None, stream=None):
        """Non-blocking recv: a Request whose wait() returns buf."""
        return self._start(lib.mncl_irecv, self._recv_call(buf, peer, dtype), stream=stream)

    def send_array(self, array, peer, *, dtype=None):
        """ChainerMN's send(data, dest): array's dtype and shape, then its data, to peer, which
        takes them with recv_array (two messages). An array that cannot travel (an unsupported
        dtype, more than 64 dimensions) raises here after telling peer, whose recv_array raises
        RemoteError; the pair's next messages stay in step."""
        own_error, arr, code = None, None, None
        try:
            arr, code = _input(array, dtype)
        except Exception as error:  # noqa: BLE001 (raised once peer has heard of it)
            own_error = error
        header, own_error = _array_header(arr, code, own_error, "send_array")
        self.send(header, peer)
        if own_error is not None:
            raise own_error
        self.send(arr, peer, dtype=dtype_name(code))

    def recv_array(self, peer):
        """ChainerMN's recv(source): a new host array of the shape and dtype that peer's
        send_array sent (bfloat16 as ml_dtypes.bfloat16 where ml_dtypes is imported, else its
        raw bits as uint16): the MNCL dtype, which for raw bits sent with dtype= is that dtype,
        not the sender's NumPy one. A receiver that cannot allocate the array raises MemoryError
        with the data not taken: the pair is out of step then."""
        header = self.recv(np.empty(_ARRAY_HEADER_WORDS, np.int64), peer)
        code, shape = _header_layout(header, "recv_array", peer)
        return self.recv(np.empty(shape, numpy_dtype(code)), peer, dtype=dtype_name(code))

    def _sendrecv_call(self, sendbuf, dest, recvbuf, source, dtype, what):
        send, code = _input(sendbuf, dtype)
        if recvbuf is None:
            recv = _matching_output(None, send, code, dtype, send.size, what)
        else:
            recv, recv_code = _output(recvbuf, "recvbuf", dtype)
            if recv_code != code:
                raise TypeError(f"mncl: {what}: dtypes differ ({send.dtype} and {recv.dtype})")
        source = dest if source is None else source
        args = (_ptr(send), send.size, dest, _ptr(recv), recv.size, source, code)
        return args, recv, (send, recv)

    def sendrecv(self, sendbuf, dest, recvbuf=None, source=None, *, dtype=None, stream=None):
        """MPI_Sendrecv: sends sendbuf to dest while receiving recvbuf from source (default:
        dest; never this rank), both at once, so a ring shift ``sendrecv(x, (r + 1) % n,
        source=(r - 1) % n)`` on every rank cannot deadlock, on any backend. recvbuf None
        receives an array like sendbuf; the sizes may differ by direction (each matches the
        peer's). Returns recvbuf."""
        return self._run(lib.mncl_sendrecv,
                         self._sendrecv_call(sendbuf, dest, recvbuf, source, dtype, "sendrecv"),
                         stream=stream)

    def isendrecv(self, sendbuf, dest, recvbuf=None, source=None, *, dtype=None, stream=None):
        """Non-blocking sendrecv: a Request whose wait() returns recvbuf."""
        return self._start(lib.mncl_isendrecv,
                           self._sendrecv_call(sendbuf, dest, recvbuf, source, dtype,
                                               "isendrecv"), stream=stream)

    @staticmethod
    def _batch_call(ops):
        ops = list(ops)
        for i, op in enumerate(ops):
            if not isinstance(op, P2POp):
                raise TypeError(f"mncl: batch op {i} is a {type(op).__name__}, not an "
                                f"mncl.P2POp")
        size = ctypes.sizeof(_lib.P2POp)
        array = (_lib.P2POp * len(ops))(
            *[_lib.P2POp(size, op.kind, _lib.fit(op.peer, ctypes.c_int32, f"batch op {i}: peer"),
                         address(op.buf), op.buf.size, op.code, 0)
              for i, op in enumerate(ops)])
        results = [None if op.is_send else op.buf for op in ops]
        return (array, len(ops)), results, (ops, array)

    def sendrecv_batch(self, ops, *, stream=None):
        """Runs a batch of P2POps (sends and receives to and from any peers) and returns when
        all have completed: PyTorch's batch_isend_irecv followed by waiting for every request.
        All ops progress together (NCCL's ncclGroupStart/End), so a ring, a halo exchange or a
        pipeline's forward-and-backward exchange cannot deadlock whatever their order. Each op
        matches the peer's send/recv (or batch op) in issue order, per direction; receive
        buffers must overlap neither each other nor a send buffer of the batch. Returns a list
        with, for each op, its receive buffer, or None for a send."""
        return self._run(lib.mncl_sendrecv_batch, self._batch_call(ops), stream=stream)

    def batch_isend_irecv(self, ops, *, stream=None):
        """Non-blocking sendrecv_batch: one Request for the whole batch (not one per op, as
        PyTorch's), whose wait() returns the list sendrecv_batch returns."""
        return self._start(lib.mncl_isendrecv_batch, self._batch_call(ops), stream=stream)

    isendrecv_batch = batch_isend_irecv

    # --- coalesced -------------------------------------------------------------------------

    @staticmethod
    def _coalesced_call(sendbufs, recvbufs, op, dtype, what):
        sends = [_input(b, dtype) for b in sendbufs]
        if recvbufs is not None and len(recvbufs) != len(sends):
            raise ValueError(f"mncl: {what}: as many recvbufs as sendbufs")
        code = sends[0][1] if sends else 0  # no buffers: nothing moves, any dtype will do
        recvs = []
        for i, (send, send_code) in enumerate(sends):
            if send_code != code:
                raise TypeError(f"mncl: {what}: dtypes differ ({sends[0][0].dtype} and "
                                f"{send.dtype})")
            recvs.append(_matching_output(None if recvbufs is None else recvbufs[i], send,
                                          code, dtype, send.size, what))
        n = len(sends)
        send_ptrs = (ctypes.c_void_p * n)(*[address(s) for s, _ in sends])
        recv_ptrs = (ctypes.c_void_p * n)(*[address(r) for r in recvs])
        counts = (ctypes.c_size_t * n)(*[s.size for s, _ in sends])
        args = (send_ptrs, recv_ptrs, counts, n, code, _op_code(op))
        return args, recvs, (sends, recvs, send_ptrs, recv_ptrs, counts)

    def allreduce_coalesced(self, sendbufs, recvbufs=None, op="sum", *, dtype=None, stream=None):
        """Several allreduces of one dtype in one call (backends may pack them). Returns the
        list of results."""
        return self._run(lib.mncl_allreduce_coalesced,
                         self._coalesced_call(sendbufs, recvbufs, op, dtype,
                                              "allreduce_coalesced"), stream=stream)

    def iallreduce_coalesced(self, sendbufs, recvbufs=None, op="sum", *, dtype=None, stream=None):
        """Non-blocking allreduce_coalesced: a Request whose wait() returns the list of
        results."""
        return self._start(lib.mncl_iallreduce_coalesced,
                           self._coalesced_call(sendbufs, recvbufs, op, dtype,
                                                "iallreduce_coalesced"), stream=stream)

    # --- ChainerMN's training helpers (mncl/training.py) -----------------------------------

    def bcast_data(self, arrays, root=0):
        """Collective: the root's arrays (a list: parameters) copied into every rank's, in
        place; see mncl.training.bcast_data."""
        return training.bcast_data(self, arrays, root)

    def multi_node_mean_grad(self, grads, *, grad_dtype=None):
        """Collective: each gradient (a list of arrays) replaced by its mean over the ranks, in
        place; grad_dtype="float16"/"bfloat16" sends them at half the bytes. See
        mncl.training.multi_node_mean_grad."""
        return training.multi_node_mean_grad(self, grads, grad_dtype=grad_dtype)
