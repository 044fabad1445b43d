# The strategy layer from Python: scope, run on replica threads, reduce, replica-context
# collectives, merge_call, variables and distributed datasets, in one process.
import numpy as np
import pytest

import tributary


@pytest.fixture
def mirrored():
    return tributary.MirroredStrategy(["CPU:0", "CPU:1"], "reduction_to_one_device")


def test_strategy_properties(mirrored):
    s = mirrored
    assert s.num_replicas_in_sync == 2 and s.num_local_replicas == 2
    assert s.worker_devices == ["CPU:0", "CPU:1"]
    assert s.is_chief and s.num_workers == 1 and s.worker_index == 0
    assert s.cross_device_ops.startswith("reduction_to_one_device")
    assert "MirroredStrategy" in repr(s)


def test_scope_and_contexts(mirrored):
    assert not tributary.has_strategy()
    with mirrored.scope() as s:
        assert s is mirrored
        assert tributary.has_strategy()
        assert tributary.get_strategy() is mirrored
        assert tributary.in_cross_replica_context()
        assert tributary.get_replica_context() is None
    assert not tributary.has_strategy()
    # Outside any scope: the default strategy's replica context.
    assert tributary.get_replica_context() is not None


def test_run_unwraps_per_replica_and_reduces(mirrored):
    s = mirrored

    def step(x, scale=1):
        ctx = tributary.get_replica_context()
        assert tributary.get_strategy() is s
        return np.asarray(x, np.float32) * scale + ctx.replica_id_in_sync_group

    with s.scope():
        per = tributary.PerReplica([np.float32(1), np.float32(2)])
        out = s.run(step, args=(per,), kwargs={"scale": 10})
        assert isinstance(out, tributary.PerReplica) and len(out) == 2
        assert [float(v) for v in s.experimental_local_results(out)] == [10, 21]
        assert float(s.reduce("sum", out)) == 31
        assert float(s.reduce(tributary.ReduceOp.MEAN, out, axis=None)) == 15.5


def test_reduce_along_an_axis_is_the_global_mean(mirrored):
    with mirrored.scope():
        per = tributary.PerReplica([np.array([1.0, 2.0, 3.0]), np.array([4.0])])
        assert float(mirrored.reduce("mean", per, axis=0)) == pytest.approx(2.5)
        g = mirrored.gather(per, axis=0)
        np.testing.assert_array_equal(g, [1, 2, 3, 4])


def test_replica_context_collectives_and_merge_call(mirrored):
    def step():
        ctx = tributary.get_replica_context()
        i = ctx.replica_id_in_sync_group
        total = ctx.all_reduce("sum", np.array([i + 1.0], np.float32))
        several = ctx.all_reduce("max", [np.int32(i), np.array([i, -i], np.int64)])
        gathered = ctx.all_gather(np.full((i + 1,), i, np.float32), axis=0)

        def merge(strategy, value):
            assert strategy is mirrored
            assert tributary.in_cross_replica_context()
            return sum(value.values)

        merged = ctx.merge_call(merge, args=(i + 100,))
        return total, several, gathered, merged

    with mirrored.scope():
        out = mirrored.run(step)  # a tuple of PerReplica (TF's regroup), one per result
    assert isinstance(out, tuple) and len(out) == 4
    totals, severals, gathereds, mergeds = out
    assert isinstance(totals, tributary.PerReplica) and isinstance(severals, list)
    # merge_call hands every replica the same int, which run() keeps per replica: Python shares
    # small ints by accident, where TF's replicas would hold two tensors.
    per_replica = zip(totals.values, zip(*(p.values for p in severals)), gathereds.values,
                      mergeds.values)
    for total, several, gathered, merged in per_replica:
        np.testing.assert_array_equal(total, [3])
        assert int(several[0]) == 1
        np.testing.assert_array_equal(several[1], [1, 0])
        np.testing.assert_array_equal(gathered, [0, 1, 1])
        assert merged == 201


def test_an_exception_in_a_replica_is_raised_by_run(mirrored):
    def step():
        ctx = tributary.get_replica_context()
        if ctx.replica_id_in_sync_group == 1:
            raise KeyError("replica one failed")
        ctx.all_reduce("sum", np.float32(1))  # replica 0 waits here for replica 1
        return 0

    with mirrored.scope():
        with pytest.raises(KeyError, match="replica one failed"):
            mirrored.run(step)
        # The strategy is still usable in one process.
        out = mirrored.run(lambda: np.float32(2))
        assert float(mirrored.reduce("sum", out)) == 4


def test_cross_replica_method_in_replica_context_is_tf_error(mirrored):
    def step():
        return mirrored.reduce("sum", tributary.PerReplica([np.float32(1), np.float32(1)]))

    with mirrored.scope():
        with pytest.raises(tributary.Error, match="cross-replica context"):
            mirrored.run(step)


def test_mirrored_variable_sum_aggregation(mirrored):
    with mirrored.scope():
        v = tributary.Variable(np.zeros((1, 1), np.float32), name="w",
                               synchronization="on_write", aggregation="sum")
        assert v.name == "w" and v.dtype == "float32" and v.shape == (1, 1)
        assert v.synchronization == tributary.VariableSynchronization.ON_WRITE
        assert v.aggregation == tributary.VariableAggregation.SUM
        assert v.devices == ["CPU:0", "CPU:1"]
        assert v.strategy is mirrored

        def step():
            ctx = tributary.get_replica_context()
            v.assign_add(np.full((1, 1), ctx.replica_id_in_sync_group + 1, np.float32))
            return v.read()

        out = mirrored.run(step)
        for r in out.values:
            np.testing.assert_array_equal(r, [[3]])
        np.testing.assert_array_equal(v.read(), [[3]])
        np.testing.assert_array_equal(np.asarray(v), [[3]])
        v.assign(np.full((1, 1), 7, np.float32))
        assert [float(c[0, 0]) for c in v.values] == [7, 7]
        v.assign_sub([[2.0]])  # a literal takes the variable's dtype
        assert float(v.numpy()[0, 0]) == 5
        with pytest.raises(tributary.InvalidArgumentError):
            v.assign(np.zeros((2, 2), np.float32))  # wrong shape: nothing changes
        assert float(v.read()[0, 0]) == 5
        w2 = mirrored.create_variable(np.int32(1), name="steps", aggregation="only_first_replica")
        assert w2.shape == ()


def test_values_are_read_only_snapshots(mirrored):
    with mirrored.scope():
        v = tributary.Variable(np.arange(3, dtype=np.float64))
        r = v.read()
        assert not r.flags.writeable
        v.assign(np.zeros(3))
        np.testing.assert_array_equal(r, [0, 1, 2])


def test_sync_on_read_variable(mirrored):
    with mirrored.scope():
        v = tributary.Variable(np.float32(0), synchronization="on_read", aggregation="sum")

        def step():
            ctx = tributary.get_replica_context()
            v.assign_add(np.float32(ctx.replica_id_in_sync_group + 1))

        mirrored.run(step)
        assert float(v.read()) == 3  # aggregated on read


def test_losses(mirrored):
    def step():
        per_example = np.array([1.0, 3.0], np.float32)
        loss = tributary.compute_average_loss(per_example, global_batch_size=4)
        reg = tributary.scale_regularization_loss(np.float32(2.0))
        return loss + reg

    with mirrored.scope():
        out = mirrored.run(step)
        assert float(mirrored.reduce("sum", out)) == pytest.approx(2 * (1.0 + 1.0))


def test_distributed_dataset_splits_the_global_batch(mirrored):
    x = np.arange(10, dtype=np.float32).reshape(10, 1)
    y = 2 * x
    ds = tributary.Dataset.from_tensor_slices((x, y)).batch(4)
    assert ds.cardinality() == 3
    plain = [b for b in ds]
    assert len(plain) == 3 and plain[0][0].shape == (4, 1)
    with mirrored.scope():
        dist = mirrored.experimental_distribute_dataset(ds)
        seen = []
        for xs, ys in dist:  # TF's structure: a tuple of PerReplica
            assert isinstance(xs, tributary.PerReplica) and isinstance(ys, tributary.PerReplica)
            for xb, yb in zip(xs.values, ys.values):
                np.testing.assert_array_equal(yb, 2 * xb)
                seen.extend(xb[:, 0].tolist())
        assert sorted(seen) == list(range(10))
        it = iter(dist)
        for _ in range(3):
            it.get_next()
        with pytest.raises(tributary.OutOfRangeError):
            it.get_next()
    single = tributary.Dataset.from_tensor_slices(np.arange(3, dtype=np.int64))
    assert [int(e) for e in single] == [0, 1, 2]


def test_strategies_by_name():
    for name in ("default", "one_device", "mirrored", "central_storage"):
        s = tributary.make_strategy(name, 2 if name in ("mirrored", "central_storage") else 1)
        assert s.num_replicas_in_sync >= 1
    with pytest.raises(tributary.Error, match="unknown strategy"):
        tributary.make_strategy("mirrorred")
    # TF's one default strategy: the same object as get_strategy() outside any scope.
    d = tributary.make_strategy("default")
    assert d is tributary.get_strategy()
    with d.scope():
        assert tributary.get_strategy() is d
    assert tributary.OneDeviceStrategy("CPU:0").num_replicas_in_sync == 1
    assert tributary.CentralStorageStrategy(["CPU:0", "CPU:1"]).num_replicas_in_sync == 2
    with pytest.raises(tributary.Error):
        tributary.MirroredStrategy(["CPU:0", "CPU:0"])


def test_dataset_skip_unbatch_padded_batch_zip_concatenate():
    ds = tributary.Dataset.range(7)
    assert [int(x) for x in ds.skip(4)] == [4, 5, 6]
    assert [int(x) for x in ds.batch(3).unbatch()] == list(range(7))
    seqs = tributary.Dataset.from_tensor_slices(np.array([[1, 0], [2, 2]], np.int64)).unbatch()
    assert [int(x) for x in seqs] == [1, 0, 2, 2]
    padded = list(tributary.Dataset.range(3).batch(2).padded_batch(2, padded_shapes=[3],
                                                                 padding_values=-1))
    assert padded[0].tolist() == [[0, 1, -1], [2, -1, -1]]
    pairs = list(tributary.Dataset.zip(tributary.Dataset.range(3), tributary.Dataset.range(10, 12)))
    assert [(int(a), int(b)) for a, b in pairs] == [(0, 10), (1, 11)]
    assert tributary.Dataset.zip((ds, ds)).cardinality() == 7
    both = tributary.Dataset.range(2).concatenate(tributary.Dataset.range(5, 6))
    assert [int(x) for x in both] == [0, 1, 5]
    with pytest.raises(TypeError):
        tributary.Dataset.range(2).concatenate(tributary.Dataset.zip(ds, ds))
    with pytest.raises(tributary.errors.InvalidArgumentError, match="scalar components"):
        tributary.Dataset.range(2).unbatch()


def test_checkpoints_round_trip_with_tfs_on_read_sum_rule(tmp_path):
    strategy = tributary.MirroredStrategy(devices=2)
    with strategy.scope():
        w = tributary.Variable(np.arange(4, dtype=np.float32), name="w")
        count = tributary.Variable(0.0, name="count", synchronization="on_read", aggregation="sum")

    def count_examples():
        ctx = tributary.get_replica_context()
        count.assign(float(ctx.replica_id_in_sync_group + 1))  # replicas hold 1 and 2

    strategy.run(count_examples)
    path = str(tmp_path / "model.ckpt")
    tributary.save_checkpoint(path, [w, count])
    with strategy.scope():
        w.assign(np.zeros(4, np.float32))
        count.assign(0.0)
    tributary.restore_checkpoint(path, [w, count])
    assert w.values[1].tolist() == [0, 1, 2, 3]
    # Saved aggregated (1 + 2 = 3), restored split evenly across the 2 replicas.
    assert [float(c) for c in count.values] == [1.5, 1.5]
    tributary.restore_checkpoint(path, w)  # one variable alone
    with pytest.raises(tributary.errors.NotFoundError):
        tributary.restore_checkpoint(str(tmp_path / "missing.ckpt"), [w])
    with pytest.raises(TypeError, match="tributary.Variable"):
        tributary.save_checkpoint(path, [np.zeros(2)])


def test_dataset_map_and_filter_run_python_functions():
    doubled = tributary.Dataset.range(5).map(lambda x: x * 2)
    assert [int(x) for x in doubled] == [0, 2, 4, 6, 8]
    x = np.arange(4, dtype=np.float32)
    pairs = tributary.Dataset.from_tensor_slices((x, 10 * x)).map(lambda a, b: (a + b, b))
    assert [(float(a), float(b)) for a, b in pairs] == [(0, 0), (11, 10), (22, 20), (33, 30)]
    kept = tributary.Dataset.range(10).filter(lambda v: v % 3 == 0)
    assert [int(v) for v in kept] == [0, 3, 6, 9]
    # On a prefetch thread, batched; an iterator dropped mid-stream does not hang.
    pipeline = tributary.Dataset.range(1000).map(lambda v: v + 1).batch(10).prefetch(4)
    it = iter(pipeline)
    assert next(it).tolist() == list(range(1, 11))
    del it
    assert sum(int(b.sum()) for b in pipeline) == sum(range(1, 1001))

    def bad(v):
        if v == 2:
            raise KeyError("no such row")
        return v

    with pytest.raises(tributary.errors.InternalError, match="no such row"):
        list(tributary.Dataset.range(5).map(bad).prefetch(2))
    with pytest.raises(tributary.errors.InternalError, match="truth value"):
        list(tributary.Dataset.range(4).batch(2).filter(lambda b: b > 0))
    # Distributed, as the trainer would use it.
    strategy = tributary.MirroredStrategy(devices=2)
    dist = strategy.experimental_distribute_dataset(
        tributary.Dataset.range(8).map(lambda v: v * v).batch(4))
    firsts = [[int(v) for v in per.values[0]] for per in dist]
    assert firsts == [[0, 1], [16, 25]]


def test_dataset_structure_before_a_map_runs_and_batch_sizes_through_zip():
    # A map that returns tuples: padded_batch and concatenate take its structure from their own
    # arguments and from the other dataset, before the function has ever run.
    pairs = tributary.Dataset.range(4).map(lambda x: (np.arange(int(x)), x))
    padded = list(pairs.padded_batch(2, padded_shapes=([None], [])))
    assert [(a.tolist(), b.tolist()) for a, b in padded] == [([[0], [0]], [0, 1]),
                                                             ([[0, 1, 0], [0, 1, 2]], [2, 3])]
    tuples = tributary.Dataset.from_tensor_slices((np.arange(2), np.arange(2)))
    both = tributary.Dataset.range(2).map(lambda x: (x, x)).concatenate(tuples)
    assert len(list(both)) == 4
    # zip(a) is a's own elements (TF 2.13); zip of batched datasets can be distributed.
    assert [int(v) for v in tributary.Dataset.zip(tributary.Dataset.range(3))] == [0, 1, 2]
    strategy = tributary.MirroredStrategy(devices=2)
    zipped = tributary.Dataset.zip(tributary.Dataset.range(8).batch(4),
                                   tributary.Dataset.range(8).batch(4))
    first = next(iter(strategy.experimental_distribute_dataset(zipped)))
    assert [v.tolist() for v in first[0].values] == [[0, 1], [2, 3]]


def test_an_iterator_shared_between_threads_yields_each_element_once():
    import threading
    it = iter(tributary.Dataset.range(4000).map(lambda v: v).filter(lambda v: True).prefetch(2))
    seen = [[] for _ in range(4)]

    def drain(k):
        for v in it:
            seen[k].append(int(v))

    threads = [threading.Thread(target=drain, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = sum(seen, [])
    assert sorted(everything) == list(range(4000))


@pytest.mark.parametrize("numpy_first", [False, True])
def test_exiting_with_live_mapped_iterators_is_clean(numpy_first):
    # Iterators left alive at exit (module-level, as TF scripts keep them) are stopped before the
    # interpreter finalizes, so their prefetch threads do not die holding the GIL (an abort); two
    # pipelines converting their first elements at once do not deadlock on NumPy's setup.
    import subprocess
    import sys
    script = ("import numpy\n" if numpy_first else "") + (
        "import tributary as tb\n"
        "a = tb.Dataset.range(10**6).map(lambda v: v + 1).prefetch(4)\n"
        "b = tb.Dataset.range(10**6).map(lambda v: v * 2).prefetch(4)\n"
        "it = iter(tb.Dataset.zip(a, b))\n"
        "print(tuple(int(x) for x in next(it)))\n"
        "s = tb.MirroredStrategy(devices=2)\n"
        "dist = iter(s.experimental_distribute_dataset(a.batch(4)))\n"
        "s.run(lambda x: x, args=(next(dist),))\n")
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip() == "(1, 0)"


def test_ctrl_c_interrupts_a_run_of_several_replicas():
    # Ctrl-C (here _thread.interrupt_main, as a SIGINT does) while replicas run Python code or
    # wait for each other: run() raises KeyboardInterrupt promptly, and the strategy stays usable.
    import subprocess
    import sys
    script = (
        "import _thread, sys, threading, time\n"
        "import numpy as np\n"
        "import tributary as tb\n"
        "s = tb.MirroredStrategy(devices=2)\n"
        "def spin():\n"
        "    while True:\n"
        "        time.sleep(0.01)\n"
        "def step(mode):\n"
        "    ctx = tb.get_replica_context()\n"
        "    if mode == 'spin' or ctx.replica_id_in_sync_group == 0:\n"
        "        spin()\n"
        "    return ctx.all_reduce('sum', np.ones(2, np.float32))\n"
        "for mode in ('spin', 'one_waits'):\n"
        "    threading.Timer(0.3, _thread.interrupt_main).start()\n"
        "    try:\n"
        "        s.run(step, args=(mode,))\n"
        "        print('no interrupt')\n"
        "    except KeyboardInterrupt:\n"
        "        print('interrupted')\n"
        "    print(float(s.reduce('sum', s.run(lambda: np.float32(1)), axis=None)))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["interrupted", "2.0", "interrupted", "2.0"]


def test_get_next_as_optional_ends_with_an_empty_optional(mirrored):
    # TF's custom-loop idiom for uneven data: loop while the Optional has a value.
    ds = tributary.Dataset.range(6).batch(4)
    it = iter(mirrored.experimental_distribute_dataset(ds))
    batches = []
    while (o := it.get_next_as_optional()).has_value():
        batches.append([v.tolist() for v in o.get_value().values])
    assert batches == [[[0, 1], [2, 3]], [[4, 5], []]]  # TF's rebatching of the partial batch
    assert not o.has_value() and "has_value=False" in repr(o)
    with pytest.raises(tributary.errors.InvalidArgumentError, match="does not have a value"):
        o.get_value()


def test_a_nested_or_concurrent_run_is_refused_and_the_outer_run_completes():
    import threading
    import time
    s = tributary.MirroredStrategy(devices=2)
    refused = []

    def step():
        if tributary.get_replica_context().replica_id_in_sync_group == 0:
            with pytest.raises(tributary.errors.FailedPreconditionError):
                s.run(lambda: 1)
            refused.append("nested")
        time.sleep(0.3)  # the outer run() waits (and polls for Ctrl-C) meanwhile
        return 1

    assert list(s.run(step).values) == [1, 1]

    def concurrent():
        try:
            s.run(lambda: 1)
        except tributary.errors.FailedPreconditionError:
            refused.append("concurrent")

    t = threading.Timer(0.1, concurrent)
    t.start()
    assert list(s.run(lambda: time.sleep(0.4) or 2).values) == [2, 2]
    t.join()
    assert refused == ["nested", "concurrent"]


def test_one_replica_values_come_back_unwrapped_as_tf():
    # TF's regroup: what every replica returns as the same object, so whatever the one replica of a
    # one-device strategy returns, comes back as it is; its iterators yield the batches themselves.
    ds = tributary.Dataset.from_tensor_slices(np.arange(4, dtype=np.float32)).batch(2)
    for s in (tributary.OneDeviceStrategy("CPU:0"), tributary.MirroredStrategy(["CPU:0"]),
              tributary.make_strategy("default")):
        with s.scope():
            out = s.run(lambda x: x * 2, args=(np.float32(3),))
            assert not isinstance(out, tributary.PerReplica) and float(out) == 6
            loss, parts = s.run(lambda: (np.float32(1), [np.float32(2)]))
            assert float(loss) == 1 and float(parts[0]) == 2
            assert s.experimental_local_results(out) == (out,)
            assert float(s.reduce("sum", out, axis=None)) == 6
            assert s.gather(np.array([1, 2]), axis=0).tolist() == [1, 2]
            batches = [b.tolist() for b in s.experimental_distribute_dataset(ds)]
            assert batches == [[0, 1], [2, 3]]
            v = s.experimental_distribute_values_from_function(
                lambda ctx: np.float32(ctx.replica_id_in_sync_group))
            # TF wraps values from a function always, except on its one-device strategies.
            one_device = s.name in ("OneDeviceStrategy", "DefaultStrategy")
            assert isinstance(v, tributary.PerReplica) != one_device


def test_same_objects_unwrap_and_local_results_map_nests(mirrored):
    with mirrored.scope():
        w = tributary.Variable(np.float32(1), aggregation="sum")
        assert mirrored.run(lambda: w) is w
        assert mirrored.run(lambda: None) is None
        # Ints and booleans stay per replica even when Python shares the object (small ints,
        # NumPy's booleans): counts from replicas reduce as counts.
        x = tributary.PerReplica([np.zeros((2, 1)), np.zeros((2, 1))])
        rows = mirrored.run(lambda b: b.shape[0], args=(x,))
        assert isinstance(rows, tributary.PerReplica) and float(mirrored.reduce("sum", rows)) == 4
        flags = mirrored.run(lambda b: (b == 0).all(), args=(x,))
        assert isinstance(flags, tributary.PerReplica)

        def step():
            i = tributary.get_replica_context().replica_id_in_sync_group

            def merge(strategy, shared, own, nest, count, flag):
                # merge_fn's arguments are regrouped as TF: the same object, an int or a bool
                # too, unwrapped.
                assert shared is w and isinstance(own, tributary.PerReplica)
                assert nest[0] == "tag" and isinstance(nest[1], tributary.PerReplica)
                assert count == 3 and flag is False
                return list(own.values)

            return tributary.get_replica_context().merge_call(
                merge, args=(w, np.float32(i), ("tag", np.float32(i)), 3, False))

        assert [float(x) for x in mirrored.run(step)] == [0.0, 1.0]
        out = mirrored.run(lambda: (
            np.float32(tributary.get_replica_context().replica_id_in_sync_group), "same"))
        assert [(float(a), b) for a, b in mirrored.experimental_local_results(out)] == [
            (0.0, "same"), (1.0, "same")]


def test_datasets_and_values_from_function():
    strategy = tributary.MirroredStrategy(devices=2)
    contexts = []

    def dataset_fn(ctx):
        contexts.append((ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync))
        return tributary.Dataset.range(8).batch(ctx.get_per_replica_batch_size(4))

    with strategy.scope():
        batches = [[v.tolist() for v in b.values]
                   for b in strategy.distribute_datasets_from_function(dataset_fn)]
    assert contexts == [(1, 0, 2)]
    assert batches == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    # One pipeline per replica.
    per_replica = tributary.InputOptions(
        experimental_replication_mode=tributary.InputReplicationMode.PER_REPLICA)
    contexts.clear()
    with strategy.scope():
        first = next(iter(strategy.distribute_datasets_from_function(dataset_fn, per_replica)))
    assert contexts == [(2, 0, 2), (2, 1, 2)]
    assert [v.tolist() for v in first.values] == [[0, 1], [0, 1]]
    # The function's own exception comes through; a wrong return is a clear error.

    def broken(ctx):
        raise KeyError("no such file")

    with strategy.scope():
        with pytest.raises(KeyError, match="no such file"):
            strategy.distribute_datasets_from_function(broken)
        with pytest.raises(tributary.errors.InvalidArgumentError, match="must return a"):
            strategy.distribute_datasets_from_function(lambda ctx: [1, 2])
        with pytest.raises(tributary.errors.InvalidArgumentError, match="does not divide|divis"):
            tributary.InputContext(1, 0, 3).get_per_replica_batch_size(4)
        values = strategy.experimental_distribute_values_from_function(
            lambda ctx: np.float32(ctx.replica_id_in_sync_group + 10 * ctx.num_replicas_in_sync))
        # A tuple per replica comes back as TF regroups it: a tuple of PerReplica.
        x, y = strategy.experimental_distribute_values_from_function(
            lambda ctx: (np.float32(ctx.replica_id_in_sync_group), np.float32(7)))
        out = strategy.run(lambda a, b: a + b, args=(x, y))
    assert [float(v) for v in values.values] == [20.0, 21.0]
    assert isinstance(x, tributary.PerReplica) and [float(v) for v in x.values] == [0.0, 1.0]
    assert [float(v) for v in out.values] == [7.0, 8.0]
    # A replica's pipeline that never runs its map does not change what the batches are.
    contexts.clear()

    def uneven(ctx):
        return tributary.Dataset.range(4 if ctx.input_pipeline_id == 0 else 0).map(
            lambda v: v * 2).batch(2)

    with strategy.scope():
        first = next(iter(strategy.distribute_datasets_from_function(uneven, per_replica)))
    assert isinstance(first, tributary.PerReplica)
    assert [v.tolist() for v in first.values] == [[0, 2], []]
    never_mapped = tributary.Dataset.range(0).map(lambda v: (v, v))
    assert [int(v) for v in never_mapped.concatenate(tributary.Dataset.range(3))] == [0, 1, 2]
    # InputOptions: TF's None is the default (True); positional arguments as TF's.
    assert tributary.InputOptions(experimental_fetch_to_device=None).experimental_fetch_to_device
    assert not tributary.InputOptions(False).experimental_fetch_to_device
    padded = next(iter(tributary.Dataset.range(2).batch(2).padded_batch(
        1, padded_shapes=(np.int64(4),))))
    assert padded.tolist() == [[0, 1, 0, 0]]
    # InputOptions reach experimental_distribute_dataset too.
    no_prefetch = tributary.InputOptions(experimental_per_replica_buffer_size=0)
    with strategy.scope():
        dist = strategy.experimental_distribute_dataset(tributary.Dataset.range(4).batch(4),
                                                        options=no_prefetch)
        assert [v.tolist() for v in next(iter(dist)).values] == [[0, 1], [2, 3]]
    with pytest.raises(TypeError, match="InputOptions"):
        strategy.experimental_distribute_dataset(tributary.Dataset.range(4).batch(4), options=3)


def test_dataset_from_generator():
    def rows():
        for i in range(5):
            yield np.full(2, i, np.float32), np.int64(i)

    ds = tributary.Dataset.from_generator(rows)
    assert [int(y) for _, y in ds] == [0, 1, 2, 3, 4]
    assert [int(y) for _, y in ds] == [0, 1, 2, 3, 4]  # each iteration calls the generator anew
    batches = list(tributary.Dataset.from_generator(lambda: range(7)).batch(3).prefetch(2))
    assert [b.tolist() for b in batches] == [[0, 1, 2], [3, 4, 5], [6]]
    strategy = tributary.MirroredStrategy(devices=2)
    dist = strategy.experimental_distribute_dataset(
        tributary.Dataset.from_generator(lambda: range(8)).batch(4))
    assert [[v.tolist() for v in b.values] for b in dist] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]

    def broken():
        yield np.float32(1)
        raise OSError("the file went away")

    with pytest.raises(tributary.errors.InternalError, match="the file went away"):
        list(tributary.Dataset.from_generator(broken))
    with pytest.raises(tributary.errors.InvalidArgumentError, match="generator's element.*dtype object"):
        list(tributary.Dataset.from_generator(lambda: iter([object()])))
