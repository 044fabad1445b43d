# MultiWorkerMirroredStrategy with one replica per worker, the common layout: run() gives each
# worker's value itself (TF's regroup of one replica), and reducing or gathering it spans the
# workers for every op, as a PerReplica of it does; the datasets still yield PerReplica (TF wraps
# in multi-worker mode). One strategy per process.
import os

import numpy as np
import pytest

import tributary

RANK = int(os.environ.get("TRIBUTARY_RANK", "0"))
WORLD = int(os.environ.get("TRIBUTARY_WORLD_SIZE", "1"))


@pytest.fixture(scope="module")
def strategy():
    s = tributary.MultiWorkerMirroredStrategy(["CPU:0"], implementation="ring", timeout=60,
                                              startup_timeout=60)
    yield s
    del s


def test_run_results_reduce_across_workers_for_every_op(strategy):
    with strategy.scope():
        out = strategy.run(lambda: np.float32(RANK + 2))
        assert not isinstance(out, tributary.PerReplica)
        values = [w + 2 for w in range(WORLD)]
        expected = {"sum": sum(values), "mean": sum(values) / WORLD, "max": max(values),
                    "min": min(values), "prod": float(np.prod(values))}
        for op, want in expected.items():
            assert float(strategy.reduce(op, out, axis=None)) == want, op
            assert float(strategy.reduce(op, tributary.PerReplica([out]), axis=None)) == want, op
        rows = strategy.run(lambda: np.full((RANK + 1, 1), RANK, np.int64))
        assert strategy.gather(rows, axis=0)[:, 0].tolist() == [w for w in range(WORLD)
                                                                for _ in range(w + 1)]
        assert float(strategy.reduce("mean", rows, axis=0)) == pytest.approx(
            sum(w * (w + 1) for w in range(WORLD)) / sum(w + 1 for w in range(WORLD)))


def test_dataset_elements_are_per_replica(strategy):
    ds = tributary.Dataset.range(4 * WORLD).batch(2 * WORLD)
    with strategy.scope():
        seen = []
        for batch in strategy.experimental_distribute_dataset(ds):
            assert isinstance(batch, tributary.PerReplica) and len(batch.values) == 1
            seen.extend(batch.values[0].tolist())
        everything = strategy.gather(np.array(seen, np.int64), axis=0)
    assert sorted(everything.tolist()) == list(range(4 * WORLD))
