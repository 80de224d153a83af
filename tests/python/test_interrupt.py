"""Ctrl-C during a blocking call (run under mncl-run -n N, N >= 2, with a long MNCL_TIMEOUT).

First, with a SIGINT handler of the application's own (one that records the signal and goes
on, as a training loop that stops at the end of its step does): rank 0's allreduce, which the
last rank joins a second late, is not ended by the SIGINT that comes meanwhile; it returns the
sum, and the handler has run. Then with Python's own handler: rank 0 enters an allreduce that
the last rank never joins, and a SIGINT reaches its process a moment later (as Ctrl-C would):
KeyboardInterrupt must come at once, not when the call ends at its timeout (the communicator's
60 s here; the library's default is 300 s). The call cannot be taken back, so the communicator
is aborted: later calls on it raise AbortedError on rank 0, and the other ranks, in the same
allreduce or in a receive from rank 0, fail naming rank 0's abort, also long before their
timeout. Exits 77 (ctest: skipped) when NumPy is missing."""

import os
import signal
import threading
import time

from checks import world_and_checks

np, mncl, comm, checks = world_and_checks()
expect = checks.expect
r, n = comm.rank, comm.size
BEFORE_TIMEOUT_S = 30  # half the communicator's timeout: "not at the timeout", judged loosely

expect(n >= 2, "run at 2 ranks or more")
# The calls of a healthy communicator give their results on the main thread (watched) and
# from another thread (not).
expect(np.all(comm.allreduce(np.ones(3)) == n), "allreduce on the main thread")
from_thread = []
worker = threading.Thread(target=lambda: from_thread.append(comm.allreduce(np.full(2, r))))
worker.start()
worker.join()
expect(len(from_thread) == 1 and np.all(from_thread[0] == n * (n - 1) / 2),
       f"allreduce from another thread: {from_thread}")

# A child forked now must not keep the wakeup fd, which points at the pipe that the parent's
# watch reads: the child's SIGINT would abort the parent's call.
child = os.fork()
if child == 0:
    os._exit(0 if signal.set_wakeup_fd(-1) == -1 else 1)
_, child_status = os.waitpid(child, 0)
expect(os.WIFEXITED(child_status) and os.WEXITSTATUS(child_status) == 0,
       f"a forked child inherited the wakeup fd (status {child_status})")

# The application's own SIGINT handler, which goes on: the call is not ended.
received = []
previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
comm.barrier()
if r == 0:
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
elif r == n - 1:
    time.sleep(1.0)
total = comm.allreduce(np.full(2, r + 1))
expect(np.all(total == n * (n + 1) / 2), f"allreduce past a handled SIGINT: {total}")
expect(received == ([signal.SIGINT] if r == 0 else []), f"the handler ran: {received}")
signal.signal(signal.SIGINT, previous)
comm.barrier()

start = time.monotonic()
outcome = None
if r == 0:
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    try:
        comm.allreduce(np.ones(4))
        outcome = "returned"
    except KeyboardInterrupt:
        outcome = "interrupted"
    except mncl.MnclError as e:
        outcome = f"{type(e).__name__}: {e}"
    took = time.monotonic() - start
    expect(outcome == "interrupted", f"Ctrl-C in an allreduce: {outcome}")
    expect(took < BEFORE_TIMEOUT_S, f"KeyboardInterrupt after {took:.2f} s, not at once")
    checks.expect_raises(mncl.AbortedError, lambda: comm.allreduce(np.ones(1)),
                         "a call after the interrupted one", "abort")
else:
    try:
        if r == n - 1:
            comm.recv(np.empty(1), 0)  # rank 0 never sends: it is interrupted
        else:
            comm.allreduce(np.ones(4))  # the last rank never joins
        outcome = "returned"
    except (mncl.AbortedError, mncl.RemoteError) as e:
        outcome = str(e)
    except mncl.MnclError as e:
        outcome = f"{type(e).__name__}: {e}"
    took = time.monotonic() - start
    expect("rank 0" in outcome and "abort" in outcome,
           f"rank 0's interrupt reaches rank {r} as its abort: {outcome}")
    expect(took < BEFORE_TIMEOUT_S, f"rank {r} failed after {took:.2f} s, not at once")
comm.close()
checks.finish(f"Ctrl-C: {outcome} on rank {r}")
