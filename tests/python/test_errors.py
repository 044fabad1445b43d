# Errors: every Status code is a Python exception class carrying .code and .message; each kind of
# bad input (dtype, sizes, backend name, buffers) raises with its code and a message that says what
# to do.
import array

import numpy as np
import pytest

import tributary
from tributary import StatusCode


def test_status_codes_match_the_library():
    for code in StatusCode:
        assert tributary._tributary.status_code_name(int(code)) == code.name.lower()


def test_error_classes_are_builtin_exceptions_too():
    assert issubclass(tributary.InvalidArgumentError, ValueError)
    assert issubclass(tributary.DTypeError, TypeError)
    assert issubclass(tributary.DTypeError, tributary.InvalidArgumentError)
    assert issubclass(tributary.NotFoundError, LookupError)
    assert issubclass(tributary.DeadlineExceededError, TimeoutError)
    assert issubclass(tributary.UnimplementedError, NotImplementedError)
    for cls in (tributary.AbortedError, tributary.UnavailableError, tributary.InternalError):
        assert issubclass(cls, tributary.Error)


def test_unknown_backend_is_not_found_listing_the_backends():
    with pytest.raises(tributary.NotFoundError) as e:
        tributary.backend("no_such_backend")
    assert e.value.code == StatusCode.NOT_FOUND
    assert "unknown backend 'no_such_backend'" in e.value.message
    assert "reduction_to_one_device" in e.value.message  # the message lists what is valid
    assert str(e.value).startswith("not_found: ")


def test_bad_backend_option_is_invalid_argument():
    with pytest.raises(tributary.InvalidArgumentError) as e:
        tributary.backend("hierarchical_copy:num_packs=-1")
    assert e.value.code == StatusCode.INVALID_ARGUMENT
    assert "num_packs" in e.value.message


def test_malformed_spec_is_invalid_argument():
    with pytest.raises(tributary.Error) as e:
        tributary.backend("ring:")
    assert e.value.code == StatusCode.INVALID_ARGUMENT


def test_unsupported_dtype_is_a_type_error_with_a_code():
    ops = tributary.backend("reduction_to_one_device")
    for bad in (np.zeros(4, np.complex64), np.zeros(4, np.int16), np.zeros(4, bool),
                np.zeros(4, np.uint32)):
        with pytest.raises(TypeError) as e:
            ops.all_reduce(bad)
        assert isinstance(e.value, tributary.DTypeError)
        assert e.value.code == StatusCode.INVALID_ARGUMENT
        assert "inputs (in place)[0] has dtype" in e.value.message
        assert "supported: float32" in e.value.message


def test_non_native_byte_order_is_a_type_error():
    ops = tributary.backend("reduction_to_one_device")
    with pytest.raises(tributary.DTypeError, match="byte order"):
        ops.all_reduce(np.zeros(4, ">f4"))


def test_wrong_sizes_are_invalid_argument_and_touch_nothing():
    ops = tributary.backend("reduction_to_one_device", devices=2)
    a = np.ones(4, np.float32)
    b = np.ones(5, np.float32)
    with pytest.raises(tributary.InvalidArgumentError) as e:
        ops.all_reduce([a, b])
    assert e.value.code == StatusCode.INVALID_ARGUMENT
    np.testing.assert_array_equal(a, 1)
    np.testing.assert_array_equal(b, 1)
    # One buffer for two replicas.
    with pytest.raises(tributary.InvalidArgumentError):
        ops.all_reduce([a])
    # reduce_scatter whose input does not divide across the replicas.
    with pytest.raises(tributary.InvalidArgumentError):
        ops.reduce_scatter([np.ones(5, np.float32), np.ones(5, np.float32)])


def test_dtype_mismatch_across_replicas():
    ops = tributary.backend("reduction_to_one_device", devices=2)
    with pytest.raises(tributary.InvalidArgumentError):
        ops.all_reduce([np.ones(4, np.float32), np.ones(4, np.float64)])


def test_non_contiguous_and_read_only_buffers():
    ops = tributary.backend("reduction_to_one_device")
    x = np.ones((4, 4), np.float32)
    with pytest.raises(tributary.InvalidArgumentError, match="not C-contiguous"):
        ops.all_reduce(x[:, 1])
    ro = np.ones(4, np.float32)
    ro.setflags(write=False)
    with pytest.raises(ValueError, match="read-only") as e:
        ops.all_reduce(ro)  # in place: the input is written
    assert e.value.code == StatusCode.INVALID_ARGUMENT
    # A read-only input with a separate output is fine.
    out = np.zeros(4, np.float32)
    ops.all_reduce(ro, out)
    np.testing.assert_array_equal(out, 1)
    with pytest.raises(ValueError, match="read-only"):
        ops.all_reduce(np.ones(4, np.float32), bytes(16))


def test_element_misaligned_buffer():
    # C-contiguous and writable, but not on a float32 boundary: refused, not read through a
    # misaligned float pointer.
    ops = tributary.backend("reduction_to_one_device")
    raw = bytearray(4 * 5)
    x = np.frombuffer(raw, np.float32, count=4, offset=1)
    assert x.flags.c_contiguous and not x.flags.aligned
    with pytest.raises(tributary.InvalidArgumentError, match="not aligned to its 4-byte elements"):
        ops.all_reduce(x)


def test_broadcast_without_a_source_on_the_root():
    ops = tributary.backend("reduction_to_one_device", devices=2)
    with pytest.raises(tributary.InvalidArgumentError, match="the root process must pass a source"):
        ops.broadcast(None, [np.zeros(3, np.float32), np.zeros(3, np.float32)])


def test_objects_that_are_not_buffers():
    ops = tributary.backend("reduction_to_one_device")
    with pytest.raises(tributary.DTypeError, match="expected a NumPy array"):
        ops.all_reduce(object())
    with pytest.raises(tributary.InvalidArgumentError, match="op must be|unknown|reduce"):
        ops.all_reduce(np.ones(2, np.float32), op="median")


def test_work_wait_timeout_is_deadline_exceeded():
    assert issubclass(tributary.DeadlineExceededError, tributary.Error)
    # A completed Work waits for nothing; a failed one raises its error on wait() and error().
    ops = tributary.backend("reduction_to_one_device", devices=2)
    w = ops.all_reduce([np.ones(3, np.float32), np.ones(4, np.float32)], async_op=True)
    assert w.done()
    err = w.error()
    assert isinstance(err, tributary.InvalidArgumentError)
    with pytest.raises(tributary.InvalidArgumentError):
        w.wait(timeout=1)


class _CudaArray:
    """Looks like a CuPy array: __cuda_array_interface__ only."""

    def __init__(self, n):
        self.__cuda_array_interface__ = {
            "shape": (n,), "typestr": "<f4", "data": (0x7F0000000000, False), "strides": None,
            "version": 3,
        }


def test_gpu_buffer_without_a_gpu_says_why():
    if tributary.cuda_available():
        pytest.skip("a GPU is visible: the error path for machines without one does not apply")
    ops = tributary.backend("reduction_to_one_device")
    with pytest.raises(tributary.Error) as e:
        ops.all_reduce(_CudaArray(4))
    assert e.value.code in (StatusCode.UNAVAILABLE, StatusCode.UNIMPLEMENTED)
    assert "__cuda_array_interface__" in e.value.message


def test_gpu_buffers_all_reduce():
    if not tributary.cuda_available():
        pytest.skip("no GPU visible to tributary: __cuda_array_interface__ buffers are only "
                    "checked for their error here")
    cupy = pytest.importorskip("cupy", reason="GPU arrays for the test need CuPy")
    ops = tributary.backend(None, devices=["GPU:0"])
    x = cupy.arange(8, dtype=cupy.float32)
    ops.all_reduce(x)
    np.testing.assert_array_equal(cupy.asnumpy(x), np.arange(8) * ops.num_replicas_in_sync)


def test_buffer_protocol_without_numpy_dtype_codes():
    ops = tributary.backend("reduction_to_one_device")
    with pytest.raises(tributary.DTypeError):
        ops.all_reduce(array.array("h", [1, 2]))  # int16
