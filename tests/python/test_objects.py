"""Object collectives and dataset scattering of the mncl Python package (run under mncl-run -n N):
bcast_obj / gather_obj / allgather_obj / scatter_obj / allreduce_obj from every root, with
objects of different sizes per rank (empty, large, NumPy arrays, nested), against exact expected
values, whole and in small pieces (max_buf_len); send_obj/recv_obj around a ring; an object that
cannot be pickled, or unpickled on one rank, fails every rank together (its own error there,
RemoteError naming it elsewhere) and the communicator works on; shard_range, scatter_index (a bad
n fails every rank) and scatter_dataset (plain, shuffled as the C++ mncl::permutation, unequal
shards) cover every sample once."""

import enum
import pickle
import threading

from checks import world_and_checks

np, mncl, comm, checks = world_and_checks()
expect, expect_raises = checks.expect, checks.expect_raises
r, n = comm.rank, comm.size


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


# Whole (the default 256 MiB pieces), and in pieces of 4099 bytes: up to ~40 rounds, in which
# ranks run out of bytes at different rounds.
for piece in (None, 4099):
    for root in range(n):
        got = comm.bcast_obj(obj_of(root) if r == root else "ignored", max_buf_len=piece,
                             root=root)
        expect(same(got, obj_of(root)), f"bcast_obj from root {root}, pieces of {piece}")
        got = comm.gather_obj(obj_of(r), root=root, max_buf_len=piece)
        if r == root:
            expect(isinstance(got, list) and len(got) == n
                   and all(same(got[i], obj_of(i)) for i in range(n)),
                   f"gather_obj root {root}, pieces of {piece}")
        else:
            expect(got is None, f"gather_obj returns None off the root {root}")
        objs = [("for", i, obj_of(i)) for i in range(n)] if r == root else None
        expect(same(comm.scatter_obj(objs, root=root, max_buf_len=piece), ("for", r, obj_of(r))),
               f"scatter_obj from root {root}, pieces of {piece}")
    everyone = comm.allgather_obj(obj_of(r), max_buf_len=piece)
    expect(len(everyone) == n and all(same(everyone[i], obj_of(i)) for i in range(n)),
           f"allgather_obj, pieces of {piece}")
    # send_obj / recv_obj around a ring (even ranks send first, so a pair never waits on each
    # other; one rank: to itself is not allowed, so nothing).
    if n > 1:
        right, left = (r + 1) % n, (r - 1) % n
        if r % 2 == 0:
            comm.send_obj(("ring", r, obj_of(r)), right, max_buf_len=piece)
            got = comm.recv_obj(left, max_buf_len=piece)
        else:
            got = comm.recv_obj(left, max_buf_len=piece)
            comm.send_obj(("ring", r, obj_of(r)), right, max_buf_len=piece)
        expect(same(got, ("ring", left, obj_of(left))), f"send_obj/recv_obj, pieces of {piece}")
# ChainerMN's and mpi4py's third argument is a tag: refused before anything is sent (it was
# read as the chunk size: 0 raised on the sender only, 5 sent 5-byte chunks).
expect_raises(TypeError, lambda: comm.send_obj("x", (r + 1) % n, 0), "send_obj with a tag",
              "no tag")
expect_raises(TypeError, lambda: comm.recv_obj((r + 1) % n, tag=3), "recv_obj with a tag",
              "tag=3")
# Pieces of 7 bytes: small objects of different lengths (rank 0's ends first).
small = ("small", r, list(range(3 * r)))
expect(comm.allgather_obj(small, max_buf_len=7) == [("small", q, list(range(3 * q)))
                                                     for q in range(n)], "allgather_obj by 7 B")
expect(comm.bcast_obj(small, max_buf_len=7, root=n - 1)
       == ("small", n - 1, list(range(3 * (n - 1)))), "bcast_obj by 7 B")
expect_raises(ValueError, lambda: comm.bcast_obj(1, max_buf_len=0), "max_buf_len 0",
              "max_buf_len")
# A second positional argument is the chunk size in ChainerMN's order, the root in mpi4py's and
# torch's: refused on every rank before anything moves (it was once read as the chunk size, a
# silent broadcast from rank 0).
expect_raises(TypeError, lambda: comm.bcast_obj("x", 1), "bcast_obj(obj, 1)", "keyword only")
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
expect(comm.allreduce_obj(float(r), op="avg") == (n - 1) / 2, "allreduce_obj avg")


# The reductions as allreduce takes them: by an enum member's name (never its value, nor a str
# Enum's value), torch's "PRODUCT", MNCL's own code.
class TorchLikeOp(enum.IntEnum):
    SUM = 0
    AVG = 1
    PRODUCT = 2


class Named(str, enum.Enum):
    MAX = "min"


expect(comm.allreduce_obj(r + 1, op=TorchLikeOp.AVG) == (n + 1) / 2, "allreduce_obj op=AVG enum")
expect(comm.allreduce_obj(r + 1, op="PRODUCT") == int(np.prod(np.arange(1, n + 1))),
       "allreduce_obj op='PRODUCT'")
expect(comm.allreduce_obj(r, op=Named.MAX) == n - 1, "allreduce_obj by a str Enum's name")
expect(comm.allreduce_obj(r + 1, op=1) == int(np.prod(np.arange(1, n + 1))),
       "allreduce_obj op=1 (MNCL's prod)")
expect(int(comm.allreduce(np.array([r]), op=Named.MAX)[0]) == n - 1,
       "allreduce by a str Enum's name, not its value")
expect_raises(ValueError, lambda: comm.allreduce_obj(1, op="median"), "unknown op",
              "unknown reduction")


def load_fails_on(rank):
    """Unpickling calls this: it raises on `rank` only (as a class missing there would)."""
    if comm.rank == rank:
        raise ImportError(f"no such class on rank {rank}")
    return "loaded"


class LoadsOnlyOffRank:
    def __init__(self, rank):
        self.rank = rank

    def __reduce__(self):
        return (load_fails_on, (self.rank,))


# An object that pickles but cannot be unpickled on one rank: that rank raises its error, all
# others RemoteError naming it, together (none returns while another raises).
victim = 1 % n
for what, call in (
        ("bcast_obj", lambda: comm.bcast_obj(LoadsOnlyOffRank(victim), root=(victim + 1) % n)),
        ("allgather_obj", lambda: comm.allgather_obj(LoadsOnlyOffRank(victim))),
        ("gather_obj", lambda: comm.gather_obj(LoadsOnlyOffRank(victim), root=victim)),
        ("scatter_obj", lambda: comm.scatter_obj([LoadsOnlyOffRank(victim)] * n, root=victim))):
    if n == 1 and what == "bcast_obj":
        continue  # the root does not unpickle its own object
    if r == victim:
        expect_raises(ImportError, call, f"{what}: the rank that cannot unpickle", "no such class")
    else:
        expect_raises(mncl.RemoteError, call, f"{what}: the others hear of it",
                      f"rank {victim} could not unpickle")

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
                      f"rank {culprit} could not pickle")
    expect(comm.allreduce(np.array([1], np.int32))[0] == n, f"{what}: usable afterwards")
if r == culprit:
    expect_raises(TypeError, lambda: comm.scatter_obj([threading.Lock()] * n, root=culprit),
                  "scatter_obj: the root's own error", "pickle")
    expect_raises(ValueError, lambda: comm.scatter_obj([1] * (n + 1), root=culprit),
                  "scatter_obj: one object per rank", "one per rank")
else:
    for _ in range(2):
        expect_raises(mncl.RemoteError, lambda: comm.scatter_obj(None, root=culprit),
                      "scatter_obj: the others hear of it", f"rank {culprit} could not provide")
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
expect([mncl.shard_range(10, 3, q, force_equal_length=False) for q in range(3)]
       == [(0, 4), (4, 7), (7, 10)], "disjoint shard_range 10/3 as ChainerMN's _scatter_index")
expect_raises(ValueError, lambda: mncl.shard_range(10, 3, 3), "shard_range rank out of range")

expect(mncl.scatter_index(10 if r == 0 else 999, comm) == mncl.shard_range(10, n, r),
       "scatter_index: the root's n counts")
for bad in (None, -1, 2**70, 10.5):
    if r == 0:
        expect_raises((TypeError, ValueError), lambda: mncl.scatter_index(bad, comm),
                      f"scatter_index({bad!r}): the root's own error")
    else:
        expect_raises(mncl.RemoteError, lambda: mncl.scatter_index(10, comm),
                      f"scatter_index({bad!r}): the others hear of it", "rank 0")

# synchronized_seed: the root's seed (or its fresh one) everywhere; a bad one fails together.
for root in range(n):
    mine = mncl.synchronized_seed(comm, 12345 + r, root=root)
    expect(mine == 12345 + root, f"synchronized_seed: root {root}'s seed, got {mine}")
    fresh = mncl.synchronized_seed(comm, root=root)
    everyone = comm.allgather(np.array([fresh], np.int64)).ravel()
    expect(0 <= fresh < 2**63 and all(everyone == fresh), f"fresh seed of root {root}: {everyone}")
    order = np.random.default_rng(fresh).permutation(50)
    expect(all((comm.allgather(order) == order).ravel()), "one shuffle order on every rank")
for bad in (-3, 2**63, "7", 1.0, True):
    if r == 0:
        expect_raises((TypeError, ValueError), lambda: mncl.synchronized_seed(comm, bad),
                      f"synchronized_seed({bad!r}): the root's own error")
    else:
        expect_raises(mncl.RemoteError, lambda: mncl.synchronized_seed(comm, 1),
                      f"synchronized_seed({bad!r}): the others hear of it", "rank 0")
expect(mncl.synchronized_seed(comm, 0) == 0, "seed 0, after the failures")

# The shuffle is the C++ frontends' mncl::permutation (std::mt19937_64, Fisher-Yates by
# rejection): the standard's check value of mt19937_64, and permutation(10, 7) as the C++ gives
# it (frontends_unit_test pins the same list).
engine = mncl.datasets._MT19937_64(5489)
for _ in range(9999):
    engine()
expect(engine() == 9981545732273789042, "mt19937_64: the 10000th value of the default seed")
expect(mncl.permutation(10, 7) == [0, 7, 4, 9, 3, 1, 2, 8, 6, 5], "permutation(10, 7) as C++")

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
    begin, end = mncl.shard_range(23, n, r, equal)
    order = mncl.permutation(23, 5) if shuffle else list(range(23))
    expect([s[1] for s in shard] == order[begin:end], f"shard in order (shuffle {shuffle})")
expect(mncl.permutation(23, 5) != list(range(23)), "the shuffle moves samples")


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
