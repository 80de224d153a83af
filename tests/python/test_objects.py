"""Object collectives and dataset scattering of the mncl Python package (run under mncl-run -n N):
bcast_obj / gather_obj / allgather_obj / scatter_obj / allreduce_obj from every root, with
objects of different sizes per rank (empty, large, NumPy arrays, nested), against exact expected
values; an object that cannot be pickled fails every rank together (its own error there,
RemoteError naming it elsewhere) and the communicator works on; shard_range, scatter_index and
scatter_dataset (plain, shuffled, unequal shards) cover every sample once."""

import pickle
import threading

from checks import Checks, numpy_or_skip

np = numpy_or_skip()

import mncl


checks = Checks()
expect, expect_raises = checks.expect, checks.expect_raises

comm = mncl.Communicator()
r, n = comm.rank, comm.size
checks.rank = r


def obj_of(rank):
    """A different object per rank: sizes from a few bytes to ~100 KB, an empty one on rank 1."""
    if rank == 1:
        return {}
    return {"rank": rank, "text": "x" * (rank * 50000), "array": np.arange(rank + 3) * rank,
            "nested": [(rank, None), {"k": float(rank) / 3}]}


def same(a, b):
    """Deep equality that compares NumPy arrays by value."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and np.array_equal(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return (type(a) is type(b) and len(a) == len(b)
                and all(same(x, y) for x, y in zip(a, b)))
    return a == b


for root in range(n):
    got = comm.bcast_obj(obj_of(root) if r == root else "ignored", root=root)
    expect(same(got, obj_of(root)), f"bcast_obj from root {root}")
    got = comm.gather_obj(obj_of(r), root=root)
    if r == root:
        expect(isinstance(got, list) and len(got) == n
               and all(same(got[i], obj_of(i)) for i in range(n)), f"gather_obj root {root}")
    else:
        expect(got is None, f"gather_obj returns None off the root {root}")
    objs = [("for", i, obj_of(i)) for i in range(n)] if r == root else None
    expect(same(comm.scatter_obj(objs, root=root), ("for", r, obj_of(r))),
           f"scatter_obj from root {root}")

everyone = comm.allgather_obj(obj_of(r))
expect(len(everyone) == n and all(same(everyone[i], obj_of(i)) for i in range(n)),
       "allgather_obj")
expect(comm.bcast_obj(None) is None, "bcast_obj of None")

# allreduce_obj: scalars, arrays element-wise, a function; the same everywhere.
expect(comm.allreduce_obj(r + 1) == n * (n + 1) // 2, "allreduce_obj sum")
expect(comm.allreduce_obj(r + 1, op="prod") == int(np.prod(np.arange(1, n + 1))),
       "allreduce_obj prod")
expect(comm.allreduce_obj(r, op="max") == n - 1 and comm.allreduce_obj(r, op="min") == 0,
       "allreduce_obj max/min")
arr = np.array([r, -r, 2 * r], np.int64)
expect(np.array_equal(comm.allreduce_obj(arr, op="max"), [n - 1, 0, 2 * (n - 1)]),
       "allreduce_obj max of arrays is element-wise")
expect(comm.allreduce_obj([r], op=lambda a, b: a + b) == list(range(n)),
       "allreduce_obj with a function (lists concatenate in rank order)")
expect(comm.allreduce_obj({"loss": 0.5 * r, "n": 1},
                          op=lambda a, b: {k: a[k] + b[k] for k in a})
       == {"loss": 0.5 * n * (n - 1) / 2, "n": n}, "allreduce_obj of dicts by a function")
expect_raises(ValueError, lambda: comm.allreduce_obj(1, op="median"), "unknown op",
              "unknown reduction")

# An object that cannot be pickled (a lock) fails every rank together, then all goes on.
culprit = n - 1
for what, call in (
        ("bcast_obj", lambda obj: comm.bcast_obj(obj, root=culprit)),
        ("gather_obj", lambda obj: comm.gather_obj(obj, root=0)),
        ("allgather_obj", lambda obj: comm.allgather_obj(obj)),
        ("allreduce_obj", lambda obj: comm.allreduce_obj(obj, op=lambda a, b: a))):
    obj = threading.Lock() if r == culprit else "fine"
    if r == culprit:
        expect_raises(TypeError, lambda: call(obj), f"{what}: the culprit's own error", "pickle")
    else:
        expect_raises(mncl.RemoteError, lambda: call(obj), f"{what}: the others hear of it",
                      f"rank {culprit} failed")
    expect(comm.allreduce(np.array([1], np.int32))[0] == n, f"{what}: usable afterwards")
if r == culprit:
    expect_raises(TypeError, lambda: comm.scatter_obj([threading.Lock()] * n, root=culprit),
                  "scatter_obj: the root's own error", "pickle")
    expect_raises(ValueError, lambda: comm.scatter_obj([1] * (n + 1), root=culprit),
                  "scatter_obj: one object per rank", "one per rank")
else:
    for _ in range(2):
        expect_raises(mncl.RemoteError, lambda: comm.scatter_obj(None, root=culprit),
                      "scatter_obj: the others hear of it", f"rank {culprit} failed")
expect(comm.allreduce(np.array([1], np.int32))[0] == n, "usable after scatter_obj failures")

# shard_range: every sample once (or, equal length, each shard ceil(n/s) long and all covered).
for total in (0, 1, 7, 10, 101):
    for size in (1, 2, 3, 4, 7):
        parts = [mncl.shard_range(total, size, q, force_equal_length=False) for q in range(size)]
        expect(parts[0][0] == 0 and parts[-1][1] == total
               and all(parts[q][1] == parts[q + 1][0] for q in range(size - 1)),
               f"shard_range {total}/{size} is a partition")
        equal = [mncl.shard_range(total, size, q) for q in range(size)]
        expect(all(e - b == -(-total // size) and e <= total for b, e in equal)
               and (total == 0 or set().union(*(range(b, e) for b, e in equal))
                    == set(range(total))), f"shard_range {total}/{size} equal length")
expect(mncl.shard_range(10, 3, 0) == (0, 4) and mncl.shard_range(10, 3, 2) == (6, 10),
       "shard_range 10/3 as ChainerMN")
expect_raises(ValueError, lambda: mncl.shard_range(10, 3, 3), "shard_range rank out of range")

expect(mncl.scatter_index(10 if r == 0 else 999, comm) == mncl.shard_range(10, n, r),
       "scatter_index: the root's n counts")

dataset = [("sample", i, np.full(3, i)) for i in range(23)]
for shuffle, equal in ((False, True), (False, False), (True, False), (True, True)):
    shard = mncl.scatter_dataset(dataset if r == 0 else None, comm, shuffle=shuffle, seed=5,
                                 force_equal_length=equal)
    expect(all(isinstance(s, tuple) and s[0] == "sample" for s in shard),
           "scatter_dataset samples arrive whole")
    ids = comm.allgather_obj([s[1] for s in shard])
    flat = [i for part in ids for i in part]
    if equal:
        expect(all(len(part) == -(-23 // n) for part in ids), "equal-length shards")
        expect(set(flat) == set(range(23)), "equal-length shards cover every sample")
    else:
        expect(sorted(flat) == list(range(23)), f"shards hold every sample once (shuffle "
                                                f"{shuffle})")
    if not shuffle:
        begin, end = mncl.shard_range(23, n, r, equal)
        expect([s[1] for s in shard] == list(range(begin, end)), "unshuffled shard in order")
    else:
        again = mncl.scatter_dataset(dataset if r == 0 else None, comm, shuffle=True, seed=5,
                                     force_equal_length=equal)
        expect([s[1] for s in again] == [s[1] for s in shard], "the seed fixes the shuffle")


class Broken:
    def __len__(self):
        return 5

    def __getitem__(self, i):
        raise IndexError(f"sample {i} is missing")


if r == 0:
    expect_raises(IndexError, lambda: mncl.scatter_dataset(Broken(), comm),
                  "scatter_dataset: the root's own error", "missing")
else:
    expect_raises(mncl.RemoteError, lambda: mncl.scatter_dataset(None, comm),
                  "scatter_dataset: the others hear of it", "rank 0")
expect(pickle.loads(pickle.dumps(comm.allgather_obj(r))) == list(range(n)),
       "usable after a failed scatter_dataset")

comm.close()
checks.finish(f"object collectives and dataset scattering passed at {n} rank(s)")
