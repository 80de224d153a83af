"""CUDA arrays as buffers: anything with __cuda_array_interface__ (CuPy arrays, PyTorch CUDA
tensors, Numba device arrays). Their device pointer goes to the C library as it is: a backend
that takes CUDA memory (nccl) uses it directly, and the core stages it through pinned host memory
for the host-only ones (naive, gloo, shm, flat without CUDA-aware MPI), ordered on the array's
stream, or on the stream the caller names with a call's ``stream=`` (explicit_stream). Nothing here
touches the device: MNCL allocates no device memory from Python, so a CUDA input needs a CUDA
output (or the in-place form)."""

import ctypes
import operator

import numpy as np

from ._lib import fit


class CudaArray:
    """A view of an object's __cuda_array_interface__ (version 2 or 3): what the collectives
    need of it, with the object kept alive (.obj) and returned as the result."""

    def __init__(self, obj, name, writeable):
        try:
            cai = obj.__cuda_array_interface__
            shape = tuple(int(d) for d in cai["shape"])
            dtype = np.dtype(cai["typestr"])
            ptr, readonly = cai["data"]
        except Exception as e:  # noqa: BLE001 (PyTorch raises RuntimeError for requires_grad)
            raise TypeError(f"mncl: {name}: no usable __cuda_array_interface__ ({e}; a PyTorch "
                            f"tensor that requires grad needs .detach())") from None
        if cai.get("mask") is not None:
            raise ValueError(f"mncl: {name}: masked CUDA arrays are not supported")
        strides = cai.get("strides")
        if strides is not None and not _c_contiguous(shape, tuple(strides), dtype.itemsize):
            raise ValueError(f"mncl: {name} must be C-contiguous (a CUDA array with strides "
                             f"{tuple(strides)} for shape {shape})")
        if writeable and readonly:
            raise ValueError(f"mncl: {name} must be writeable (a read-only CUDA array)")
        self.obj, self.shape, self.dtype = obj, shape, dtype
        self.ndim = len(shape)
        self.size = int(np.prod(shape, dtype=np.int64)) if shape else 1
        self.nbytes = self.size * dtype.itemsize
        # Refused if it does not fit a pointer (ctypes.ArgumentError): c_void_p would keep its
        # low 64 bits, another address.
        self.ptr = fit(ptr or 0, ctypes.c_void_p, f"{name}: __cuda_array_interface__ data pointer")
        # The MNCL dtype when the typestr cannot say it: PyTorch gives bfloat16 as "<V2".
        self.default_dtype = ("bfloat16" if dtype.kind == "V" and dtype.itemsize == 2
                              and str(getattr(obj, "dtype", "")) == "torch.bfloat16" else None)
        self.stream = _stream(obj, cai, name)

    def __repr__(self):
        return f"<mncl CUDA array {self.dtype}{list(self.shape)} at {self.ptr:#x}>"


def _stream(obj, cai, name):
    """The stream the producer's work is on, which the collective is ordered on, as the interface
    asks of a consumer: version 3's "stream" (None: nothing to wait for). PyTorch exports version
    2 without one; its tensors are on the current stream of their device, so that is taken."""
    if "stream" in cai and int(cai.get("version", 2)) >= 3:
        stream = cai["stream"]
        if stream is None:
            return None
        stream = fit(stream, ctypes.c_void_p, f"{name}: __cuda_array_interface__ stream")
        if stream == 0:
            raise ValueError(f"mncl: {name}: __cuda_array_interface__ stream 0 is not allowed "
                             f"(1 is the legacy default stream)")
        if stream == 2:
            # On MNCL's worker threads it would name their own per-thread stream.
            raise ValueError(f"mncl: {name}: the per-thread default stream (2) is not supported: "
                             f"use an explicit stream, or synchronize first")
        return stream
    if type(obj).__module__.startswith("torch"):
        import torch  # only for a torch tensor, so torch is loaded already

        return fit(torch.cuda.current_stream(obj.device).cuda_stream, ctypes.c_void_p,
                   f"{name}: the PyTorch stream") or 1
    return None


def _c_contiguous(shape, strides, itemsize):
    expected = itemsize
    for dim, stride in zip(reversed(shape), reversed(strides)):
        if dim > 1 and stride != expected:
            return False
        expected *= dim
    return True


def is_cuda_array(buf):
    if isinstance(buf, np.ndarray):
        return False
    try:
        return hasattr(buf, "__cuda_array_interface__")
    except Exception:  # noqa: BLE001 (a broken interface: CudaArray says what is wrong)
        return True


def _cuda_arrays(objects):
    for o in objects:
        if isinstance(o, CudaArray):
            yield o
        elif isinstance(o, (list, tuple)):
            yield from _cuda_arrays(o)
        elif isinstance(getattr(o, "buf", None), CudaArray):  # a P2POp
            yield o.buf


def stream_of(objects):
    """The stream argument of a call on these buffers: their CUDA arrays' stream (a cudaStream_t
    value; 1 is CUDA's legacy default stream), else None. Arrays on different streams are
    refused: one collective is ordered on one stream."""
    streams = {array.stream for array in _cuda_arrays(objects) if array.stream}
    if len(streams) > 1:
        raise ValueError(f"mncl: the CUDA arrays of one call are on different streams "
                         f"({', '.join(hex(s) for s in sorted(streams))}): synchronize them, or "
                         f"put them on one stream")
    return ctypes.c_void_p(streams.pop()) if streams else None


def explicit_stream(stream):
    """The cudaStream_t value (an int, never 0) of a call's ``stream=`` argument: an int, the
    stream's address (0 and 1: the legacy default stream, which reaches the library as 1,
    cudaStreamLegacy, as PyTorch's default stream does when taken from a tensor), or a stream
    object: anything with an int ``cuda_stream`` (torch.cuda.Stream, torch.cuda.ExternalStream)
    or ``ptr`` (cupy.cuda.Stream, cupy.cuda.ExternalStream; Stream.null is 0). Anything else is a
    TypeError naming the argument; an address that does not fit a pointer is refused with
    ctypes.ArgumentError, and the per-thread default stream (2, CuPy's Stream.ptds) with
    ValueError, as for a CUDA array's own stream."""
    if isinstance(stream, bool) or is_cuda_array(stream):
        raise _stream_type_error(stream)
    source = "stream"
    for attr in ("cuda_stream", "ptr"):
        try:
            handle = getattr(stream, attr)
        except AttributeError:
            continue
        except Exception as e:  # noqa: BLE001 (a property that fails: say which)
            raise TypeError(f"mncl: stream: reading {type(stream).__name__}.{attr} failed "
                            f"({e})") from None
        source = f"stream.{attr}"
        try:
            if isinstance(handle, bool):
                raise TypeError
            stream = operator.index(handle)
        except TypeError:
            raise TypeError(f"mncl: {source} must be an int (a cudaStream_t address), not "
                            f"{type(handle).__name__}") from None
        break
    else:
        try:
            stream = operator.index(stream)
        except TypeError:
            raise _stream_type_error(stream) from None
    value = fit(stream, ctypes.c_void_p, source)
    if value == 2:
        # On MNCL's worker threads it would name their own per-thread stream.
        raise ValueError(f"mncl: {source}: the per-thread default stream (2) is not supported: "
                         f"pass a stream of your own, or 0 (the legacy default stream)")
    return value or 1


def _stream_type_error(stream):
    return TypeError(f"mncl: stream must be None, an int (a cudaStream_t address; 0: the legacy "
                     f"default stream) or a stream object with a cuda_stream (torch.cuda.Stream) "
                     f"or ptr (cupy.cuda.Stream) attribute, not {type(stream).__name__}")


def call_stream(stream, objects):
    """The stream argument of a C call: the explicit ``stream=`` (explicit_stream) when it is
    not None, else the stream of the call's CUDA arrays (stream_of)."""
    if stream is None:
        return stream_of(objects)
    return ctypes.c_void_p(explicit_stream(stream))


def address(arr):
    """The buffer's address for the C call (None for no buffer)."""
    if arr is None:
        return None
    return arr.ptr if isinstance(arr, CudaArray) else arr.ctypes.data


def public(result):
    """What a call returns for its output: the caller's own object for a CUDA array (also in a
    list of results)."""
    if isinstance(result, list):
        return [public(r) for r in result]
    return result.obj if isinstance(result, CudaArray) else result
