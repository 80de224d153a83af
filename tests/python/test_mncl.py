"""The mncl Python package at any size (run under mncl-run -n N): every collective on NumPy
arrays with exact integer checks and float tolerances, in-place forms, non-blocking requests,
split, point to point, and failures raised as the right exceptions with the library's message.
Exits 77 (ctest: skipped) when NumPy is missing."""

import shutil
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    print(f"SKIPPED: numpy is not installed for {sys.executable} (Debian: python3-numpy)")
    sys.exit(77)

import mncl

failures = 0


def expect(cond, what):
    global failures
    if not cond:
        failures += 1
        print(f"FAIL rank {comm.rank}: {what}", file=sys.stderr, flush=True)


def expect_raises(exc, fn, what, contains=""):
    try:
        fn()
    except exc as e:
        expect(contains in str(e), f"{what}: message {str(e)!r} lacks {contains!r}")
        return e
    except Exception as e:  # noqa: BLE001
        expect(False, f"{what}: raised {type(e).__name__}({e}), expected {exc.__name__}")
        return None
    expect(False, f"{what}: nothing raised, expected {exc.__name__}")
    return None


comm = mncl.Communicator()
r, n = comm.rank, comm.size
if r == 0:
    print(f"mncl {mncl.version()} from {mncl.library_path}; package {mncl.__file__}; "
          f"backend {comm.backend}, {n} ranks", flush=True)

# allreduce: every dtype, counts 0, 1, prime, larger; out of place and in place.
for dtype in (np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64, np.float16,
              np.float32, np.float64):
    for count in (0, 1, 7, 1000):
        x = (np.arange(count) % 13 + r).astype(dtype)
        want = (np.arange(count) % 13 * n + n * (n - 1) // 2).astype(dtype)
        y = comm.allreduce(x)
        expect(y.dtype == dtype and y.shape == x.shape, f"allreduce {dtype} shape/dtype")
        expect(np.array_equal(y, want), f"allreduce {np.dtype(dtype).name} x{count}")
        comm.allreduce(x, x)
        expect(np.array_equal(x, want), f"in-place allreduce {np.dtype(dtype).name} x{count}")

x = np.full((3, 4), r + 1, dtype=np.int64)
expect(np.all(comm.allreduce(x, op="prod") == np.prod(np.arange(1, n + 1))), "allreduce prod")
expect(np.all(comm.allreduce(x, op="min") == 1), "allreduce min")
expect(np.all(comm.allreduce(x, op="max") == n), "allreduce max")
expect(np.all(comm.allreduce(x, op="avg") == (n + 1) // 2), "allreduce avg (integer)")
f = np.linspace(0, 1, 101, dtype=np.float64) * (r + 1)
expect(np.allclose(comm.allreduce(f), np.linspace(0, 1, 101) * n * (n + 1) / 2), "float64 sum")

# reduce, bcast, gather, allgather, scatter, reduce_scatter, alltoall
for root in range(n):
    got = comm.reduce(np.arange(5, dtype=np.int32) + r, root=root)
    if r == root:
        expect(np.array_equal(got, np.arange(5) * n + n * (n - 1) // 2), f"reduce root {root}")
    else:
        expect(got is None, "reduce returns None off the root")

    b = np.arange(6, dtype=np.float32) * (r + 1) if r == root else np.zeros(6, np.float32)
    comm.bcast(b, root=root)
    expect(np.array_equal(b, np.arange(6, dtype=np.float32) * (root + 1)), f"bcast root {root}")

    g = comm.gather(np.full(2, r, np.uint8), root=root)
    if r == root:
        expect(np.array_equal(g, np.repeat(np.arange(n), 2).reshape(n, 2)), f"gather {root}")

    send = np.arange(3 * n, dtype=np.int64).reshape(n, 3) * 10 if r == root else None
    recv = comm.scatter(send, np.empty(3, np.int64), root=root)
    expect(np.array_equal(recv, np.arange(3 * r, 3 * r + 3) * 10), f"scatter root {root}")

ag = comm.allgather(np.array([r, -r], dtype=np.int32))
expect(ag.shape == (n, 2) and np.array_equal(ag[:, 0], np.arange(n)), "allgather")

rs = comm.reduce_scatter(np.arange(n * 4, dtype=np.int64).reshape(n, 4) + r)
expect(rs.shape == (4,), "reduce_scatter shape")
expect(np.array_equal(rs, (np.arange(4) + 4 * r) * n + n * (n - 1) // 2), "reduce_scatter")

a2a = comm.alltoall(np.arange(n * 2, dtype=np.int32) + 100 * r)
want = np.array([100 * j + 2 * r + k for j in range(n) for k in range(2)])
expect(np.array_equal(a2a, want), "alltoall")

co = comm.allreduce_coalesced([np.ones(3, np.float32) * r, np.arange(5, dtype=np.float32)])
expect(np.all(co[0] == n * (n - 1) / 2) and np.array_equal(co[1], np.arange(5) * n), "coalesced")

# non-blocking
req = comm.iallreduce(np.full(16, r, dtype=np.int64))
bar = comm.ibarrier()
out = req.wait()
bar.wait()
expect(req.done and np.all(out == n * (n - 1) // 2), "iallreduce + wait")
req = comm.iallgather(np.array([r], np.int64))
while not req.test():
    pass
expect(np.array_equal(req.wait().ravel(), np.arange(n)), "iallgather + test")

# point to point: a ring
if n > 1:
    nxt, prv = (r + 1) % n, (r - 1) % n
    token = np.empty(4, np.int32)
    if r % 2 == 0:
        comm.send(np.full(4, r, np.int32), nxt)
        comm.recv(token, prv)
    else:
        comm.recv(token, prv)
        comm.send(np.full(4, r, np.int32), nxt)
    expect(np.all(token == prv), "send/recv ring")

# split by parity, reversed order
sub = comm.split(r % 2, key=-r)
expect(sub.size == (n + 1 - r % 2) // 2, "split size")
expect(np.all(sub.allreduce(np.array([1])) == sub.size), "allreduce on the split communicator")
sub.close()
none = comm.split(None if r == 0 else 1)
expect((none is None) == (r == 0), "split with color None")
if none is not None:
    none.close()

# errors: checked here (TypeError/ValueError) or by the library (MnclError subclasses)
expect_raises(mncl.InvalidArgumentError, lambda: comm.bcast(np.zeros(2), root=n), "bad root",
              f"root {n}")
e = expect_raises(ValueError, lambda: comm.bcast(np.zeros(2), root=-5), "bad root is ValueError")
expect(isinstance(e, mncl.MnclError) and e.status == 1, "status of InvalidArgumentError")
expect_raises(TypeError, lambda: comm.allreduce(np.zeros(2, np.complex64)), "complex dtype",
              "unsupported array dtype")
expect_raises(TypeError, lambda: comm.allreduce(np.zeros(2), np.zeros(2, np.float32)),
              "dtype mismatch", "dtypes differ")
expect_raises(ValueError, lambda: comm.bcast(np.zeros((4, 4))[:, 0]), "non-contiguous",
              "C-contiguous")
expect_raises(ValueError, lambda: comm.allreduce(np.zeros(2), op="median"), "unknown op",
              "unknown reduction")
# A size-1 communicator of its own (a private file store, not the job's) naming no plugin.
store = tempfile.mkdtemp(prefix="mncl-py-")
expect_raises(mncl.PluginError,
              lambda: mncl.Communicator(backend="no-such-backend", size=1, rank=0,
                                        bootstrap="file://" + store),
              "unknown backend", "no-such-backend")
shutil.rmtree(store, ignore_errors=True)

comm.barrier()
comm.close()
expect_raises(ValueError, comm.barrier, "closed communicator", "closed")
if failures:
    print(f"rank {r}: {failures} failure(s)", file=sys.stderr)
    sys.exit(1)
print(f"rank {r}: all mncl Python checks passed", flush=True)
