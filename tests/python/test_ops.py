# The collectives of a Backend in one process (in-process backends, 1 and 3 local replicas): results
# checked exactly (small integers), buffers used in place without copies, async Work, and every kind
# of object that exposes memory.
import array

import numpy as np
import pytest

import tributary

DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.int8, np.uint8]
SPECS = ["reduction_to_one_device", "hierarchical_copy"]


def replicas(n, count, dtype, base=1):
    return [np.full(count, base + i, dtype) for i in range(n)]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce_in_place_every_dtype(spec, n, dtype):
    ops = tributary.backend(spec, devices=n)
    assert ops.num_local_replicas == n and ops.num_replicas_in_sync == n
    assert ops.rank == 0 and ops.world_size == 1
    xs = replicas(n, 11, dtype)
    ptrs = [x.ctypes.data for x in xs]
    out = ops.all_reduce(xs, op="sum")
    assert [o.ctypes.data for o in out] == ptrs  # the very same buffers: no copies
    for x in xs:
        np.testing.assert_array_equal(x, np.full(11, sum(range(1, n + 1)), dtype))


@pytest.mark.parametrize("op,expect", [("sum", 6), ("mean", 2), ("min", 1), ("max", 3),
                                       ("prod", 6), (tributary.ReduceOp.MAX, 3)])
def test_reduce_ops(op, expect):
    ops = tributary.backend("hierarchical_copy", devices=3)
    xs = replicas(3, 5, np.float32)
    outs = [np.zeros(5, np.float32) for _ in range(3)]
    got = ops.all_reduce(xs, outs, op=op)
    assert got[0] is outs[0]
    for o in outs:
        np.testing.assert_array_equal(o, expect)
    np.testing.assert_array_equal(xs[2], 3)  # inputs untouched


def test_single_array_for_one_replica():
    ops = tributary.backend("reduction_to_one_device")
    x = np.arange(6, dtype=np.float64).reshape(2, 3)
    y = ops.all_reduce(x)
    assert y is x
    np.testing.assert_array_equal(x, np.arange(6).reshape(2, 3))


def test_random_data_against_float64_reference(rng):
    ops = tributary.backend("hierarchical_copy:num_packs=2", devices=3)
    xs = [rng.standard_normal(1001) for _ in range(3)]
    ref = np.sum(xs, axis=0)
    ops.all_reduce(xs)
    for x in xs:
        np.testing.assert_allclose(x, ref, rtol=1e-12)


def test_reduce_to_new_and_given_destinations():
    ops = tributary.backend("reduction_to_one_device", devices=2)
    xs = replicas(2, 4, np.int32)
    dests = ops.reduce(xs, op="sum")
    assert len(dests) == 2
    for d in dests:
        np.testing.assert_array_equal(d, 3)
        assert d.dtype == np.int32
    one = np.zeros(4, np.int32)
    got = ops.reduce(xs, [one], op="max")
    assert got[0] is one
    np.testing.assert_array_equal(one, 2)


def test_batch_reduce():
    ops = tributary.backend("hierarchical_copy", devices=2)
    a = replicas(2, 3, np.float32)
    b = replicas(2, 7, np.int64, base=10)
    dest_b = [np.zeros(7, np.int64), np.zeros(7, np.int64)]
    out = ops.batch_reduce([(a, None), (b, dest_b)], op="sum")
    np.testing.assert_array_equal(out[0][0], 3)
    assert out[1][1] is dest_b[1]
    np.testing.assert_array_equal(dest_b[0], 21)
    # A pair of the value alone gets new destinations, as (value, None) does.
    (alone,) = ops.batch_reduce([(b,)], op="max")
    assert len(alone) == 2 and alone[0] is not b[0]
    np.testing.assert_array_equal(alone[1], 11)


@pytest.mark.parametrize("call", ["reduce", "batch_reduce", "all_gather", "reduce_scatter"])
def test_new_outputs_need_an_input_to_go_by(call):
    ops = tributary.backend("hierarchical_copy", devices=2)
    run = {
        "reduce": lambda: ops.reduce([], op="sum"),
        "batch_reduce": lambda: ops.batch_reduce([([],)], op="sum"),
        "all_gather": lambda: ops.all_gather([]),
        "reduce_scatter": lambda: ops.reduce_scatter([], op="sum"),
    }[call]
    with pytest.raises(ValueError, match="is empty"):
        run()


def test_broadcast():
    ops = tributary.backend("reduction_to_one_device", devices=3)
    src = np.arange(5, dtype=np.float32)
    dests = [np.zeros(5, np.float32) for _ in range(3)]
    ops.broadcast(src, dests)
    for d in dests:
        np.testing.assert_array_equal(d, src)
    fresh = ops.broadcast(src)  # new arrays, one per local replica
    assert len(fresh) == 3
    for f in fresh:
        np.testing.assert_array_equal(f, src)
    one = tributary.backend("reduction_to_one_device")
    np.testing.assert_array_equal(one.broadcast(src), src)  # one replica: one array


def test_all_gather_and_reduce_scatter_shapes():
    ops = tributary.backend("hierarchical_copy", devices=3)
    xs = [np.full((2, 4), i, np.float32) for i in range(3)]
    gathered = ops.all_gather(xs)
    assert len(gathered) == 3
    for g in gathered:
        assert g.shape == (6, 4)
        np.testing.assert_array_equal(g[:, 0], [0, 0, 1, 1, 2, 2])
    ins = [np.arange(6, dtype=np.int32) + 100 * i for i in range(3)]
    outs = ops.reduce_scatter(ins, op="sum")
    for i, o in enumerate(outs):
        assert o.shape == (2,)
        np.testing.assert_array_equal(o, [3 * (2 * i) + 300, 3 * (2 * i + 1) + 300])


def test_async_work():
    ops = tributary.backend("hierarchical_copy", devices=2)
    xs = replicas(2, 1 << 16, np.float32)
    w = ops.all_reduce(xs, async_op=True)
    assert isinstance(w, tributary.Work)
    out = w.wait(timeout=30)
    assert w.done() and w.error() is None
    assert out[0] is xs[0]
    np.testing.assert_array_equal(xs[1], 3)
    assert w.elapsed >= 0
    # Timeouts beyond a year, infinity included, wait (a year); before, they overflowed into a
    # deadline already past and raised DeadlineExceededError at once.
    for forever in (float("inf"), 1e17, 1e10):
        w = ops.all_reduce(xs, async_op=True)
        w.wait(timeout=forever)
        assert w.done() and w.error() is None
    with pytest.raises(tributary.InvalidArgumentError):
        w.wait(timeout=float("nan"))
    # Dropping a Work is safe: its buffers stay referenced until it completes.
    ops.all_gather(xs, [np.zeros(2 << 16, np.float32), np.zeros(2 << 16, np.float32)],
                   async_op=True)


def test_buffer_protocol_and_array_interface_are_zero_copy():
    ops = tributary.backend("reduction_to_one_device", devices=2)
    a = array.array("f", [1, 2, 3])
    b = bytearray(np.array([10, 20, 30], np.float32).tobytes())
    ops.all_reduce([a, memoryview(b).cast("f")])
    assert list(a) == [11, 22, 33]
    np.testing.assert_array_equal(np.frombuffer(b, np.float32), [11, 22, 33])

    class Interface:  # only __array_interface__, as many array libraries expose
        def __init__(self, arr):
            self._arr = arr
            self.__array_interface__ = arr.__array_interface__

    x, y = np.ones(4, np.int64), np.full(4, 2, np.int64)
    ops.all_reduce([Interface(x), Interface(y)])
    np.testing.assert_array_equal(x, 3)
    np.testing.assert_array_equal(y, 3)


def test_bfloat16_when_ml_dtypes_is_there():
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="NumPy has no bfloat16 without ml_dtypes")
    ops = tributary.backend("reduction_to_one_device", devices=2)
    xs = [np.full(4, 1.5, ml_dtypes.bfloat16), np.full(4, 2.0, ml_dtypes.bfloat16)]
    ops.all_reduce(xs)
    np.testing.assert_array_equal(xs[0].astype(np.float32), 3.5)


def test_properties_and_context():
    ctx = tributary.make_context(devices=["CPU:0", "CPU:1"])
    assert ctx.rank == 0 and ctx.world_size == 1 and ctx.devices == ["CPU:0", "CPU:1"]
    ops = ctx.backend("reduction_to_one_device:timeout=7s")
    assert ops.name == "reduction_to_one_device"
    assert ops.spec.startswith("reduction_to_one_device:")
    assert ops.timeout == pytest.approx(7.0)
    assert ops.devices == ["CPU:0", "CPU:1"]
    assert "float32" in ops.capabilities
    ops.check()
    ops.all_reduce(replicas(2, 2, np.float32))
    assert ops.last_sequence == 1
    assert "reduction_to_one_device" in repr(ops)
    ops.close()
    with pytest.raises(tributary.FailedPreconditionError):
        ops.all_reduce(replicas(2, 2, np.float32))


def test_spec_from_the_environment(monkeypatch):
    monkeypatch.setenv("TRIBUTARY_CROSS_DEVICE_OPS", "hierarchical_copy:num_packs=3")
    ops = tributary.backend(None, devices=2)
    assert ops.name == "hierarchical_copy"
    assert "num_packs=3" in ops.spec
    monkeypatch.setenv("TRIBUTARY_CROSS_DEVICE_OPS", "nope")
    with pytest.raises(tributary.NotFoundError):
        tributary.backend(devices=2)
    ops = tributary.backend("auto", devices=2)
    assert ops.name in tributary.backends()


def test_abort_breaks_the_backend():
    ops = tributary.backend("reduction_to_one_device", devices=2)
    ops.abort("the trainer gave up")
    with pytest.raises(tributary.Error) as e:
        ops.check()
    assert "the trainer gave up" in e.value.message
    with pytest.raises(tributary.FailedPreconditionError):
        ops.all_reduce(replicas(2, 2, np.float32))


def test_shareable_array():
    x = tributary.shareable_array((3, 5), "int32")
    assert x.dtype == np.int32 and x.shape == (3, 5) and x.flags.writeable and not x.any()
    x[:] = 4
    assert tributary.shareable_array(7).dtype == np.float32
    with pytest.raises(TypeError):
        tributary.shareable_array(4, np.complex64)


def test_registered_buffers():
    # In one process registration changes nothing but is checked and counted; the Registration
    # holds the buffers until released, and may outlive a closed backend.
    ops = tributary.backend("reduction_to_one_device", devices=2)
    xs = replicas(2, 100, np.float32)
    with ops.register_buffers(xs) as reg:
        assert reg.active and reg.id == 1
        assert ops.last_sequence == 1
        ops.all_reduce(xs)
        np.testing.assert_array_equal(xs[1], 3)
    assert not reg.active
    with pytest.raises(tributary.InvalidArgumentError, match="buffers has 1 values"):
        ops.register_buffers(xs[:1])
    reg = ops.register_buffers(xs)
    ops.close()
    assert not reg.active
    reg.release()
