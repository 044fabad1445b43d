# tf.distribute's structures and conversions from Python: distributed dataset elements, nests in
# run()/reduce()/gather()/all_reduce()/all_gather(), run()'s argument checks, from_tensor_slices'
# list/tuple rule, variables' dtypes and non-narrowing updates, and ReplicaContext lifetimes.
import collections
import gc
import subprocess
import sys
import textwrap
import weakref

import numpy as np
import pytest

import tributary


@pytest.fixture
def mirrored():
    return tributary.MirroredStrategy(devices=2)


# --- 1. distributed datasets: a tuple element is a tuple of PerReplica -------------------------

def test_distributed_tuple_elements_are_tuples_of_per_replica(mirrored):
    x = np.arange(8, dtype=np.float32).reshape(8, 1)
    y = 2 * x
    dist = mirrored.experimental_distribute_dataset(
        tributary.Dataset.from_tensor_slices((x, y)).batch(4))

    def step(xb, yb):
        return np.float32(np.sum((2 * np.asarray(xb) - np.asarray(yb)) ** 2))

    steps = 0
    for xs, ys in dist:  # TF's idiom
        assert isinstance(xs, tributary.PerReplica) and isinstance(ys, tributary.PerReplica)
        assert [v.shape for v in xs.values] == [(2, 1), (2, 1)]
        out = mirrored.run(step, args=(xs, ys))
        assert [float(v) for v in out.values] == [0.0, 0.0]
        steps += 1
    assert steps == 2
    element = iter(dist).get_next()
    assert isinstance(element, tuple) and len(element) == 2


def test_distributed_single_component_elements_stay_per_replica(mirrored):
    dist = mirrored.experimental_distribute_dataset(tributary.Dataset.range(8).batch(4))
    for batch in dist:
        assert isinstance(batch, tributary.PerReplica)
        assert [v.tolist() for v in batch.values] in ([[0, 1], [2, 3]], [[4, 5], [6, 7]])


# --- 2. ReplicaContext handles keep their strategy alive ----------------------------------------

def test_a_kept_replica_context_keeps_its_strategy_alive():
    s = tributary.MirroredStrategy(devices=2)
    ref = weakref.ref(s)
    saved = []
    s.run(lambda: saved.append(tributary.get_replica_context()))
    del s
    gc.collect()
    assert ref() is not None  # the contexts hold it
    ctx = saved[0]
    assert ctx.num_replicas_in_sync == 2
    assert ctx.strategy is ref()
    assert sorted(c.replica_id_in_sync_group for c in saved) == [0, 1]
    # Its collectives outside its run(): a clear RuntimeError, not undefined behaviour.
    with pytest.raises(RuntimeError, match="outside the Strategy.run"):
        ctx.all_reduce("sum", np.float32(1))
    with pytest.raises(RuntimeError, match="outside the Strategy.run"):
        ctx.all_gather(np.float32(1))
    del ctx, saved
    gc.collect()
    assert ref() is None


def test_a_dangling_replica_context_does_not_crash():
    code = textwrap.dedent("""
        import gc, numpy as np, tributary as t
        s = t.MirroredStrategy(devices=2)
        saved = []
        s.run(lambda: saved.append(t.get_replica_context()))
        del s; gc.collect()
        junk = [t.MirroredStrategy(devices=3) for _ in range(3)]
        ctx = min(saved, key=lambda c: c.local_replica_id)
        print(ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync, ctx.device)
        st = ctx.strategy
        print(float(st.reduce("sum", st.run(lambda: np.float32(1)), axis=None)))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "2", "CPU:0", "2.0"]


def test_merge_call_and_reduce_op_keyword(mirrored):
    def step():
        ctx = tributary.get_replica_context()
        a = ctx.all_reduce(reduce_op="sum", value=np.float32(1))
        b = ctx.all_reduce(value=np.float32(2), op="sum")  # the older keyword
        return float(a), float(b)

    a, b = mirrored.run(step)  # TF's regroup: a tuple of PerReplica
    assert list(a.values) == [2.0, 2.0] and list(b.values) == [4.0, 4.0]


# --- 3. nests ---------------------------------------------------------------------------------

def test_run_unwraps_per_replica_inside_nests(mirrored):
    pr = tributary.PerReplica([np.float32(1), np.float32(2)])
    out = mirrored.run(lambda d: float(d["a"]), args=({"a": pr},))
    assert list(out.values) == [1.0, 2.0]
    out = mirrored.run(lambda t: float(t[0]) + t[1], args=((pr, 3),))
    assert list(out.values) == [4.0, 5.0]
    out = mirrored.run(lambda lst: float(lst[1][0]), args=([0, [pr]],))
    assert list(out.values) == [1.0, 2.0]
    out = mirrored.run(lambda *, k: float(k["x"][0]), kwargs={"k": {"x": (pr,)}})
    assert list(out.values) == [1.0, 2.0]
    Pair = collections.namedtuple("Pair", "a b")
    names, values = mirrored.run(lambda p: (type(p).__name__, float(p.a)), args=(Pair(pr, 0),))
    # The same object from every replica (the class name) comes back unwrapped, as TF's regroup.
    assert names == "Pair" and list(values.values) == [1.0, 2.0]


def test_reduce_and_gather_map_over_nests(mirrored):
    def fn():
        return (np.array([1.0, 2.0], np.float32), np.array([100.0, 200.0], np.float32))

    out = mirrored.run(fn)  # a tuple of PerReplica (TF's regroup)
    assert isinstance(out, tuple) and isinstance(out[0], tributary.PerReplica)
    loss, acc = mirrored.reduce("sum", out, axis=0)
    assert float(loss) == 6 and float(acc) == 600
    loss, acc = mirrored.reduce("sum", out, axis=None)
    np.testing.assert_array_equal(loss, [2, 4])
    np.testing.assert_array_equal(acc, [200, 400])
    d = mirrored.run(lambda: {"loss": np.float32(1.0), "n": np.float32(2.0)})
    r = mirrored.reduce("sum", d, axis=None)
    assert isinstance(r, dict) and float(r["loss"]) == 2 and float(r["n"]) == 4
    pr = tributary.PerReplica([np.float32(1), np.float32(2)])
    r = mirrored.reduce("mean", {"a": pr, "b": [pr, pr]}, axis=None)
    assert float(r["a"]) == 1.5 and [float(v) for v in r["b"]] == [1.5, 1.5]
    g = mirrored.gather((tributary.PerReplica([np.zeros(1, np.float32), np.ones(2, np.float32)]),
                         out), axis=0)
    assert isinstance(g, tuple) and len(g) == 2
    np.testing.assert_array_equal(g[0], [0, 1, 1])
    np.testing.assert_array_equal(g[1][0], [1, 2, 1, 2])


def part_values(part):
    """Each replica's value of one part of a regrouped result: a PerReplica's values, or per
    replica, the same nest rebuilt from the PerReplica leaves inside it."""
    if isinstance(part, tributary.PerReplica):
        return list(part.values)
    if isinstance(part, dict):
        keys = list(part)
        columns = [part_values(part[k]) for k in keys]
        return [dict(zip(keys, row)) for row in zip(*columns)]
    columns = [part_values(x) for x in part]
    return [type(part)(row) for row in zip(*columns)]


def test_replica_all_reduce_and_all_gather_keep_the_structure(mirrored):
    def f():
        ctx = tributary.get_replica_context()
        r1 = ctx.all_reduce("sum", (np.float32(1), np.float32(2)))
        r2 = ctx.all_reduce("sum", {"a": np.float32(1), "b": [np.float64(2), np.int32(3)]})
        r3 = ctx.all_gather({"x": np.full((1,), ctx.replica_id_in_sync_group, np.int64)})
        return r1, r2, r3

    regrouped = mirrored.run(f)
    assert isinstance(regrouped, tuple) and len(regrouped) == 3
    for r1, r2, r3 in zip(*(part_values(part) for part in regrouped)):
        assert isinstance(r1, tuple) and [float(v) for v in r1] == [2, 4]
        assert isinstance(r2, dict) and float(r2["a"]) == 2
        assert isinstance(r2["b"], list) and [float(v) for v in r2["b"]] == [4, 6]
        assert isinstance(r3, dict) and r3["x"].tolist() == [0, 1]


def test_dicts_line_up_by_key_and_structures_must_match(mirrored):
    # Replicas that build their dicts in different orders: keys, not insertion order, pair the
    # values (TF's nest sorts keys); the result keeps a dict's own order.
    def f():
        ctx = tributary.get_replica_context()
        i = ctx.replica_id_in_sync_group
        d = {"a": np.float32(1 + i), "b": np.float32(100 * (1 + i))}
        if i == 1:
            d = {"b": d["b"], "a": d["a"]}
        return d, ctx.all_reduce("sum", d)

    mine, summed = mirrored.run(f)  # a dict of PerReplica each
    reduced = mirrored.reduce("sum", mine, axis=None)
    assert float(reduced["a"]) == 3 and float(reduced["b"]) == 300
    assert [float(v) for v in summed["a"].values] == [3, 3]
    assert [float(v) for v in summed["b"].values] == [300, 300]
    # Replicas whose dicts have other keys are refused in replica context too.
    def other_keys():
        ctx = tributary.get_replica_context()
        key = "b" if ctx.replica_id_in_sync_group == 0 else "c"
        return ctx.all_reduce("sum", {"a": np.float32(1), key: np.float32(2)})

    with pytest.raises(ValueError, match="same nested structure"):
        mirrored.run(other_keys)
    # A tuple on one replica and a list on the other are different structures (TF's error).
    with pytest.raises(ValueError, match="same nested structure"):
        mirrored.run(lambda: (np.float32(1), np.float32(2))
                     if tributary.get_replica_context().replica_id_in_sync_group == 0
                     else [np.float32(3), np.float32(4)])
    mixed = tributary.PerReplica([(np.float32(1), np.float32(2)), [np.float32(3), np.float32(4)]])
    with pytest.raises(ValueError, match="same nested structure"):
        mirrored.reduce("sum", mixed, axis=None)


# --- 4. run()'s argument checks -----------------------------------------------------------------

def test_run_args_must_be_a_list_or_tuple(mirrored):
    with pytest.raises(ValueError, match="positional args must be a list or tuple, got"):
        mirrored.run(lambda x: x, args=np.float32(1))
    with pytest.raises(ValueError, match="positional args must be a list or tuple"):
        mirrored.run(lambda x: x, args="ab")
    with pytest.raises(ValueError, match="kwargs must be a dict, got"):
        mirrored.run(lambda x: x, kwargs=[("x", 1)])
    # The same int from both replicas stays per replica (Python shares small ints by accident).
    assert list(mirrored.run(lambda x: x, args=[5]).values) == [5, 5]


# --- 5. from_tensor_slices: a list is one tensor ----------------------------------------------

def test_from_tensor_slices_list_is_one_tensor():
    assert [int(e) for e in tributary.Dataset.from_tensor_slices([1, 2, 3])] == [1, 2, 3]
    rows = [e.tolist() for e in tributary.Dataset.from_tensor_slices([[1, 2, 3], [4, 5, 6]])]
    assert rows == [[1, 2, 3], [4, 5, 6]]
    pairs = list(tributary.Dataset.from_tensor_slices((np.arange(2), np.arange(2) * 10)))
    assert [tuple(int(c) for c in p) for p in pairs] == [(0, 0), (1, 10)]
    with pytest.raises(TypeError, match="dicts are not supported"):
        tributary.Dataset.from_tensor_slices({"x": np.arange(2)})


# --- 6. and 7. variables ----------------------------------------------------------------------

def test_variable_updates_do_not_narrow(mirrored):
    with mirrored.scope():
        vi = tributary.Variable(np.int32(5))
        vf = tributary.Variable(np.zeros(2, np.float32))
        vu = tributary.Variable(np.uint8(1))
        with pytest.raises(TypeError, match="Cannot convert 1.7 to EagerTensor of dtype int32"):
            vi.assign(1.7)
        with pytest.raises(TypeError):
            vi.assign(np.float64(2.9))
        with pytest.raises(TypeError):
            vi.assign_add([3.5])
        with pytest.raises(ValueError, match="out of range for int32"):
            vi.assign(2 ** 40)
        with pytest.raises(ValueError, match="out of range for int32"):
            vi.assign_sub(np.int64(2 ** 31))
        with pytest.raises(ValueError, match="out of range for uint8"):
            vu.assign(-1)
        with pytest.raises(ValueError, match="out of range"):
            vi.assign(2 ** 70)
        assert int(vi.read()) == 5 and int(vu.read()) == 1
        vi.assign(7)
        vi.assign_add(np.int64(1))
        assert int(vi.read()) == 8
        vf.assign([0.1, 2.0])  # float64 literals into float32: allowed, as TF
        vf.assign_add([np.float64(1.0), 1])
        np.testing.assert_allclose(vf.read(), [1.1, 3.0], rtol=1e-6)


def test_variable_literal_dtypes_and_values_property(mirrored):
    with mirrored.scope():
        assert tributary.Variable(0.0).dtype == "float32"
        assert tributary.Variable([1.0, 2.0]).dtype == "float32"
        assert tributary.Variable(1).dtype == "int32"
        assert tributary.Variable([1, 2]).dtype == "int32"
        assert tributary.Variable(2 ** 40).dtype == "int64"
        assert tributary.Variable(np.zeros(2)).dtype == "float64"  # NumPy keeps its dtype
        assert tributary.Variable(np.float64(1)).dtype == "float64"
        assert tributary.Variable(np.int64(1)).dtype == "int64"
        v = tributary.Variable(3.0)
        assert isinstance(v.values, tuple) and [float(c) for c in v.values] == [3.0, 3.0]


# --- MultiWorkerMirroredStrategy(communication_options=...) -----------------------------------

def test_multi_worker_communication_options():
    opts = tributary.CommunicationOptions(
        implementation=tributary.CommunicationImplementation.RING, timeout_seconds=30,
        bytes_per_pack=1 << 20)
    s = tributary.MultiWorkerMirroredStrategy(devices=2, communication_options=opts)
    spec = s.cross_device_ops
    assert spec.startswith("ring:") and "timeout=30s" in spec and "bytes_per_pack=1MiB" in spec
    s = tributary.MultiWorkerMirroredStrategy(
        devices=2, communication_options=tributary.CommunicationOptions(implementation="ring"))
    assert s.cross_device_ops.startswith("ring:")
    with pytest.raises(ValueError):
        tributary.CommunicationOptions(bytes_per_pack=-1)
