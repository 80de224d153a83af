"""mncl.HierarchicalCommunicator (run under mncl-run -n N --ranks-per-host M, M as the first
argument): the layout it sees, and allreduce by both algorithms against exact expectations for
every op, several dtypes and counts, in and out of place; float16 AVG that would overflow as a
16-bit partial sum; the closed error after close(); a `with` block left by an exception on one
rank, which aborts rather than holds up its host; a group failing on one host; hosts of
different sizes refused by two_dimensional on every rank; multi_node_mean_grad and bcast_data
through it. Exits 77 (skipped) without NumPy."""

import os
import sys
import time

from checks import world_and_checks

np, mncl, world, checks = world_and_checks()
expect, expect_raises = checks.expect, checks.expect_raises
per_host = int(sys.argv[1])
r, n = world.rank, world.size
host, position = r // per_host, r % per_host
host_sizes = [min(per_host, n - h * per_host) for h in range(-(-n // per_host))]
even = len(set(host_sizes)) == 1


def inputs(rank, count, dtype, op):
    i = np.arange(count)
    if op == "prod":
        v = 1 + (rank + i) % 2
        return (np.where((rank * 5 + i) % 3 == 0, -v, v) if np.dtype(dtype).kind != "u"
                else v).astype(dtype)
    v = (rank * 7 + i * 3) % 11
    return (v - 5 if np.dtype(dtype).kind != "u" else v).astype(dtype)


def expected(count, dtype, op):
    data = np.stack([inputs(k, count, dtype, op).astype(np.int64) for k in range(n)])
    if op in ("sum", "avg"):
        total = data.sum(axis=0)
        if op == "avg":
            total = np.trunc(total / n) if np.dtype(dtype).kind in "iu" else total / n
        return total.astype(dtype)
    return {"prod": data.prod(axis=0), "min": data.min(axis=0),
            "max": data.max(axis=0)}[op].astype(dtype)


algorithms = ["hierarchical"] + (["two_dimensional"] if even else [])
for algorithm in algorithms:
    with mncl.HierarchicalCommunicator(world, algorithm=algorithm) as h:
        expect(h.intra_rank == position and h.intra_size == host_sizes[host],
               f"{algorithm}: intra rank/size")
        expect(h.num_hosts == len(host_sizes) and h.host_index == host, f"{algorithm}: hosts")
        # As ChainerMN's: the world's rank and size, object collectives, scatter_dataset.
        expect(h.rank == world.rank and h.size == n, f"{algorithm}: rank and size")
        expect(h.bcast_obj({"from": n - 1} if world.rank == n - 1 else None, root=n - 1)
               == {"from": n - 1}, f"{algorithm}: bcast_obj")
        expect(h.allreduce_obj(world.rank) == n * (n - 1) // 2, f"{algorithm}: allreduce_obj")
        shard = mncl.scatter_dataset(list(range(10)) if world.rank == 0 else None, h)
        begin, end = mncl.shard_range(10, n, world.rank)
        expect(shard == list(range(begin, end)), f"{algorithm}: scatter_dataset")
        expect(mncl.scatter_index(10 if world.rank == 0 else None, h) == (begin, end),
               f"{algorithm}: scatter_index")
        expect(mncl.synchronized_seed(h, 99 if world.rank == 1 % n else None, root=1 % n) == 99,
               f"{algorithm}: synchronized_seed")
        if os.environ.get("MNCL_TEST_HAVE_SHM") == "1":
            expect(h.intra.backend == "shm", f"{algorithm}: 'auto' within a host is shm")
        expect((h.inter is not None) == (algorithm == "two_dimensional" or position == 0),
               f"{algorithm}: who talks across hosts")
        for dtype in (np.int32, np.uint8, np.int64, np.float32, np.float64):
            for op in ("sum", "prod", "min", "max", "avg"):
                for count in (0, 1, 3, 7, 1031):
                    want = expected(count, dtype, op)
                    got = h.allreduce(inputs(r, count, dtype, op), op=op)
                    expect(got.dtype == want.dtype and np.array_equal(got, want),
                           f"{algorithm} {np.dtype(dtype)} {op} count {count}")
                    inout = inputs(r, count, dtype, op)
                    h.allreduce(inout, inout, op=op)
                    expect(np.array_equal(inout, want), f"{algorithm} in place {op} {count}")
        # float16 AVG: a host's 16-bit sum of 40000s would overflow to inf.
        big = h.allreduce(np.full(3, 40000, np.float16), op="avg")
        expect(np.all(big == np.float16(40000)), f"{algorithm}: float16 avg without overflow")
        # bfloat16 as raw bits, rounded once: 256 + (n - 1) ones.
        bits = mncl.to_bfloat16_bits(np.full(5, 256.0 if r == 0 else 1.0, np.float32))
        out = mncl.from_bfloat16_bits(h.allreduce(bits, op="sum", dtype="bfloat16"))
        want = mncl.from_bfloat16_bits(mncl.to_bfloat16_bits(np.float32(256 + n - 1)))
        expect(np.all(out == want), f"{algorithm}: bfloat16 rounded once")
        # Raw bits: float32 values as uint32 with dtype="float32", reduced as floats.
        raw = np.full(4, 1.5 + r, np.float32).view(np.uint32)
        got = h.allreduce(raw, op="max", dtype="float32")
        expect(got.dtype == np.uint32 and np.all(got.view(np.float32) == 0.5 + n),
               f"{algorithm}: raw float32 bits")
        # int8 sums wrap in the element type, as the library's: 100 per rank.
        wrapped = h.allreduce(np.full(3, 100, np.int8), op="sum")
        expect(np.all(wrapped == np.int8(np.int64(100 * n).astype(np.int8))),
               f"{algorithm}: int8 sum wraps")
        # Out of place into a given buffer, from a non-contiguous input.
        strided = np.arange(14, dtype=np.int64)[::2] + r
        into = np.empty(7, np.int64)
        back = h.allreduce(strided, into, op="sum")
        expect(back is into and np.array_equal(into, n * np.arange(14)[::2] + n * (n - 1) // 2),
               f"{algorithm}: out of place, non-contiguous input")
        expect_raises(ValueError, lambda: h.allreduce(np.zeros(3, np.float32),
                                                      np.zeros(2, np.float32)),
                      "recvbuf of another size", "elements")
        expect_raises(mncl.InvalidArgumentError, lambda: h.allreduce(np.zeros(2), op=9),
                      "op 9", "unknown reduction")
        if n > 1:
            # Every rank fails together: refused on the last rank only (RemoteError elsewhere,
            # not a wait until the timeout); avg on one rank and sum on the others, or 3
            # elements against 4 (a wrong result on every rank, once).
            last = n - 1
            bad = np.zeros(2, np.float32) if r == last else np.zeros(3, np.float32)
            expect_raises(ValueError if r == last else mncl.RemoteError,
                          lambda: h.allreduce(np.zeros(3, np.float32), bad),
                          f"{algorithm}: recvbuf refused on rank {last} only",
                          "elements" if r == last else f"rank {last}")
            for what, call in (
                    ("avg against sum",
                     lambda: h.allreduce(np.ones(4), op="avg" if r == last else "sum")),
                    ("3 elements against 4", lambda: h.allreduce(np.ones(3 if r == last else 4)))):
                expect_raises(mncl.InvalidArgumentError, call, f"{algorithm}: {what}",
                              "passed other arguments")
            expect(h.allreduce(np.ones(2), op="sum")[0] == n, f"{algorithm}: in step after")
        # ChainerMN's training helpers: gradients averaged through the hierarchy, in place
        # (rank q contributes q + 1, so the mean is (n + 1) / 2), parameters from the world.
        grads = [np.full((2, 3), r + 1.0, np.float32), np.full(4, 2.0 * (r + 1))]
        expect(h.multi_node_mean_grad(grads) is grads and
               np.all(grads[0] == np.float32((n + 1) / 2)) and np.all(grads[1] == n + 1.0),
               f"{algorithm}: multi_node_mean_grad")
        grads = [np.full(3, r + 1.0, np.float32)]
        h.multi_node_mean_grad(grads, grad_dtype="bfloat16")
        expect(np.all(grads[0] == np.float32((n + 1) / 2)),
               f"{algorithm}: multi_node_mean_grad through bfloat16")
        params = [np.full(2, float(r)), np.arange(3, dtype=np.int32) * r]
        h.bcast_data(params, root=n - 1)
        expect(np.all(params[0] == n - 1.0) and np.array_equal(params[1], np.arange(3) * (n - 1)),
               f"{algorithm}: bcast_data")
        expect(h.group_path == "", f"{algorithm}: the world's group path")
    # Closed (by the with block): the package's "closed" error, not an AttributeError of None.
    expect_raises(ValueError, lambda: h.allreduce(np.ones(2)),
                  f"{algorithm}: allreduce after close", "closed")
    for attribute in ("intra_rank", "intra_size"):
        expect_raises(ValueError, lambda: getattr(h, attribute),
                      f"{algorithm}: {attribute} after close", "closed")

# A rank leaving a `with` block on an exception aborts both groups (local) rather than closing
# them collectively, which waited for its host's ranks while they waited in their allreduce for
# it: they fail at once (their intra group is shm), not with a TimeoutError. The other hosts
# leave normally: their close is not held up by the rank that aborted.
# (naive passes no abort on: on it, they would still wait out the timeout.)
if os.environ.get("MNCL_TEST_HAVE_SHM") == "1":
    short = world.split_config(0, timeout=5)
    try:
        with mncl.HierarchicalCommunicator(short, intra_backend="shm") as h:
            if r == 0:
                time.sleep(0.1)  # its host's ranks are in their allreduce by now
                raise KeyError("a bug on rank 0")
            if host == 0:
                h.allreduce(np.ones(2))
        expect(host != 0, "an allreduce on rank 0's host finished without rank 0")
    except KeyError:
        expect(r == 0, "the KeyError on the rank that raised it")
    except (mncl.AbortedError, mncl.RemoteError):
        expect(host == 0 and r != 0, "AbortedError/RemoteError on rank 0's host")
    except mncl.MnclError as e:
        expect(False, f"an exception in a `with` block: {type(e).__name__}: {e}")
    expect(h.intra is None and h.inter is None, "left on an exception, both groups are freed")
    short.close()

# A group failing on one host: its error there, RemoteError elsewhere, the world goes on.
try:
    mncl.HierarchicalCommunicator(
        world, intra_backend="no-such-backend" if host == 0 else "auto")
    expect(False, "a failing host group was accepted")
except mncl.PluginError:
    expect(host == 0, "PluginError only on the failing host")
except mncl.RemoteError as e:
    expect(host != 0 and "failed on other ranks" in str(e), "RemoteError elsewhere")
expect(world.allreduce(np.array([1]))[0] == n, "the world after a failed construction")

if not even:
    expect_raises(mncl.InvalidArgumentError,
                  lambda: mncl.HierarchicalCommunicator(world, algorithm="two_dimensional"),
                  "hosts of different sizes", "same number of ranks")
expect(world.allreduce(np.array([1]))[0] == n, "the world at the end")
world.close()
checks.finish("all HierarchicalCommunicator checks passed")
