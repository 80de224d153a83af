"""Finding and describing libmncl.so.1 for ctypes: the one place that knows the C signatures."""

import ctypes
import operator
import os
import re

from .errors import error_for

SONAME = "libmncl.so.1"
ABI_MAJOR = 1  # the SONAME's number; mncl.h's MNCL_ABI_MAJOR


def _explicit():
    """The library MNCL_LIBRARY names (a file, or the SONAME in a folder), or None."""
    env = os.environ.get("MNCL_LIBRARY")
    if not env:
        return None
    return os.path.join(env, SONAME) if os.path.isdir(env) else env


def _candidates():
    """Where libmncl may be, most explicit first."""
    explicit = _explicit()
    if explicit:
        yield explicit
    here = os.path.dirname(os.path.abspath(__file__))
    rels = [
        ".",  # bundled next to the package
        "../../..",  # <prefix>/lib/pythonX.Y/site-packages/mncl -> <prefix>/lib
    ]
    # Debian's pip --prefix P installs into P/local/lib/pythonX.Y/dist-packages/mncl: -> P/lib,
    # where `cmake --install --prefix P` puts the library (in that layout only: five levels up
    # from anywhere else is no prefix).
    if re.search(r"/local/lib/python[0-9.]+/dist-packages/mncl$", here.replace(os.sep, "/")):
        rels.append("../../../../../lib")
    rels.append("../../build/lib")  # a source checkout: python/mncl -> build/lib
    for rel in rels:
        path = os.path.normpath(os.path.join(here, rel, SONAME))
        if os.path.exists(path):
            yield path
    yield SONAME  # the dynamic loader's search: LD_LIBRARY_PATH, ldconfig


def _load():
    errors = []
    explicit = _explicit()
    for path in _candidates():
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            errors.append(f"{path}: {e}")
            if path == explicit:
                # An explicit choice that fails is not silently replaced: a file, or a folder
                # without the library.
                errors[-1] += f" (from MNCL_LIBRARY={os.environ['MNCL_LIBRARY']})"
                break
    raise ImportError(
        "mncl: cannot load libmncl (set MNCL_LIBRARY to its path); tried:\n  "
        + "\n  ".join(errors)
    )


lib, library_path = _load()

c_status = ctypes.c_int  # mncl_status_t (an enum: int-sized)
c_handle = ctypes.c_void_p  # mncl_comm_t, mncl_request_t
c_size_p = ctypes.POINTER(ctypes.c_size_t)
c_voidp_p = ctypes.POINTER(ctypes.c_void_p)


class Config(ctypes.Structure):
    """mncl_config_t as this package knows it. struct_size = sizeof(Config) is the handshake:
    an older libmncl accepts it as long as the fields it does not know are zero."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("magic", ctypes.c_uint32),
        ("version", ctypes.c_uint32),
        ("backend", ctypes.c_char_p),
        ("rank", ctypes.c_int32),
        ("size", ctypes.c_int32),
        ("bootstrap", ctypes.c_char_p),
        ("timeout_ms", ctypes.c_int64),
        ("device", ctypes.c_int32),
        ("reserved0", ctypes.c_int32),
    ]


class P2POp(ctypes.Structure):
    """mncl_p2p_op_t: one send or receive of a batch (mncl_sendrecv_batch). struct_size =
    sizeof(P2POp) in every element, and is also the array's stride."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("kind", ctypes.c_int32),  # P2P_SEND or P2P_RECV
        ("peer", ctypes.c_int32),
        ("buf", ctypes.c_void_p),
        ("count", ctypes.c_size_t),
        ("dtype", ctypes.c_int32),
        ("reserved0", ctypes.c_int32),
    ]


P2P_SEND, P2P_RECV = 0, 1  # mncl_p2p_kind_t
SPLIT_TYPE_HOST, SPLIT_TYPE_CROSS_HOST = 0, 1  # mncl_split_type_t

CONFIG_MAGIC = 0x4D4E434C
HEADER_VERSION = 100  # MNCL_VERSION of the mncl.h this file mirrors (0.1.0)
FROM_ENV = -1


def _bounds(ctype):
    """The smallest and largest value of a ctypes integer type (c_void_p: an address)."""
    bits = 8 * ctypes.sizeof(ctype)
    if ctype(-1).value == -1:
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


_C_NAMES = {ctypes.c_int32: "int", ctypes.c_int64: "int64_t", ctypes.c_size_t: "size_t",
            ctypes.c_void_p: "pointer"}


def integer(value, what):
    """value as a Python int, refusing what is no integer (a float, a str: never truncated nor
    parsed) with ctypes.ArgumentError, as ctypes refuses such a function argument
    (_CheckedInt). Anything with __index__ counts as an integer (NumPy's integers, Python's
    bool; NumPy 1.24 deprecates np.bool_ there)."""
    try:
        return operator.index(value)
    except TypeError:
        raise ctypes.ArgumentError(f"mncl: {what} must be an integer, not "
                                   f"{type(value).__name__} {value!r}") from None


def fit(value, ctype, what):
    """value as a Python int that fits ctype, for a ctypes struct field or array element: ctypes
    would silently keep the low bits there (Config(rank=2**32) was rank 0, a P2POp peer
    2**32 + 1 reached rank 1). Refuses what does not fit, or is no integer (a float, a str),
    with ctypes.ArgumentError, as ctypes refuses such a function argument (_CheckedInt).
    Anything with __index__ counts as an integer (NumPy's integers, Python's bool; NumPy 1.24
    deprecates np.bool_ there)."""
    number = integer(value, what)
    low, high = _bounds(ctype)
    if not low <= number <= high:
        raise ctypes.ArgumentError(f"mncl: {what} {number} does not fit a C "
                                   f"{_C_NAMES.get(ctype, ctype.__name__)} ({low} to {high})")
    return number


class _CheckedInt(ctypes.c_int):
    """A C int argument (rank, peer, root, color, key, enum) that refuses what does not fit:
    ctypes would silently keep the low 32 bits, so peer 2**32 + 1 would reach rank 1. NumPy's
    integers (anything with __index__) are checked too: ctypes takes them as it takes an int."""

    @classmethod
    def from_param(cls, value):
        if not isinstance(value, ctypes._SimpleCData) and hasattr(type(value), "__index__"):
            value = operator.index(value)
            if not -(1 << 31) <= value < (1 << 31):
                raise ValueError(f"mncl: {value} does not fit a C int (rank, peer, root, color, "
                                 f"key or enum)")
        return ctypes.c_int.from_param(value)


_I = _CheckedInt
_P = ctypes.c_void_p
_N = ctypes.c_size_t
_R = ctypes.POINTER(c_handle)  # mncl_request_t *
# name: (restype, argtypes); every function in mncl.h.
_SIGNATURES = {
    "mncl_get_version": (ctypes.c_int, []),
    "mncl_status_string": (ctypes.c_char_p, [c_status]),
    "mncl_last_error": (ctypes.c_char_p, []),
    "mncl_dtype_size": (_N, [_I]),
    "mncl_dtype_name": (ctypes.c_char_p, [_I]),
    "mncl_op_name": (ctypes.c_char_p, [_I]),
    "mncl_comm_create": (c_status, [ctypes.POINTER(Config), ctypes.POINTER(c_handle)]),
    "mncl_comm_destroy": (c_status, [c_handle]),
    "mncl_comm_abort": (c_status, [c_handle]),
    "mncl_comm_split": (c_status, [c_handle, _I, _I, ctypes.POINTER(c_handle)]),
    "mncl_comm_rank": (c_status, [c_handle, ctypes.POINTER(ctypes.c_int)]),
    "mncl_comm_size": (c_status, [c_handle, ctypes.POINTER(ctypes.c_int)]),
    "mncl_comm_backend": (c_status, [c_handle, ctypes.POINTER(ctypes.c_char_p)]),
    "mncl_allreduce": (c_status, [c_handle, _P, _P, _N, _I, _I, _P]),
    "mncl_reduce": (c_status, [c_handle, _P, _P, _N, _I, _I, _I, _P]),
    "mncl_bcast": (c_status, [c_handle, _P, _N, _I, _I, _P]),
    "mncl_scatter": (c_status, [c_handle, _P, _P, _N, _I, _I, _P]),
    "mncl_gather": (c_status, [c_handle, _P, _P, _N, _I, _I, _P]),
    "mncl_allgather": (c_status, [c_handle, _P, _P, _N, _I, _P]),
    "mncl_reduce_scatter": (c_status, [c_handle, _P, _P, _N, _I, _I, _P]),
    "mncl_alltoall": (c_status, [c_handle, _P, _P, _N, _I, _P]),
    "mncl_barrier": (c_status, [c_handle, _P]),
    "mncl_send": (c_status, [c_handle, _P, _N, _I, _I, _P]),
    "mncl_recv": (c_status, [c_handle, _P, _N, _I, _I, _P]),
    "mncl_allreduce_coalesced": (
        c_status, [c_handle, c_voidp_p, c_voidp_p, c_size_p, _N, _I, _I, _P]),
    "mncl_iallreduce": (c_status, [c_handle, _P, _P, _N, _I, _I, _P, _R]),
    "mncl_ireduce": (c_status, [c_handle, _P, _P, _N, _I, _I, _I, _P, _R]),
    "mncl_ibcast": (c_status, [c_handle, _P, _N, _I, _I, _P, _R]),
    "mncl_iscatter": (c_status, [c_handle, _P, _P, _N, _I, _I, _P, _R]),
    "mncl_igather": (c_status, [c_handle, _P, _P, _N, _I, _I, _P, _R]),
    "mncl_iallgather": (c_status, [c_handle, _P, _P, _N, _I, _P, _R]),
    "mncl_ireduce_scatter": (c_status, [c_handle, _P, _P, _N, _I, _I, _P, _R]),
    "mncl_ialltoall": (c_status, [c_handle, _P, _P, _N, _I, _P, _R]),
    "mncl_ibarrier": (c_status, [c_handle, _P, _R]),
    "mncl_isend": (c_status, [c_handle, _P, _N, _I, _I, _P, _R]),
    "mncl_irecv": (c_status, [c_handle, _P, _N, _I, _I, _P, _R]),
    "mncl_iallreduce_coalesced": (
        c_status, [c_handle, c_voidp_p, c_voidp_p, c_size_p, _N, _I, _I, _P, _R]),
    # MNCL_1.1: collectives with a count per rank.
    "mncl_allgatherv": (c_status, [c_handle, _P, _N, _P, c_size_p, c_size_p, _I, _P]),
    "mncl_alltoallv": (
        c_status, [c_handle, _P, c_size_p, c_size_p, _P, c_size_p, c_size_p, _I, _P]),
    "mncl_iallgatherv": (c_status, [c_handle, _P, _N, _P, c_size_p, c_size_p, _I, _P, _R]),
    "mncl_ialltoallv": (
        c_status, [c_handle, _P, c_size_p, c_size_p, _P, c_size_p, c_size_p, _I, _P, _R]),
    # MNCL_1.2: batched point to point.
    "mncl_sendrecv_batch": (c_status, [c_handle, ctypes.POINTER(P2POp), _N, _P]),
    "mncl_isendrecv_batch": (c_status, [c_handle, ctypes.POINTER(P2POp), _N, _P, _R]),
    "mncl_sendrecv": (c_status, [c_handle, _P, _N, _I, _P, _N, _I, _I, _P]),
    "mncl_isendrecv": (c_status, [c_handle, _P, _N, _I, _P, _N, _I, _I, _P, _R]),
    # MNCL_1.3: rooted collectives with a count per rank.
    "mncl_gatherv": (c_status, [c_handle, _P, _N, _P, c_size_p, c_size_p, _I, _I, _P]),
    "mncl_scatterv": (c_status, [c_handle, _P, c_size_p, c_size_p, _P, _N, _I, _I, _P]),
    "mncl_igatherv": (c_status, [c_handle, _P, _N, _P, c_size_p, c_size_p, _I, _I, _P, _R]),
    "mncl_iscatterv": (c_status, [c_handle, _P, c_size_p, c_size_p, _P, _N, _I, _I, _P, _R]),
    # MNCL_1.4: splits with their own settings, and by host.
    "mncl_comm_split_config": (
        c_status, [c_handle, _I, _I, ctypes.POINTER(Config), ctypes.POINTER(c_handle)]),
    "mncl_comm_split_type": (
        c_status, [c_handle, _I, _I, ctypes.POINTER(Config), ctypes.POINTER(c_handle)]),
    # MNCL_1.5: where this rank runs, by host.
    "mncl_comm_host_info": (c_status, [c_handle] + [ctypes.POINTER(ctypes.c_int)] * 4),
    "mncl_test": (c_status, [c_handle, ctypes.POINTER(ctypes.c_int)]),
    "mncl_wait": (c_status, [c_handle, ctypes.c_int64]),
}
# Functions a libmncl.so.1 older than their symbol version node lacks: the package still loads
# with such a library, and calling one of them raises NotSupportedError.
_ADDED_IN = {
    "mncl_allgatherv": "1.1",
    "mncl_alltoallv": "1.1",
    "mncl_iallgatherv": "1.1",
    "mncl_ialltoallv": "1.1",
    "mncl_sendrecv_batch": "1.2",
    "mncl_isendrecv_batch": "1.2",
    "mncl_sendrecv": "1.2",
    "mncl_isendrecv": "1.2",
    "mncl_gatherv": "1.3",
    "mncl_scatterv": "1.3",
    "mncl_igatherv": "1.3",
    "mncl_iscatterv": "1.3",
    "mncl_comm_split_config": "1.4",
    "mncl_comm_split_type": "1.4",
    "mncl_comm_host_info": "1.5",
}


def _missing(name):
    def call(*_args):
        status = 2  # MNCL_ERR_NOT_SUPPORTED
        status_name = (lib.mncl_status_string(status) or b"").decode(errors="replace")
        raise error_for(status, f"{name}: {library_path} predates it (symbol version "
                        f"MNCL_{_ADDED_IN[name]})", status_name.split(":")[0])

    call.__name__ = name
    return call


for _name, (_res, _args) in _SIGNATURES.items():
    try:
        _fn = getattr(lib, _name)
    except AttributeError:
        if _name not in _ADDED_IN:
            raise
        setattr(lib, _name, _missing(_name))
        continue
    _fn.restype = _res
    _fn.argtypes = _args


def version():
    """The library's MNCL_VERSION as (major, minor, patch)."""
    v = lib.mncl_get_version()
    return (v // 10000, v // 100 % 100, v % 100)


def check(status):
    """Raises the MnclError subclass for a failed status (mncl_last_error() as the message)."""
    if status != 0:
        message = (lib.mncl_last_error() or b"").decode(errors="replace")
        name = (lib.mncl_status_string(status) or b"").decode(errors="replace").split(":")[0]
        raise error_for(status, message, name)
