"""ChainerMN's training helpers, for lists of arrays from any framework: bcast_data (the root's
parameters onto every rank), multi_node_mean_grad (gradients averaged over the ranks, in as few
calls as there are dtypes, optionally sent as float16/bfloat16), Evaluator (metrics averaged
over every sample of every rank) and multi_node_iterator (one rank reads, every rank gets the
batches). Communicator and HierarchicalCommunicator have bcast_data and multi_node_mean_grad
as methods.

Every call ends alike on every rank: the ranks first agree on what they pass (one allgather of
two int64 per rank), so arrays refused on one rank (not contiguous, read-only, a list of other
shapes or dtypes than the others') raise there and RemoteError elsewhere, or, when the ranks
pass different layouts, InvalidArgumentError naming them on every rank; nothing has moved then.
"""

import hashlib
import operator

import numpy as np

from ._cuda import CudaArray, is_cuda_array
from ._dtypes import from_bfloat16_bits, to_bfloat16_bits
from ._objects import _fail_together
from .errors import InvalidArgumentError, RemoteError

GRAD_DTYPES = ("float16", "bfloat16", "float32", "float64")


def _is_float(dtype):
    """float16/32/64, and ml_dtypes' bfloat16 (whose kind is 'V')."""
    return dtype.kind == "f" or dtype.name == "bfloat16"


def _layout(arrays, what, host_only):
    """(list of arrays, their layout as a tuple) for this rank's arrays; raises TypeError or
    ValueError naming the first array refused. Checks what the library would refuse on this
    rank alone (contiguity, writeability, a CUDA array's interface, arrays sharing memory), so
    that it is refused before the ranks agree, never after."""
    if isinstance(arrays, np.ndarray) or is_cuda_array(arrays):
        raise TypeError(f"mncl: {what} takes a list of arrays, not one array")
    arrays = list(arrays)
    layout, extents = [], []
    for i, a in enumerate(arrays):
        if is_cuda_array(a):
            if host_only:
                raise TypeError(f"mncl: {what}: array {i} is a CUDA array; {host_only}")
            cuda = CudaArray(a, f"{what}: array {i}", writeable=True)
            layout.append(("cuda", cuda.dtype.str, cuda.shape))
            extents.append((cuda.ptr, cuda.nbytes, i, "cuda"))
            continue
        if not isinstance(a, np.ndarray):
            raise TypeError(f"mncl: {what}: array {i} is a {type(a).__name__}, not a NumPy or "
                            f"CUDA array (for a CPU tensor pass tensor.numpy(), its memory)")
        if not a.flags.c_contiguous or not a.flags.writeable:
            raise ValueError(f"mncl: {what}: array {i} must be C-contiguous and writeable "
                             f"(its values are replaced in place)")
        dtype = a.dtype  # .str tells every dtype apart but opaque ones (ml_dtypes' bfloat16)
        layout.append((dtype.str if dtype.kind != "V" else dtype.name, a.shape))
        extents.append((a.ctypes.data, a.nbytes, i, "host"))
    # Each array is written in place once: two that share memory (one array listed twice,
    # overlapping views) would be averaged into each other.
    extents = sorted(e for e in extents if e[1] > 0)
    for (start, size, i, kind), (next_start, _, j, next_kind) in zip(extents, extents[1:]):
        if kind == next_kind and next_start < start + size:
            raise ValueError(f"mncl: {what}: arrays {min(i, j)} and {max(i, j)} share memory "
                             f"(one array listed twice, or overlapping views)")
    return arrays, tuple(layout)


def _digest(layout):
    """63 bits of a hash of the layout (an int64 that no rank's flag can be mistaken for)."""
    raw = hashlib.blake2b(repr(layout).encode(), digest_size=8).digest()
    return int.from_bytes(raw, "little") >> 1


def _agree(world, what, layout, error, reference=0):
    """Collective over world: raises on every rank when some rank's arguments were refused
    (error, its own, raised there) or when the layouts differ from rank `reference`'s."""
    mine = np.array([0 if error is None else 1, 0 if error is not None else _digest(layout)],
                    np.int64)
    table = world.allgather(mine).reshape(world.size, 2)
    _fail_together(what, [r for r in range(world.size) if table[r, 0]], error,
                   "take part: its arguments were refused")
    differ = [r for r in range(world.size) if table[r, 1] != table[reference, 1]]
    if differ:
        plural = "s" if len(differ) > 1 else ""
        raise InvalidArgumentError(
            f"mncl: {what}: rank{plural} {', '.join(map(str, differ))} passed other arguments "
            f"than rank {reference} (the number, shapes or dtypes of the arrays, or the other "
            f"arguments); nothing was moved",
            status_name="MNCL_ERR_INVALID_ARGUMENT")


def _groups(arrays, key):
    """The arrays by key(array), in order of first appearance: [(key, [arrays])]."""
    groups = {}
    for a in arrays:
        groups.setdefault(key(a), []).append(a)
    return list(groups.items())


def _pack(arrays, dtype):
    """One flat array of `dtype` holding the arrays' elements one after another."""
    out = np.empty(sum(a.size for a in arrays), dtype)
    offset = 0
    for a in arrays:
        out[offset:offset + a.size] = a.reshape(-1)
        offset += a.size
    return out


def _unpack(flat, arrays):
    """The inverse of _pack, into the arrays' own memory (cast to their dtypes)."""
    offset = 0
    for a in arrays:
        a.reshape(-1)[...] = flat[offset:offset + a.size].astype(a.dtype, copy=False)
        offset += a.size


def bcast_data(comm, arrays, root=0):
    """Collective: the root's arrays copied into every rank's arrays of the same shapes and
    dtypes, in place (ChainerMN's comm.bcast_data(model), e.g. the initial parameters). Host
    arrays of one dtype travel in one broadcast; CUDA arrays one by one."""
    what = "bcast_data"
    layout, error = None, None
    try:
        root = operator.index(root)
        if not 0 <= root < comm.size:
            raise InvalidArgumentError(f"mncl: {what}: root {root} is not a rank of "
                                       f"{comm.size}", status_name="MNCL_ERR_INVALID_ARGUMENT")
        items, layout = _layout(arrays, what, None)
        layout = (root, layout)
    except Exception as e:  # noqa: BLE001 (raised here once every rank knows)
        error = e
    _agree(comm, what, layout, error)
    host = [a for a in items if not is_cuda_array(a)]
    for dtype, group in _groups(host, lambda a: a.dtype):
        if len(group) == 1:
            comm._bcast_in_place(group[0], root=root)
            continue
        flat = _pack(group, dtype) if comm.rank == root else np.empty(
            sum(a.size for a in group), dtype)
        comm._bcast_in_place(flat, root=root)
        if comm.rank != root:
            _unpack(flat, group)
    for a in items:
        if is_cuda_array(a):
            comm._bcast_in_place(a, root=root)
    return arrays


def multi_node_mean_grad(comm, grads, *, grad_dtype=None):
    """Collective: each gradient replaced, in place, by its mean over the ranks (ChainerMN's
    comm.multi_node_mean_grad; the same as one process's gradient of the ranks' batches
    together, when they are of one size). Without grad_dtype, one allreduce_coalesced per dtype
    (CUDA arrays included): the result is the library's AVG in that dtype. grad_dtype
    ("float16", "bfloat16", "float32" or "float64"; ChainerMN's allreduce_grad_dtype) packs
    every gradient, cast to it, into one message: float16 or bfloat16 halves the bytes sent
    for float32 gradients at the cost of their precision (host arrays of floats only). comm
    may be a HierarchicalCommunicator (host arrays only): one packed allreduce per dtype."""
    world = getattr(comm, "world", comm)  # a HierarchicalCommunicator's ranks agree on its world
    what = "multi_node_mean_grad"
    layout, error = None, None
    try:
        if grad_dtype is not None and grad_dtype not in GRAD_DTYPES:
            raise ValueError(f"mncl: {what}: grad_dtype {grad_dtype!r} is not one of "
                             f"{GRAD_DTYPES} (or None)")
        host_only = getattr(comm, "_host_only", None) or (
            grad_dtype is not None and "grad_dtype casts on the host")
        items, layout = _layout(grads, what, host_only)
        if grad_dtype is not None:
            for i, a in enumerate(items):
                if not _is_float(a.dtype):
                    raise TypeError(f"mncl: {what}: gradient {i} is {a.dtype}; grad_dtype "
                                    f"takes floating-point gradients only")
        layout = (grad_dtype, layout)
    except Exception as e:  # noqa: BLE001 (raised here once every rank knows)
        error = e
    _agree(world, what, layout, error)
    if not items:
        return grads
    if grad_dtype is None:
        dtype_of = (lambda a: ("cuda", a.__cuda_array_interface__["typestr"])
                    if is_cuda_array(a) else a.dtype)
        for _, group in _groups(items, dtype_of):
            if hasattr(comm, "allreduce_coalesced"):
                comm.allreduce_coalesced(group, group, op="avg")
            else:  # HierarchicalCommunicator: one packed allreduce
                flat = _pack(group, group[0].dtype)
                comm.allreduce(flat, flat, op="avg")
                _unpack(flat, group)
        return grads
    wide = np.float64 if any(a.dtype == np.float64 for a in items) else np.float32
    values = _pack(items, wide)
    if grad_dtype == "bfloat16":
        bits = to_bfloat16_bits(values)
        comm.allreduce(bits, bits, op="avg", dtype="bfloat16")
        values = from_bfloat16_bits(bits)
    else:
        sent = values.astype(grad_dtype)
        comm.allreduce(sent, sent, op="avg")
        values = sent
    _unpack(values, items)
    return grads


class Evaluator:
    """Multi-node evaluation (ChainerMN's create_multi_node_evaluator, the C++ mncl::Evaluator):
    every rank evaluates its own shard, and the metrics are averaged over the ranks weighted by
    how many samples each one saw, so the result equals one process evaluating every shard.
    The shards must be disjoint for that (scatter_dataset(..., force_equal_length=False)):
    ChainerMN averages each rank's mean unweighted, which differs where shards are uneven.

        evaluator = mncl.Evaluator(comm)
        metrics = evaluator.evaluate(test_shard, 256, lambda batch: {"loss": ..., "acc": ...})
    """

    def __init__(self, comm):
        self.comm = comm

    def average(self, local_means, local_samples):
        """Collective: {name: the sample-weighted mean over the ranks of each rank's mean}.
        Ranks with samples pass the same names (else InvalidArgumentError on every rank); what a
        rank without samples passes is ignored. No samples anywhere: {}. Arguments refused on
        one rank (a negative count, a value that is no number) raise there and RemoteError on
        the others."""
        return self._average(local_means, local_samples, None)

    def _average(self, local_means, local_samples, failure):
        comm = self.comm
        names, values, samples = [], [], 0
        if failure is None:
            try:
                samples = operator.index(local_samples)
                if samples < 0:
                    raise ValueError(f"mncl: Evaluator.average: negative sample count "
                                     f"{local_samples}")
                if samples:
                    names = sorted(local_means)
                    values = [float(local_means[k]) for k in names]
                    np.array(values, np.float64) * samples  # as the allreduce will take them
            except Exception as e:  # noqa: BLE001 (raised here once every rank knows)
                failure, names, values, samples = e, [], [], 0
        # min(hash), min(~hash) (a max as a min), the first reporting rank and the first rank
        # that failed, in one allreduce; the hash is mncl::Evaluator's FNV-1a of the names.
        neutral = (1 << 64) - 1
        digest = _fnv1a(names)
        agree = np.array([digest if samples else neutral, ~digest & neutral if samples else neutral,
                          comm.rank if samples else comm.size,
                          comm.rank if failure is not None else comm.size], np.uint64)
        comm.allreduce(agree, agree, op="min")
        if int(agree[3]) != comm.size:
            _fail_together("Evaluator", [int(agree[3])], failure, "evaluate")
        if int(agree[2]) == comm.size:
            return {}
        if int(agree[0]) != ~int(agree[1]) & neutral:
            raise InvalidArgumentError("mncl: Evaluator.average: the ranks report different "
                                       "metric names", status_name="MNCL_ERR_INVALID_ARGUMENT")
        # Ranks that report nothing learn the names from the first one that does.
        names = comm.bcast_obj(names, root=int(agree[2]))
        sums = np.array([samples] + ([v * samples for v in values] if samples else
                                     [0.0] * len(names)), np.float64)
        comm.allreduce(sums, sums, op="sum")
        total = sums[0]
        return {k: float(sums[i + 1] / total) if total > 0 else float("nan")
                for i, k in enumerate(names)}

    def evaluate(self, shard, batch_size, evaluate_batch):
        """Collective: evaluate_batch(samples) -> {name: mean over those samples} over the shard
        in batches of batch_size (slices of it), then average() over every rank's samples. An
        evaluate_batch that raises on one rank raises there and RemoteError on the others; so
        does a batch that reports other metric names than the rank's first batch (a metric of
        some batches only would be divided by every sample: a mean biased toward zero)."""
        sums, n, failure = {}, 0, None
        try:
            batch_size = operator.index(batch_size)
            if batch_size <= 0:
                raise ValueError(f"mncl: Evaluator.evaluate: batch_size must be positive, not "
                                 f"{batch_size}")
            n = len(shard)
            first = None
            for begin in range(0, n, batch_size):
                batch = shard[begin:begin + batch_size]
                metrics = evaluate_batch(batch)
                names = sorted(map(str, metrics))
                if first is None:
                    first = names
                elif names != first:
                    raise ValueError(f"mncl: Evaluator.evaluate: the batch from sample {begin} "
                                     f"reports the metrics {names}, the first batch {first}: "
                                     f"every batch must report the same ones")
                for name, value in metrics.items():
                    sums[name] = sums.get(name, 0.0) + float(value) * len(batch)
        except Exception as e:  # noqa: BLE001 (raised on this rank after the others learn it)
            failure = e
        return self._average({k: v / n for k, v in sums.items()} if n else {}, n, failure)


def _fnv1a(names):
    """FNV-1a (64 bits) over the names, each with its terminating NUL: mncl::Evaluator's."""
    h = 0xCBF29CE484222325
    for name in names:
        for byte in str(name).encode() + b"\0":
            h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


_ITEM, _END, _FAILED = 0, 1, 2


def multi_node_iterator(iterable, comm, root=0, max_buf_len=None):
    """Collective generator (ChainerMN's create_multi_node_iterator): the root iterates
    `iterable` (pass None elsewhere) and every rank gets each item, pickled through bcast_obj;
    e.g. a pipeline whose first stage alone reads the data, while the others need the labels
    or the batch count. Every rank must consume it to the same point (a rank that stops early
    leaves the others in their next broadcast). An iterable that fails on the root fails every
    rank: the root raises its error, the others RemoteError."""
    iterator = None
    while True:
        message, failure = None, None
        if comm.rank == root:
            try:
                if iterator is None:
                    iterator = iter(iterable)
                message = (_ITEM, next(iterator))
            except StopIteration:
                message = (_END, None)
            except Exception as e:  # noqa: BLE001 (told to every rank, raised here)
                failure = e
                message = (_FAILED, f"{type(e).__name__}: {e}")
        kind, item = comm.bcast_obj(message, max_buf_len=max_buf_len, root=root)
        if kind == _END:
            return
        if kind == _FAILED:
            if failure is not None:
                raise failure
            raise RemoteError(f"mncl: multi_node_iterator: the iterable failed on the root "
                              f"(rank {root}): {item}", status_name="MNCL_ERR_REMOTE")
        yield item
