"""Collectives on Python objects (ChainerMN's bcast_obj, gather_obj, allreduce_obj; PyTorch's
broadcast_object_list, all_gather_object...): each object travels pickled, as bytes, in the
array collectives. Every rank first learns every sender's byte count, so an object that cannot
be pickled fails every rank together: the sender raises its own error, the others
mncl.RemoteError naming the sender, and nobody waits for bytes that never come.

Pickle runs code on load: use these only among processes that trust each other (the ranks of
one job), as ChainerMN and PyTorch do.
"""

import functools
import operator
import pickle

import numpy as np

from .errors import RemoteError

_FAILED = -1  # a byte count that says "this rank could not pickle its object"


def _dumps(obj):
    """The pickled bytes as a uint8 array, or (None, the exception)."""
    try:
        # A bytearray: the root's buffer of a bcast must be writeable.
        data = bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
        return np.frombuffer(data, np.uint8), None
    except Exception as error:  # noqa: BLE001 (any pickling failure is reported to every rank)
        return None, error


def _raise_for_failures(comm, what, counts, own_error, senders):
    """Raises on every rank when some rank could not pickle: its own error on that rank,
    RemoteError naming the ranks elsewhere."""
    failed = [senders[i] for i, c in enumerate(counts) if c == _FAILED]
    if not failed:
        return
    if own_error is not None:
        raise own_error
    ranks = ", ".join(str(r) for r in failed)
    plural = len(failed) > 1
    raise RemoteError(f"mncl: {what}: rank{'s' if plural else ''} {ranks} failed to provide "
                      f"{'their objects' if plural else 'its object'} (the cause is raised "
                      f"there)")


def _loads_all(data, counts):
    objs, offset = [], 0
    for c in counts:
        objs.append(pickle.loads(memoryview(data[offset:offset + c])))
        offset += c
    return objs


class ObjectCollectives:
    """The object collectives of Communicator (mixed into it)."""

    def bcast_obj(self, obj=None, root=0):
        """root's obj on every rank (obj is ignored elsewhere)."""
        own_error = None
        header = np.zeros(1, np.int64)
        if self.rank == root:
            data, own_error = _dumps(obj)
            header[0] = _FAILED if data is None else data.size
        self.bcast(header, root=root)
        _raise_for_failures(self, "bcast_obj", header, own_error, [root])
        if self.rank != root:
            data = np.empty(int(header[0]), np.uint8)
        self.bcast(data, root=root)
        return obj if self.rank == root else pickle.loads(memoryview(data))

    def allgather_obj(self, obj):
        """Every rank's obj, as a list in rank order, on every rank."""
        data, own_error = _dumps(obj)
        counts = self.allgather(np.array([_FAILED if data is None else data.size], np.int64))
        counts = [int(c) for c in counts.ravel()]
        _raise_for_failures(self, "allgather_obj", counts, own_error, list(range(self.size)))
        return _loads_all(self.allgatherv(data, counts), counts)

    def gather_obj(self, obj, root=0):
        """Every rank's obj, as a list in rank order, on root; None elsewhere. The byte counts
        go to every rank (an allgather of one integer), so that a failure anywhere fails all."""
        data, own_error = _dumps(obj)
        counts = self.allgather(np.array([_FAILED if data is None else data.size], np.int64))
        counts = [int(c) for c in counts.ravel()]
        _raise_for_failures(self, "gather_obj", counts, own_error, list(range(self.size)))
        gathered = self.gatherv(data, counts if self.rank == root else None, root=root)
        return _loads_all(gathered, counts) if self.rank == root else None

    def scatter_obj(self, objs=None, root=0):
        """root's objs[r] on rank r: root passes a sequence of exactly size objects (objs is
        ignored elsewhere)."""
        own_error, pieces = None, []
        header = np.zeros(self.size, np.int64)
        if self.rank == root:
            try:
                objs = list(objs)
                if len(objs) != self.size:
                    raise ValueError(f"mncl: scatter_obj: {len(objs)} objects for {self.size} "
                                     f"ranks (one per rank)")
                for obj in objs:
                    data, own_error = _dumps(obj)
                    if own_error is not None:
                        break
                    pieces.append(data)
            except Exception as error:  # noqa: BLE001 (reported to every rank below)
                own_error = error
            if own_error is None:
                header[:] = [p.size for p in pieces]
            else:
                header[:] = _FAILED
        self.bcast(header, root=root)
        counts = [int(c) for c in header]
        _raise_for_failures(self, "scatter_obj", counts[:1], own_error, [root])
        send = np.concatenate(pieces) if self.rank == root else None
        recv = np.empty(counts[self.rank], np.uint8)
        self.scatterv(send, counts if self.rank == root else None, recv, root=root)
        return pickle.loads(memoryview(recv))

    def allreduce_obj(self, obj, op="sum"):
        """The reduction of every rank's obj, the same on every rank: op is "sum", "prod",
        "max", "min" (element-wise for NumPy arrays) or a function of two objects. The objects
        are gathered and reduced in rank order, so the result is identical everywhere."""
        if callable(op):
            combine = op
        else:
            combine = _OBJECT_OPS.get(str(op).lower())
            if combine is None:
                raise ValueError(f"mncl: allreduce_obj: unknown reduction '{op}' (one of "
                                 f"{', '.join(_OBJECT_OPS)}, or a function of two objects)")
        return functools.reduce(combine, self.allgather_obj(obj))


def _elementwise(array_op, scalar_op):
    def combine(a, b):
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            return array_op(a, b)
        return scalar_op(a, b)
    return combine


_OBJECT_OPS = {
    "sum": operator.add,
    "prod": operator.mul,
    "max": _elementwise(np.maximum, max),
    "min": _elementwise(np.minimum, min),
}
