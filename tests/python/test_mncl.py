"""The mncl Python package at any size (run under mncl-run -n N): every collective, blocking
and non-blocking, on NumPy arrays with exact integer checks and float tolerances, in-place forms,
requests (wait, test, timed waits, failures, arrays kept alive), bfloat16 as raw uint16 bits,
split, point to point (sendrecv and batches of P2POps included), timeouts in milliseconds (sub-ms
ones rounded up), integers that do not fit their C type (arguments, config and P2POp fields,
counts; counts that are no integers) refused, 0-d inputs keeping their shape, the functions of
each symbol version node known (NotSupportedError with an older libmncl), an MNCL_LIBRARY folder
without the library failing the import, a `with` block left by an exception aborting rather
than holding up the others, and failures raised as the right exceptions with the library's
message. Exits 77 (ctest: skipped) when NumPy is missing; ml_dtypes arrays are
test_ml_dtypes.py's."""

import ctypes
import enum
import gc
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import weakref

from checks import world_and_checks

np, mncl, comm, checks = world_and_checks()
expect, expect_raises = checks.expect, checks.expect_raises
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

    # ChainerMN's form: None off the root gets a new array of root's shape and dtype.
    x = np.arange(6, dtype=np.int32).reshape(2, 3) * (root + 1)
    got = comm.bcast(x.copy() if r == root else None, root=root)
    expect(got.dtype == np.int32 and got.shape == (2, 3) and np.array_equal(got, x),
           f"bcast root {root} into None: {got.dtype} {got.shape}")
    got = comm.bcast(np.array(root + 7, np.uint64) if r == root else None, root=root)
    expect(got.shape == () and got.dtype == np.uint64 and got == root + 7, "0-d bcast into None")
    # An array of root's element count and dtype takes the data in its own shape.
    flat = np.zeros(6, np.int32)
    mine = x.copy() if r == root else flat
    expect(comm.bcast(mine, root=root) is mine, "bcast returns the caller's own array")
    expect(r == root or np.array_equal(flat, x.ravel()), "bcast into another shape, same size")
    if n > 1:
        # A rank whose buf does not fit root's raises there, after taking part; root and the
        # others complete, and the next call is in step.
        # None with a dtype= that is not root's, or no dtype at all, likewise.
        for wrong, kw, exc in ((np.zeros(5, np.int32), {}, ValueError),
                               (np.zeros(6, np.float32), {}, TypeError),
                               (None, {"dtype": "float16"}, TypeError),
                               (None, {"dtype": "bogus"}, ValueError)):
            culprit = r == (root + 1) % n
            mine = x.copy() if r == root else wrong if culprit else None
            if culprit:
                expect_raises(exc, lambda: comm.bcast(mine, root=root, **kw),
                              f"bcast into {wrong!r} {kw}",
                              "unknown dtype" if kw.get("dtype") == "bogus" else
                              f"the root (rank {root}) sends int32 with 6")
            else:
                got = comm.bcast(mine, root=root)
                expect(np.array_equal(got, x), f"bcast beside a rank with a wrong buf: {got}")
        # A root without a usable array fails every rank: its own error there, RemoteError
        # naming it elsewhere.
        for bad, exc in ((None, TypeError), (np.zeros((4, 4))[:, 0], ValueError),
                         ([1, 2], TypeError)):
            if r == root:
                expect_raises(exc, lambda: comm.bcast(bad, root=root), f"bcast root buf {bad!r}")
            else:
                expect_raises(mncl.RemoteError, lambda: comm.bcast(None, root=root),
                              f"bcast when root {root} passes {type(bad).__name__}",
                              f"the root (rank {root}) passed no usable buf")
        after = comm.bcast(np.full(3, root, np.int64) if r == root else None, root=root)
        expect(np.array_equal(after, [root] * 3), "bcast in step after the failures")

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

# 0-d inputs (NumPy scalars, 0-d arrays) keep their shape: a 0-d result, (size,) from allgather
# and gather (they came back as (1,) and (size, 1)).
y = comm.allreduce(np.float32(r + 1))
expect(y.shape == () and y == n * (n + 1) // 2, f"allreduce of a NumPy scalar: shape {y.shape}")
y = comm.iallreduce(np.array(r, np.int64), op="max").wait()
expect(y.shape == () and y == n - 1, f"iallreduce of a 0-d array: shape {y.shape}")
ag = comm.allgather(np.array(float(r)))
expect(ag.shape == (n,) and np.array_equal(ag, np.arange(n)), f"allgather 0-d: shape {ag.shape}")
g = comm.gather(np.int32(r), root=0)
expect(g is None if r else g.shape == (n,) and np.array_equal(g, np.arange(n)), "gather 0-d")

# allgatherv / alltoallv: uneven blocks (rank 0's may be empty), packed in rank order.
agv = comm.allgatherv(np.arange(r, dtype=np.int32) + 10 * r)  # counts exchanged first
want = np.concatenate([np.arange(i, dtype=np.int32) + 10 * i for i in range(n)])
expect(agv.dtype == np.int32 and np.array_equal(agv, want), f"allgatherv {agv}")
out = np.full(n * (n - 1) // 2, -1, np.int32)
agv = comm.iallgatherv(np.arange(r, dtype=np.int32) + 10 * r, list(range(n)), out).wait()
expect(agv is out and np.array_equal(out, want), "iallgatherv into recvbuf")
sendcounts = [(r + j) % 3 for j in range(n)]  # rank r sends (r + j) % 3 elements to rank j
send = np.concatenate([np.full(c, 100 * r + j, np.float64) for j, c in enumerate(sendcounts)])
a2av = comm.alltoallv(send, sendcounts)  # recvcounts exchanged first
want = np.concatenate([np.full((i + r) % 3, 100 * i + r, np.float64) for i in range(n)])
expect(np.array_equal(a2av, want), f"alltoallv {a2av}")
a2av = comm.ialltoallv(send, sendcounts, [(i + r) % 3 for i in range(n)]).wait()
expect(np.array_equal(a2av, want), "ialltoallv")
too_many = [send.size + 1] + [0] * (n - 1)
expect_raises(ValueError, lambda: comm.alltoallv(send, too_many, [0] * n), "sendcounts vs sendbuf",
              "add up to")
expect_raises(ValueError, lambda: comm.allgatherv(np.zeros(1), [1] * (n + 1)),
              "one count per rank", "one per rank")
# Counts are integers (Python's or NumPy's): a float or a string is refused, never cut (4.9 was
# taken as 4) nor parsed ("4" was taken as 4).
for bad in (4.9, "1", np.float64(1.0)):
    expect_raises(ctypes.ArgumentError,
                  lambda: comm.allgatherv(np.zeros(1), [bad] * n, np.zeros(n)),
                  f"allgatherv counts of {bad!r}", "must be an integer")
    expect_raises(ctypes.ArgumentError, lambda: comm.alltoallv(np.zeros(n), [bad] * n),
                  f"alltoallv sendcounts of {bad!r} (before exchanging them)", "must be an integer")
    expect_raises(ctypes.ArgumentError,
                  lambda: comm.ialltoallv(np.zeros(n), [1] * n, [bad] * n, np.zeros(n)),
                  f"ialltoallv recvcounts of {bad!r}", "must be an integer")
agv = comm.allgatherv(np.full(1, r, np.int32), [np.uint8(1)] * n)
expect(np.array_equal(agv, np.arange(n)), "allgatherv counts as NumPy integers")

# gatherv / scatterv: rank r's block has r elements (rank 0's is empty); the last rank is root.
root = n - 1
mine = np.arange(r, dtype=np.int32) + 10 * r
want = np.concatenate([np.arange(i, dtype=np.int32) + 10 * i for i in range(n)])
sizes = comm.gather(np.array([mine.size]), root=root)  # None except on root
gv = comm.gatherv(mine, None if sizes is None else sizes.ravel(), root=root)
expect(gv is None if r != root else np.array_equal(gv, want), f"gatherv {gv}")
gv = comm.igatherv(mine, list(range(n)) if r == root else None, root=root).wait()
expect(gv is None if r != root else np.array_equal(gv, want), f"igatherv {gv}")
part = np.full(r, -1, np.int32)
got = comm.scatterv(want if r == root else None, list(range(n)) if r == root else None, part,
                    root=root)
expect(got is part and np.array_equal(part, mine), f"scatterv {part}")
part = np.full(r, -1, np.int32)
comm.iscatterv(want if r == root else None, list(range(n)) if r == root else None, part,
               root=root).wait()
expect(np.array_equal(part, mine), f"iscatterv {part}")
if r == root:
    expect_raises(ValueError, lambda: comm.gatherv(mine, None, root=root), "gatherv without counts",
                  "needs counts")
    expect_raises(ValueError, lambda: comm.scatterv(want, None, part, root=root),
                  "scatterv without counts", "needs counts")
    one_too_many = np.append(want, np.int32(7))
    expect_raises(ValueError, lambda: comm.scatterv(one_too_many, list(range(n)), part, root=root),
                  "scatterv counts vs sendbuf", "add up to")

co = comm.allreduce_coalesced([np.ones(3, np.float32) * r, np.arange(5, dtype=np.float32)])
expect(np.all(co[0] == n * (n - 1) / 2) and np.array_equal(co[1], np.arange(5) * n), "coalesced")

# bfloat16 as raw bits: uint16 arrays of bf16 bit patterns with dtype="bfloat16" (no ml_dtypes).
# The conversion helpers first, against known bit patterns (round to nearest, ties to even).
BF16 = {0.0: 0x0000, 1.0: 0x3F80, 2.0: 0x4000, 3.0: 0x4040, 4.0: 0x4080, 6.0: 0x40C0,
        10.0: 0x4120, -1.0: 0xBF80, 0.5: 0x3F00, 256.0: 0x4380, 257.0: 0x4380, 259.0: 0x4382,
        1.00390625: 0x3F80, 1.01171875: 0x3F82, np.inf: 0x7F80, -np.inf: 0xFF80}
got = mncl.to_bfloat16_bits(np.array(list(BF16), np.float32))
expect(got.dtype == np.uint16 and got.tolist() == list(BF16.values()),
       f"to_bfloat16_bits: {[hex(v) for v in got.tolist()]}")
nan_bits = mncl.to_bfloat16_bits([np.nan, -np.nan])
expect(np.all(np.isnan(mncl.from_bfloat16_bits(nan_bits))), "to_bfloat16_bits keeps NaN")
expect(mncl.to_bfloat16_bits(3.0).shape == () and mncl.to_bfloat16_bits(3.0) == 0x4040,
       "to_bfloat16_bits of a scalar")
exact = np.array([0.0, 1.0, 3.0, 10.0, -1.0, 0.5, 256.0, 258.0], np.float32)
back = mncl.from_bfloat16_bits(mncl.to_bfloat16_bits(exact))
expect(back.dtype == np.float32 and np.array_equal(back, exact), "bfloat16 round trip")
expect_raises(TypeError, lambda: mncl.from_bfloat16_bits(np.zeros(2, np.int32)),
              "from_bfloat16_bits of int32", "uint16")

# Sums of small integers are exact in bfloat16 (at most 8 significant bits), so every rank must
# get exactly the bit pattern of the integer sum.
tri = n * (n + 1) // 2  # 1 + 2 + ... + n
if n <= 4:  # literal bit patterns in (1.0 ... 4.0), literal bit patterns out (1, 3, 6, 10)
    y = comm.allreduce(np.full(3, BF16[float(r + 1)], np.uint16), dtype="bfloat16")
    expect(y.dtype == np.uint16 and np.all(y == BF16[float(tri)]),
           f"bf16 1+..+{n}: {hex(int(y[0]))}, expected {hex(BF16[float(tri)])}")
for count in (1, 7, 300):
    base = np.arange(count) % 7
    x = mncl.to_bfloat16_bits(base + r)
    want = mncl.to_bfloat16_bits(base * n + n * (n - 1) // 2)
    expect(np.array_equal(comm.allreduce(x, dtype="bfloat16"), want), f"bf16 allreduce x{count}")
    comm.allreduce(x, x, dtype="bfloat16")
    expect(np.array_equal(x, want), f"in-place bf16 allreduce x{count}")
x = mncl.to_bfloat16_bits(np.full(2, r + 1))
fact = int(np.prod(np.arange(1, n + 1)))
for op, want in (("prod", fact), ("min", 1), ("max", n)):
    got = comm.allreduce(x, op=op, dtype="bfloat16")
    expect(np.all(got == mncl.to_bfloat16_bits(want)), f"bf16 allreduce {op}")
got = comm.allreduce(mncl.to_bfloat16_bits(np.full(2, 2 * (r + 1))), op="avg", dtype="bfloat16")
expect(np.all(got == mncl.to_bfloat16_bits(n + 1)), "bf16 allreduce avg")
got = comm.iallreduce(mncl.to_bfloat16_bits([r, -r, 0.5]), dtype="bfloat16").wait()
expect(np.array_equal(mncl.from_bfloat16_bits(got), [n * (n - 1) / 2, -n * (n - 1) / 2, n / 2]),
       "bf16 iallreduce")
got = comm.ireduce(mncl.to_bfloat16_bits([r + 1]), root=n - 1, dtype="bfloat16").wait()
if r == n - 1:
    expect(got.tolist() == [mncl.to_bfloat16_bits(tri)], "bf16 ireduce at the root")
else:
    expect(got is None, "bf16 ireduce off the root")
got = comm.reduce_scatter(mncl.to_bfloat16_bits(np.arange(2 * n) + r), dtype="bfloat16")
want = mncl.to_bfloat16_bits(np.arange(2 * r, 2 * r + 2) * n + n * (n - 1) // 2)
expect(np.array_equal(got, want), "bf16 reduce_scatter")
co = comm.iallreduce_coalesced([mncl.to_bfloat16_bits([r]), mncl.to_bfloat16_bits([1, 2])],
                               dtype="bfloat16").wait()
expect(co[0][0] == mncl.to_bfloat16_bits(n * (n - 1) // 2)
       and np.array_equal(co[1], mncl.to_bfloat16_bits([n, 2 * n])), "bf16 coalesced")
# Data movement does not look at the bits: NaN payloads and odd patterns arrive untouched.
odd = np.array([0x7FC1, 0xFFFF, 0x0001, 0x8000 + r], np.uint16)
got = comm.iallgather(odd, dtype="bfloat16").wait()
expect(np.array_equal(got[:, :3], np.tile(odd[:3], (n, 1))) and
       np.array_equal(got[:, 3], 0x8000 + np.arange(n)), "bf16 allgather of raw bits")
b = odd.copy() if r == 0 else np.zeros(4, np.uint16)
comm.bcast(b, dtype="bfloat16")
expect(np.array_equal(b, [0x7FC1, 0xFFFF, 0x0001, 0x8000]), "bf16 bcast of raw bits")
got = comm.bcast(odd.copy() if r == 0 else None, dtype="bfloat16")
expect(got.dtype == np.uint16 and np.array_equal(got, [0x7FC1, 0xFFFF, 0x0001, 0x8000]),
       "bf16 raw bits bcast into None: uint16 without ml_dtypes")
# The override names any MNCL dtype whose raw bits the unsigned array holds: float16 too.
h = comm.allreduce(np.full(2, np.float16(r + 1)).view(np.uint16), dtype="float16")
expect(np.all(h.view(np.float16) == tri), "float16 allreduce as raw uint16 bits")
# and an array that already has the named dtype is fine
expect(np.all(comm.allreduce(np.ones(2, np.float32), dtype="float32") == n), "dtype= its own")
expect_raises(TypeError, lambda: comm.allreduce(np.zeros(2, np.uint16)), "uint16 without dtype",
              "dtype='bfloat16'")
expect_raises(TypeError, lambda: comm.allreduce(np.zeros(2, np.int32), dtype="bfloat16"),
              "int32 as bfloat16", "cannot be passed as bfloat16")
expect_raises(TypeError, lambda: comm.allreduce(np.zeros(2, np.uint32), dtype="bfloat16"),
              "uint32 as bfloat16", "uint16")
expect_raises(ValueError, lambda: comm.allreduce(np.zeros(2, np.uint16), dtype="float128"),
              "unknown dtype name", "unknown dtype")
expect_raises(TypeError, lambda: comm.allreduce(np.zeros(2, np.uint16), np.zeros(2, np.float16),
                                                dtype="bfloat16"),
              "bf16 bits into a float16 output", "cannot be passed as bfloat16")

# The bindings cover the whole C API: a signature for every function of mncl.h, and an i* method
# for every non-blocking collective.
header = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../abi/mncl/mncl.h")
with open(header) as f:
    c_functions = set(re.findall(r"MNCL_API\s[^;(]*?\b(mncl_\w+)\s*\(", f.read()))
expect(len(c_functions) > 30, f"parsed {len(c_functions)} functions from {header}")
missing = c_functions - set(mncl._lib._SIGNATURES)
expect(not missing, f"mncl.h functions without a ctypes signature: {sorted(missing)}")
nonblocking = {name[len("mncl_"):] for name in c_functions
               if name.startswith("mncl_i") and name != "mncl_init"}
missing = {name for name in nonblocking if not callable(getattr(comm, name, None))}
expect(not missing, f"non-blocking collectives without a Communicator method: {sorted(missing)}")
# Every function added after MNCL_1.0 (a node of its own in libmncl.map) is in _ADDED_IN, so
# that the package still imports with an older libmncl and raises NotSupportedError on use.
mapfile = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../sdk/api/libmncl.map")
with open(mapfile) as f:
    version_script = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
added = {name: node for node, body in re.findall(r"MNCL_(\d+\.\d+)\s*\{(.*?)\}", version_script,
                                                 re.S)
         if node != "1.0" for name in re.findall(r"\b(mncl_\w+)\s*;", body)}
have = mncl._lib._ADDED_IN
expect(len(added) >= 4 and have == added,
       f"_ADDED_IN differs from {mapfile}: lacks or misnames "
       f"{sorted(set(added.items()) - set(have.items()))}, has besides "
       f"{sorted(set(have.items()) - set(added.items()))}")
real_allgatherv = mncl.comm.lib.mncl_allgatherv
try:
    mncl.comm.lib.mncl_allgatherv = mncl._lib._missing("mncl_allgatherv")  # as if predating 1.1
    expect_raises(mncl.NotSupportedError, lambda: comm.allgatherv(np.zeros(1), [1] * n),
                  "allgatherv with a libmncl older than MNCL_1.1", "MNCL_1.1")
finally:
    mncl.comm.lib.mncl_allgatherv = real_allgatherv

# A folder in MNCL_LIBRARY without the library fails the import, naming it, as a file that fails
# does; it is not replaced by another copy (here one the dynamic loader would find).
if r == 0:
    empty = tempfile.mkdtemp(prefix="mncl-py-")
    env = dict(os.environ, MNCL_LIBRARY=empty,
               LD_LIBRARY_PATH=os.path.dirname(os.path.realpath(mncl.library_path)))
    proc = subprocess.run([sys.executable, "-c", "import mncl; print(mncl.library_path)"],
                          env=env, capture_output=True, text=True, timeout=60)
    expect(proc.returncode != 0 and "ImportError" in proc.stderr
           and os.path.join(empty, "libmncl.so.1") in proc.stderr,
           f"MNCL_LIBRARY={empty} (no library there): {proc.stdout!r} {proc.stderr[-300:]!r}")
    shutil.rmtree(empty, ignore_errors=True)

# non-blocking: each against the exact values of its blocking twin
req = comm.iallreduce(np.full(16, r, dtype=np.int64))
bar = comm.ibarrier()
out = req.wait()
expect(bar.wait() is None, "ibarrier's wait returns None")
expect(req.done and np.all(out == n * (n - 1) // 2), "iallreduce + wait")
req = comm.iallgather(np.array([r], np.int64))
while not req.test():
    pass
expect(np.array_equal(req.wait().ravel(), np.arange(n)), "iallgather + test")

for root in range(n):
    req = comm.ireduce(np.arange(5, dtype=np.int32) + r, op="sum", root=root)
    got = req.wait()
    if r == root:
        expect(np.array_equal(got, np.arange(5) * n + n * (n - 1) // 2), f"ireduce root {root}")
    else:
        expect(got is None, f"ireduce returns None off the root ({root})")
    mx = np.empty(3, np.float64) if r == root else None
    got = comm.ireduce(np.array([r, -r, 2.5 * r]), mx, op="max", root=root).wait()
    if r == root:
        expect(got is mx and np.array_equal(mx, [n - 1, 0, 2.5 * (n - 1)]),
               f"ireduce max into recvbuf, root {root}")

    b = np.arange(6, dtype=np.int64) * (r + 1) if r == root else np.zeros(6, np.int64)
    got = comm.ibcast(b, root=root).wait()
    expect(got is b and np.array_equal(b, np.arange(6) * (root + 1)), f"ibcast root {root}")

    send = np.arange(3 * n, dtype=np.uint32).reshape(n, 3) * 7 if r == root else None
    recv = np.empty(3, np.uint32)
    got = comm.iscatter(send, recv, root=root).wait()
    expect(got is recv and np.array_equal(recv, np.arange(3 * r, 3 * r + 3) * 7),
           f"iscatter root {root}")

    got = comm.igather(np.array([r, r * r], np.int8), root=root).wait()
    if r == root:
        want = np.array([[k, k * k] for k in range(n)], np.int8)
        expect(got.shape == (n, 2) and np.array_equal(got, want), f"igather root {root}")
    else:
        expect(got is None, f"igather returns None off the root ({root})")

rs = comm.ireduce_scatter(np.arange(n * 4, dtype=np.int64).reshape(n, 4) + r).wait()
expect(rs.shape == (4,) and np.array_equal(rs, (np.arange(4) + 4 * r) * n + n * (n - 1) // 2),
       "ireduce_scatter")
rs = comm.ireduce_scatter(np.arange(n * 2, dtype=np.int32) * (r + 1), np.empty(2, np.int32),
                          op="min").wait()
expect(np.array_equal(rs, np.arange(2 * r, 2 * r + 2)), "ireduce_scatter min into recvbuf")

a2a = comm.ialltoall(np.arange(n * 2, dtype=np.int32) + 100 * r).wait()
want = np.array([100 * j + 2 * r + k for j in range(n) for k in range(2)])
expect(np.array_equal(a2a, want), "ialltoall")

req = comm.iallreduce_coalesced([np.full(3, r, np.int32), np.arange(5, dtype=np.int32) * r],
                                op="sum")
co = req.wait()
expect(len(co) == 2 and np.all(co[0] == n * (n - 1) // 2)
       and np.array_equal(co[1], np.arange(5) * (n * (n - 1) // 2)), "iallreduce_coalesced")
outs = [np.empty(2, np.float64), np.empty(1, np.float64)]
co = comm.iallreduce_coalesced([np.full(2, r + 1.0), np.array([r + 1.0])], outs,
                               op="max").wait()
expect(co[0] is outs[0] and np.all(outs[0] == n) and np.all(outs[1] == n),
       "iallreduce_coalesced max into recvbufs")
expect(comm.iallreduce_coalesced([]).wait() == [], "iallreduce_coalesced of no buffers")

# Several requests in flight at once, waited for out of order: they run in issue order.
acc = np.zeros(4, np.int64)
reqs = [comm.iallreduce(np.full(4, r + k, np.int64)) for k in range(3)]
reqs.append(comm.iallreduce(acc, acc))  # in place
for k, req in reversed(list(enumerate(reqs[:3]))):
    expect(np.all(req.wait() == n * (n - 1) // 2 + n * k), f"request {k} of 3 in flight")
expect(reqs[3].wait() is acc and np.all(acc == 0), "in-place iallreduce among others")

# A dropped Request keeps its arrays alive until the operation has run: the input below is
# referenced by nothing but the request in flight, and the blocking barrier runs behind it.
dropped_in = np.full(1000, r + 1, np.int64)
alive = weakref.ref(dropped_in)
dropped_out = np.empty(1000, np.int64)
comm.iallreduce(dropped_in, dropped_out)
del dropped_in
gc.collect()
expect(alive() is not None, "the input of a dropped request is kept alive")
comm.barrier()
expect(np.all(dropped_out == n * (n + 1) // 2), "a dropped request still completes")

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

    # send_array / recv_array (ChainerMN's send / recv): shape and dtype travel; a sender whose
    # array cannot travel raises, its receiver RemoteError, and the pair stays in step.
    def ring_array(array, **kw):
        if r % 2 == 0:
            comm.send_array(array, nxt, **kw)
            return comm.recv_array(prv)
        got = comm.recv_array(prv)
        comm.send_array(array, nxt, **kw)
        return got
    for make in (lambda q: np.arange(6, dtype=np.float32).reshape(2, 3) + q,
                 lambda q: np.array(q * 1000 + 7, np.int64),
                 lambda q: np.zeros((0,), np.float64), lambda q: np.full((2, 0, 3), q, np.uint8),
                 lambda q: [[q, q + 1]]):
        want = np.asarray(make(prv))
        got = ring_array(make(r))
        expect(got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want),
               f"send_array ring: {want.dtype}{want.shape}, got {got.dtype}{got.shape}")
    got = ring_array(np.array([0x7FC1, 0x8000 + r], np.uint16), dtype="bfloat16")
    expect(got.dtype == np.uint16 and np.array_equal(got, [0x7FC1, 0x8000 + prv]),
           "send_array of bfloat16 raw bits")
    bad = np.array([object()])
    if r % 2 == 0:
        expect_raises(TypeError, lambda: comm.send_array(bad, nxt), "send_array of objects",
                      "unsupported array dtype")
        expect_raises(mncl.RemoteError, lambda: comm.recv_array(prv), "recv_array of objects",
                      f"rank {prv} could not send")
    else:
        expect_raises(mncl.RemoteError, lambda: comm.recv_array(prv), "recv_array of objects",
                      f"rank {prv} could not send")
        expect_raises(TypeError, lambda: comm.send_array(bad, nxt), "send_array of objects",
                      "unsupported array dtype")
    got = ring_array(np.full(3, r, np.int32))
    expect(np.array_equal(got, [prv] * 3), "send_array in step after a failed one")
    # A plain send where the peer waits in recv_array is no header (zeros included).
    if n == 2 and r == 0:
        comm.send(np.array([0] + [99] * 66, np.int64), 1)  # a header's size, dtype 99
        comm.send(np.zeros(67, np.int64), 1)
    elif n == 2:
        for what in ("garbage", "zeros"):
            expect_raises(mncl.RemoteError, lambda: comm.recv_array(0),
                          f"recv_array of a plain send of {what}", "no array header")

    # The same ring non-blocking, MPI style: every rank posts its receive before its send (point
    # to point progresses on its own, so nobody waits behind its own receive).
    payload = np.arange(5, dtype=np.float32) + 10 * r
    inbox = np.full(5, -1, np.float32)
    reqs = [comm.irecv(inbox, prv), comm.isend(payload, nxt)]
    results = [q.wait() for q in reqs]
    expect(results[0] is inbox and results[1] is None, "isend/irecv results")
    expect(np.array_equal(inbox, np.arange(5) + 10 * prv), "isend/irecv ring")

    # sendrecv: the same ring in one call each, no ordering; small and large (3 MiB) messages,
    # then sizes that differ by direction (rank r sends r + 1 elements) into a given recvbuf.
    for count in (1, 1000, 3 << 17):
        sent = np.arange(count, dtype=np.int64) % 97 + 1000 * r
        got = comm.sendrecv(sent, nxt, source=prv)
        expect(got.dtype == np.int64 and got.shape == (count,), f"sendrecv x{count} shape")
        expect(np.array_equal(got, np.arange(count) % 97 + 1000 * prv), f"sendrecv ring x{count}")
    inbox = np.full(prv + 1, -1, np.float32)
    got = comm.isendrecv(np.full(r + 1, r + 0.5, np.float32), nxt, inbox, prv).wait()
    expect(got is inbox and np.all(inbox == prv + 0.5), "isendrecv, sizes differ by direction")
    bits = mncl.to_bfloat16_bits(np.full(3, r + 1.0))  # raw bits with dtype=, as send/recv
    got = comm.sendrecv(bits, nxt, np.zeros(3, np.uint16), prv, dtype="bfloat16")
    expect(np.array_equal(mncl.from_bfloat16_bits(got), np.full(3, prv + 1.0)),
           "sendrecv of bfloat16 bits")
    partner = r ^ 1  # dest == source: pairs (0, 1), (2, 3); an odd last rank sits out
    if partner < n:
        swapped = comm.sendrecv(np.array([r, 7 * r], np.int32), partner)
        expect(np.array_equal(swapped, [partner, 7 * partner]), "sendrecv swap, dest == source")

    # A halo exchange as one batch: recvs listed first, a different dtype each way, an empty
    # message; ops named every way P2POp accepts. With 2 ranks both neighbours are one rank, so
    # this also checks that ops match in array order per direction.
    left = np.full(n + 5, -1.0)
    right = np.full(3, -1, np.int64)
    empty = np.empty(0, np.uint8)
    ops = [mncl.P2POp("irecv", left, prv), mncl.P2POp(comm.isend, np.arange(n + 5) + r / 4, nxt),
           mncl.P2POp(mncl.Communicator.irecv, right, nxt),
           mncl.P2POp("send", [-r, -2 * r, -3 * r], prv),  # a list: sent as int64
           mncl.P2POp("isend", empty, nxt), mncl.P2POp("recv", np.empty(0, np.uint8), prv)]
    results = comm.sendrecv_batch(ops)
    expect(results[0] is left and results[2] is right and results[1] is None,
           "sendrecv_batch results: receive buffers, None for sends")
    expect(np.array_equal(left, np.arange(n + 5) + prv / 4), "halo from the left")
    expect(np.array_equal(right, [-nxt, -2 * nxt, -3 * nxt]), "halo from the right")

    # Non-blocking, PyTorch style: one array to every other rank, one from each.
    mine = np.arange(33, dtype=np.int64) * (r + 1)
    inboxes = {p: np.full(33, -1, np.int64) for p in range(n) if p != r}
    ops = []
    for p, box in inboxes.items():
        ops += [mncl.P2POp(comm.isend, mine, p), mncl.P2POp(comm.irecv, box, p)]
    req = comm.batch_isend_irecv(ops)
    while not req.test():
        pass
    expect(all(np.array_equal(box, np.arange(33) * (p + 1)) for p, box in inboxes.items()),
           "batch_isend_irecv to and from every rank")

    # Batches, sendrecv and send/recv of a pair match in issue order.
    if r < 2:
        other = 1 - r
        if r == 0:
            comm.sendrecv_batch([mncl.P2POp("send", np.full(2, 10, np.int64), other),
                                 mncl.P2POp("send", np.full(3, 11, np.int64), other)])
            comm.send(np.full(4, 12, np.int64), other)
        else:
            a = comm.recv(np.empty(2, np.int64), other)
            b, c = comm.isendrecv_batch([mncl.P2POp("recv", np.empty(3, np.int64), other),
                                         mncl.P2POp("recv", np.empty(4, np.int64), other)]).wait()
            expect(np.all(a == 10) and np.all(b == 11) and np.all(c == 12),
                   "batch and send/recv messages match in issue order")

    # A request that cannot finish: a timed wait leaves it pending; the abort then fails it,
    # and each later wait raises again. On a communicator of its own (every rank aborts it).
    side = comm.split(0)
    req = side.irecv(np.empty(2, np.int32), nxt)  # nobody sends on `side`
    expect_raises(mncl.TimeoutError, lambda: req.wait(timeout=0.05), "timed wait",
                  "did not finish")
    expect(not req.done and not req.test(), "a timed-out request stays pending")
    expect_raises(ValueError, lambda: req.wait(timeout=-1), "negative wait timeout", "negative")
    side.abort()
    expect_raises(mncl.AbortedError, req.wait, "wait on an aborted operation", "abort")
    expect(req.done and req.test(), "a failed request is done")
    expect_raises(mncl.AbortedError, req.wait, "a failed request raises again", "abort")
    expect_raises(mncl.AbortedError, lambda: side.isend(np.zeros(1, np.int32), nxt),
                  "isend on an aborted communicator", "aborted")
    side.close()

    # A bounded wait whose operation itself times out (the communicator's 1 s): TimeoutError, and
    # the request is done, failing again on a later wait. (It once kept the freed C handle, so a
    # later wait could complete another request that got the same address, returning garbage.)
    quick = comm.split_config(0, timeout=1)
    req = quick.irecv(np.empty(2, np.int32), nxt)  # nobody sends on `quick`
    expect_raises(mncl.TimeoutError, lambda: req.wait(timeout=30), "the operation's own timeout",
                  "mncl_irecv")
    expect(req.done, "a request whose operation timed out is done")
    expect_raises(mncl.TimeoutError, req.wait, "and fails again", "mncl_irecv")
    quick.abort()
    quick.close()

    # A rank leaving a `with` block on an exception aborts the communicator (local) instead of a
    # collective close that waited for the others, while they waited in their allreduce for it:
    # they fail at once (shm: AbortedError, gloo: RemoteError), not with a TimeoutError. (naive
    # passes no abort on: its ranks would still wait out the timeout.)
    short = comm.split_config(0, backend="shm", timeout=5)
    try:
        with short:
            if r == n - 1:
                time.sleep(0.1)  # the others are in their allreduce by now
                raise KeyError("a bug on the last rank")
            short.allreduce(np.ones(2))
        expect(False, "an allreduce without the last rank finished")
    except KeyError:
        expect(r == n - 1, "the KeyError on the rank that raised it")
    except (mncl.AbortedError, mncl.RemoteError):
        expect(r != n - 1, "AbortedError/RemoteError on the other ranks")
    except mncl.MnclError as e:
        expect(False, f"an exception in a `with` block: the others got {type(e).__name__}: {e}")
    expect("closed" in repr(short), "left on an exception, the communicator is freed")

    # Two threads waiting on one request both get its result (the library once freed it under
    # the second: a crash).
    got = []
    recv = comm.irecv(np.empty(3, np.int64), prv)
    waiters = [threading.Thread(target=lambda: got.append(recv.wait().copy())) for _ in range(2)]
    for t in waiters:
        t.start()
    time.sleep(0.2)
    comm.send(np.full(3, r, np.int64), nxt)
    for t in waiters:
        t.join()
    expect(len(got) == 2 and all(np.all(g == prv) for g in got), f"two waiters: {got}")

    # Ranks, peers, roots and enums that do not fit a C int are refused (ctypes once kept the low
    # 32 bits: peer 2**32 + 1 reached rank 1).
    expect_raises(ctypes.ArgumentError, lambda: comm.send(np.zeros(1), 2**32 + nxt),
                  "peer 2**32 + next", "does not fit")

# Timeouts past int64 milliseconds (ctypes once wrapped them into other numbers): a wait has no
# limit then; a config's is refused by the library, naming its bound.
for forever in (float("inf"), 1e300):
    expect(np.array_equal(comm.iallreduce(np.ones(2)).wait(timeout=forever), np.full(2, n)),
           f"wait(timeout={forever})")
expect_raises(mncl.InvalidArgumentError, lambda: mncl.Communicator(timeout=1e17),
              "a config timeout of 1e17 s", "one week")
expect_raises(ValueError, lambda: mncl.Communicator(timeout=float("nan")), "a NaN timeout", "NaN")

# Positive sub-millisecond timeouts round up to 1 ms, as MNCL_TIMEOUT's parser does (they were
# cut to 0 ms: a config refused "timeout_ms is 0", a wait only polled); from the decimal form, so
# 0.3 s is 300 ms (not 301).
for seconds, ms in ((0.0001, 1), (1e-300, 1), (0.0015, 2), (0.3, 300), (2, 2000), (1.1, 1100)):
    got_ms = mncl.comm._config_timeout_ms(seconds)
    expect(got_ms == ms, f"config timeout {seconds} s: {got_ms} ms, expected {ms}")
# Zero and negative timeouts are refused in the caller's words: seconds and the keyword (the
# library said "config->timeout_ms is -1000").
for seconds in (0, -1, -0.0001):
    expect_raises(mncl.InvalidArgumentError, lambda: mncl.Communicator(timeout=seconds),
                  f"a config timeout of {seconds} s", f"timeout={seconds!r}: give seconds > 0")
store = tempfile.mkdtemp(prefix="mncl-py-")
try:
    with mncl.Communicator(backend="naive", rank=0, size=1, bootstrap="file://" + store,
                           timeout=0.0001) as tiny:
        expect(np.all(tiny.allreduce(np.ones(2)) == 1), "a communicator with a 0.1 ms timeout")
except mncl.TimeoutError:
    pass  # 1 ms ran out (a loaded machine): the timeout was taken, which is the point
except mncl.MnclError as e:
    expect(False, f"Communicator(timeout=0.0001) refused: {e}")
shutil.rmtree(store, ignore_errors=True)
# wait(timeout): the milliseconds mncl_wait gets, seen through a wrapper.
waits = []
real_wait = mncl.comm.lib.mncl_wait
mncl.comm.lib.mncl_wait = lambda handle, ms: (waits.append(ms), real_wait(handle, ms))[1]
try:
    for seconds, ms in ((0.0001, 1), (1e-300, 1), (0, 0), (0.25, 250), (2**41, -1)):
        waits.clear()
        req = comm.iallreduce(np.ones(2))
        try:
            req.wait(timeout=seconds)
        except mncl.TimeoutError:
            pass  # not finished that soon: a positive timeout still waited, not only polled
        expect(waits[:1] == [ms], f"wait(timeout={seconds}) waits {waits[:1]} ms, expected {ms}")
        expect(np.all(req.wait() == n), f"wait(timeout={seconds}) result")
finally:
    mncl.comm.lib.mncl_wait = real_wait

# Integers that do not fit their C type are refused with ctypes.ArgumentError wherever they go:
# struct fields and size_t arrays too, where ctypes silently kept the low bits (a P2POp peer
# 2**32 + 1 - r reached a truncated peer; Communicator(rank=2**32, size=2**32 + 1) made rank 0 of
# 1; split_config(0, device=2**32) took device 0), and NumPy integers as Python ones.
big = 2**32
for peer in (big + r, -big - 1, np.int64(big + r), np.uint64(2**64 - 1)):
    expect_raises(ctypes.ArgumentError, lambda: mncl.P2POp("send", np.zeros(1), peer),
                  f"P2POp peer {peer}", "does not fit a C int")
expect_raises(ctypes.ArgumentError, lambda: mncl.P2POp("recv", np.zeros(1), 1.0),
              "P2POp peer 1.0 (a float, as send() refuses it)", "must be an integer")
op = mncl.P2POp("send", np.zeros(1), (r + 1) % n)
op.peer = big + r  # changed after the checks of P2POp(): packing the batch checks it again
expect_raises(ctypes.ArgumentError, lambda: comm.sendrecv_batch([op]),
              "a batch op whose peer became 2**32 + r", "does not fit a C int")
expect_raises(ctypes.ArgumentError, lambda: comm.bcast(np.zeros(2), root=np.int64(big + n)),
              "NumPy root 2**32 + size", "does not fit a C int")
expect_raises(ctypes.ArgumentError, lambda: comm.allreduce(np.ones(2), op=1.5),
              "reduction 1.5 (was cut to 1, prod)")
for args, kwargs in (((np.int64(big),), {}), ((0,), {"key": np.int64(-big - 1)}),
                     ((0,), {"device": big}), ((0,), {"device": -big - 1}),
                     ((0,), {"device": np.int64(big)})):
    expect_raises(ctypes.ArgumentError,
                  lambda: comm.split_config(*args, **kwargs), f"split_config{args} {kwargs}",
                  "does not fit")
expect_raises(ctypes.ArgumentError, lambda: comm.split_host(device=big), "split_host device",
              "config device")
expect_raises(ctypes.ArgumentError, lambda: comm.split_cross_host(device=-big - 1),
              "split_cross_host device", "config device")
store = tempfile.mkdtemp(prefix="mncl-py-")
for kwargs, words in (({"rank": big, "size": big + 1}, "config rank"),
                      ({"rank": 0, "size": big + 1}, "config size"),
                      ({"rank": np.int64(big), "size": 1}, "config rank"),
                      ({"rank": 0, "size": 1, "device": big}, "config device"),
                      ({"rank": 0.0, "size": 1}, "must be an integer")):
    expect_raises(ctypes.ArgumentError,
                  lambda: mncl.Communicator(backend="naive", bootstrap="file://" + store,
                                            **kwargs), f"Communicator({kwargs})", words)
shutil.rmtree(store, ignore_errors=True)
# Counts per rank are size_t: beyond it (or a sum beyond it) they are refused, not cut.
expect_raises(ctypes.ArgumentError, lambda: comm.allgatherv(np.zeros(1), [2**64 + 1] * n,
                                                            np.zeros(1)),
              "allgatherv counts of 2**64 + 1", "does not fit a C size_t")
if n > 1:
    expect_raises(ctypes.ArgumentError,
                  lambda: comm.allgatherv(np.zeros(1), [2**64 - 1] + [1] * (n - 1), np.zeros(1)),
                  "allgatherv counts adding up past size_t", "the sum of counts")
expect_raises(ctypes.ArgumentError, lambda: comm.alltoallv(np.zeros(n), [2**64] * n),
              "alltoallv sendcounts of 2**64 (before exchanging them)", "does not fit a C size_t")
expect_raises(ctypes.ArgumentError,
              lambda: comm.ialltoallv(np.zeros(n), [1] * n, [2**64 + 1] * n, np.zeros(n)),
              "ialltoallv recvcounts of 2**64 + 1", "does not fit a C size_t")
expect(np.all(comm.allreduce(np.ones(2)) == n), "usable after the refused calls")

# Batches on any size: an empty one is valid; ops are checked before anything starts.
expect(comm.sendrecv_batch([]) == [] and comm.batch_isend_irecv([]).wait() == [], "empty batch")
expect_raises(mncl.InvalidArgumentError,
              lambda: comm.sendrecv_batch([mncl.P2POp("send", np.zeros(2), r)]),
              "batch op sending to this rank")
expect_raises(mncl.InvalidArgumentError,
              lambda: comm.sendrecv(np.zeros(2), r), "sendrecv with this rank")
overlap = np.zeros(8, np.int32)
expect_raises(mncl.InvalidArgumentError,
              lambda: comm.batch_isend_irecv([mncl.P2POp("recv", overlap, (r + 1) % n),
                                              mncl.P2POp("recv", overlap[4:], (r + 1) % n)]),
              "overlapping receive buffers")
expect_raises(ValueError, lambda: mncl.P2POp("bcast", overlap, 0), "unknown P2POp op",
              "op must be")
expect_raises(TypeError, lambda: comm.sendrecv_batch([("send", overlap, 0)]),
              "a batch of tuples", "not an mncl.P2POp")
expect_raises(ValueError, lambda: mncl.P2POp("recv", overlap[::2], 0), "non-contiguous recv",
              "C-contiguous")
expect_raises(TypeError, lambda: comm.sendrecv(np.zeros(2), (r + 1) % n, np.zeros(2, np.int32)),
              "sendrecv dtypes differ", "dtypes differ")

# split by parity, reversed order
sub = comm.split(r % 2, key=-r)
expect(sub.size == (n + 1 - r % 2) // 2, "split size")
expect(np.all(sub.allreduce(np.array([1])) == sub.size), "allreduce on the split communicator")
sub.close()
# by host (one host here unless MNCL_HOSTID says otherwise), on a backend of its own
host = comm.split_host(backend="shm")
expect(host.backend == "shm" and host.size == n and host.rank == r, "split_host")
# One host here: this rank's place on it, as split_host gave it, without a collective call.
expect((comm.local_rank, comm.local_size, comm.host_index, comm.num_hosts) == (r, n, 0, 1),
       f"host info {(comm.local_rank, comm.local_size, comm.host_index, comm.num_hosts)}")
expect((comm.intra_rank, comm.intra_size, comm.inter_rank, comm.inter_size) == (r, n, 0, 1),
       "ChainerMN's intra_rank, intra_size, inter_rank, inter_size")
expect(np.all(host.allreduce(np.array([r], dtype=np.int64)) == n * (n - 1) // 2),
       "allreduce on the host communicator")
cross = comm.split_cross_host(timeout=5)
expect(cross.size == 1 and cross.rank == 0 and cross.backend == comm.backend,
       "split_cross_host: one rank per host")
cross.close()
host.close()
odd = comm.split_config(r % 2, backend="shm" if r % 2 else None)
expect(odd.backend == ("shm" if r % 2 else comm.backend), "split_config backend")
odd.close()
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


# Another library's enum is read by its members' names, never their values: torch numbers its
# ReduceOp SUM 0, AVG 1, PRODUCT 2, MIN 3, MAX 4 (AVG was once taken as MNCL's code 1, prod).
class TorchLikeReduceOp(enum.IntEnum):
    SUM = 0
    AVG = 1
    PRODUCT = 2
    MIN = 3
    MAX = 4
    PREMUL_SUM = 5


base = np.arange(1, 4, dtype=np.int64)
x = base * (r + 1)
for member, want in ((TorchLikeReduceOp.SUM, base * n * (n + 1) // 2),
                     (TorchLikeReduceOp.AVG, base * (n + 1) // 2),
                     (TorchLikeReduceOp.PRODUCT, base ** n * math.factorial(n)),
                     (TorchLikeReduceOp.MIN, base), (TorchLikeReduceOp.MAX, base * n)):
    expect(np.array_equal(comm.allreduce(x, op=member), want), f"allreduce op={member!r}")
expect_raises(ValueError, lambda: comm.allreduce(x, op=TorchLikeReduceOp.PREMUL_SUM),
              "an enum member of no MNCL reduction", "unknown reduction")
expect_raises(TypeError, lambda: comm.allreduce(x, op=True), "op=True", "a name such as")
expect(np.array_equal(comm.allreduce(x, op=1), base ** n * math.factorial(n)),
       "a plain int is MNCL's own code (1: prod)")
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
checks.finish("all mncl Python checks passed")
