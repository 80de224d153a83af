"""ChainerMN's training helpers of the mncl Python package (run under mncl-run -n N), against
exact values: bcast_data from every root; multi_node_mean_grad over mixed dtypes, through
grad_dtype float16/bfloat16/float32, in place; Evaluator over uneven shards (a rank with none
included); multi_node_iterator; Checkpointer (keep, a rank that died mid-save, a corrupt
snapshot, a load that refuses, a job of another size, groups from splits). Every refused
argument fails every rank together: its own error on the rank that passed it, RemoteError or
InvalidArgumentError naming the rank on the others; the communicator works on."""

import os
import pickle
import shutil
import struct
import tempfile
import zlib

from checks import world_and_checks

np, mncl, comm, checks = world_and_checks()
expect, expect_raises = checks.expect, checks.expect_raises
r, n = comm.rank, comm.size
other = n - 1  # the rank that misbehaves in the failure cases (rank 0 itself at 1 rank)


def params_of(rank):
    """Arrays of several dtypes and shapes (a 0-d one, an empty one), different per rank."""
    return [np.arange(12, dtype=np.float32).reshape(3, 4) + 100 * rank,
            np.full(5, rank, np.int64), np.array(rank + 0.25), np.zeros(0, np.float32),
            np.arange(7, dtype=np.float32) - rank, np.arange(3, dtype=np.uint8) + rank]


def same_arrays(got, want):
    return len(got) == len(want) and all(
        a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
        for a, b in zip(got, want))


# --- bcast_data ---------------------------------------------------------------------------
for root in range(n):
    mine = params_of(r)
    memory = [a.ctypes.data for a in mine]
    got = comm.bcast_data(mine, root=root)
    expect(got is mine and [a.ctypes.data for a in mine] == memory,
           f"bcast_data from {root} works in place")
    expect(same_arrays(mine, params_of(root)), f"bcast_data from root {root}")
expect(comm.bcast_data([]) == [], "bcast_data of no arrays")

# A read-only array on one rank: its ValueError there, RemoteError naming it elsewhere.
mine = params_of(r)
if r == other:
    mine[1].flags.writeable = False
if r == other:
    expect_raises(ValueError, lambda: comm.bcast_data(mine), "bcast_data, read-only array",
                  "array 1 must be C-contiguous and writeable")
else:
    expect_raises(mncl.RemoteError, lambda: comm.bcast_data(mine),
                  "bcast_data beside a refused array", f"rank {other} could not take part")
expect(same_arrays(mine, params_of(r)), "a refused bcast_data moved nothing")
if n > 1:
    # Another shape on one rank: InvalidArgumentError naming it on every rank.
    mine = params_of(r)
    if r == other:
        mine[4] = np.zeros(8, np.float32)
    expect_raises(mncl.InvalidArgumentError, lambda: comm.bcast_data(mine),
                  "bcast_data with another shape on one rank",
                  f"rank {other} passed other arguments than rank 0")
    expect(r == other or same_arrays(mine, params_of(r)), "a mismatched bcast_data moved nothing")
expect_raises(mncl.InvalidArgumentError, lambda: comm.bcast_data(params_of(r), root=n),
              "bcast_data from a root past the size", f"root {n} is not a rank")
expect_raises(TypeError, lambda: comm.bcast_data(np.zeros(3)), "bcast_data of one array",
              "takes a list of arrays")
mine = params_of(r)
comm.bcast_data(mine, root=0)
expect(same_arrays(mine, params_of(0)), "bcast_data after the refusals")

# --- multi_node_mean_grad -----------------------------------------------------------------
# Rank q contributes (q + 1) * base: the mean is base * (n + 1) / 2, exact in every float
# dtype here (base holds small integers; (n + 1) / 2 is a multiple of 1/2), and for integers
# the library's AVG truncates toward zero.
half_steps = n + 1  # the mean is base * half_steps / 2


def grads_of(rank, dtypes=(np.float32, np.float64, np.float32, np.int32)):
    return [(np.arange(6, dtype=dt).reshape(2, 3) - 2) * (rank + 1) if dt != np.int32
            else np.array([7, -7, 1], dt) * (rank + 1) for dt in dtypes]


def mean_of(dtypes=(np.float32, np.float64, np.float32, np.int32)):
    out = []
    for dt, g in zip(dtypes, grads_of(0, dtypes)):
        total = g.astype(np.int64) * (n * (n + 1) // 2)
        out.append((np.trunc(total / n) if dt == np.int32 else g.astype(np.float64) *
                    half_steps / 2).astype(dt))
    return out


grads = grads_of(r)
memory = [g.ctypes.data for g in grads]
expect(comm.multi_node_mean_grad(grads) is grads and
       [g.ctypes.data for g in grads] == memory, "multi_node_mean_grad works in place")
expect(same_arrays(grads, mean_of()), f"multi_node_mean_grad: {grads} vs {mean_of()}")
floats = (np.float32, np.float64, np.float32, np.float16)
for grad_dtype in mncl.training.GRAD_DTYPES:
    grads = grads_of(r, floats)
    comm.multi_node_mean_grad(grads, grad_dtype=grad_dtype)
    expect(same_arrays(grads, mean_of(floats)), f"multi_node_mean_grad through {grad_dtype}")
# float16 on the wire rounds: 1 + 2^-11 is not a float16, 1 + 2^-10 is.
fine = [np.full(4, 1 + 2.0**-11, np.float32)]
comm.multi_node_mean_grad(fine, grad_dtype="float16")
expect(np.all(fine[0] == np.float32(1.0)), "grad_dtype=float16 sends float16 values")
expect(comm.multi_node_mean_grad([]) == [], "multi_node_mean_grad of no arrays")
expect_raises(TypeError, lambda: comm.multi_node_mean_grad(grads_of(r), grad_dtype="float16"),
              "grad_dtype with an integer gradient", "gradient 3 is int32")
expect_raises(ValueError, lambda: comm.multi_node_mean_grad(grads_of(r), grad_dtype="int8"),
              "an unknown grad_dtype", "grad_dtype 'int8' is not one of")
grads = grads_of(r)
if r == other:
    grads[2] = np.asfortranarray(np.ones((2, 3), np.float32))[:, :2]
if r == other:
    expect_raises(ValueError, lambda: comm.multi_node_mean_grad(grads),
                  "multi_node_mean_grad with a strided array", "array 2 must be C-contiguous")
else:
    expect_raises(mncl.RemoteError, lambda: comm.multi_node_mean_grad(grads),
                  "multi_node_mean_grad beside a refused array",
                  f"rank {other} could not take part")
    expect(same_arrays(grads, grads_of(r)), "a refused multi_node_mean_grad moved nothing")
if n > 1:
    for variant in ("a gradient more", "grad_dtype"):
        grads = grads_of(r, floats)
        grad_dtype = None
        if r == other and variant == "a gradient more":
            grads.append(np.ones(2, np.float32))
        if r == other and variant == "grad_dtype":
            grad_dtype = "bfloat16"
        expect_raises(mncl.InvalidArgumentError,
                      lambda: comm.multi_node_mean_grad(grads, grad_dtype=grad_dtype),
                      f"multi_node_mean_grad with {variant} on one rank",
                      f"rank {other} passed other arguments than rank 0")
# Failures that are neither TypeError nor ValueError, and arrays sharing memory (which the
# library's coalesced call would refuse on that rank alone), fail every rank together too.


def broken_generator():
    yield np.zeros(3, np.float32)
    raise RuntimeError("the model is gone")


# The others pass arrays of the culprit's layout: only the culprit's own problem is left.
shared = np.zeros(4, np.float32)
for what, culprit_args, others_args, error, says in (
        ("a generator that raises", broken_generator, lambda: [np.zeros(3, np.float32)],
         RuntimeError, "the model is gone"),
        ("one array listed twice", lambda: [shared, shared],
         lambda: [np.zeros(4, np.float32), np.zeros(4, np.float32)], ValueError,
         "arrays 0 and 1 share memory"),
        ("overlapping views", lambda: [shared[:3], shared[2:]],
         lambda: [np.zeros(3, np.float32), np.zeros(2, np.float32)], ValueError,
         "share memory")):
    for call in (comm.multi_node_mean_grad, comm.bcast_data):
        args = culprit_args() if r == other else others_args()
        if r == other:
            expect_raises(error, lambda: call(args), f"{call.__name__}: {what}", says)
        else:
            expect_raises(mncl.RemoteError, lambda: call(args),
                          f"{call.__name__} beside {what}", f"rank {other} could not take part")
grads = grads_of(r)
comm.multi_node_mean_grad(grads)
expect(same_arrays(grads, mean_of()), "multi_node_mean_grad after the refusals")

# --- Evaluator ----------------------------------------------------------------------------
# Rank q saw q + 1 samples with mean loss q and accuracy 1 / (q + 1), except rank 1 (none,
# reporting nothing): the result is the mean over every sample.
evaluator = mncl.Evaluator(comm)
seen = {q: (0 if q == 1 else q + 1) for q in range(n)}
total = sum(seen.values())
want = {"loss": sum(q * s for q, s in seen.items()) / total,
        "accuracy": sum(1.0 / (q + 1) * s for q, s in seen.items()) / total}
mine = {} if r == 1 else {"loss": float(r), "accuracy": 1.0 / (r + 1)}
got = evaluator.average(mine, seen[r])
expect(got.keys() == want.keys() and all(abs(got[k] - want[k]) <= 1e-12 * abs(want[k])
                                         for k in want), f"Evaluator.average {got} vs {want}")
expect(evaluator.average({"loss": float("nan")}, 0) == {}, "Evaluator.average of no samples")
if n > 1:
    expect_raises(mncl.InvalidArgumentError,
                  lambda: evaluator.average({"loss" if r != other else "lost": 1.0}, 1),
                  "Evaluator.average with other names on one rank", "different metric names")
# evaluate(): shards of uneven sizes, batches of 2; sample value v has loss v.
shard = [float(10 * r + i) for i in range(r + 2)]
got = evaluator.evaluate(shard, 2, lambda batch: {"loss": sum(batch) / len(batch)})
everything = [float(10 * q + i) for q in range(n) for i in range(q + 2)]
expect(abs(got["loss"] - sum(everything) / len(everything)) <= 1e-12 * sum(everything),
       f"Evaluator.evaluate {got}")


def fails_on_other(batch):
    if r == other:
        raise KeyError("no such column")
    return {"loss": 0.0}


if r == other:
    expect_raises(KeyError, lambda: evaluator.evaluate(shard, 2, fails_on_other),
                  "Evaluator.evaluate whose batch fails", "no such column")
else:
    expect_raises(mncl.RemoteError, lambda: evaluator.evaluate(shard, 2, fails_on_other),
                  "Evaluator.evaluate beside a failing batch", f"rank {other} could not evaluate")

# Refused arguments on one rank: an empty shard's batch size (len(shard) = 0), a value that
# no float holds, a count that is no integer.
for what, call, error in (
        ("batch size 0", lambda: evaluator.evaluate([] if r == other else shard,
                                                    0 if r == other else 2,
                                                    lambda b: {"loss": 0.0}), ValueError),
        # A metric of the first batch only (it was divided by every sample: biased to zero).
        ("a metric of one batch only", lambda: evaluator.evaluate(
            shard, 1, lambda b: {"loss": 0.0, **({"extra": 1.0} if r == other and b == shard[:1]
                                                  else {})}), ValueError),
        ("a value past float", lambda: evaluator.average(
            {"loss": 10**400 if r == other else 1.0}, 1), OverflowError),
        ("a count of 1.5 samples", lambda: evaluator.average(
            {"loss": 1.0}, 1.5 if r == other else 1), TypeError)):
    if r == other:
        expect_raises(error, call, f"Evaluator: {what}")
    else:
        expect_raises(mncl.RemoteError, call, f"Evaluator beside {what}",
                      f"rank {other} could not evaluate")

# --- multi_node_iterator ------------------------------------------------------------------
for root in range(n):
    batches = ({"x": np.arange(i), "label": i} for i in range(5)) if r == root else None
    got = list(mncl.multi_node_iterator(batches, comm, root=root))
    expect(len(got) == 5 and all(b["label"] == i and np.array_equal(b["x"], np.arange(i))
                                 for i, b in enumerate(got)), f"multi_node_iterator from {root}")


def breaks_at_two():
    yield 0
    yield 1
    raise OSError("disk gone")


received = []
if r == other:
    expect_raises(OSError, lambda: received.extend(mncl.multi_node_iterator(
        breaks_at_two(), comm, root=other)), "multi_node_iterator whose iterable fails",
        "disk gone")
else:
    expect_raises(mncl.RemoteError, lambda: received.extend(mncl.multi_node_iterator(
        None, comm, root=other)), "multi_node_iterator beside a failing iterable",
        "OSError: disk gone")
expect(received == [0, 1], f"multi_node_iterator yields what came before the failure: {received}")

# --- Checkpointer -------------------------------------------------------------------------
top = comm.bcast_obj(tempfile.mkdtemp(prefix="mncl-py-ckpt-") if r == 0 else None)
directory = os.path.join(top, "ckpt")
ckpt = mncl.Checkpointer(comm, directory, "mlp", sync=False, verbose=False)
expect(ckpt.resume() is None, "resume with no snapshot")


def state_of(iteration):
    return {"rank": r, "iteration": iteration, "w": np.arange(4.0) * iteration}


def same_state(got, iteration):
    want = state_of(iteration)
    return (isinstance(got, dict) and got.keys() == want.keys() and got["rank"] == r and
            got["iteration"] == iteration and np.array_equal(got["w"], want["w"]))


for it in (1, 2, 3):
    ckpt.save(it, state_of(it))
expect(ckpt.local_iterations() == [2, 3], f"keep=2 keeps {ckpt.local_iterations()}")
expect(ckpt.path(3) == os.path.join(directory, f"mlp.{r}.3"), f"the file name {ckpt.path(3)}")
with open(ckpt.path(3), "rb") as f:
    head = f.read(48)
# The C++ mncl::Checkpointer's header: magic, version 1, rank, size, no group, iteration.
expect(head[:8] == b"MNCLCKPT" and struct.unpack_from("<IIIIQ", head, 8) == (1, r, n, 0, 3),
       "the header is the C++ checkpointer's")
expect(struct.unpack_from("<I", head, 44)[0] == zlib.crc32(head[:44]), "the header's CRC-32")
found = ckpt.resume()
expect(found is not None and found[0] == 3 and same_state(found[1], 3), "resume the newest")
# Rank `other` died after saving 4 (keeping 3 files, so that 2 stays), before the others did,
# and left a temporary of 5.
if r == other and n > 1:
    mncl.Checkpointer(comm, directory, "mlp", keep=3, sync=False).save(4, state_of(4))
    with open(ckpt.path(5) + ".tmp", "wb") as f:
        f.write(b"half")
    expect(ckpt.local_iterations() == [2, 3, 4], "the crashed rank's snapshots")
found = ckpt.resume()
expect(found is not None and found[0] == 3 and same_state(found[1], 3),
       "resume what every rank holds")
expect(ckpt.local_iterations() == [2, 3] and not os.path.exists(ckpt.path(5) + ".tmp"),
       "resume removes an unfinished save's snapshot and temporaries")
# A corrupt newest snapshot on one rank: every rank goes back to 2.
if r == other:
    with open(ckpt.path(3), "r+b") as f:
        f.seek(60)
        byte = f.read(1)
        f.seek(60)
        f.write(bytes([byte[0] ^ 0xFF]))
found = ckpt.resume()
expect(found is not None and found[0] == 2 and same_state(found[1], 2),
       "resume past a corrupt snapshot")
# A load that refuses the snapshot for this run: every rank raises, nothing is deleted.
before = ckpt.local_iterations()


def refuse(state):
    raise ValueError("saved with allreduce_every=4")


expect_raises(mncl.InvalidArgumentError, lambda: ckpt.resume(load=refuse),
              "a load that refuses the snapshot", "saved with allreduce_every=4")
expect(ckpt.local_iterations() == before, "a refused resume deleted nothing")
found = ckpt.resume(load=lambda state: state["iteration"])
expect(found == (2, 2), f"resume(load=) returns what load returns: {found}")
# A newer snapshot that verifies but does not unpickle on one rank (a pickle protocol this
# Python lacks, say: a ValueError) is not a refusal: every rank resumes the older one.
ckpt.save_bytes(3, b"\x80\x09not a pickle" if r == other else pickle.dumps(state_of(3)))
found = ckpt.resume()
expect(found is not None and found[0] == 2 and same_state(found[1], 2),
       "resume past a snapshot that does not unpickle")
expect_raises(TypeError, lambda: ckpt.save_bytes(4, 5), "save_bytes of an int")
expect_raises(TypeError, lambda: ckpt.save(2.5, {}), "save of iteration 2.5")


class JobOfAnotherSize:
    """What a job of n + 1 ranks' rank r would be, for its (local) save."""
    rank, size, group_path = r, n + 1, ""


# Snapshots of a job of another size: never loaded nor overwritten; resume says so.
other_dir = os.path.join(top, "other")
mncl.Checkpointer(JobOfAnotherSize(), other_dir, "mlp", sync=False).save(7, {"x": 1})
theirs = mncl.Checkpointer(comm, other_dir, "mlp", sync=False, verbose=False)
expect_raises(mncl.CheckpointError, lambda: theirs.resume(), "resume among another job's",
              f"a job of {n + 1} ranks wrote")
expect_raises(mncl.CheckpointError, lambda: theirs.save(7, {"x": 2}), "save over another job's",
              "it was not overwritten")
expect(mncl.Checkpointer(JobOfAnotherSize(), other_dir, "mlp").read_snapshot(7)[0] is not None,
       "another job's snapshot is intact")

# Groups: a split's checkpointer names its group in the files; split_host's needs group=.
half = comm.split(r % 2)
expect(half.group_path == f"s0c{r % 2}", f"the first split's group path {half.group_path}")
grouped = mncl.Checkpointer(half, directory, "mlp", sync=False)
grouped.save(1, {"half": r % 2})
expect(os.path.basename(grouped.path(1)) == f"mlp.s0c{r % 2}.{half.rank}.1",
       f"a group's file name {grouped.path(1)}")
found = grouped.resume()
expect(found == (1, {"half": r % 2}), f"a group resumes its own snapshot: {found}")
half.close()
flag = comm.split(bool(r % 2))  # True is color 1, as the library takes it
expect(flag.group_path == f"s1c{r % 2}", f"a bool color's group path {flag.group_path}")
flag.close()
host = comm.split_host()
expect(host.group_path is None, "split_host's group is unknown")
expect_raises(mncl.InvalidArgumentError, lambda: mncl.Checkpointer(host, directory, "mlp"),
              "a checkpointer on split_host without group=", "name the group in group=")
expect(mncl.Checkpointer(host, directory, "mlp", group="host").group == "uhost",
       "group= names it")
host.close()
comm.barrier()
if r == 0:
    shutil.rmtree(top)

comm.close()
checks.finish("training helpers passed")
