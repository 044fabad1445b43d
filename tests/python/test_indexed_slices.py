# Sparse values from Python (TF's tf.IndexedSlices): construction checks, reduction across replicas
# (concatenation in replica order, in all_reduce, nests and Strategy.reduce) and the variables'
# scatter updates with TF's rules.
import numpy as np
import pytest

import tributary


@pytest.fixture
def mirrored():
    return tributary.MirroredStrategy(devices=2)


def rows(indices, values, dense_rows, width=2):
    return tributary.IndexedSlices(
        np.asarray(values, dtype=np.float32).reshape(len(indices), width),
        np.asarray(indices, dtype=np.int64), (dense_rows, width))


def test_construction_and_dense_form():
    s = rows([2, 0, 2], [1, 2, 3, 4, 10, 20], 3)
    assert s.dense_shape == (3, 2)
    assert s.indices.tolist() == [2, 0, 2]
    assert s.values.dtype == np.float32 and s.dtype == np.float32
    assert "dense_shape=[3, 2]" in repr(s)
    assert tributary.to_dense(s).tolist() == [[3, 4], [0, 0], [11, 22]]
    with pytest.raises(tributary.errors.InvalidArgumentError, match="int32 or int64"):
        tributary.IndexedSlices(np.ones((1, 2), np.float32), np.zeros(1, np.float32), (3, 2))
    with pytest.raises(tributary.errors.InvalidArgumentError, match="does not fit values"):
        tributary.IndexedSlices(np.ones((1, 2), np.float32), np.zeros(1, np.int64), (3, 5))
    with pytest.raises(tributary.errors.InvalidArgumentError, match=r"indices\[0\] = 7"):
        tributary.to_dense(rows([7], [1, 1], 3))


def test_all_reduce_concatenates_the_replicas_rows(mirrored):
    def step():
        ctx = tributary.get_replica_context()
        mine = rows([1], [1, 2], 4) if ctx.local_replica_id == 0 else rows([3, 1], [5, 6, 7, 8], 4)
        total = ctx.all_reduce("sum", mine)
        mean = ctx.all_reduce(tributary.ReduceOp.MEAN, mine)
        # A nest mixing sparse and dense values keeps its structure.
        pair = ctx.all_reduce("sum", (mine, np.float32(ctx.local_replica_id + 1)))
        return total, mean, pair

    totals, means, (sparses, denses) = mirrored.run(step)  # regrouped, as TF
    for total, mean, sparse, dense in zip(totals.values, means.values, sparses.values,
                                          denses.values):
        assert isinstance(total, tributary.IndexedSlices)
        assert total.indices.tolist() == [1, 3, 1]
        assert total.values.tolist() == [[1, 2], [5, 6], [7, 8]]
        assert np.allclose(mean.values, [[0.5, 1], [2.5, 3], [3.5, 4]])
        assert sparse.indices.tolist() == [1, 3, 1] and float(dense) == 3.0
    with mirrored.scope():
        per_replica = tributary.PerReplica([rows([0], [1, 1], 2), rows([], [], 2)])
        reduced = mirrored.reduce("sum", per_replica, axis=None)
    assert reduced.indices.tolist() == [0]


def test_only_sum_and_mean_and_replicas_must_agree(mirrored):
    with pytest.raises(tributary.errors.InvalidArgumentError,
                       match="must be Reduce.SUM or Reduce.MEAN"):
        mirrored.run(lambda: tributary.get_replica_context().all_reduce("max", rows([0], [1, 1], 2)))

    def other_shape():
        ctx = tributary.get_replica_context()
        return ctx.all_reduce("sum", rows([0], [1, 1], 2 + ctx.local_replica_id))

    with pytest.raises(tributary.errors.InvalidArgumentError, match="dense_shape"):
        mirrored.run(other_shape)


def test_scatter_updates_follow_the_aggregation(mirrored):
    with mirrored.scope():
        table = tributary.Variable(np.zeros((3, 2), np.float32), name="emb",
                                   aggregation="sum")
        own = tributary.Variable(np.zeros((3, 2), np.float32), name="own")
        acc = tributary.Variable(np.zeros((3, 2), np.float32), synchronization="on_read",
                                 aggregation="sum")

    def step():
        ctx = tributary.get_replica_context()
        grad = rows([0, 2], [1, 1, 2, 2], 3) if ctx.local_replica_id == 0 else rows([2], [10, 10], 3)
        table.scatter_add(grad)
        own.scatter_add(grad)

    mirrored.run(step)
    for copy in table.values:
        assert copy.tolist() == [[1, 1], [0, 0], [12, 12]]
    assert [c.tolist() for c in own.values] == [[[1, 1], [0, 0], [2, 2]],
                                                [[0, 0], [0, 0], [10, 10]]]
    with pytest.raises(tributary.errors.UnimplementedError, match="only supported for mirrored"):
        with mirrored.scope():
            table.scatter_update(rows([0], [5, 5], 3))
    with pytest.raises(tributary.errors.UnimplementedError, match="ON_READ"):
        mirrored.run(lambda: acc.scatter_add(rows([0], [1, 1], 3)))
    with pytest.raises(TypeError, match="IndexedSlices"):
        with mirrored.scope():
            table.scatter_add(np.ones((3, 2), np.float32))


def test_nests_of_sparse_values_must_match_and_gather_refuses_them(mirrored):
    def keys_differ():
        ctx = tributary.get_replica_context()
        key = "b" if ctx.local_replica_id == 0 else "c"
        return ctx.all_reduce("sum", {"a": rows([0], [1, 1], 4), key: rows([1], [2, 2], 4)})

    with pytest.raises(tributary.errors.InvalidArgumentError, match="same nested structure"):
        mirrored.run(keys_differ)

    def tuple_or_list():
        ctx = tributary.get_replica_context()
        parts = [rows([0], [1, 1], 4), rows([1], [2, 2], 4)]
        return ctx.all_reduce("sum", tuple(parts) if ctx.local_replica_id == 0 else parts)

    with pytest.raises(tributary.errors.InvalidArgumentError, match="same nested structure"):
        mirrored.run(tuple_or_list)
    with pytest.raises(NotImplementedError, match="does not support IndexedSlices"):
        mirrored.run(lambda: tributary.get_replica_context().all_gather(rows([0], [1, 1], 4)))
    with mirrored.scope():
        per_replica = tributary.PerReplica([rows([0], [1, 1], 2), rows([1], [2, 2], 2)])
        with pytest.raises(NotImplementedError, match="does not support IndexedSlices"):
            mirrored.gather(per_replica, axis=0)
        with pytest.raises(TypeError, match="mixes IndexedSlices"):
            mirrored.reduce("sum", tributary.PerReplica([np.ones((1, 2), np.float32),
                                                         rows([1], [2, 2], 2)]), axis=None)
        # A value that is not distributed: MEAN gives it back, SUM is TF's error.
        same = mirrored.reduce("mean", rows([1], [2, 2], 2), axis=None)
        assert same.indices.tolist() == [1]
        with pytest.raises(tributary.errors.InvalidArgumentError, match="non-DistributedValues"):
            mirrored.reduce("sum", rows([1], [2, 2], 2), axis=None)
