"""What the tests/python scripts share: expectations counted per rank, and the exit status."""

import sys


def numpy_or_skip():
    """NumPy, or exit 77 (ctest: skipped) with the reason when it is not installed."""
    try:
        import numpy
    except ImportError:
        print(f"SKIPPED: numpy is not installed for {sys.executable} (Debian: python3-numpy)")
        sys.exit(77)
    return numpy


def _names(exc):
    """An exception class's name, or a tuple of them (as except takes them)."""
    return " or ".join(e.__name__ for e in exc) if isinstance(exc, tuple) else exc.__name__


class Checks:
    """expect()/expect_raises() record failures and keep going; finish() exits 1 if any."""

    def __init__(self):
        self.failures = 0
        self.rank = "?"  # set once the communicator exists

    def expect(self, cond, what):
        if not cond:
            self.failures += 1
            print(f"FAIL rank {self.rank}: {what}", file=sys.stderr, flush=True)

    def expect_raises(self, exc, fn, what, contains=""):
        try:
            fn()
        except exc as e:
            self.expect(contains in str(e), f"{what}: message {str(e)!r} lacks {contains!r}")
            return e
        except Exception as e:  # noqa: BLE001
            self.expect(False, f"{what}: raised {type(e).__name__}({e}), expected {_names(exc)}")
            return None
        self.expect(False, f"{what}: nothing raised, expected {_names(exc)}")
        return None

    def finish(self, passed_message):
        if self.failures:
            print(f"rank {self.rank}: {self.failures} failure(s)", file=sys.stderr)
            sys.exit(1)
        print(f"rank {self.rank}: {passed_message}", flush=True)


def world_and_checks():
    """What every script starts with: NumPy (or exit 77), the mncl package, the world
    communicator (from mncl-run's variables) and a Checks that names its rank."""
    np = numpy_or_skip()
    import mncl

    comm = mncl.Communicator()
    checks = Checks()
    checks.rank = comm.rank
    return np, mncl, comm, checks
