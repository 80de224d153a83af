"""NumPy dtypes as MNCL dtypes (mncl_dtype_t), bfloat16 included.

NumPy has no bfloat16. An array of `ml_dtypes.bfloat16` (the optional ml_dtypes package, also
what JAX uses) is taken as MNCL_BFLOAT16 as it is. Without ml_dtypes, bfloat16 data travels as a
uint16 array of raw bf16 bit patterns with an explicit ``dtype="bfloat16"``; to_bfloat16_bits()
and from_bfloat16_bits() convert between such arrays and float32.
"""

import sys

import numpy as np

from ._cuda import CudaArray
from ._lib import lib

# mncl_dtype_t, by name (mncl_dtype_name's names).
CODES = {
    "int8": 0,
    "uint8": 1,
    "int32": 2,
    "uint32": 3,
    "int64": 4,
    "uint64": 5,
    "float16": 6,
    "bfloat16": 7,
    "float32": 8,
    "float64": 9,
}
BFLOAT16 = CODES["bfloat16"]
# The NumPy dtypes that are MNCL dtypes as they are (native byte order only).
_NATIVE = {np.dtype(name): code for name, code in CODES.items() if name != "bfloat16"}


def _ml_dtypes_bfloat16():
    """ml_dtypes.bfloat16's NumPy dtype, or None. An array of that dtype can only exist once
    ml_dtypes has been imported, so it is looked up rather than imported here: mncl neither
    requires ml_dtypes nor pays for importing it."""
    ml_dtypes = sys.modules.get("ml_dtypes")
    bf16 = getattr(ml_dtypes, "bfloat16", None)
    return None if bf16 is None else np.dtype(bf16)


def _unsupported(arr):
    hint = ""
    if arr.dtype == np.uint16:
        hint = "; a uint16 array of raw bfloat16 bits needs dtype='bfloat16'"
    return TypeError(
        f"mncl: unsupported array dtype {arr.dtype} (use a native-order int8, uint8, int32, "
        f"uint32, int64, uint64, float16, float32, float64 or ml_dtypes.bfloat16 array{hint})"
    )


def dtype_code(arr, dtype=None):
    """The mncl_dtype_t of an array's elements.

    dtype None: from the array's own dtype. Otherwise an MNCL dtype name ("bfloat16", ...) that
    the array either already has, or holds as raw bits in an unsigned integer array of the same
    item size (uint16 for bfloat16 or float16, uint32 for float32, ...; for a CUDA array, also
    opaque items of that size, as PyTorch's bfloat16). Any other array is a TypeError.
    """
    if dtype is None:
        if not arr.dtype.isnative:
            raise _unsupported(arr)
        code = _NATIVE.get(arr.dtype)
        if code is None and arr.dtype == _ml_dtypes_bfloat16():
            code = BFLOAT16
        if code is None:
            raise _unsupported(arr)
        return code
    code = code_of_name(dtype)
    # Native unsigned integers of the size, or, in a CUDA array only, opaque "V" items of the
    # size (PyTorch's CUDA bfloat16 is "<V2": its typestr says no more). A NumPy array of "V"
    # kind is some other type (ml_dtypes' bfloat16, float8...): not raw bits.
    kind = arr.dtype.kind
    raw_bits = (arr.dtype.itemsize == lib.mncl_dtype_size(code)
                and ((kind == "u" and arr.dtype.isnative)
                     or (kind == "V" and isinstance(arr, CudaArray))))
    if not raw_bits:
        try:
            same = dtype_code(arr) == code
        except TypeError:
            same = False
        if not same:
            raise TypeError(
                f"mncl: an array of {arr.dtype} cannot be passed as {dtype} (pass an array of "
                f"that dtype, or its raw bits as uint{8 * lib.mncl_dtype_size(code)})"
            )
    return code


def code_of_name(dtype):
    """The code of an MNCL dtype name ("bfloat16", ...); ValueError for any other."""
    if not isinstance(dtype, str) or dtype.lower() not in CODES:
        raise ValueError(f"mncl: unknown dtype {dtype!r} (one of {', '.join(CODES)})")
    return CODES[dtype.lower()]


def dtype_name(code):
    """The MNCL dtype name of a code."""
    return next(name for name, c in CODES.items() if c == code)


def numpy_dtype(code):
    """The NumPy dtype an array of an MNCL dtype is allocated with: for bfloat16, ml_dtypes'
    bfloat16 where ml_dtypes is imported, and its raw bits as uint16 otherwise."""
    if code == BFLOAT16:
        bf16 = _ml_dtypes_bfloat16()  # (not `or`: a dtype without fields is falsy)
        return np.dtype(np.uint16) if bf16 is None else bf16
    return np.dtype(dtype_name(code))


def to_bfloat16_bits(values):
    """The bfloat16 bit patterns (a uint16 array of values' shape) of values taken as float32,
    rounded to nearest even as hardware conversions do; NaNs stay NaNs (quiet, same sign)."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32)
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> 16) & 1))) >> 16
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (bits >> 16) | 0x0040, rounded).astype(np.uint16)


def from_bfloat16_bits(bits):
    """The float32 values (exact: every bfloat16 is a float32) of raw bfloat16 bit patterns."""
    raw = np.asarray(bits)
    if raw.dtype != np.uint16:
        raise TypeError(f"mncl: bfloat16 bits are a uint16 array, not {raw.dtype}")
    wide = raw.astype(np.uint32) << np.uint32(16)  # stays uint32 for a 0-d array too
    # (A 0-d array cannot change its dtype by view(): through a 1-element one.)
    return wide.reshape(-1).view(np.float32).reshape(raw.shape)
