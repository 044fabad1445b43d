// What the binding files of the Python module share: the Status -> exception bridge, Python objects
// seen as tensors (zero-copy) and Arrays seen as NumPy arrays.
//
// Only the public API (include/tributary/) is used: libtributary exports nothing else.
// GIL discipline: every call that can block (a collective, a wait, a rendezvous, a meeting of the
// replicas) runs with the GIL released; Python objects are created, copied and destroyed only with
// the GIL held.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tributary/tributary.h"

namespace tributary::python {

namespace py = pybind11;

// A non-OK Status on its way to Python, where it becomes the tributary.errors class of its code.
// `type_error` also makes it a TypeError (an unsupported dtype or kind of object).
class StatusError : public std::exception {
 public:
  explicit StatusError(Status status, bool type_error = false)
      : status_(std::move(status)), type_error_(type_error) {}
  const Status& status() const { return status_; }
  bool type_error() const { return type_error_; }
  const char* what() const noexcept override { return status_.message().c_str(); }

 private:
  Status status_;
  bool type_error_;
};

// Throws StatusError for a non-OK status.
inline void check(const Status& s) {
  if (!s.ok()) throw StatusError(s);
}
template <typename T>
T value_or_throw(StatusOr<T> v) {
  if (!v.ok()) throw StatusError(v.status());
  return std::move(v).value();
}
[[noreturn]] inline void throw_invalid(std::string message) {
  throw StatusError(invalid_argument(std::move(message)));
}
[[noreturn]] inline void throw_type(std::string message) {
  throw StatusError(invalid_argument(std::move(message)), /*type_error=*/true);
}

// The Python exception (an instance of a tributary.errors class) for a status.
py::object exception_for(const Status& s, bool type_error = false);

// "sum", "MEAN", tributary.ReduceOp.SUM -> ReduceOp.
ReduceOp reduce_op_from(py::handle op);
// Seconds (int or float) or None -> a timeout; None gives `none`.
std::chrono::milliseconds timeout_from(py::handle seconds, std::chrono::milliseconds none);
// "CPU:0", "/device:GPU:1", ... ; an int n means CPU:0..n-1; None means `fallback`.
std::vector<Device> devices_from(py::handle devices, std::vector<Device> fallback);
std::vector<std::string> device_names(const std::vector<Device>& devices);

// --- Python objects as tensors ------------------------------------------------------------------

enum class Access { kRead, kWrite };

// A zero-copy view of a Python object's memory, holding what keeps it alive: the object, and the
// buffer-protocol view when it was obtained that way. Move-only; destroy it with the GIL held.
class HeldTensor {
 public:
  HeldTensor() = default;
  HeldTensor(HeldTensor&&) noexcept = default;
  HeldTensor& operator=(HeldTensor&&) noexcept = default;
  ~HeldTensor() = default;

  Tensor tensor;
  py::object owner;
  bool on_gpu = false;
  struct BufferRelease {
    void operator()(Py_buffer* view) const;
  };
  std::unique_ptr<Py_buffer, BufferRelease> view;
};

// `obj` as a tensor of replica `replica_device`, without copying: a NumPy array, an object with the
// buffer protocol, __array_interface__ or __cuda_array_interface__. It must be C-contiguous, of a
// dtype tributary reduces, and writable for Access::kWrite. Host memory is labelled with the
// replica's device when that is a CPU (else CPU:0, which the backend refuses for GPU replicas with
// its own message); GPU memory likewise with a GPU. `what` names the argument in errors
// ("inputs[1]").
HeldTensor hold_tensor(py::handle obj, const Device& replica_device, Access access,
                       const std::string& what);

// The DType of a NumPy dtype; throws a TypeError-flavoured StatusError naming `what` otherwise.
DType dtype_from_numpy(const py::dtype& dt, const std::string& what);
// The NumPy dtype of a DType (bfloat16: ml_dtypes' when importable, else none).
std::optional<py::dtype> numpy_dtype(DType dtype);

// A new NumPy array of `shape` and `dtype` (for outputs the caller did not pass).
py::array new_numpy(DType dtype, const Shape& shape);

// --- Arrays (the strategy layer's values) -------------------------------------------------------

// A copy of anything NumPy can make an array of (arrays, buffers, scalars, nested lists). With
// `dtype`, Python scalars, lists and NumPy scalars take it (as TF converts literals to a variable's
// dtype), never narrowing: a float for an integer dtype is a TypeError, an integer outside the
// dtype's range a ValueError (float64 -> float32 is allowed).
Array array_from(py::handle obj, const std::string& what,
                 std::optional<DType> dtype = std::nullopt);
// A read-only NumPy view of an Array that keeps its storage alive (bfloat16 without ml_dtypes: a
// float32 copy).
py::array to_numpy(const Array& a);
// A writable NumPy array in memory from Buffer::allocate_shareable (tributary.shareable_array).
py::array shareable_array(py::handle shape, py::handle dtype);

// tributary.PerReplica: one Python value per local replica.
struct PerReplicaValue {
  std::vector<py::object> values;
};

// What regroup does with a leaf that is the same object on every replica (so any leaf of one).
enum class Unwrap {
  kNever,       // TF's always_wrap (values from a function)
  kSameObject,  // TF's rule: that object, unwrapped (merge_call's arguments)
  // run()'s results: as kSameObject, except ints and NumPy booleans from several replicas, which
  // Python shares by accident (small ints) where TF's replicas return two tensors.
  kSameObjectExceptCounts,
};

// TF's regroup of a PerReplica: values that are nests (tuples, lists, dicts) become the nest of
// PerReplica leaves, each unwrapped as `unwrap` says. Any other value as it is.
py::object regroup(py::handle value, Unwrap unwrap);

// --- module parts -------------------------------------------------------------------------------
void bind_errors(py::module_& m);
void bind_ops(py::module_& m);
void bind_strategy(py::module_& m);
void bind_data(py::module_& m);

}  // namespace tributary::python
