"""What the Python training helpers cost on top of the bare collective, side by side in one
run: allreduce_coalesced(op="avg") against multi_node_mean_grad (which agrees on its
arguments first) and MultiNodeOptimizer.update (agreement, packing into its own buffers, the
division; step a no-op), plain and double-buffered (no compute between updates here, so no
overlap is measured). Rank 0 prints microseconds per call.

    build/bin/mncl-run -n 2 --backend shm -- python3 bench/python/training_cost.py 4 256 200

Arguments: arrays per call, float32 elements per array, timed calls (after 10 untimed)."""

import sys
import time

import numpy as np

import mncl


def main():
    n_arrays, elems, iters = (int(a) for a in sys.argv[1:4])
    with mncl.Communicator() as comm:
        params = [np.zeros(elems, np.float32) for _ in range(n_arrays)]
        grads = [np.ones(elems, np.float32) for _ in range(n_arrays)]
        plain = mncl.MultiNodeOptimizer(comm, lambda p, g: None)
        double = mncl.MultiNodeOptimizer(comm, lambda p, g: None, double_buffering=True)

        def per_call_us(fn):
            for _ in range(10):
                fn()
            comm.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                fn()
            return (time.perf_counter() - start) / iters * 1e6

        rows = [("allreduce_coalesced", lambda: comm.allreduce_coalesced(grads, grads, op="avg")),
                ("multi_node_mean_grad", lambda: comm.multi_node_mean_grad(grads)),
                ("MultiNodeOptimizer.update", lambda: plain.update(params, grads)),
                ("  double-buffered", lambda: double.update(params, grads))]
        times = [(name, per_call_us(fn)) for name, fn in rows]
        if comm.rank == 0:
            print(f"# {comm.size} ranks on {comm.backend}, {n_arrays} arrays x {elems} float32")
            for name, us in times:
                print(f"{name:28s} {us:10.1f} us  {us / times[0][1]:5.2f}x")


if __name__ == "__main__":
    main()
