"""ChainerMN's ``hierarchical`` and ``two_dimensional`` communicators: an allreduce in two levels,
the ranks of each host first (on shared memory: the shm backend, which "auto" picks for one
host) and the hosts after (on the world's backend, over the network). The Python twin of the C++
frontends' mncl::HierarchicalCommunicator (frontends/include/mncl/frontends/hierarchical.hpp).

    world = mncl.Communicator()
    hier = mncl.HierarchicalCommunicator(world)            # collective
    grads = hier.allreduce(grads, op="avg")               # the same result as world.allreduce

"hierarchical": reduce onto each host's first rank, allreduce among those, bcast in the host.
"two_dimensional": reduce_scatter in the host, allreduce of each 1/M shard across the hosts,
allgather in the host; it needs the same number of ranks on every host. Hosts are told apart by
MNCL_HOSTID (default: the host name); ``mncl-run --ranks-per-host M`` simulates them.
"""

import numpy as np

from ._dtypes import BFLOAT16, CODES, from_bfloat16_bits, to_bfloat16_bits
from .comm import _OPS, _input, _matching_output, _op_code
from ._cuda import is_cuda_array
from .errors import InvalidArgumentError, MnclError, RemoteError
from . import training

_ALGORITHMS = ("hierarchical", "two_dimensional")
_SUM, _AVG = _OPS["sum"], _OPS["avg"]
_FLOAT16 = CODES["float16"]
# The NumPy type of each MNCL dtype but bfloat16 (NumPy has none).
_NATIVE_BY_CODE = {code: np.dtype(name) for name, code in CODES.items() if name != "bfloat16"}


class HierarchicalCommunicator:
    """Collective over `world` (which must outlive it). intra: the ranks of this rank's host;
    inter: the ranks that talk across hosts (every host's first rank for "hierarchical", the
    ranks at this rank's position on every host for "two_dimensional"; None on the others).
    Construction ends alike on every rank: a group whose backend fails on one host makes that
    host's ranks raise its error and the others a RemoteError."""

    def __init__(self, world, intra_backend="auto", inter_backend=None,
                 algorithm="hierarchical"):
        if algorithm not in _ALGORITHMS:
            raise ValueError(f"mncl: algorithm {algorithm!r} is not one of {_ALGORITHMS}")
        self.world, self.algorithm = world, algorithm
        self.intra = self.inter = None
        self.intra = self._everywhere("the ranks of each host",
                                      lambda: world.split_host(backend=intra_backend))
        # Every host's size, from its first rank: one world collective, the same on every rank.
        mine = np.array([self.intra.size if self.intra.rank == 0 else 0], np.int32)
        firsts = world.allgather(mine).ravel()
        sizes = [int(s) for s in firsts if s > 0]
        self.num_hosts = len(sizes)
        if algorithm == "two_dimensional" and len(set(sizes)) > 1:
            self.close()
            raise InvalidArgumentError(
                f"mncl: two_dimensional needs the same number of ranks on every host, but the "
                f"{len(sizes)} hosts have {', '.join(map(str, sizes))} ranks (use hierarchical)")
        if algorithm == "two_dimensional":
            make = lambda: world.split_cross_host(backend=inter_backend)  # noqa: E731
        else:
            make = lambda: world.split_config(  # noqa: E731
                0 if self.intra.rank == 0 else None, backend=inter_backend)
        self.inter = self._everywhere("the ranks across hosts", make)
        first_rank = self.intra._bcast_in_place(np.array([world.rank], np.int64))[0]
        self.host_index = int(np.count_nonzero(firsts[:first_rank]))

    @property
    def rank(self):
        """The world rank (as ChainerMN's hierarchical communicators have it)."""
        return self.world.rank

    @property
    def size(self):
        return self.world.size

    # The object collectives run on the world (so scatter_dataset(dataset, hier) works too).
    def bcast_obj(self, obj=None, *positional, max_buf_len=None, root=0):
        return self.world.bcast_obj(obj, *positional, max_buf_len=max_buf_len, root=root)

    def gather_obj(self, obj, root=0, max_buf_len=None):
        return self.world.gather_obj(obj, root, max_buf_len)

    def allgather_obj(self, obj, max_buf_len=None):
        return self.world.allgather_obj(obj, max_buf_len)

    def scatter_obj(self, objs=None, root=0, max_buf_len=None):
        return self.world.scatter_obj(objs, root, max_buf_len)

    def allreduce_obj(self, obj, op="sum", max_buf_len=None):
        return self.world.allreduce_obj(obj, op, max_buf_len)

    def _bcast_in_place(self, buf, root=0, **kwargs):  # scatter_index, synchronized_seed
        return self.world._bcast_in_place(buf, root, **kwargs)

    # ChainerMN's training helpers: gradients through the hierarchy, the rest on the world.
    _host_only = "a HierarchicalCommunicator takes host memory only"

    def bcast_data(self, arrays, root=0):
        return self.world.bcast_data(arrays, root)

    def multi_node_mean_grad(self, grads, *, grad_dtype=None):
        """As Communicator.multi_node_mean_grad (host arrays), with one allreduce per dtype
        through the hierarchy."""
        return training.multi_node_mean_grad(self, grads, grad_dtype=grad_dtype)

    @property
    def group_path(self):
        """The world's (its rank and size are the world's): for a Checkpointer."""
        return self.world.group_path

    @property
    def intra_rank(self):
        return self._live().rank

    @property
    def intra_size(self):
        return self._live().size

    def _live(self):
        """intra (every rank has one while open), or the closed communicator's ValueError."""
        if self.intra is None:
            raise ValueError("mncl: the HierarchicalCommunicator is closed")
        return self.intra

    def close(self):
        """Collective: frees both communicators (intra even when closing inter fails)."""
        inter, intra, self.inter, self.intra = self.inter, self.intra, None, None
        try:
            if inter is not None:
                inter.close()
        finally:
            if intra is not None:
                intra.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
            return
        # Leaving on an exception: abort both (local) rather than a collective close that would
        # wait for the other ranks, which may be blocked in a collective this rank never joins.
        inter, intra, self.inter, self.intra = self.inter, self.intra, None, None
        for comm in (inter, intra):
            if comm is not None:
                comm._abandon()

    def _everywhere(self, what, make):
        """make() on every rank, then a vote over the world: a rank that failed re-raises its
        own error, the others raise RemoteError, and what was made is freed."""
        made, failure = None, None
        try:
            made = make()
        except Exception as e:  # noqa: BLE001 (re-raised below, after the vote)
            failure = e
        try:
            ok = self.world.allreduce(np.array([0 if failure else 1], np.int32), op="min")[0]
        except MnclError as e:  # the world itself failed: this rank's own error says more
            ok, failure = 0, failure or e
        if failure is None and ok == 1:
            return made
        for comm in (made, self.inter, self.intra):
            if comm is not None:
                try:
                    comm.close()
                except MnclError:
                    pass
        self.inter = self.intra = None
        if failure is not None:
            raise failure
        raise RemoteError(f"mncl: HierarchicalCommunicator: making {what} failed on other "
                          f"ranks (their errors say why)", status_name="MNCL_ERR_REMOTE")

    def allreduce(self, sendbuf, recvbuf=None, op="sum", *, dtype=None):
        """As Communicator.allreduce (the same ops, dtypes, raw-bit arrays and checks, the
        same result on every rank): returns recvbuf (a new array when None). float16/bfloat16
        travel as float32 and are rounded once; avg is a sum divided once by the world size
        (integers toward zero). Host memory only (NumPy arrays).

        Every rank fails together: the ranks first agree over the world (one allgather of two
        int64) on whether each accepts its arguments and on the dtype, count, op and
        algorithm. Arguments refused on one rank raise there and RemoteError elsewhere; ones
        that differ between the ranks (avg against sum, 3 elements against 4, an empty array
        on one rank) raise InvalidArgumentError on every rank, where the levels' collectives
        returned a wrong result or waited until the timeout."""
        self._live()
        layout, error = None, None
        try:
            if is_cuda_array(sendbuf) or is_cuda_array(recvbuf):
                raise TypeError("mncl: HierarchicalCommunicator.allreduce takes host memory only "
                                "(NumPy arrays), not CUDA arrays")
            send, code = _input(sendbuf, dtype)
            recv = _matching_output(recvbuf, send, code, dtype, send.size, "allreduce")
            op_code = _op_code(op)
            if not 0 <= op_code < len(_OPS):
                raise InvalidArgumentError(f"mncl: allreduce: unknown reduction {op!r}",
                                           status_name="MNCL_ERR_INVALID_ARGUMENT")
            layout = ("allreduce", code, send.size, op_code, self.algorithm)
        except Exception as e:  # noqa: BLE001 (raised here once every rank knows)
            error = e
        training._agree(self.world, "HierarchicalCommunicator.allreduce", layout, error)
        # The elements as what they are (raw-bit arrays viewed as their type); 16-bit floats
        # in float32 through every level, rounded once at the end.
        flat = send.reshape(-1)
        if code == BFLOAT16:
            work = from_bfloat16_bits(flat.view(np.uint16))
        else:
            work = flat.view(_NATIVE_BY_CODE[code]).astype(
                np.float32 if code == _FLOAT16 else _NATIVE_BY_CODE[code])
        if work.size:
            work = self._levels(work, _SUM if op_code == _AVG else op_code)
            if op_code == _AVG:
                work = _divide(work, self.world.size)
        # Written through a view of recvbuf's bits, whatever flavour of the dtype it is.
        out = recv.reshape(-1)
        if code == BFLOAT16:
            out.view(np.uint16)[...] = to_bfloat16_bits(work)
        else:
            out.view(_NATIVE_BY_CODE[code])[...] = work
        return recv

    def _levels(self, work, op_code):
        if self.algorithm == "hierarchical":
            if self.intra.size > 1:
                reduced = self.intra.reduce(work, op=op_code, root=0)
                work = reduced if reduced is not None else work
            if self.intra.rank == 0 and self.num_hosts > 1:
                self.inter.allreduce(work, work, op=op_code)
            if self.intra.size > 1:
                self.intra._bcast_in_place(work, root=0)
            return work
        m = self.intra.size
        shard = -(-work.size // m)
        padded = np.zeros(shard * m, work.dtype)  # padding only ever meets padding
        padded[:work.size] = work
        mine = self.intra.reduce_scatter(padded, op=op_code) if m > 1 else padded
        if self.num_hosts > 1:
            self.inter.allreduce(mine, mine, op=op_code)
        whole = self.intra.allgather(mine).reshape(-1) if m > 1 else mine
        return whole[:work.size]


def _divide(values, n):
    """values / n as mncl.h's AVG: integers truncate toward zero, exactly (no float detour)."""
    if values.dtype.kind == "u":
        return (values.astype(np.uint64) // np.uint64(n)).astype(values.dtype)
    if values.dtype.kind == "i":
        wide = values.astype(np.int64)
        q = wide // n
        q += ((wide - q * n != 0) & (wide < 0)).astype(np.int64)  # floor -> toward zero
        return q.astype(values.dtype)
    return values / values.dtype.type(n)
