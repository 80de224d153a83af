"""ChainerMN's multi-node optimizer (create_multi_node_optimizer), as the C++
mncl::MultiNodeOptimizer: wraps any step function and makes data-parallel training look like
single-process training.

    def sgd(params, grads):                  # the wrapped optimizer: any function, or an
        for p, g in zip(params, grads):      # object with an update(params, grads) method
            p -= 0.1 * g
    optimizer = mncl.MultiNodeOptimizer(comm, sgd)
    for batch in batches:
        optimizer.update(params, gradients(params, batch))

- The first update() broadcasts the root's parameters, so every rank starts from the same
  model; its gradients are then used like any other's (they were computed from this rank's own
  initial parameters: where the ranks initialise differently, call broadcast_parameters()
  before computing the first gradients).
- Every update() averages the gradients over the ranks, packed into one message per dtype,
  and calls step(params, averages) with arrays of the parameters' shapes and dtypes that the
  optimizer owns (read them there; copy what you keep). Without grad_dtype, float16 and
  bfloat16 gradients travel in the float32 message (summed in float32, divided once, rounded
  back once).
- grad_dtype ("float16", "bfloat16", "float32", "float64"): every gradient travels in that
  dtype, in one message; float16/bfloat16 halve the bytes of float32 gradients (scaled by
  1/size before the cast, so that the sum cannot overflow).
- double_buffering overlaps the exchange of step t's gradients with the caller's compute of
  step t+1 (a non-blocking allreduce): update() steps with the averages of the previous
  update's gradients, a lag of exactly one step; the first update only starts an exchange.
- zero_fill: a parameter may have no gradient on some ranks (None): it contributes zeros and
  every rank steps it with the average. Without zero_fill a missing gradient is refused.
- allreduce_every = k: update() is called once per micro-batch; k calls accumulate their
  gradients here (float16 and bfloat16 ones in float32) and the k-th exchanges their mean once
  and steps, the step of one k-times larger batch for 1/k of the communication. Only the calls
  that step return True. With double buffering each exchange overlaps the compute of one
  micro-batch, not k as in the C++ optimizer: the next update() completes it, since every
  update's agreement is a collective on the same communicator and would queue behind it.
- comm may be a HierarchicalCommunicator (no double buffering: it has no non-blocking
  allreduce). Host arrays (NumPy) of native-byte-order float16, float32, float64 and
  ml_dtypes.bfloat16 only (no longdouble, complex or big-endian arrays).
- Every update ends alike on every rank, as multi_node_mean_grad: arguments refused on one
  rank (a gradient of another shape, a read-only parameter, one parameter changing shape) raise
  there and RemoteError on the others, ranks passing other layouts or settings, or whose
  optimizers are at different points (a state loaded on some ranks only, a round of
  allreduce_every resumed mid-way on some), raise InvalidArgumentError naming them, and
  nothing changes (no exchange, no step, no count). step() runs after the exchange: what it
  raises is its rank's own (the accumulated micro-batches are spent all the same).
- state_dict() / load_state_dict() hold the optimizer's progress, the averages and the
  accumulated micro-batches (picklable, for mncl.Checkpointer); the wrapped optimizer's own
  state (momentum) is the caller's to save beside it. A state loads into either
  double-buffering mode, every averaged gradient applied once, as the C++ one's; a malformed
  state is a ValueError naming its field, and then nothing changes.
"""

import contextlib
import operator
import reprlib
import time

import numpy as np

from ._dtypes import from_bfloat16_bits, to_bfloat16_bits
from .training import GRAD_DTYPES, _agree, _layout, bcast_data

_STATE_FORMAT = "mncl.MultiNodeOptimizer"
_STATE_VERSION = 1
_HALF = ("float16", "bfloat16")
_FLOATS = ("float16", "float32", "float64")
_TAKES = "native-byte-order float16, float32, float64 or ml_dtypes.bfloat16"


def _supported(dtype):
    """A dtype the library carries as it is: native float16/32/64, or ml_dtypes' bfloat16."""
    return dtype.name == "bfloat16" or (dtype.isnative and dtype.name in _FLOATS)


def _is_half(dtype):
    return dtype.name in _HALF


def _sum_dtype(dtype):
    """The dtype micro-batches and exchanges of a dtype are summed in: float32 for the halves
    (whose own sums would overflow, or drop small terms), the dtype itself otherwise."""
    return np.dtype(np.float32) if _is_half(dtype) else dtype


@contextlib.contextmanager
def _field(name):
    """Any error reading or checking the state's field `name` as a ValueError naming it."""
    try:
        yield
    except KeyError:
        raise ValueError(f"mncl: MultiNodeOptimizer.load_state_dict: the state has no "
                         f"{name!r}; nothing was loaded") from None
    except (TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"mncl: MultiNodeOptimizer.load_state_dict: the state's {name!r} {e}; "
                         f"nothing was loaded") from None


def _read_int(value, low, high=None):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"is {value!r}, not an int")
    if value < low or (high is not None and value >= high):
        within = f">= {low}" if high is None else f"in [{low}, {high})"
        raise ValueError(f"is {value}, not {within}")
    return int(value)


def _read_bool(value):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"is {value!r}, not a bool")
    return bool(value)


def _read_arrays(value, like=None):
    """None, or copies (C-contiguous, writeable) of a list of arrays of supported dtypes; with
    like, of its length and shapes, and of the dtypes its arrays are summed in."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"is {reprlib.repr(value)}, not None or a list of NumPy arrays")
    if like is not None and len(value) != len(like):
        raise ValueError(f"holds {len(value)} arrays, 'averaged' {len(like)}")
    out = []
    for i, a in enumerate(value):
        if not isinstance(a, np.ndarray):
            raise TypeError(f"item {i} is {reprlib.repr(a)}, not a NumPy array")
        if not _supported(a.dtype):
            raise TypeError(f"item {i} is {a.dtype}, not {_TAKES}")
        if like is not None and (a.shape, a.dtype) != (like[i].shape, _sum_dtype(like[i].dtype)):
            raise ValueError(f"item {i} is {a.dtype}{list(a.shape)} where 'averaged' needs "
                             f"{_sum_dtype(like[i].dtype)}{list(like[i].shape)}")
        out.append(np.array(a, order="C"))
    return out


class ExchangeStats:
    """exchanges: gradient allreduces started; bytes: their message bytes on this rank;
    wait_seconds: the time update() and synchronize() spent blocked on them."""

    def __init__(self):
        self.exchanges, self.bytes, self.wait_seconds = 0, 0, 0.0

    def __repr__(self):
        return (f"<mncl.ExchangeStats exchanges={self.exchanges} bytes={self.bytes} "
                f"wait_seconds={self.wait_seconds:.6f}>")


class MultiNodeOptimizer:
    """See the module's text. step: a function step(params, averaged_grads), or an object
    with update(params, grads) (kept as actual_optimizer). The settings are checked here, on
    this rank; that they agree between the ranks, at the first update()."""

    def __init__(self, comm, step, *, double_buffering=False, zero_fill=True, grad_dtype=None,
                 allreduce_every=1, root=0):
        self.comm = comm
        self._world = getattr(comm, "world", comm)  # a HierarchicalCommunicator's ranks
        self._hierarchical = self._world is not comm
        if not callable(step) and not callable(getattr(step, "update", None)):
            raise TypeError("mncl: MultiNodeOptimizer: step must be a function step(params, "
                            "grads) or an object with an update(params, grads) method")
        self.actual_optimizer = step
        self._step = step if callable(step) else step.update
        if grad_dtype is not None and grad_dtype not in GRAD_DTYPES:
            raise ValueError(f"mncl: MultiNodeOptimizer: grad_dtype {grad_dtype!r} is not one "
                             f"of {GRAD_DTYPES} (or None)")
        self.allreduce_every = operator.index(allreduce_every)
        if self.allreduce_every < 1:
            raise ValueError(f"mncl: MultiNodeOptimizer: allreduce_every must be >= 1, not "
                             f"{allreduce_every}")
        self.root = operator.index(root)
        if not 0 <= self.root < self._world.size:
            raise ValueError(f"mncl: MultiNodeOptimizer: root {root} is not a rank of "
                             f"{self._world.size}")
        if double_buffering and self._hierarchical:
            raise ValueError("mncl: MultiNodeOptimizer: double_buffering needs a non-blocking "
                             "allreduce, which a HierarchicalCommunicator does not have")
        self.double_buffering, self.zero_fill = bool(double_buffering), bool(zero_fill)
        self.grad_dtype = grad_dtype
        self.stats = ExchangeStats()
        self._updates = 0
        self._broadcasted = False
        self._layout = None       # the parameters' layout, fixed by the first update
        self._averaged = None     # the averages step() gets, one array per parameter
        self._have_averaged = False
        self._unapplied = None    # from a double-buffered state: averages not applied yet
        self._accumulator = None  # allreduce_every > 1: this round's sums
        self._accumulated = 0
        self._groups = None       # [(name, wire buffer, parameter indices)]
        self._in_flight = None    # double buffering: the requests of the exchange

    @property
    def updates(self):
        """Calls to update() that went through."""
        return self._updates

    @property
    def pending_micro_batches(self):
        """Micro-batches accumulated towards the next exchange (allreduce_every > 1)."""
        return self._accumulated

    @property
    def averaged_grads(self):
        """The averages the last step used (or the next double-buffered step will use); None
        before the first exchange."""
        return self._averaged if self._have_averaged else None

    def reset_stats(self):
        self.stats = ExchangeStats()

    # --- the collective calls ------------------------------------------------------------------

    def update(self, params, grads):
        """Collective: averages grads (one per parameter, None for none: zero_fill) over the
        ranks and steps the parameters with the averages (double buffering: the previous
        update's). Returns whether it stepped."""
        what = "MultiNodeOptimizer.update"
        self._finish()  # the previous exchange (double buffering), before any new collective
        layout, error, items = None, None, None
        try:
            items, grads, layout = self._check(params, grads, what)
        except Exception as e:  # noqa: BLE001 (raised here once every rank knows)
            error = e
        _agree(self._world, what, layout, error)
        if not self._broadcasted:
            self.broadcast_parameters(items)
        self._prepare(items, layout)
        self._updates += 1
        to_send = grads
        if self.allreduce_every > 1:
            for total, g in zip(self._accumulator, grads):
                if g is not None:
                    total += g.astype(total.dtype, copy=False)
            self._accumulated += 1
            if self._accumulated < self.allreduce_every:
                return False
            self._accumulated = 0
            to_send = self._accumulator
        # The exchange first, then every step(): what step() raises is its rank's own, once
        # every rank has taken part. The round's micro-batches are spent once packed.
        unapplied, self._unapplied = self._unapplied, None
        try:
            self._start(to_send)
        finally:
            if to_send is self._accumulator:
                for total in self._accumulator:
                    total[...] = 0
        if self.double_buffering:
            # step() runs while this round's exchange travels (packed into buffers of its
            # own: the previous averages stay as they are until the next update's _finish).
            if self._have_averaged:
                self._step(items, self._averaged)
                return True
            return False
        # A double-buffered state's last averages (exchanged, not applied yet: the same
        # arrays as self._averaged, which _finish overwrites) go first.
        try:
            if unapplied is not None:
                self._step(items, unapplied)
        finally:
            self._finish()
        self._step(items, self._averaged)
        return True

    def broadcast_parameters(self, params):
        """Collective: the root's parameters copied into every rank's, now (the first update()
        does it otherwise)."""
        bcast_data(self._world, params, self.root)
        self._broadcasted = True

    def synchronize(self):
        """Local: completes the exchange in flight (double buffering), e.g. before reading
        averaged_grads. The next update() still steps with those averages: the lag stays."""
        self._finish()

    # --- state --------------------------------------------------------------------------------

    def state_dict(self):
        """The optimizer's progress as a dict of plain values and NumPy arrays (copies; the
        accumulated micro-batches of float16/bfloat16 parameters in float32): completes an
        exchange in flight first. The wrapped optimizer's state is not in it."""
        self._finish()
        # Averages loaded from a double-buffered state and not applied yet stay that state's.
        pending = self.double_buffering or self._unapplied is not None
        averaged = self._unapplied if self._unapplied is not None else self._averaged
        return {
            "format": _STATE_FORMAT, "version": _STATE_VERSION, "updates": self._updates,
            "broadcasted": self._broadcasted, "double_buffering": pending,
            "allreduce_every": self.allreduce_every,
            "have_averaged": self._have_averaged or self._unapplied is not None,
            "averaged": [a.copy() for a in averaged] if averaged is not None else None,
            "accumulated": self._accumulated,
            "accumulator": ([a.copy() for a in self._accumulator]
                            if self._accumulated and self._accumulator is not None else None),
        }

    def load_state_dict(self, state):
        """Local: takes a state_dict() back (of this or the other double-buffering mode; of
        another allreduce_every only when saved at a step boundary). Checked against the
        parameters at the next update(). Raises ValueError naming the field of a state that
        does not fit, and then changes nothing."""
        what = "mncl: MultiNodeOptimizer.load_state_dict"
        if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
            raise ValueError(f"{what}: not a state of MultiNodeOptimizer.state_dict()")
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"{what}: state version {state.get('version')!r} is unknown")
        # Every field read and checked before anything here changes.
        with _field("updates"):
            updates = _read_int(state["updates"], 0)
        flags = {}
        for name in ("broadcasted", "double_buffering", "have_averaged"):
            with _field(name):
                flags[name] = _read_bool(state[name])
        with _field("allreduce_every"):
            every = _read_int(state["allreduce_every"], 1)
        with _field("accumulated"):
            accumulated = _read_int(state["accumulated"], 0, every)
        with _field("averaged"):
            averaged = _read_arrays(state["averaged"])
            if averaged is None and flags["have_averaged"]:
                raise ValueError("is None, but 'have_averaged' is True")
        with _field("accumulator"):
            if state["accumulator"] is not None and averaged is None:
                raise ValueError("is given without 'averaged'")
            accumulator = _read_arrays(state["accumulator"], averaged)
            if accumulator is None and accumulated:
                raise ValueError(f"is None, but 'accumulated' is {accumulated}")
        if every != self.allreduce_every and accumulated:
            raise ValueError(f"{what}: the state was saved after {accumulated} of {every} "
                             f"micro-batches (allreduce_every = {every}); resume it with that "
                             f"allreduce_every, or save at a step boundary")
        self._finish()  # no wire buffer in flight when they are dropped below
        self._updates, self._broadcasted = updates, flags["broadcasted"]
        self._averaged = averaged
        self._have_averaged = flags["have_averaged"]
        self._accumulated = accumulated
        self._accumulator = accumulator if accumulated else None
        # The other double-buffering mode: every exchanged gradient applied once.
        self._unapplied = None
        if flags["double_buffering"] and not self.double_buffering and self._have_averaged:
            self._unapplied = self._averaged  # exchanged, not applied: the next step first
        elif not flags["double_buffering"] and self.double_buffering:
            self._have_averaged = False  # applied already: the next step only starts one
        self._layout = None  # checked against the parameters at the next update
        self._groups = None

    # --- inside ------------------------------------------------------------------------------

    def _check(self, params, grads, what):
        """(parameters, gradients, layout) of this rank's arguments, as lists, or the first
        refusal raised."""
        items, layout = _layout(params, what, "MultiNodeOptimizer takes host arrays (NumPy)")
        grads = list(grads)
        if len(grads) != len(items):
            raise ValueError(f"mncl: {what}: {len(items)} parameters but {len(grads)} "
                             f"gradients")
        for i, (p, g) in enumerate(zip(items, grads)):
            if not _supported(p.dtype):
                raise TypeError(f"mncl: {what}: parameter {i} is {p.dtype}; the optimizer "
                                f"takes {_TAKES} parameters")
            if g is None:
                if not self.zero_fill:
                    raise ValueError(f"mncl: {what}: parameter {i} has no gradient (None); "
                                     f"enable zero_fill")
                continue
            if not isinstance(g, np.ndarray) or g.shape != p.shape or g.dtype != p.dtype:
                got = (f"{g.dtype}{list(g.shape)}" if isinstance(g, np.ndarray)
                       else type(g).__name__)
                raise ValueError(f"mncl: {what}: parameter {i} is {p.dtype}{list(p.shape)} but "
                                 f"its gradient {got}")
        if self._layout is not None and layout != self._layout:
            raise ValueError(f"mncl: {what}: the parameters changed shape or dtype since the "
                             f"last update")
        if self._averaged is not None and self._layout is None:  # a loaded state
            # (its accumulator was checked against its averages by load_state_dict)
            shapes = tuple((a.dtype, a.shape) for a in self._averaged)
            if shapes != tuple((p.dtype, p.shape) for p in items):
                raise ValueError(f"mncl: {what}: the parameters do not match the loaded "
                                 f"state's averages")
        # The settings, and the progress that decides which collectives this update enters:
        # ranks at different points (a state loaded on some only) are refused together.
        settings = (self.grad_dtype, self.double_buffering, self.allreduce_every, self.root,
                    self._hierarchical, self._broadcasted, self._accumulated,
                    self._have_averaged, self._unapplied is not None)
        return items, grads, (settings, layout)

    def _prepare(self, params, layout):
        """The averages, accumulators and wire buffers, made by the first update."""
        if self._groups is not None:
            return
        self._layout = layout[1]
        if self._averaged is None:
            self._averaged = [np.zeros_like(p) for p in params]
        if self.allreduce_every > 1 and self._accumulator is None:
            self._accumulator = [np.zeros(p.shape, _sum_dtype(p.dtype)) for p in params]
        if self.grad_dtype is not None:
            wire = "uint16" if self.grad_dtype == "bfloat16" else self.grad_dtype
            groups = [(self.grad_dtype, np.dtype(wire), list(range(len(params))))]
        else:  # each dtype as it is, float16 and bfloat16 in the float32 message
            by_dtype = {}
            for i, p in enumerate(params):
                by_dtype.setdefault(_sum_dtype(p.dtype), []).append(i)
            groups = [(dtype.name, dtype, indices) for dtype, indices in by_dtype.items()]
        self._groups = [(name, np.empty(sum(params[i].size for i in indices), dtype), indices)
                        for name, dtype, indices in groups]

    def _divisor(self):
        return self._world.size * self.allreduce_every

    def _start(self, grads):
        """Packs the gradients (zeros for None) and runs (or, double buffering, starts) one
        allreduce per group."""
        requests = []
        try:
            self._pack_and_send(grads, requests)
        except BaseException:
            # No wire buffer may be reused while in flight: the started ones complete first.
            for request in requests:
                try:
                    request.wait()
                except Exception:  # noqa: BLE001 (the first error is the one raised)
                    pass
            raise
        self.stats.exchanges += 1
        self._in_flight = requests

    def _pack_and_send(self, grads, requests):
        for name, wire, indices in self._groups:
            offset = 0
            for i in indices:
                size = self._averaged[i].size
                out = wire[offset:offset + size]
                g = grads[i]
                if g is None:
                    out[...] = 0
                elif name in _HALF:  # a mean before the cast: the sum cannot overflow
                    values = np.asarray(g, np.float32).reshape(-1) / np.float32(self._divisor())
                    out[...] = to_bfloat16_bits(values) if wire.dtype == np.uint16 else values
                else:
                    out[...] = g.reshape(-1)
                offset += size
            dtype = "bfloat16" if wire.dtype == np.uint16 else None
            if wire.size == 0:
                continue
            if self.double_buffering:
                requests.append(self._world.iallreduce(wire, wire, op="sum", dtype=dtype))
            else:
                begin = time.perf_counter()
                self.comm.allreduce(wire, wire, op="sum", dtype=dtype)
                self.stats.wait_seconds += time.perf_counter() - begin
            self.stats.bytes += wire.nbytes

    def _finish(self):
        """Waits for the exchange (if any) and leaves the averages in self._averaged."""
        if self._in_flight is None:
            return
        requests, self._in_flight = self._in_flight, None
        begin = time.perf_counter()
        error = None
        try:
            for request in requests:  # every one, so that none is left in flight
                try:
                    request.wait()
                except Exception as e:  # noqa: BLE001 (the first is raised below)
                    error = error or e
        finally:
            self.stats.wait_seconds += time.perf_counter() - begin
        if error is not None:
            raise error
        for name, wire, indices in self._groups:
            if wire.dtype == np.uint16:  # bfloat16 as raw bits
                values = from_bfloat16_bits(wire)
            elif name in _HALF:
                values = wire
            else:
                # A division, not a product with 1/n: the correctly rounded mean, the one a
                # single process on the whole batch computes.
                values = wire / wire.dtype.type(self._divisor())
            offset = 0
            for i in indices:
                a = self._averaged[i]
                a.reshape(-1)[...] = values[offset:offset + a.size].astype(a.dtype, copy=False)
                offset += a.size
        self._have_averaged = True


# ChainerMN's spelling.
def create_multi_node_optimizer(actual_optimizer, comm, **options):
    """MultiNodeOptimizer(comm, actual_optimizer, **options)."""
    return MultiNodeOptimizer(comm, actual_optimizer, **options)

