"""bfloat16 as ml_dtypes.bfloat16 arrays through the mncl Python package, at any size (run under
mncl-run -n N), with exact checks on the bit patterns. ml_dtypes is optional for mncl: without it
(or without NumPy) this exits 77, which ctest reports as skipped with the reason printed here.
ml_dtypes arrays passed as another dtype of their item size (bfloat16 as float16, float8 as uint8)
are refused, by Communicator and HierarchicalCommunicator. The raw-bits form (uint16 arrays with
dtype="bfloat16") is tested by test_mncl.py either way."""

import sys

from checks import Checks, numpy_or_skip

np = numpy_or_skip()
try:
    import ml_dtypes
except ImportError as e:
    print(f"SKIPPED: the optional ml_dtypes package is not importable for {sys.executable} ({e});"
          " install it (pip install ml_dtypes) to test ml_dtypes.bfloat16 arrays")
    sys.exit(77)

import mncl

bf16 = np.dtype(ml_dtypes.bfloat16)
checks = Checks()
expect, expect_raises = checks.expect, checks.expect_raises


def bits(arr):
    return arr.view(np.uint16)


comm = mncl.Communicator()
r, n = comm.rank, comm.size
checks.rank = r
if r == 0:
    print(f"ml_dtypes {ml_dtypes.__version__}, numpy {np.__version__}; backend {comm.backend}, "
          f"{n} ranks", flush=True)

# mncl's bit conversion agrees with ml_dtypes' on every kind of float32: exact, ties, rounding
# up and down, subnormals, overflow to infinity.
rng = np.random.default_rng(7)
samples = np.concatenate([
    rng.standard_normal(2000).astype(np.float32) * 1000,
    np.array([0.0, -0.0, 1.0, 257.0, 259.0, 1.00390625, 1.01171875, 3.4e38, -3.4e38, 1e-39,
              np.inf, -np.inf], np.float32),
])
expect(np.array_equal(mncl.to_bfloat16_bits(samples), bits(samples.astype(bf16))),
       "to_bfloat16_bits == ml_dtypes' conversion")
expect(np.array_equal(mncl.from_bfloat16_bits(bits(samples.astype(bf16))),
                      samples.astype(bf16).astype(np.float32)),
       "from_bfloat16_bits == ml_dtypes' conversion")

# bcast into None allocates ml_dtypes.bfloat16 (ml_dtypes is imported here), bits unchanged.
root_bf16 = np.array([1.5, -2.0, 3.0e38, 1e-40], np.float32).astype(bf16)
got = comm.bcast(root_bf16.copy() if r == 0 else None)
expect(got.dtype == bf16 and np.array_equal(bits(got), bits(root_bf16)), "bf16 bcast into None")

# 1 + 2 + ... + n, literal bit patterns for the tested sizes.
TRI_BITS = {1: 0x3F80, 2: 0x4040, 3: 0x40C0, 4: 0x4120}  # 1.0, 3.0, 6.0, 10.0
x = np.full(5, r + 1, bf16)
y = comm.allreduce(x)
expect(y.dtype == bf16 and y.shape == x.shape, "allreduce keeps ml_dtypes.bfloat16")
if n in TRI_BITS:
    expect(np.all(bits(y) == TRI_BITS[n]), f"bf16 1+..+{n}: {hex(int(bits(y)[0]))}")
expect(np.all(y.astype(np.float32) == n * (n + 1) // 2), "bf16 sum value")

for count in (1, 7, 300):
    base = np.arange(count) % 7
    x = (base + r).astype(bf16)
    want = (base * n + n * (n - 1) // 2).astype(bf16)
    expect(np.array_equal(bits(comm.allreduce(x)), bits(want)), f"bf16 allreduce x{count}")
    comm.allreduce(x, x)
    expect(np.array_equal(bits(x), bits(want)), f"in-place bf16 allreduce x{count}")
x = np.full(2, r + 1, bf16)
for op, want in (("prod", np.prod(np.arange(1, n + 1))), ("min", 1), ("max", n)):
    expect(np.all(comm.allreduce(x, op=op).astype(np.float32) == want), f"bf16 {op}")

# An ml_dtypes input with a raw-bits output (and the other way round) is one MNCL dtype.
raw = np.empty(2, np.uint16)
expect(comm.allreduce(x, raw, dtype="bfloat16") is raw
       and np.all(raw == mncl.to_bfloat16_bits(n * (n + 1) // 2)), "bf16 in, raw bits out")
out = np.empty(2, bf16)
comm.allreduce(bits(x).copy(), out, dtype="bfloat16")
expect(np.all(out.astype(np.float32) == n * (n + 1) // 2), "raw bits in, bf16 out")

# Raw bits come from unsigned integer arrays only: an ml_dtypes array (NumPy kind "V", as the
# opaque items of PyTorch's CUDA bfloat16) passed as another dtype of its item size is refused,
# not reduced as those bits (bfloat16 as float16, float8 as uint8).
f8 = np.ones(2, ml_dtypes.float8_e4m3fn)
for arr, name in ((x, "float16"), (f8, "uint8"), (f8, "int8")):
    expect_raises(TypeError, lambda: comm.allreduce(arr, dtype=name),
                  f"{arr.dtype} array as dtype={name!r}", "cannot be passed as")
with mncl.HierarchicalCommunicator(comm, intra_backend="shm") as h:
    expect_raises(TypeError, lambda: h.allreduce(x, dtype="float16"),
                  "HierarchicalCommunicator: a bfloat16 array as dtype='float16'",
                  "cannot be passed as")
    got = h.allreduce(x, dtype="bfloat16")
    expect(got.dtype == bf16 and np.all(got.astype(np.float32) == n * (n + 1) // 2),
           "HierarchicalCommunicator: bfloat16 array")

# Non-blocking collectives on ml_dtypes arrays.
got = comm.iallreduce(np.array([r, 0.5], bf16)).wait()
expect(got.dtype == bf16 and got.astype(np.float32).tolist() == [n * (n - 1) / 2, n / 2],
       "bf16 iallreduce")
rs = comm.ireduce_scatter((np.arange(2 * n) + r).astype(bf16)).wait()
want = (np.arange(2 * r, 2 * r + 2) * n + n * (n - 1) // 2).astype(bf16)
expect(rs.dtype == bf16 and np.array_equal(bits(rs), bits(want)), "bf16 ireduce_scatter")
ag = comm.iallgather(np.array([r, -r], bf16)).wait()
expect(ag.shape == (n, 2) and ag[:, 0].astype(np.float32).tolist() == list(range(n)),
       "bf16 iallgather")
co = comm.iallreduce_coalesced([np.ones(3, bf16), np.full(1, r, bf16)]).wait()
expect(np.all(co[0].astype(np.float32) == n) and co[1][0] == n * (n - 1) // 2, "bf16 coalesced")

comm.close()
checks.finish("all ml_dtypes bfloat16 checks passed")
