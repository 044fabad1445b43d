# Every collective across processes (the ring backend over shared memory and TCP, and gloo when
# built in), two local replicas per process; each rank checks its own results exactly.
import os

import numpy as np
import pytest

import tributary

RANK = int(os.environ.get("TRIBUTARY_RANK", "0"))
WORLD = int(os.environ.get("TRIBUTARY_WORLD_SIZE", "1"))
LOCAL = 2


@pytest.fixture(scope="module")
def context():
    # One rendezvous per process; every backend made from it meets its peers in creation order.
    ctx = tributary.make_context(devices=LOCAL, timeout=60)
    yield ctx
    del ctx


SPECS = ["ring:timeout=60s", "ring:timeout=60s,intra_host=net"]


def global_id(i):
    return RANK * LOCAL + i


@pytest.fixture(scope="module", params=SPECS + (["gloo:timeout=60s"] if "gloo" in tributary.backends() else []))
def ops(request, context):
    b = context.backend(request.param)
    yield b
    b.close()


def test_queries(ops):
    assert ops.rank == RANK and ops.world_size == WORLD
    assert ops.num_local_replicas == LOCAL and ops.num_replicas_in_sync == LOCAL * WORLD


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.float16, np.uint8])
def test_all_reduce(ops, dtype):
    n = LOCAL * WORLD
    xs = [np.full(1001, global_id(i) + 1, dtype) for i in range(LOCAL)]
    ops.all_reduce(xs, op="sum")
    for x in xs:
        np.testing.assert_array_equal(x, n * (n + 1) // 2)
    ys = [np.full(7, global_id(i) + 1, dtype) for i in range(LOCAL)]
    out = ops.all_reduce(ys, [np.zeros(7, dtype) for _ in range(LOCAL)], op="max")
    np.testing.assert_array_equal(out[1], n)


def test_registered_shareable_arrays(ops):
    # Arrays every process takes from shareable memory, registered: ring's shared memory
    # all-reduces them in place through its direct path; every backend takes them.
    n = LOCAL * WORLD
    xs = [tributary.shareable_array(300001, np.float32) for _ in range(LOCAL)]
    assert all(x.flags.writeable and x.shape == (300001,) and not x.any() for x in xs)
    with ops.register_buffers(xs):
        for step in (1, 2):
            for i, x in enumerate(xs):
                x[:] = step * (global_id(i) + 1)
            ops.all_reduce(xs, op="sum")
            for x in xs:
                np.testing.assert_array_equal(x, step * n * (n + 1) // 2)


def test_registered_shareable_gather_broadcast_and_scatter(ops):
    # All-gathers, broadcasts and reduce-scatters on registered shareable arrays (ring's direct
    # path between the processes of one host), and an all-reduce out of place from a registered
    # input.
    n = LOCAL * WORLD
    count = 70001
    outs = [tributary.shareable_array(count * n, np.float32) for _ in range(LOCAL)]
    ins = [tributary.shareable_array(count, np.float32) for _ in range(LOCAL)]
    with ops.register_buffers(outs), ops.register_buffers(ins):
        for i in range(LOCAL):
            ins[i][:] = global_id(i) + 1
        ops.all_gather(ins, outs)
        want = np.repeat(np.arange(1, n + 1, dtype=np.float32), count)
        for o in outs:
            np.testing.assert_array_equal(o, want)
        for i, o in enumerate(outs):
            o[:] = 7.0 if RANK == WORLD - 1 else global_id(i)
        ops.broadcast(outs[0], outs, root=WORLD - 1)
        for o in outs:
            np.testing.assert_array_equal(o, 7.0)
        ops.all_reduce(ins, [o[:count] for o in outs], op="sum")
        for i, (x, o) in enumerate(zip(ins, outs)):
            np.testing.assert_array_equal(o[:count], n * (n + 1) // 2)
            np.testing.assert_array_equal(x, global_id(i) + 1)
        # Reduce-scatter from the registered arrays into ordinary ones: block j of every input
        # holds j + 1, so block g of the sum is n * (g + 1).
        for o in outs:
            o[:] = np.repeat(np.arange(1, n + 1, dtype=np.float32), count)
        got = ops.reduce_scatter(outs, [np.zeros(count, np.float32) for _ in range(LOCAL)])
        for i, g in enumerate(got):
            np.testing.assert_array_equal(g, n * (global_id(i) + 1))


def test_async_all_reduce_mean(ops):
    n = LOCAL * WORLD
    xs = [np.full(1 << 18, 2.0 * global_id(i), np.float32) for i in range(LOCAL)]
    w = ops.all_reduce(xs, op="mean", async_op=True)
    w.wait(timeout=60)
    assert w.done() and w.error() is None
    np.testing.assert_array_equal(xs[0], (n - 1))


def test_reduce_and_batch_reduce(ops):
    n = LOCAL * WORLD
    xs = [np.full(5, global_id(i), np.int64) for i in range(LOCAL)]
    dests = ops.reduce(xs, op="sum")
    for d in dests:
        np.testing.assert_array_equal(d, n * (n - 1) // 2)
    out = ops.batch_reduce([([np.full(3, 1.0, np.float32)] * LOCAL, None),
                            ([np.full(9, global_id(i), np.int32) for i in range(LOCAL)], None)],
                           op="sum")
    np.testing.assert_array_equal(out[0][0], n)
    np.testing.assert_array_equal(out[1][1], n * (n - 1) // 2)


def test_broadcast_from_each_root(ops):
    for root in range(WORLD):
        src = np.arange(6, dtype=np.float32) + 100 * RANK
        dests = ops.broadcast(src, [np.zeros(6, np.float32) for _ in range(LOCAL)], root=root)
        for d in dests:
            np.testing.assert_array_equal(d, np.arange(6) + 100 * root)


def test_broadcast_source_none_off_the_root(ops):
    # As in C and C++: off the root the source is not read, so it may be None.
    src = np.arange(6, dtype=np.float32) if RANK == 0 else None
    dests = ops.broadcast(src, [np.zeros(6, np.float32) for _ in range(LOCAL)], root=0)
    for d in dests:
        np.testing.assert_array_equal(d, np.arange(6))


def test_all_gather(ops):
    n = LOCAL * WORLD
    xs = [np.full((2, 3), global_id(i), np.float32) for i in range(LOCAL)]
    outs = ops.all_gather(xs)
    for o in outs:
        assert o.shape == (2 * n, 3)
        np.testing.assert_array_equal(o[::2, 0], np.arange(n))


def test_reduce_scatter(ops):
    n = LOCAL * WORLD
    xs = [np.arange(2 * n, dtype=np.int64) for _ in range(LOCAL)]
    outs = ops.reduce_scatter(xs, op="sum")
    for i, o in enumerate(outs):
        g = global_id(i)
        np.testing.assert_array_equal(o, [n * 2 * g, n * (2 * g + 1)])


def test_backends_joined_by_tributary_backend_beside_the_context(context):
    # tributary.backend() joins the job by itself. While the module's context is alive (on rank 0
    # it serves the job's store on the coordinator port), two more join through its connection and
    # are used in turn, each meeting its own peers.
    a = tributary.backend("ring:timeout=60s", devices=1)
    b = tributary.backend("ring:timeout=60s,intra_host=net", devices=1)
    for k in range(3):
        x = np.full(5, RANK + 1, np.float64)
        a.all_reduce([x])
        np.testing.assert_array_equal(x, WORLD * (WORLD + 1) // 2)
        y = np.full(3, RANK + k, np.int32)
        b.all_reduce([y], op="max")
        np.testing.assert_array_equal(y, WORLD - 1 + k)
    a.close()
    b.close()
