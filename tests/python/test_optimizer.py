"""mncl.MultiNodeOptimizer (run under mncl-run -n N), against exact values computed here from
every rank's gradients: the first update's broadcast from the root, averages of mixed dtypes,
double buffering's one-step lag, allreduce_every's accumulation, zero_fill, grad_dtype
float16/bfloat16, a HierarchicalCommunicator, and state_dict/load_state_dict across the
double-buffering modes (malformed states refused whole), float16 and ml_dtypes' bfloat16
parameters (summed in float32), gradients from generators, a step() that raises on one rank.
Every refused argument fails every rank together (its own error where it was passed,
RemoteError or InvalidArgumentError elsewhere, also for optimizers at different points) and
changes nothing: checked on parameters that differ between the ranks, so that a broadcast
would show."""

import os
import pickle

from checks import world_and_checks

np, mncl, comm, checks = world_and_checks()
expect, expect_raises = checks.expect, checks.expect_raises
r, n = comm.rank, comm.size
other = n - 1  # the rank that misbehaves in the failure cases (rank 0 itself at 1 rank)
LR = 0.5


def initial(rank):
    """Each rank's own initial parameters: float32, float64, float32."""
    return [np.arange(6, dtype=np.float32).reshape(2, 3) + 10 * rank,
            np.linspace(-1.0, 1.0, 4) + rank, np.array([rank + 0.5], np.float32)]


def grads_of(step, rank, scale=1):
    """The gradients rank computes at step: small integers (times scale), exact in every
    dtype and in any summation order."""
    return [(np.arange(6, dtype=np.float32).reshape(2, 3) % 4 + step + rank) * scale,
            (np.arange(4, dtype=np.float64) - rank + 2 * step) * scale,
            np.array([(rank + 1) * (step + 1)], np.float32) * scale]


def mean(step_list, ranks=None, scale=1, skip=None):
    """The average over the ranks of the gradients of the steps in step_list (summed, then
    divided once by ranks x steps, as the optimizer does); skip: (rank, index) with no
    gradient."""
    ranks = range(n) if ranks is None else ranks
    out = []
    for i, like in enumerate(grads_of(0, 0)):
        total = np.zeros_like(like)
        for s in step_list:
            for q in ranks:
                if (q, i) != skip:
                    total = total + grads_of(s, q, scale)[i]
        out.append(total / like.dtype.type(n * len(step_list)))
    return out


def sgd(params, grads):
    for p, g in zip(params, grads):
        p -= p.dtype.type(LR) * g


def stepped(params, *averages):
    """params after sgd with each of averages in turn."""
    params = [p.copy() for p in params]
    for a in averages:
        sgd(params, a)
    return params


def same(got, want):
    return len(got) == len(want) and all(
        a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
        for a, b in zip(got, want))


def same_state(got, want):
    """Two state_dict()s alike, arrays by value."""
    if got.keys() != want.keys():
        return False
    for key, value in want.items():
        if isinstance(value, list):
            if not isinstance(got[key], list) or not same(got[key], value):
                return False
        elif got[key] != value or type(got[key]) is not type(value):
            return False
    return True


class Recorder:
    """A step that keeps a copy of every averages list it gets and steps with sgd; on rank
    `fail_on`, its call number `fail_at` (from 1) raises FloatingPointError instead."""

    def __init__(self, fail_on=None, fail_at=None):
        self.seen, self.fail_on, self.fail_at = [], fail_on, fail_at

    def __call__(self, params, grads):
        self.seen.append([g.copy() for g in grads])
        if r == self.fail_on and len(self.seen) == self.fail_at:
            raise FloatingPointError("this rank's own step failure")
        sgd(params, grads)


def same_seen(seen, want):
    return len(seen) == len(want) and all(same(a, b) for a, b in zip(seen, want))


# --- plain: the broadcast, then one average per update ------------------------------------
for root in sorted({0, n - 1}):
    params = initial(r)
    opt = mncl.MultiNodeOptimizer(comm, sgd, root=root)
    results = [opt.update(params, grads_of(t, r)) for t in range(3)]
    expect(results == [True] * 3, f"every plain update steps (root {root}): {results}")
    want = stepped(initial(root), mean([0]), mean([1]), mean([2]))
    expect(same(params, want), f"plain updates from root {root}'s parameters")
    expect(same(opt.averaged_grads, mean([2])), "averaged_grads: the last step's")
    expect(opt.updates == 3 and opt.stats.exchanges == 3, f"counts: {opt.updates}, {opt.stats}")
    expect(opt.stats.bytes == 3 * (7 * 4 + 4 * 8), f"bytes: {opt.stats.bytes}")

# An optimizer object with update(params, grads), ChainerMN's spelling.
class Sgd:
    def __init__(self):
        self.calls = 0

    def update(self, params, grads):
        self.calls += 1
        sgd(params, grads)


params = initial(r)
opt = mncl.create_multi_node_optimizer(Sgd(), comm)
opt.update(params, grads_of(0, r))
expect(opt.actual_optimizer.calls == 1 and same(params, stepped(initial(0), mean([0]))),
       "create_multi_node_optimizer with an object's update()")

# --- double buffering: the previous update's averages --------------------------------------
params = initial(r)
opt = mncl.MultiNodeOptimizer(comm, sgd, double_buffering=True)
expect(opt.update(params, grads_of(0, r)) is False, "the first double-buffered update only "
       "starts an exchange")
expect(same(params, initial(0)), "double buffering: the first update broadcast, no step")
expect(opt.update(params, grads_of(1, r)) is True, "the second double-buffered update steps")
expect(same(params, stepped(initial(0), mean([0]))), "double buffering steps with step 0's")
opt.update(params, grads_of(2, r))
expect(same(params, stepped(initial(0), mean([0]), mean([1]))), "double buffering: one lag")
opt.synchronize()
expect(same(opt.averaged_grads, mean([2])), "synchronize completes step 2's exchange")

# --- allreduce_every: k micro-batches per exchange -----------------------------------------
params = initial(r)
opt = mncl.MultiNodeOptimizer(comm, sgd, allreduce_every=2)
results = [opt.update(params, grads_of(t, r)) for t in range(4)]
expect(results == [False, True, False, True], f"allreduce_every=2 steps every 2nd: {results}")
expect(same(params, stepped(initial(0), mean([0, 1]), mean([2, 3]))),
       "allreduce_every=2: the mean over ranks and micro-batches")
expect(opt.stats.exchanges == 2, f"allreduce_every=2 exchanges twice: {opt.stats}")
# With double buffering: each exchange overlaps the next round.
params = initial(r)
opt = mncl.MultiNodeOptimizer(comm, sgd, allreduce_every=2, double_buffering=True)
results = [opt.update(params, grads_of(t, r)) for t in range(4)]
expect(results == [False, False, False, True], f"every=2 double-buffered: {results}")
expect(same(params, stepped(initial(0), mean([0, 1]))), "every=2 double-buffered values")

# --- zero_fill: a parameter without a gradient on one rank ---------------------------------
params = initial(r)
opt = mncl.MultiNodeOptimizer(comm, sgd)
mine = grads_of(0, r)
if r == other:
    mine[1] = None
opt.update(params, mine)
expect(same(params, stepped(initial(0), mean([0], skip=(other, 1)))), "zero_fill")

# --- gradients from any iterable: a generator, dict.values() -------------------------------
params = initial(r)
opt = mncl.MultiNodeOptimizer(comm, sgd)
opt.update(params, (g for g in grads_of(0, r)))
expect(same(params, stepped(initial(0), mean([0]))), "gradients from a generator")
params = initial(r)
opt = mncl.MultiNodeOptimizer(comm, sgd, allreduce_every=2)
for t in range(2):
    opt.update(params, (g for g in grads_of(t, r)))
expect(same(params, stepped(initial(0), mean([0, 1]))),
       "allreduce_every=2: micro-batches from generators")
params = initial(r)
opt = mncl.MultiNodeOptimizer(comm, sgd)
named = dict(enumerate(grads_of(0, r)))
opt.update(params, named.values() if r == other else list(named.values()))
expect(same(params, stepped(initial(0), mean([0]))), "dict.values() on one rank, lists elsewhere")

# --- grad_dtype: one message of float16 or bfloat16 ----------------------------------------
for grad_dtype in ("float16", "bfloat16"):
    params = initial(r)
    opt = mncl.MultiNodeOptimizer(comm, sgd, grad_dtype=grad_dtype)
    # Gradients of n x small integers: the per-rank means (g / n) and their sum are exact.
    opt.update(params, grads_of(0, r, scale=n))
    expect(same(params, stepped(initial(0), mean([0], scale=n))), f"grad_dtype {grad_dtype}")
    expect(opt.stats.bytes == 11 * 2, f"grad_dtype {grad_dtype}: 2 bytes per element, in one "
           f"message: {opt.stats.bytes}")

# --- float16 and bfloat16 parameters: summed in float32, divided once, rounded once ---------
try:
    import ml_dtypes
    halves = [(np.dtype(np.float16), 2.0 ** -24), (np.dtype(ml_dtypes.bfloat16), 2.0 ** -133)]
except ImportError:  # ml_dtypes is optional: its bfloat16 is checked where it is installed
    halves = [(np.dtype(np.float16), 2.0 ** -24)]


def as_float64(arrays):
    return [a.astype(np.float64) for a in arrays]


for half, tiny in halves:
    # The smallest subnormal (divided by the size first it would round to 0), 1 (1/3 is not
    # exact), small integers: every mean exact, as is the float32 parameter beside them.
    params = [np.zeros(4, half), np.zeros(2, np.float32)]
    keep = Recorder()
    opt = mncl.MultiNodeOptimizer(comm, keep)
    opt.update(params, [np.array([tiny, 1, r + 1, 3 * (r + 1)], half),
                        np.array([r, 2], np.float32)])
    want = [np.array([tiny, 1, (n + 1) / 2, 3 * (n + 1) / 2], half),
            np.array([(n - 1) / 2, 2], np.float32)]
    got = keep.seen[0]
    expect([a.dtype for a in got] == [half, np.float32] and
           same(as_float64(got), as_float64(want)),
           f"{half} parameters: the correctly rounded mean: {got} (want {want})")
    expect(opt.stats.bytes == 6 * 4, f"{half} gradients travel in the float32 message: "
           f"{opt.stats.bytes}")
    # allreduce_every: the micro-batches summed in float32 (float16: 40000 + 40000 overflows;
    # bfloat16: 256 + 1 + 1 + 2 is 258 summed in order, 260 exactly).
    every, batches = ((2, [40000, 40000]) if half == np.float16 else (4, [256, 1, 1, 2]))
    params = [np.zeros(2, half)]
    keep = Recorder()
    opt = mncl.MultiNodeOptimizer(comm, keep, allreduce_every=every)
    for b in batches:
        opt.update(params, [np.array([b, r + 1], half)])
    want = [np.array([sum(batches) / every, (n + 1) / 2], half)]
    got = keep.seen
    expect(len(got) == 1 and got[0][0].dtype == half and
           same(as_float64(got[0]), as_float64(want)),
           f"{half} parameters, allreduce_every={every}: {got} (want {want})")

# --- refusals: on one rank, on every rank together; nothing changes ------------------------
params = initial(r)
opt = mncl.MultiNodeOptimizer(comm, sgd)
opt.update(params, grads_of(0, r))
after_one = [p.copy() for p in params]


def refused(mine, what, own_type, own_text, *, on=other, optimizer=None, own_params=None):
    """An update with gradients `mine` (and parameters own_params, if given) on rank `on`, good
    gradients elsewhere, raises own_type there and RemoteError on the others, and changes
    nothing: neither the parameters (each rank's own, from initial(r), where a broadcast or a
    step would show) nor the optimizer's count."""
    optimizer = optimizer or opt
    before = optimizer.updates
    own = own_params if own_params is not None and r == on else initial(r)
    want = [p.copy() for p in own]
    if r == on:
        expect_raises(own_type, lambda: optimizer.update(own, mine), what, own_text)
    else:
        expect_raises(mncl.RemoteError, lambda: optimizer.update(own, grads_of(1, r)),
                      f"{what} (beside)", f"rank {on} could not take part")
    expect(same(own, want) and optimizer.updates == before, f"{what}: nothing changed")


bad = grads_of(1, r)
bad[0] = bad[0].reshape(3, 2)
refused(bad, "a gradient of another shape", ValueError, "parameter 0 is float32[2, 3] but its "
        "gradient float32[3, 2]")
refused(grads_of(1, r)[:2], "a missing gradient", ValueError, "3 parameters but 2 gradients")
bad = grads_of(1, r)
bad[1] = bad[1].astype(np.float32)
refused(bad, "a gradient of another dtype", ValueError, "its gradient float32[4]")
read_only = initial(r)
read_only[1].flags.writeable = False
refused(grads_of(1, r), "a read-only parameter", ValueError, "array 1 must be C-contiguous and "
        "writeable", own_params=read_only)
big_endian = initial(r)
big_endian[2] = big_endian[2].astype(">f4")
refused(grads_of(1, r), "a big-endian parameter", TypeError, "parameter 2 is >f4; the optimizer "
        "takes native-byte-order", own_params=big_endian)
strict = mncl.MultiNodeOptimizer(comm, sgd, zero_fill=False)
bad = grads_of(1, r)
bad[2] = None
refused(bad, "None without zero_fill (a first update: no broadcast)", ValueError,
        "parameter 2 has no gradient (None); enable zero_fill", optimizer=strict)
expect(strict.updates == 0, "a refused first update counts nothing")
fresh = mncl.MultiNodeOptimizer(comm, sgd)
refused(grads_of(1, r), "a read-only parameter in a first update", ValueError,
        "must be C-contiguous and writeable", optimizer=fresh, own_params=read_only)
# Dtypes the library does not carry, on every rank: each raises its own, before any exchange.
unsupported = [np.dtype(">f4"), np.dtype(np.complex64)]
if np.dtype(np.longdouble).itemsize > 8:
    unsupported.append(np.dtype(np.longdouble))
for dtype in unsupported:
    fresh = mncl.MultiNodeOptimizer(comm, sgd)
    own = [np.zeros(2, np.float32), np.zeros(3, dtype)]
    expect_raises(TypeError, lambda: fresh.update(own, [np.ones(2, np.float32),
                                                        np.ones(3, dtype)]),
                  f"{dtype} parameters", f"parameter 1 is {dtype}; the optimizer takes")
    expect(fresh.updates == 0 and fresh.stats.exchanges == 0, f"{dtype}: nothing exchanged")
if n > 1:
    # Another layout on one rank: InvalidArgumentError naming it on every rank.
    fresh = mncl.MultiNodeOptimizer(comm, sgd)
    own = initial(r)
    mine_params = own + [np.zeros(2, np.float32)] if r == other else own
    mine_grads = grads_of(1, r) + ([np.ones(2, np.float32)] if r == other else [])
    expect_raises(mncl.InvalidArgumentError, lambda: fresh.update(mine_params, mine_grads),
                  "another layout on one rank", f"rank {other} passed other arguments")
    expect(same(own, initial(r)) and fresh.updates == 0, "another layout: nothing changed")
    # Other settings on one rank.
    mixed = mncl.MultiNodeOptimizer(comm, sgd, grad_dtype="float16" if r == other else None)
    expect_raises(mncl.InvalidArgumentError, lambda: mixed.update(own, grads_of(1, r)),
                  "another grad_dtype on one rank", f"rank {other} passed other arguments")
    expect(same(own, initial(r)) and mixed.updates == 0, "another grad_dtype: nothing changed")


class Faulty:
    """comm, but its iallreduce number fail_start raises instead of starting, and the wait of
    its request number fail_wait raises once the request is complete; its requests count
    their waits."""

    def __init__(self, comm, fail_start=None, fail_wait=None):
        self._comm, self.fail_start, self.fail_wait = comm, fail_start, fail_wait
        self.started, self.waited = 0, 0

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def iallreduce(self, *args, **kwargs):
        self.started += 1
        if self.started == self.fail_start:
            raise RuntimeError("injected: this iallreduce did not start")
        request, number, owner = self._comm.iallreduce(*args, **kwargs), self.started, self

        class Counted:
            def wait(self, timeout=None):
                owner.waited += 1
                result = request.wait(timeout)
                if number == owner.fail_wait:
                    raise RuntimeError("injected: this wait failed")
                return result
        return Counted()


# A later group's exchange that fails to start, or the wait of an earlier group's that fails
# (on every rank): every exchange started completes before the error is raised, so that no
# buffer of theirs is reused in flight.
failing = Faulty(comm, fail_start=2)
fresh = mncl.MultiNodeOptimizer(failing, sgd, double_buffering=True)
expect_raises(RuntimeError, lambda: fresh.update(initial(r), grads_of(0, r)),
              "a later group's iallreduce fails", "did not start")
expect(failing.started == 2 and failing.waited == 1, f"the exchange started before it was "
       f"waited for: {failing.started} started, {failing.waited} waited")
failing = Faulty(comm, fail_wait=1)
fresh = mncl.MultiNodeOptimizer(failing, sgd, double_buffering=True)
fresh.update(initial(r), grads_of(0, r))
expect_raises(RuntimeError, fresh.synchronize, "an earlier group's wait fails", "wait failed")
expect(failing.started == 2 and failing.waited == 2, f"the exchange after it was waited for: "
       f"{failing.started} started, {failing.waited} waited")
check = comm.allreduce(np.ones(3, np.float64), op="sum")
expect(np.array_equal(check, np.full(3, n, np.float64)), "the communicator works on")

# The optimizer goes on after every refusal.
opt.update(params, grads_of(1, r))
expect(same(params, stepped(initial(0), mean([0]), mean([1]))), "updates after the refusals")
# step() raising on one rank is that rank's: every rank goes on, and the next round's averages
# are that round's alone (the failed round's micro-batches were spent).
for double in (False, True):
    params = initial(r)
    keep = Recorder(fail_on=other, fail_at=1)
    fragile = mncl.MultiNodeOptimizer(comm, keep, allreduce_every=2, double_buffering=double)
    for t in range(6):
        if r == other and t == (3 if double else 1):
            expect_raises(FloatingPointError, lambda: fragile.update(params, grads_of(t, r)),
                          "step() raising on this rank", "own step failure")
        else:
            fragile.update(params, grads_of(t, r))
    rounds = [mean([0, 1]), mean([2, 3]), mean([4, 5])]
    expect(same_seen(keep.seen, rounds[:2] if double else rounds),
           f"after a step() that raised (double buffering {double}): each round's averages")
    applied = rounds[1:2] if double else rounds[1:]
    if r != other:
        applied = rounds[:2] if double else rounds
    expect(same(params, stepped(initial(0), *applied)), "the parameters after a step() raised")
    fragile.synchronize()
    expect(same(fragile.averaged_grads, rounds[2]), "the last round's averages")

# Parameters that change shape between updates (on every rank: each raises its own).
expect_raises(ValueError, lambda: opt.update(params[:2], grads_of(2, r)[:2]),
              "fewer parameters than before", "changed shape or dtype since the last update")
expect_raises(TypeError, lambda: mncl.MultiNodeOptimizer(comm, 42), "a step that is neither",
              "step must be a function")
expect_raises(ValueError, lambda: mncl.MultiNodeOptimizer(comm, sgd, allreduce_every=0),
              "allreduce_every 0", "allreduce_every must be >= 1")
expect_raises(ValueError, lambda: mncl.MultiNodeOptimizer(comm, sgd, grad_dtype="int8"),
              "grad_dtype int8", "is not one of")
expect_raises(ValueError, lambda: mncl.MultiNodeOptimizer(comm, sgd, root=n), "root n",
              f"root {n} is not a rank of {n}")

# --- state_dict / load_state_dict ----------------------------------------------------------
plain_three = stepped(initial(0), mean([0]), mean([1]), mean([2]))
# Double-buffered, saved after two updates (step 1's averages exchanged, not applied), resumed
# without double buffering: that run applies them first, then step 2's: every one once.
params = initial(r)
db = mncl.MultiNodeOptimizer(comm, sgd, double_buffering=True)
db.update(params, grads_of(0, r))
db.update(params, grads_of(1, r))
state = pickle.loads(pickle.dumps(db.state_dict()))
resumed = mncl.MultiNodeOptimizer(comm, sgd)
resumed.load_state_dict(state)
expect(resumed.updates == 2, f"the state's update count: {resumed.updates}")
resumed.update(params, grads_of(2, r))
expect(same(params, plain_three), "double-buffered state resumed without: each average once")
# Saved without, resumed double-buffered: its first update only starts an exchange.
params = initial(r)
plain = mncl.MultiNodeOptimizer(comm, sgd)
plain.update(params, grads_of(0, r))
plain.update(params, grads_of(1, r))
resumed = mncl.MultiNodeOptimizer(comm, sgd, double_buffering=True)
resumed.load_state_dict(plain.state_dict())
own = stepped(initial(r), mean([0]), mean([1]))  # each rank's own: a broadcast would show
expect(resumed.update(own, grads_of(2, r)) is False, "plain state, double-buffered run: "
       "the first update only starts an exchange")
expect(same(own, stepped(initial(r), mean([0]), mean([1]))), "no broadcast, no step after a "
       "load")
resumed.update(own, grads_of(3, r))
expect(same(own, stepped(initial(r), mean([0]), mean([1]), mean([2]))),
       "then step 2's averages")
# Double-buffered into double-buffered: the lag goes on where it was.
params = initial(r)
db = mncl.MultiNodeOptimizer(comm, sgd, double_buffering=True)
db.update(params, grads_of(0, r))
state = db.state_dict()
again = mncl.MultiNodeOptimizer(comm, sgd, double_buffering=True)
again.load_state_dict(state)
expect(again.update(params, grads_of(1, r)) is True, "a double-buffered resume steps at once")
expect(same(params, stepped(initial(0), mean([0]))), "with the saved averages")
# Mid-round (allreduce_every=2, one micro-batch in): only the same allreduce_every resumes.
params = initial(r)
acc = mncl.MultiNodeOptimizer(comm, sgd, allreduce_every=2)
acc.update(params, grads_of(0, r))
state = acc.state_dict()
expect_raises(ValueError, lambda: mncl.MultiNodeOptimizer(comm, sgd, allreduce_every=3)
              .load_state_dict(state), "mid-round state, other allreduce_every",
              "saved after 1 of 2 micro-batches")
acc2 = mncl.MultiNodeOptimizer(comm, sgd, allreduce_every=2)
acc2.load_state_dict(state)
expect(acc2.update(params, grads_of(1, r)) is True, "the resumed round completes")
expect(same(params, stepped(initial(0), mean([0, 1]))), "with the saved micro-batch")
expect_raises(ValueError, lambda: acc2.load_state_dict({"format": "x"}), "a foreign state",
              "not a state of MultiNodeOptimizer.state_dict()")
# A state of other parameters: refused at the next update, on every rank alike.
small = mncl.MultiNodeOptimizer(comm, sgd)
small.load_state_dict(plain.state_dict())
expect_raises(ValueError, lambda: small.update(params[:2], grads_of(0, r)[:2]),
              "a state of other parameters", "do not match the loaded state's averages")

# With allreduce_every = 2 across the modes: every round's averages applied once, in order.
rounds = [mean([0, 1]), mean([2, 3]), mean([4, 5])]
for saved_double, saved_after, updates_after in ((True, 4, 2), (True, 3, 1), (False, 3, 3)):
    params = initial(r)
    saved = mncl.MultiNodeOptimizer(comm, sgd, allreduce_every=2, double_buffering=saved_double)
    for t in range(saved_after):
        saved.update(params, grads_of(t, r))
    state = pickle.loads(pickle.dumps(saved.state_dict()))
    after = mncl.MultiNodeOptimizer(comm, sgd, allreduce_every=2,
                                    double_buffering=not saved_double)
    after.load_state_dict(state)
    for t in range(saved_after, saved_after + updates_after):
        after.update(params, grads_of(t, r))
    applied = rounds[:(saved_after + updates_after) // 2]
    if not saved_double:
        applied = applied[:-1]  # the last round's averages are in flight
    expect(same(params, stepped(initial(0), *applied)), f"allreduce_every=2, state saved "
           f"after {saved_after} updates (double buffering {saved_double}) resumed in the "
           f"other mode")
    after.synchronize()
    expect(same(after.averaged_grads, applied[-1] if saved_double else rounds[len(applied)]),
           "... and its last averages")

# A double-buffered state resumed without double buffering, step() raising on one rank: the
# exchange came first, so the other ranks go on.
params = initial(r)
db = mncl.MultiNodeOptimizer(comm, sgd, double_buffering=True)
db.update(params, grads_of(0, r))
state = db.state_dict()
keep = Recorder(fail_on=other, fail_at=1)
resumed = mncl.MultiNodeOptimizer(comm, keep)
resumed.load_state_dict(state)
if r == other:
    expect_raises(FloatingPointError, lambda: resumed.update(params, grads_of(1, r)),
                  "the pending averages' step() raising on this rank", "own step failure")
else:
    expect(resumed.update(params, grads_of(1, r)) is True, "the pending averages, then step 1's")
resumed.update(params, grads_of(2, r))
# (where it raised, neither they nor step 1's were applied: that rank's own loss)
applied = [mean([2])] if r == other else [mean([0]), mean([1]), mean([2])]
given = [mean([0]), mean([2])] if r == other else [mean([0]), mean([1]), mean([2])]
expect(same(params, stepped(initial(0), *applied)) and same_seen(keep.seen, given),
       "after the pending averages' step() raised on one rank, the updates go on")

# Malformed states: a ValueError naming the field, and nothing changes.
params = initial(r)
source = mncl.MultiNodeOptimizer(comm, sgd, allreduce_every=2)
for t in range(3):
    source.update(params, grads_of(t, r))
good = source.state_dict()  # averages, and one micro-batch accumulated
params = initial(r)
target = mncl.MultiNodeOptimizer(comm, sgd, allreduce_every=2)
target.update(params, grads_of(0, r))
target.update(params, grads_of(1, r))
kept = target.state_dict()
longdouble = np.longdouble if np.dtype(np.longdouble).itemsize > 8 else np.complex64
malformed = [("format", "not a state of", None), ("version", "version", 2)]
malformed += [(key, key, None) for key in ("updates", "broadcasted", "double_buffering",
                                           "have_averaged", "allreduce_every", "accumulated")]
malformed += [("updates", "updates", v) for v in (-1, True, 1.5, "3")]
malformed += [(key, key, v) for key in ("broadcasted", "double_buffering", "have_averaged")
              for v in ("yes", 1)]
malformed += [("allreduce_every", "allreduce_every", v) for v in (0, "2", 2.0)]
malformed += [("accumulated", "accumulated", v) for v in (-1, 2, 0.5, "1")]
malformed += [("averaged", "averaged", v) for v in (
    5, "abc", [5] * 3, [np.zeros(6, longdouble), *good["averaged"][1:]],
    np.stack([np.zeros(2), np.ones(2)]))]
malformed += [("accumulator", "accumulator", v) for v in (
    5, good["accumulator"][:2], [good["accumulator"][0].reshape(3, 2), *good["accumulator"][1:]],
    [a.astype(np.float64) for a in good["accumulator"]], None)]
cases = [(field, text, dict(good, **{field: value})) for field, text, value in malformed]
cases += [(key, key, {k: v for k, v in good.items() if k != key}) for key in good
          if key not in ("format", "version")]
cases += [("have_averaged", "averaged", dict(good, averaged=None, accumulator=None,
                                             accumulated=0)),
          ("accumulator without averaged", "accumulator",
           dict(good, averaged=None, have_averaged=False)),
          ("not a dict", "not a state of", [("format", "mncl.MultiNodeOptimizer")])]
for i, (field, text, state) in enumerate(cases):
    what = f"malformed state {i} ({field!r})"
    expect_raises(ValueError, lambda: target.load_state_dict(state), what, text)
    expect(same_state(target.state_dict(), kept), f"{what}: nothing changed")
for t in range(2, 4):
    target.update(params, grads_of(t, r))
expect(same(params, stepped(initial(0), mean([0, 1]), mean([2, 3]))),
       "the optimizer goes on after the malformed states")
target.load_state_dict(good)  # the well-formed one, for comparison
expect(same_state(target.state_dict(), good), "a well-formed state loads")

if n > 1:
    # Optimizers at different points (states loaded on one rank only, or another state there):
    # InvalidArgumentError on every rank, nothing moved. Each differs in one thing that decides
    # which collectives an update enters, or whether it steps.
    params = initial(r)
    source = mncl.MultiNodeOptimizer(comm, sgd, allreduce_every=2)
    source.update(params, grads_of(0, r))
    source.update(params, grads_of(1, r))
    boundary = source.state_dict()
    source.update(params, grads_of(2, r))
    mid = source.state_dict()  # a step taken, and one micro-batch of the next
    broadcast_only = mncl.MultiNodeOptimizer(comm, sgd)
    broadcast_only.broadcast_parameters(initial(r))
    diverging = [
        ("a state loaded on one rank only", {"allreduce_every": 2}, boundary, None),
        ("a state of the broadcast alone, loaded on one rank only", {},
         broadcast_only.state_dict(), None),
        ("a round resumed mid-way on one rank only", {"allreduce_every": 2}, mid, boundary),
        ("pending double-buffered averages on one rank only", {}, db.state_dict(),
         plain.state_dict()),
        ("averages to step with on one rank only", {"double_buffering": True}, db.state_dict(),
         plain.state_dict()),
    ]
    for what, settings, there, elsewhere in diverging:
        ahead = mncl.MultiNodeOptimizer(comm, sgd, **settings)
        state = there if r == other else elsewhere
        if state is not None:
            ahead.load_state_dict(state)
        before = ahead.state_dict()
        own = initial(r)
        expect_raises(mncl.InvalidArgumentError, lambda: ahead.update(own, grads_of(2, r)),
                      what, f"rank {other} passed other arguments")
        expect(same(own, initial(r)) and same_state(ahead.state_dict(), before),
               f"{what}: nothing changed")

# --- a HierarchicalCommunicator -------------------------------------------------------------
backend = os.environ.get("MNCL_BACKEND", "naive")
with mncl.HierarchicalCommunicator(comm, intra_backend=backend) as hier:
    params = initial(r)
    opt = mncl.MultiNodeOptimizer(hier, sgd)
    opt.update(params, grads_of(0, r))
    opt.update(params, grads_of(1, r))
    expect(same(params, stepped(initial(0), mean([0]), mean([1]))), "through the hierarchy")
    expect_raises(ValueError, lambda: mncl.MultiNodeOptimizer(hier, sgd, double_buffering=True),
                  "double buffering on a hierarchy", "needs a non-blocking allreduce")

comm.close()
checks.finish("MultiNodeOptimizer checks passed")
