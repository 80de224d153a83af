"""Collectives on Python objects (ChainerMN's bcast_obj, gather_obj, allreduce_obj; PyTorch's
broadcast_object_list, all_gather_object...): each object travels pickled, as bytes, in the
array collectives, in pieces of at most max_buf_len bytes (default 256 MiB, ChainerMN's), which
bounds the size of each message.

Every call fails on every rank together, never on some while others wait: the byte counts go
first, so an object that cannot be pickled is known to all (its rank raises its own error, the
others mncl.RemoteError naming it); after loading, one small allgather says whether every rank
could unpickle what it got (a class missing on one rank, say), with the same outcome.

Pickle runs code on load: use these only among processes that trust each other (the ranks of
one job), as ChainerMN and PyTorch do.
"""

import enum
import functools
import operator
import pickle

import numpy as np

from ._ops import _OPS, _op_name
from .errors import RemoteError

DEFAULT_MAX_BUF_LEN = 256 << 20
_FAILED = -1  # a byte count that says "this rank could not pickle its object"


def _dumps(obj):
    """The pickled bytes as a uint8 array (writeable: a bcast root's buffer is written to), or
    (None, the exception)."""
    try:
        data = bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
        return np.frombuffer(data, np.uint8), None
    except Exception as error:  # noqa: BLE001 (any pickling failure is reported to every rank)
        return None, error


def _chunk(max_buf_len):
    chunk = DEFAULT_MAX_BUF_LEN if max_buf_len is None else int(max_buf_len)
    if chunk <= 0:
        raise ValueError(f"mncl: max_buf_len must be positive, not {max_buf_len}")
    return chunk


def _rounds(counts, chunk):
    """The pieces of every rank's bytes, round by round: for round k, each rank's (start, size)
    within its own bytes."""
    longest = max(counts) if counts else 0
    for k in range(-(-longest // chunk)):
        start = k * chunk
        yield start, [min(max(c - start, 0), chunk) for c in counts]


def _fail_together(what, failed_ranks, own_error, doing):
    """Raises on every rank when some rank failed: its own error there, RemoteError naming the
    ranks elsewhere. failed_ranks is the same list on every rank."""
    if not failed_ranks:
        return
    if own_error is not None:
        raise own_error
    plural = len(failed_ranks) > 1
    ranks = ", ".join(str(r) for r in failed_ranks)
    raise RemoteError(f"mncl: {what}: rank{'s' if plural else ''} {ranks} could not {doing} "
                      f"(the cause is raised there)")


class ObjectCollectives:
    """The object collectives of Communicator (mixed into it)."""

    def _loaded_everywhere(self, what, load):
        """Runs load() (or nothing: None) on this rank, then agrees with every rank on whether
        all succeeded; returns load()'s result."""
        result, error = None, None
        if load is not None:
            try:
                result = load()
            except Exception as e:  # noqa: BLE001 (reported to every rank)
                error = e
        flags = self.allgather(np.array([0 if error is None else 1], np.int32)).ravel()
        _fail_together(what, [r for r, f in enumerate(flags) if f], error,
                       "unpickle what it received")
        return result

    def _counts_everywhere(self, what, obj):
        """This rank's pickled bytes and every rank's byte count (allgather), or the vote's
        error on every rank."""
        data, error = _dumps(obj)
        counts = self.allgather(np.array([_FAILED if data is None else data.size], np.int64))
        counts = [int(c) for c in counts.ravel()]
        _fail_together(what, [r for r, c in enumerate(counts) if c == _FAILED], error,
                       "pickle its object")
        return data, counts

    def bcast_obj(self, obj=None, *positional, max_buf_len=None, root=0):
        """root's obj on every rank (obj is ignored elsewhere). root and max_buf_len are
        keywords only: a second positional argument is the chunk size in ChainerMN's order but
        the root in mpi4py's and torch's, so it is refused rather than read either way."""
        if positional:
            raise TypeError(f"mncl: bcast_obj takes root= and max_buf_len= by keyword only, not "
                            f"as positional {positional!r} (ChainerMN's second argument is "
                            f"max_buf_len, mpi4py's and torch's the root)")
        chunk = _chunk(max_buf_len)
        own_error, data = None, None
        header = np.zeros(1, np.int64)
        if self.rank == root:
            data, own_error = _dumps(obj)
            header[0] = _FAILED if data is None else data.size
        self._bcast_in_place(header, root=root)
        _fail_together("bcast_obj", [root] if header[0] == _FAILED else [], own_error,
                       "pickle its object")
        if self.rank != root:
            data = np.empty(int(header[0]), np.uint8)
        for start in range(0, data.size, chunk):
            self._bcast_in_place(data[start:start + chunk], root=root)
        if self.rank == root:
            self._loaded_everywhere("bcast_obj", None)
            return obj
        return self._loaded_everywhere("bcast_obj", lambda: pickle.loads(memoryview(data)))

    def allgather_obj(self, obj, max_buf_len=None):
        """Every rank's obj, as a list in rank order, on every rank."""
        chunk = _chunk(max_buf_len)
        data, counts = self._counts_everywhere("allgather_obj", obj)
        received = [np.empty(c, np.uint8) for c in counts]
        for start, sizes in _rounds(counts, chunk):
            got = self.allgatherv(data[start:start + sizes[self.rank]], sizes)
            offset = 0
            for r, size in enumerate(sizes):
                received[r][start:start + size] = got[offset:offset + size]
                offset += size
        return self._loaded_everywhere(
            "allgather_obj", lambda: [pickle.loads(memoryview(b)) for b in received])

    def gather_obj(self, obj, root=0, max_buf_len=None):
        """Every rank's obj, as a list in rank order, on root; None elsewhere. The byte counts
        go to every rank (an allgather of one integer), so that a failure anywhere fails all."""
        chunk = _chunk(max_buf_len)
        data, counts = self._counts_everywhere("gather_obj", obj)
        is_root = self.rank == root
        received = [np.empty(c, np.uint8) for c in counts] if is_root else None
        for start, sizes in _rounds(counts, chunk):
            got = self.gatherv(data[start:start + sizes[self.rank]], sizes if is_root else None,
                               root=root)
            if is_root:
                offset = 0
                for r, size in enumerate(sizes):
                    received[r][start:start + size] = got[offset:offset + size]
                    offset += size
        load = (lambda: [pickle.loads(memoryview(b)) for b in received]) if is_root else None
        return self._loaded_everywhere("gather_obj", load)

    def scatter_obj(self, objs=None, root=0, max_buf_len=None):
        """root's objs[r] on rank r: root passes a sequence (or an iterable, consumed inside the
        call) of exactly size objects; objs is ignored elsewhere. Every rank gets an unpickled
        copy, the root too; the root does not send its own piece."""
        chunk = _chunk(max_buf_len)
        own_error, pieces = None, []
        header = np.zeros(self.size, np.int64)
        if self.rank == root:
            try:
                for obj in objs:
                    if len(pieces) == self.size:
                        raise ValueError(f"mncl: scatter_obj: more than {self.size} objects for "
                                         f"{self.size} ranks (one per rank)")
                    data, own_error = _dumps(obj)
                    if own_error is not None:
                        break
                    pieces.append(data)
                if own_error is None and len(pieces) != self.size:
                    raise ValueError(f"mncl: scatter_obj: {len(pieces)} objects for {self.size} "
                                     f"ranks (one per rank)")
            except Exception as error:  # noqa: BLE001 (reported to every rank below)
                own_error = error
            header[:] = _FAILED if own_error is not None else [p.size for p in pieces]
        self._bcast_in_place(header, root=root)
        _fail_together("scatter_obj", [root] if header[0] == _FAILED else [], own_error,
                       "provide one picklable object per rank")
        counts = [int(c) for c in header]
        counts[root] = 0  # the root keeps its own piece
        recv = np.empty(counts[self.rank], np.uint8)
        for start, sizes in _rounds(counts, chunk):
            send = None
            if self.rank == root:
                send = np.concatenate([p[start:start + s] for p, s in zip(pieces, sizes)])
            self.scatterv(send, sizes if self.rank == root else None,
                          recv[start:start + sizes[self.rank]], root=root)
        mine = pieces[root] if self.rank == root else recv
        return self._loaded_everywhere("scatter_obj", lambda: pickle.loads(memoryview(mine)))

    def allreduce_obj(self, obj, op="sum", max_buf_len=None):
        """The reduction of every rank's obj, the same on every rank: op is "sum", "prod",
        "max", "min" (element-wise for NumPy arrays), "avg" (the sum divided by the number of
        ranks) or a function of two objects. The objects are gathered and reduced in rank
        order, so the result is identical everywhere."""
        name = None if callable(op) and not isinstance(op, enum.Enum) else _op_name(op)
        if name is None and type(op) is int:  # MNCL's own code, as allreduce takes it
            name = {code: key for key, code in _OPS.items()}.get(op)
        if name is None and not callable(op):
            raise ValueError(f"mncl: allreduce_obj: unknown reduction {op!r} (one of "
                             f"{', '.join(list(_OBJECT_OPS) + ['avg'])}, an enum member of those "
                             f"names, or a function of two objects)")
        combine = op if name is None else _OBJECT_OPS["sum" if name == "avg" else name]
        result = functools.reduce(combine, self.allgather_obj(obj, max_buf_len))
        return result / self.size if name == "avg" else result

    def send_obj(self, obj, dest, *positional, max_buf_len=None, **unknown):
        """Sends obj to dest, which calls recv_obj(source). An object that cannot be pickled
        raises here and RemoteError in the receiver; one that cannot be unpickled raises in the
        receiver only (the sender has returned). max_buf_len is a keyword only, and there are
        no tags (see _no_tags)."""
        _no_tags("send_obj", positional, unknown)
        chunk = _chunk(max_buf_len)
        data, error = _dumps(obj)
        self.send(np.array([_FAILED if data is None else data.size], np.int64), dest)
        if error is not None:
            raise error
        for start in range(0, data.size, chunk):
            self.send(data[start:start + chunk], dest)

    def recv_obj(self, source, *positional, max_buf_len=None, **unknown):
        """The object source sent with send_obj (max_buf_len, a keyword only, must match the
        sender's; no tags: see _no_tags)."""
        _no_tags("recv_obj", positional, unknown)
        chunk = _chunk(max_buf_len)
        header = self.recv(np.zeros(1, np.int64), source)
        if header[0] == _FAILED:
            raise RemoteError(f"mncl: recv_obj: rank {source} could not pickle its object (the "
                              f"cause is raised there)")
        data = np.empty(int(header[0]), np.uint8)
        for start in range(0, data.size, chunk):
            self.recv(data[start:start + chunk], source)
        return pickle.loads(memoryview(data))


def _no_tags(call, positional, unknown):
    """ChainerMN's and mpi4py's send_obj(obj, dest, tag) and recv_obj(source, status, tag):
    their third argument once became the chunk size here (a tag of 0 raised before anything
    was sent, leaving the receiver waiting; 5 sent 5-byte chunks the receiver did not expect).
    MNCL has no tags, since messages between two ranks match in the order they were sent: a
    tag or status is refused rather than ignored, and max_buf_len is a keyword only."""
    if positional or unknown:
        given = [repr(p) for p in positional] + [f"{k}={v!r}" for k, v in unknown.items()]
        raise TypeError(f"mncl: {call} takes max_buf_len= by keyword only and has no tag or "
                        f"status (messages between two ranks match in the order they were "
                        f"sent); got {', '.join(given)}")


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
