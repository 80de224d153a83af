"""mncl.MultiNodeOptimizer (run under mncl-run -n N), against exact values computed here from
every rank's gradients: the first update's broadcast from the root, averages of mixed dtypes,
double buffering's one-step lag, allreduce_every's accumulation, zero_fill, grad_dtype
float16/bfloat16, a HierarchicalCommunicator, and state_dict/load_state_dict across the
double-buffering modes. Every refused argument fails every rank together (its own error where
it was passed, RemoteError or InvalidArgumentError elsewhere) and changes nothing."""

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

# --- grad_dtype: one message of float16 or bfloat16 ----------------------------------------
for grad_dtype in ("float16", "bfloat16"):
    params = initial(r)
    opt = mncl.MultiNodeOptimizer(comm, sgd, grad_dtype=grad_dtype)
    # Gradients of n x small integers: the per-rank means (g / n) and their sum are exact.
    opt.update(params, grads_of(0, r, scale=n))
    expect(same(params, stepped(initial(0), mean([0], scale=n))), f"grad_dtype {grad_dtype}")
    expect(opt.stats.bytes == 11 * 2, f"grad_dtype {grad_dtype}: 2 bytes per element, in one "
           f"message: {opt.stats.bytes}")

# --- refusals: on one rank, on every rank together; nothing changes ------------------------
params = initial(r)
opt = mncl.MultiNodeOptimizer(comm, sgd)
opt.update(params, grads_of(0, r))
after_one = [p.copy() for p in params]


def refused(mine, what, own_type, own_text, *, on=other, optimizer=None):
    """An update with `mine` on rank `on` (good gradients elsewhere) raises own_type there and
    RemoteError on the others, and changes nothing."""
    optimizer = optimizer or opt
    if r == on:
        expect_raises(own_type, lambda: optimizer.update(params, mine), what, own_text)
    else:
        expect_raises(mncl.RemoteError, lambda: optimizer.update(params, grads_of(1, r)),
                      f"{what} (beside)", f"rank {on} could not take part")
    expect(same(params, after_one) and opt.updates == 1, f"{what}: nothing changed")


bad = grads_of(1, r)
bad[0] = bad[0].reshape(3, 2)
refused(bad, "a gradient of another shape", ValueError, "parameter 0 is float32[2, 3] but its "
        "gradient float32[3, 2]")
refused(grads_of(1, r)[:2], "a missing gradient", ValueError, "3 parameters but 2 gradients")
bad = grads_of(1, r)
bad[1] = bad[1].astype(np.float32)
refused(bad, "a gradient of another dtype", ValueError, "its gradient float32[4]")
strict = mncl.MultiNodeOptimizer(comm, sgd, zero_fill=False)
bad = grads_of(1, r)
bad[2] = None
if r == other:
    expect_raises(ValueError, lambda: strict.update(params, bad), "None without zero_fill",
                  "parameter 2 has no gradient (None); enable zero_fill")
else:
    expect_raises(mncl.RemoteError, lambda: strict.update(params, grads_of(1, r)),
                  "None without zero_fill (beside)", f"rank {other} could not take part")
expect(same(params, after_one) and strict.updates == 0, "a refused first update: no broadcast")
if n > 1:
    # Another layout on one rank: InvalidArgumentError naming it on every rank.
    fresh = mncl.MultiNodeOptimizer(comm, sgd)
    mine_params = params + [np.zeros(2, np.float32)] if r == other else params
    mine_grads = grads_of(1, r) + ([np.ones(2, np.float32)] if r == other else [])
    expect_raises(mncl.InvalidArgumentError, lambda: fresh.update(mine_params, mine_grads),
                  "another layout on one rank", f"rank {other} passed other arguments")
    expect(same(params, after_one) and fresh.updates == 0, "another layout: nothing changed")
    # Other settings on one rank.
    mixed = mncl.MultiNodeOptimizer(comm, sgd, grad_dtype="float16" if r == other else None)
    expect_raises(mncl.InvalidArgumentError, lambda: mixed.update(params, grads_of(1, r)),
                  "another grad_dtype on one rank", f"rank {other} passed other arguments")
# The optimizer goes on after every refusal.
opt.update(params, grads_of(1, r))
expect(same(params, stepped(initial(0), mean([0]), mean([1]))), "updates after the refusals")
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
expect(resumed.update(params, grads_of(2, r)) is False, "plain state, double-buffered run: "
       "the first update only starts an exchange")
expect(same(params, stepped(initial(0), mean([0]), mean([1]))), "no broadcast, no step after a "
       "load")
resumed.update(params, grads_of(3, r))
expect(same(params, stepped(initial(0), mean([0]), mean([1]), mean([2]))),
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
