"""ChainerMN's dataset scattering: every rank gets its shard of a dataset that only the root
holds (scatter_dataset), or just the index range of its shard (scatter_index). The arithmetic is
the C++ frontends' (mncl::shard_range), and ChainerMN's: with force_equal_length (the default),
ceil(n / s) samples from floor(n r / s), so that every rank runs the same number of steps (the
last shards then share a few samples); without, disjoint shards of n // s samples, the first
n % s ranks one more ([0, 4) [4, 7) [7, 10) for 10 over 3; MNCL once gave [0, 3) [3, 6)
[6, 10)). The shuffle is the C++
frontends' too (mncl::permutation: Fisher-Yates on std::mt19937_64), so a Python job and a C++
job with the same seed cut the same shards."""

import operator
import os

import numpy as np

from .errors import RemoteError

_MASK64 = (1 << 64) - 1


class _MT19937_64:
    """std::mt19937_64, which the C++ frontends shuffle with (NumPy has only the 32-bit MT)."""

    _N, _M = 312, 156

    def __init__(self, seed):
        mt = [int(seed) & _MASK64]
        for i in range(1, self._N):
            mt.append((6364136223846793005 * (mt[-1] ^ (mt[-1] >> 62)) + i) & _MASK64)
        self._mt, self._index = mt, self._N

    def _twist(self):
        mt, n, m = self._mt, self._N, self._M
        for i in range(n):
            x = (mt[i] & 0xFFFFFFFF80000000) | (mt[(i + 1) % n] & 0x7FFFFFFF)
            mt[i] = mt[(i + m) % n] ^ (x >> 1) ^ (0xB5026F5AA96619E9 if x & 1 else 0)
        self._index = 0

    def __call__(self):
        if self._index >= self._N:
            self._twist()
        y = self._mt[self._index]
        self._index += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & _MASK64


def permutation(n, seed):
    """A permutation of range(n) that depends only on the seed: mncl::permutation's (unbiased
    bounded draws by rejection), element for element."""
    order = list(range(int(n)))
    engine = _MT19937_64(seed)
    for i in range(len(order), 1, -1):
        limit = _MASK64 - _MASK64 % i
        draw = engine()
        while draw >= limit:
            draw = engine()
        j = draw % i
        order[i - 1], order[j] = order[j], order[i - 1]
    return order


def shard_range(n, size, rank, force_equal_length=True):
    """(begin, end) of rank's shard of n samples over size ranks (no communication)."""
    n, size, rank = operator.index(n), operator.index(size), operator.index(rank)
    if size <= 0 or not 0 <= rank < size:
        raise ValueError(f"mncl: shard_range: rank {rank} is out of range for size {size}")
    if n < 0:
        raise ValueError(f"mncl: shard_range: negative sample count {n}")
    if force_equal_length:
        begin = n * rank // size
        return begin, begin + -(-n // size)
    begin = rank * (n // size) + min(rank, n % size)  # ChainerMN's: the first n % size get one more
    return begin, begin + n // size + (1 if rank < n % size else 0)


def _root_count(comm, value, root, what, meaning):
    """Collective: root's value, an integer in [0, 2**63), on every rank. A root value that is
    none (negative, not an integer, past int64) raises there and RemoteError elsewhere."""
    total = np.array([-1], np.int64)
    error = None
    if comm.rank == root:
        try:
            if isinstance(value, bool):
                raise TypeError(f"mncl: {what}: {value!r} is not {meaning}")
            count = operator.index(value)
            if not 0 <= count < 2**63:
                raise ValueError(f"mncl: {what}: {count} is not {meaning} (0 to 2**63 - 1)")
            total[0] = count
        except Exception as e:  # noqa: BLE001 (raised once the others have heard of it)
            error = e
    comm._bcast_in_place(total, root=root)
    if total[0] < 0:
        if error is not None:
            raise error
        raise RemoteError(f"mncl: {what}: the root (rank {root}) passed no {meaning} (the cause "
                          f"is raised there)")
    return int(total[0])


def scatter_index(n, comm, root=0, force_equal_length=True):
    """Collective: (begin, end) of this rank's shard of the root's n samples (only the root's
    n counts). A root n that is not a count (negative, not an integer, past int64) fails every
    rank together."""
    total = _root_count(comm, n, root, "scatter_index", "a sample count")
    return shard_range(total, comm.size, comm.rank, force_equal_length)


def synchronized_seed(comm, seed=None, *, root=0):
    """Collective: the root's seed (seed there, or fresh entropy where it is None) on every rank,
    an int in [0, 2**63): what ChainerMN's create_synchronized_iterator shares, for any shuffle,
    so that every rank draws the same order, e.g. every stage of a model-parallel chain the same
    batches: ``np.random.default_rng(mncl.synchronized_seed(comm))``,
    ``torch.Generator().manual_seed(...)``, ``permutation(n, ...)``. seed is read on the root
    only; one that is not an int in that range fails every rank together."""
    if comm.rank == root and seed is None:
        seed = int.from_bytes(os.urandom(8), "little") >> 1
    return _root_count(comm, seed, root, "synchronized_seed", "a seed")


def scatter_dataset(dataset, comm, root=0, shuffle=False, seed=None, force_equal_length=True,
                    max_buf_len=None):
    """Collective: this rank's shard of the root's dataset, as a list of samples.

    dataset is read on the root only (pass None elsewhere): anything with len() and indexing by
    int, whose samples pickle. shuffle permutes the samples first, on the root, by
    permutation(n, seed) (seed None: a fresh random one). The shards travel in one scatter_obj
    (in pieces of max_buf_len bytes): while they are sent the root holds the pickled shards as
    well as the dataset. A dataset that fails on the root (len(), indexing) or a sample that
    cannot be pickled fails every rank together."""
    def shards():
        # A generator: scatter_obj runs it inside its own error handling, so a failure here
        # fails every rank together instead of leaving them waiting.
        n = len(dataset)
        order = None
        if shuffle:
            order = permutation(n, int.from_bytes(os.urandom(8), "little") if seed is None
                                else seed)
        for rank in range(comm.size):
            begin, end = shard_range(n, comm.size, rank, force_equal_length)
            indices = range(begin, end) if order is None else order[begin:end]
            yield [dataset[i] for i in indices]

    return comm.scatter_obj(shards() if comm.rank == root else None, root=root,
                            max_buf_len=max_buf_len)
