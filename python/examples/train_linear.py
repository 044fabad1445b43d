#!/usr/bin/env python3
"""train_linear.py: the custom training loop of TF's distributed-training guide, with tributary and NumPy.

The Python twin of examples/train_linear.cc: a one-weight linear model (Dense(1): y = w*x + b) fit
to y = 2x + 1 by SGD with mean squared error and a small L2 regularizer. Data comes from a
distributed dataset; each replica computes its gradient with the loss scaled by the GLOBAL batch
size (compute_average_loss, scale_regularization_loss), and the variables' SUM aggregation
all-reduces the updates through the strategy, as TF's optimizers do. The same global batch and
seed give the same loss curve on every strategy.

    PYTHONPATH=build/python python3 python/examples/train_linear.py --strategy mirrored --replicas 2
    build/tributary-run -n 2 -- python3 python/examples/train_linear.py --strategy multi_worker_mirrored

(The synthetic data comes from NumPy's generator, so the curve differs from the C++ program's.)
"""

import argparse
import sys

import numpy as np

import tributary


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategy", default="mirrored",
                   help="default, one_device, mirrored, multi_worker_mirrored, central_storage")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--backend", default="", help="backend spec ('' = the strategy's default)")
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--examples", type=int, default=60,
                   help="not a multiple of the batch: the last batch is partial")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--l2", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=42)
    a = p.parse_args(argv)
    if a.global_batch < 1 or a.examples < 1 or a.epochs < 1:
        p.error("--global-batch, --examples and --epochs must be >= 1")
    return a


def make_dataset(a):
    """x uniform in [-1, 1), y = 2x + 1 + noise, from the seed."""
    rng = np.random.default_rng(a.seed)
    x = rng.uniform(-1.0, 1.0, size=(a.examples, 1)).astype(np.float32)
    y = (2.0 * x + 1.0 + rng.normal(0.0, 0.1, size=(a.examples, 1))).astype(np.float32)
    return tributary.Dataset.from_tensor_slices((x, y)).shuffle(a.examples, a.seed).batch(a.global_batch)


def main(argv):
    a = parse_args(argv)
    strategy = tributary.make_strategy(a.strategy, a.replicas, a.backend)
    with strategy.scope():
        if strategy.is_chief:
            print(f"# {strategy.describe()}, {strategy.num_replicas_in_sync} replica(s) in sync, "
                  f"global batch {a.global_batch}, {a.examples} examples, seed {a.seed}")
        # Variables: the update of every replica is summed, as TF's optimizers do.
        w = tributary.Variable(np.zeros((1, 1), np.float32), name="dense/kernel",
                               synchronization="on_write", aggregation="sum")
        b = tributary.Variable(np.zeros((1,), np.float32), name="dense/bias",
                               synchronization="on_write", aggregation="sum")
        dataset = strategy.experimental_distribute_dataset(make_dataset(a))

        def train_step(x, y):
            """One replica's step on its share of the global batch."""
            wf, bf = np.float32(w.read()[0, 0]), np.float32(b.read()[0])
            err = wf * x[:, 0] + bf - y[:, 0]
            per_example = err * err
            loss = tributary.compute_average_loss(per_example, global_batch_size=a.global_batch)
            reg = tributary.scale_regularization_loss(np.float32(a.l2 * wf * wf))
            replicas = tributary.get_strategy().num_replicas_in_sync
            # d/dw of the mean squared error over the global batch, plus this replica's share of L2.
            grad_w = np.sum(2.0 * err * x[:, 0], dtype=np.float64) / a.global_batch \
                + 2.0 * a.l2 * wf / replicas
            grad_b = np.sum(2.0 * err, dtype=np.float64) / a.global_batch
            w.assign_sub(np.full((1, 1), a.lr * grad_w, np.float32))
            b.assign_sub(np.full((1,), a.lr * grad_b, np.float32))
            return loss + reg

        for epoch in range(1, a.epochs + 1):
            total, steps = 0.0, 0
            for x, y in dataset:  # a tuple of PerReplica, as TF
                losses = strategy.run(train_step, args=(x, y))
                total += float(strategy.reduce("sum", losses, axis=None))
                steps += 1
            wv, bv = w.read(), b.read()
            if strategy.is_chief:
                print(f"epoch {epoch}: loss {total / steps:.6f} w {wv[0, 0]:.6f} b {bv[0]:.6f} "
                      f"({steps} steps)", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except tributary.Error as e:
        print(f"train_linear.py: {e}", file=sys.stderr)
        sys.exit(1)
