"""Data-parallel training in NumPy with MNCL's ChainerMN-style helpers: a softmax classifier on
synthetic data (three Gaussian blobs; nothing to download).

    mncl-run -n 4 -- python3 examples/python/train_softmax.py --checkpoint /tmp/softmax

- rank 0 makes the dataset; scatter_dataset hands every rank its shard,
- each rank starts from its own random weights; bcast_data makes them rank 0's,
- every step: this rank's gradient, then MultiNodeOptimizer.update: the mean over the ranks
  (the same as one process's gradient of the ranks' batches together) and an SGD step with it
  (--double-buffering: with the previous step's mean, its exchange overlapping this step),
- Evaluator: test loss and accuracy over every rank's test shard, sample-weighted,
- Checkpointer: a snapshot per epoch, the optimizer's state included; a rerun resumes from the
  newest one every rank holds (--stop-after K ends the run after epoch K, as a crash would).
"""

import argparse
import sys

import numpy as np

import mncl

CLASSES, FEATURES = 3, 2


def make_dataset(n, seed):
    """n samples (features as float32, label) of three blobs around the corners of a
    triangle."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, n)
    centers = np.array([[0.0, 2.0], [-1.7, -1.0], [1.7, -1.0]])
    features = centers[labels] + rng.normal(0.0, 0.8, (n, FEATURES))
    return [(features[i].astype(np.float32), int(labels[i])) for i in range(n)]


def forward(params, x, y):
    """(mean cross-entropy, accuracy, gradients) of a batch."""
    weights, bias = params
    logits = x @ weights + bias
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    n = len(y)
    loss = float(-np.log(probs[np.arange(n), y] + 1e-12).mean())
    accuracy = float((probs.argmax(axis=1) == y).mean())
    delta = probs
    delta[np.arange(n), y] -= 1.0
    delta /= n
    return loss, accuracy, [(x.T @ delta).astype(np.float32), delta.sum(axis=0).astype(np.float32)]


def stack(samples):
    return (np.stack([s[0] for s in samples]) if samples else np.zeros((0, FEATURES), np.float32),
            np.array([s[1] for s in samples], np.int64))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16, help="samples per rank and step")
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--samples", type=int, default=1200)
    parser.add_argument("--grad-dtype", choices=mncl.training.GRAD_DTYPES, default=None)
    parser.add_argument("--double-buffering", action="store_true",
                        help="step with the previous step's averaged gradients")
    parser.add_argument("--checkpoint", help="a folder for snapshots (resumed when present)")
    parser.add_argument("--stop-after", type=int, help="end after this epoch, as a crash would")
    args = parser.parse_args()

    with mncl.Communicator() as comm:
        dataset = make_dataset(args.samples, seed=0) if comm.rank == 0 else None
        cut = args.samples * 3 // 4
        train = mncl.scatter_dataset(dataset[:cut] if dataset else None, comm, shuffle=True,
                                     seed=1)
        # Disjoint test shards, so that the Evaluator counts every sample once.
        test = mncl.scatter_dataset(dataset[cut:] if dataset else None, comm,
                                    force_equal_length=False)
        rng = np.random.default_rng(100 + comm.rank)  # on purpose: every rank its own start
        params = [rng.normal(0.0, 0.1, (FEATURES, CLASSES)).astype(np.float32),
                  np.zeros(CLASSES, np.float32)]
        comm.bcast_data(params, root=0)

        def sgd(params, grads):
            for p, g in zip(params, grads):
                p -= np.float32(args.lr) * g

        optimizer = mncl.MultiNodeOptimizer(comm, sgd, grad_dtype=args.grad_dtype,
                                            double_buffering=args.double_buffering)

        start = 0
        checkpointer = None
        if args.checkpoint:
            checkpointer = mncl.Checkpointer(comm, args.checkpoint, "softmax")
            found = checkpointer.resume()
            if found is not None:
                start, saved = found[0], found[1]
                params[0][...], params[1][...] = saved["weights"], saved["bias"]
                optimizer.load_state_dict(saved["optimizer"])
                if comm.rank == 0:
                    print(f"resumed after epoch {start}", flush=True)

        evaluator = mncl.Evaluator(comm)
        x_all, y_all = stack(train)
        metrics = {}
        for epoch in range(start + 1, args.epochs + 1):
            order = np.random.default_rng(epoch).permutation(len(train))  # same on every rank
            for begin in range(0, len(order) - args.batch + 1, args.batch):
                batch = order[begin:begin + args.batch]
                _, _, grads = forward(params, x_all[batch], y_all[batch])
                optimizer.update(params, grads)
            metrics = evaluator.evaluate(test, 64, lambda samples: dict(
                zip(("loss", "accuracy"), forward(params, *stack(samples))[:2])))
            if comm.rank == 0:
                print(f"epoch {epoch} test loss {metrics['loss']:.4f} "
                      f"accuracy {metrics['accuracy']:.4f}", flush=True)
            if checkpointer:
                checkpointer.save(epoch, {"weights": params[0], "bias": params[1],
                                          "optimizer": optimizer.state_dict()})
            if args.stop_after == epoch:
                return 3
        if comm.rank == 0:
            print("weights " + " ".join(f"{v:.9g}" for v in np.concatenate(
                [p.ravel() for p in params])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
