"""CUDA arrays as buffers: anything with __cuda_array_interface__ (CuPy arrays, PyTorch CUDA
tensors, Numba device arrays). Their device pointer goes to the C library as it is: a backend
that takes CUDA memory (nccl) uses it directly, and the core stages it through pinned host memory
for the host-only ones (naive, gloo, shm, flat without CUDA-aware MPI), ordered on the array's
stream. Nothing here touches the device: MNCL allocates no device memory from Python, so a CUDA
input needs a CUDA output (or the in-place form)."""

import ctypes

import numpy as np


class CudaArray:
    """A view of an object's __cuda_array_interface__ (version 2 or 3): what the collectives
    need of it, with the object kept alive (.obj) and returned as the result."""

    def __init__(self, obj, name, writeable):
        try:
            cai = obj.__cuda_array_interface__
            shape = tuple(int(d) for d in cai["shape"])
            dtype = np.dtype(cai["typestr"])
            ptr, readonly = cai["data"]
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise TypeError(f"mncl: {name}: a malformed __cuda_array_interface__ ({e})") from None
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
        self.ptr = int(ptr or 0)
        # Version 3: the stream the producer's work is on (None: already synchronized). The
        # collective is ordered on it, as the interface asks of a consumer.
        self.stream = cai.get("stream") if int(cai.get("version", 2)) >= 3 else None

    def __repr__(self):
        return f"<mncl CUDA array {self.dtype}{list(self.shape)} at {self.ptr:#x}>"


def _c_contiguous(shape, strides, itemsize):
    expected = itemsize
    for dim, stride in zip(reversed(shape), reversed(strides)):
        if dim > 1 and stride != expected:
            return False
        expected *= dim
    return True


def is_cuda_array(buf):
    return hasattr(buf, "__cuda_array_interface__") and not isinstance(buf, np.ndarray)


def _cuda_arrays(objects):
    for o in objects:
        if isinstance(o, CudaArray):
            yield o
        elif isinstance(o, (list, tuple)):
            yield from _cuda_arrays(o)
        elif isinstance(getattr(o, "buf", None), CudaArray):  # a P2POp
            yield o.buf


def stream_of(objects):
    """The stream argument of a call on these buffers: the first CUDA array's stream (a
    cudaStream_t value; 1 and 2 are CUDA's legacy and per-thread default streams), else None.
    Every CUDA buffer of one call must be on that stream or already synchronized."""
    for array in _cuda_arrays(objects):
        if array.stream:
            return ctypes.c_void_p(int(array.stream))
    return None


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
