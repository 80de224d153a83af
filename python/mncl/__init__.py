"""MNCL, the Multi-Node Communication Library, for Python: ctypes over libmncl.so.1, NumPy
arrays in and out. See Communicator."""

from ._lib import library_path, version
from .comm import Communicator, Request
from .errors import (
    AbortedError,
    BootstrapError,
    InternalError,
    InvalidArgumentError,
    MnclError,
    NotSupportedError,
    PluginError,
    RemoteError,
    SystemCallError,
    TimeoutError,
)

__all__ = [
    "Communicator",
    "Request",
    "library_path",
    "version",
    "MnclError",
    "InvalidArgumentError",
    "NotSupportedError",
    "TimeoutError",
    "RemoteError",
    "AbortedError",
    "PluginError",
    "BootstrapError",
    "SystemCallError",
    "InternalError",
]
__version__ = "0.1.0"
