"""Status codes of the C API as exceptions: one class per mncl_status_t, all MnclError."""

import builtins


class MnclError(RuntimeError):
    """A failed MNCL call. `status` is the mncl_status_t value, `message` the library's
    mncl_last_error() text for the call."""

    status = -1

    def __init__(self, message, status=None, status_name=""):
        super().__init__(message)
        if status is not None:
            self.status = status
        self.status_name = status_name
        self.message = message

    def __str__(self):
        return f"{self.status_name}: {self.message}" if self.status_name else self.message


class InvalidArgumentError(MnclError, ValueError):
    status = 1


class NotSupportedError(MnclError):
    status = 2


class TimeoutError(MnclError, builtins.TimeoutError):  # noqa: A001 (mirrors MNCL_ERR_TIMEOUT)
    status = 3


class RemoteError(MnclError):
    status = 4


class AbortedError(MnclError):
    status = 5


class PluginError(MnclError):
    status = 6


class BootstrapError(MnclError):
    status = 7


class SystemCallError(MnclError, OSError):
    status = 8


class InternalError(MnclError):
    status = 9


_BY_STATUS = {
    cls.status: cls
    for cls in (
        InvalidArgumentError,
        NotSupportedError,
        TimeoutError,
        RemoteError,
        AbortedError,
        PluginError,
        BootstrapError,
        SystemCallError,
        InternalError,
    )
}


def error_for(status, message, status_name):
    """The exception for a failed status (an unknown, newer status gives a plain MnclError)."""
    return _BY_STATUS.get(status, MnclError)(message, status, status_name)
