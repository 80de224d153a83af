"""ChainerMN's dataset scattering: every rank gets its shard of a dataset that only the root
holds (scatter_dataset), or just the index range of its shard (scatter_index). The arithmetic is
the C++ frontends' (mncl::shard_range): rank r of s gets [floor(n r / s), floor(n (r + 1) / s)),
or, with force_equal_length, ceil(n / s) samples from floor(n r / s), so that every rank runs the
same number of steps (the last shards then share a few samples)."""

import numpy as np


def shard_range(n, size, rank, force_equal_length=True):
    """(begin, end) of rank's shard of n samples over size ranks (no communication)."""
    n, size, rank = int(n), int(size), int(rank)
    if size <= 0 or not 0 <= rank < size:
        raise ValueError(f"mncl: shard_range: rank {rank} is out of range for size {size}")
    if n < 0:
        raise ValueError(f"mncl: shard_range: negative sample count {n}")
    begin = n * rank // size
    if force_equal_length:
        return begin, begin + -(-n // size)
    return begin, n * (rank + 1) // size


def scatter_index(n, comm, root=0, force_equal_length=True):
    """Collective: (begin, end) of this rank's shard of the root's n samples (only the root's
    n counts)."""
    total = np.array([n if comm.rank == root else 0], np.int64)
    comm.bcast(total, root=root)
    return shard_range(int(total[0]), comm.size, comm.rank, force_equal_length)


def scatter_dataset(dataset, comm, root=0, shuffle=False, seed=None, force_equal_length=True):
    """Collective: this rank's shard of the root's dataset, as a list of samples.

    dataset is read on the root only (pass None elsewhere): anything with len() and indexing by
    int, whose samples pickle. shuffle permutes the samples first, on the root, from seed (None:
    a fresh random one). The shards travel in one scatter_obj, so the root holds the pickled
    dataset once more while it is sent; a dataset that fails (len, indexing) or a sample that
    cannot be pickled fails every rank together."""
    def shards():
        # A generator: scatter_obj runs it inside its own error handling, so a failure here
        # (len(), indexing) fails every rank together instead of leaving them waiting.
        n = len(dataset)
        order = np.random.default_rng(seed).permutation(n) if shuffle else None
        for rank in range(comm.size):
            begin, end = shard_range(n, comm.size, rank, force_equal_length)
            indices = range(begin, end) if order is None else order[begin:end]
            yield [dataset[int(i)] for i in indices]

    return comm.scatter_obj(shards() if comm.rank == root else None, root=root)
