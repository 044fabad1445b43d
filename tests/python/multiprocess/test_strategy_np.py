# MultiWorkerMirroredStrategy across processes: run, reduce, replica-context all_reduce, variables
# whose initial value comes from the chief, and a distributed dataset sharded across workers. One
# strategy per process (it joins the cluster once); every rank checks its own results.
import os

import numpy as np
import pytest

import tributary

RANK = int(os.environ.get("TRIBUTARY_RANK", "0"))
WORLD = int(os.environ.get("TRIBUTARY_WORLD_SIZE", "1"))
LOCAL = 2


@pytest.fixture(scope="module")
def strategy():
    s = tributary.MultiWorkerMirroredStrategy(["CPU:0", "CPU:1"], implementation="ring",
                                              timeout=60, startup_timeout=60)
    yield s
    del s


def test_cluster(strategy):
    assert strategy.num_workers == WORLD and strategy.worker_index == RANK
    assert strategy.num_replicas_in_sync == LOCAL * WORLD
    assert strategy.is_chief == (RANK == 0)


def test_run_and_reduce(strategy):
    n = LOCAL * WORLD
    with strategy.scope():
        out = strategy.run(lambda: np.float32(tributary.get_replica_context().replica_id_in_sync_group))
        assert float(strategy.reduce("sum", out)) == n * (n - 1) / 2
        assert float(strategy.reduce("mean", out)) == (n - 1) / 2

        def step():
            ctx = tributary.get_replica_context()
            return ctx.all_reduce("sum", np.array([1.0, ctx.replica_id_in_sync_group], np.float64))

        for r in strategy.run(step).values:
            np.testing.assert_array_equal(r, [n, n * (n - 1) / 2])


def test_values_that_are_not_distributed_are_each_workers_part(strategy):
    # As TF's MultiWorkerMirrored: reduced and gathered across the workers, one part per worker.
    with strategy.scope():
        assert float(strategy.reduce("sum", np.float32(RANK + 1), axis=None)) == \
            WORLD * (WORLD + 1) / 2
        assert float(strategy.reduce("mean", np.float32(RANK + 1), axis=None)) == (WORLD + 1) / 2
        rows = np.full((RANK + 1, 2), RANK, np.int64)
        assert strategy.gather(rows, axis=0)[:, 0].tolist() == [w for w in range(WORLD)
                                                                  for _ in range(w + 1)]


def test_variables_start_from_the_chief_and_stay_mirrored(strategy):
    n = LOCAL * WORLD
    with strategy.scope():
        v = tributary.Variable(np.full(3, 10.0 * (RANK + 1), np.float32), aggregation="sum")
        np.testing.assert_array_equal(v.read(), 10)  # the chief's initial value

        def step():
            v.assign_add(np.full(3, tributary.get_replica_context().replica_id_in_sync_group, np.float32))

        strategy.run(step)
        np.testing.assert_array_equal(v.read(), 10 + n * (n - 1) / 2)
        for copy in v.values:
            np.testing.assert_array_equal(copy, 10 + n * (n - 1) / 2)


def test_distributed_dataset_covers_the_data_once(strategy):
    x = np.arange(16, dtype=np.int64).reshape(16, 1)
    ds = tributary.Dataset.from_tensor_slices(x).batch(8)
    with strategy.scope():
        seen = []
        for batch in strategy.experimental_distribute_dataset(ds):
            for part in batch.values:
                seen.extend(part[:, 0].tolist())
        everything = strategy.gather(tributary.PerReplica(
            [np.array(seen if i == 0 else [], np.int64) for i in range(LOCAL)]), axis=0)
        assert sorted(everything.tolist()) == list(range(16))


def test_datasets_from_function_one_pipeline_per_worker_and_sparse_values(strategy):
    contexts = []

    def dataset_fn(ctx):
        contexts.append((ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync))
        batch = ctx.get_per_replica_batch_size(4 * WORLD)
        return tributary.Dataset.range(8 * WORLD).shard(ctx.num_input_pipelines,
                                                        ctx.input_pipeline_id).batch(batch)

    with strategy.scope():
        dist = strategy.distribute_datasets_from_function(dataset_fn)
        first = next(iter(dist))
    assert contexts == [(WORLD, RANK, LOCAL * WORLD)]
    assert [v.tolist() for v in first.values] == [[RANK, RANK + WORLD], [RANK + 2 * WORLD,
                                                                         RANK + 3 * WORLD]]

    # Sparse values across workers: every replica's rows, in global replica order.
    def step():
        ctx = tributary.get_replica_context()
        g = ctx.replica_id_in_sync_group
        mine = tributary.IndexedSlices(np.full((1, 2), g, np.float32), np.array([g], np.int64),
                                       (LOCAL * WORLD, 2))
        return ctx.all_reduce("sum", mine)

    with strategy.scope():
        out = strategy.run(step)
    assert out.values[0].indices.tolist() == list(range(LOCAL * WORLD))


def test_ctrl_c_in_a_collective_ends_it_and_fails_the_other_workers(strategy):
    # Last: it breaks the strategy. Rank 0's replicas wait in an all-reduce for workers that come
    # 6 s late; a Ctrl-C (interrupt_main, as SIGINT does) 0.3 s in aborts the backend, so run()
    # raises KeyboardInterrupt long before they come, and their step fails naming rank 0's reason.
    import _thread
    import threading
    import time

    def step():
        ctx = tributary.get_replica_context()
        return ctx.all_reduce("sum", np.ones(4, np.float32))

    if RANK == 0:
        threading.Timer(0.3, _thread.interrupt_main).start()
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            strategy.run(step)
        assert time.monotonic() - start < 4  # not when the others come (6 s), nor at the timeout
        with pytest.raises(tributary.errors.FailedPreconditionError, match="was interrupted"):
            strategy.run(step)
        time.sleep(8)  # the job's store (served here) stays while the others report
    else:
        time.sleep(6)
        with pytest.raises(tributary.errors.Error) as failed:
            for _ in range(3):  # what rank 0 sent before the abort may complete the first
                strategy.run(step)
        assert "rank 0 refused its part: Strategy.run() was interrupted" in str(failed.value)
