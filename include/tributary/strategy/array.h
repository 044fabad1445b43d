// Array: the owning tensor value of the strategy layer (what TF's eager tf.Tensor is to
// tf.distribute): run() results, dataset elements, variable values and reduce() results.
//
// An Array shares its storage when copied (copies are cheap handles, like TF's eager tensors) and
// is treated as immutable once made: operations return new Arrays. The one exception is
// mutable_data(), for whoever just created the Array and is filling it. Variables own their own
// storage and copy values in and out, so an Array read from a variable never changes afterwards.
//
// Element access (at(), to_doubles(), the helpers below) works on CPU arrays only; a GPU array can
// be moved to the CPU with to_device(). All functions return Status on bad input (shape mismatch,
// axis out of range, non-CPU data); nothing throws.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "tributary/device.h"
#include "tributary/dtype.h"
#include "tributary/export.h"
#include "tributary/status.h"
#include "tributary/tensor.h"

TRIBUTARY_BEGIN_PUBLIC_API
namespace tributary {

// The DType of a C++ element type (float, double, int32_t, int64_t, int8_t, uint8_t).
template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return DType::kFloat32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::kFloat64;
  else if constexpr (std::is_same_v<T, int32_t>)
    return DType::kInt32;
  else if constexpr (std::is_same_v<T, int64_t>)
    return DType::kInt64;
  else if constexpr (std::is_same_v<T, int8_t>)
    return DType::kInt8;
  else if constexpr (std::is_same_v<T, uint8_t>)
    return DType::kUInt8;
  else
    static_assert(sizeof(T) == 0, "no DType for this C++ type");
}

class Array {
 public:
  Array();  // float32 [0] on CPU:0

  // Zero-filled storage. Fails for a negative dimension or when the device cannot allocate.
  static StatusOr<Array> zeros(DType dtype, Shape shape, Device device = Device::cpu());
  // A copy of `tensor`'s contents (any device).
  static StatusOr<Array> copy_of(const Tensor& tensor);
  // From host values; `shape` defaults to {values.size()}; its element count must match.
  template <typename T>
  static StatusOr<Array> from_vector(const std::vector<T>& values, Shape shape = {-1});
  // A rank-0 array.
  template <typename T>
  static Array scalar(T value);
  // From doubles, each rounded to `dtype`.
  static StatusOr<Array> from_doubles(DType dtype, std::span<const double> values, Shape shape);

  const Tensor& tensor() const { return view_; }
  DType dtype() const { return view_.dtype(); }
  const Shape& shape() const { return view_.shape(); }
  int rank() const { return static_cast<int>(view_.shape().size()); }
  const Device& device() const { return view_.device(); }
  int64_t num_elements() const { return view_.num_elements(); }
  size_t nbytes() const { return view_.nbytes(); }
  // Size of dimension 0 (1 for a scalar).
  int64_t dim0() const { return rank() == 0 ? 1 : shape()[0]; }

  template <typename T>
  const T* data() const {
    return static_cast<const T*>(view_.data());
  }
  template <typename T>
  T* mutable_data() const {
    return static_cast<T*>(view_.data());
  }

  // Element `i` of the flattened array as a double (CPU only; asserts in range).
  double at(int64_t i) const;
  std::vector<double> to_doubles() const;  // CPU only
  template <typename T>
  std::vector<T> to_vector() const;  // dtype must be dtype_of<T>()

  // A copy on `device`; between CPU devices (replicas of one address space) the storage is shared.
  StatusOr<Array> to_device(const Device& device) const;
  // Same storage, another shape with as many elements.
  StatusOr<Array> reshape(Shape shape) const;
  // Rows [begin, end) along dimension 0, sharing storage. Rank >= 1.
  StatusOr<Array> rows(int64_t begin, int64_t end) const;

  // True when both have the same dtype, shape and elements (bitwise for floats).
  bool equals(const Array& other) const;
  // "float32[2]{1, 2}"; long arrays are elided after `max_elements`.
  std::string to_string(int64_t max_elements = 16) const;

 private:
  Array(std::shared_ptr<Buffer> storage, Tensor view);
  std::shared_ptr<Buffer> storage_;
  Tensor view_;
};

// Element-wise math and shape helpers for replica functions (losses, gradients) and the strategy
// layer. CPU arrays; a GPU array is kUnimplemented (move it with to_device(Device::cpu())), except
// for reduce_sum_all, reduce_mean_all and cast, which return no Status: they copy a GPU array to
// the host and their result back to its device, and a copy that fails there (out of memory on the
// device) ends the process with its error.
// Floating values are computed in double and rounded to the dtype once (float16/bfloat16
// therefore accumulate wider, as the reductions do); the binary ops compute integers exactly in
// int64 and wrap around in narrow dtypes, as TF's integer kernels (Variable updates and scatters
// too; reductions along an axis and the unary ops still go through double, exact to 2^53). These
// are for the small tensors of a model's step, not hot loops.
//
// Binary ops need equal dtypes (no implicit casts, as in TF: cast() first) and broadcast shapes as
// TF and NumPy do: shapes are aligned at their last dimension and each pair of dimensions must be
// equal or 1 ([B, D] + [D], [B, 1] * [1, D], x * Array::scalar(2.f)). Otherwise kInvalidArgument
// with TF's wording ("Incompatible shapes: [2,3] vs. [4]").
StatusOr<Array> add(const Array& a, const Array& b);
StatusOr<Array> subtract(const Array& a, const Array& b);
StatusOr<Array> multiply(const Array& a, const Array& b);
// Floating dtypes: IEEE division (x / 0 is inf or nan). Integer dtypes truncate toward zero (TF's
// truncatediv); an integer division by zero is kInvalidArgument ("Integer division by zero").
StatusOr<Array> divide(const Array& a, const Array& b);
StatusOr<Array> maximum(const Array& a, const Array& b);
StatusOr<Array> minimum(const Array& a, const Array& b);
// (a - b)^2, element-wise (TF's squared_difference).
StatusOr<Array> squared_difference(const Array& a, const Array& b);
// Unary ops, shape kept. negative/abs/square work on every dtype; sqrt, exp, log and sigmoid need a
// floating dtype (kInvalidArgument otherwise, as TF has no integer kernels for them).
StatusOr<Array> negative(const Array& a);
StatusOr<Array> abs(const Array& a);
StatusOr<Array> square(const Array& a);
StatusOr<Array> sqrt(const Array& a);
StatusOr<Array> exp(const Array& a);
StatusOr<Array> log(const Array& a);
StatusOr<Array> sigmoid(const Array& a);
// Matrix product of rank-2 arrays [m, k] x [k, n] -> [m, n] (TF's matmul), optionally transposing
// either operand first.
StatusOr<Array> matmul(const Array& a, const Array& b, bool transpose_a = false,
                       bool transpose_b = false);
// Mean over dimension `axis` (removed), and of every element (a scalar); an empty input gives NaN
// for floating dtypes, as TF's reduce_mean does.
StatusOr<Array> reduce_mean(const Array& a, int axis);
Array reduce_mean_all(const Array& a);
// Every element times `factor` (integer dtypes truncate toward zero, as TF's integer division does
// for positive values).
StatusOr<Array> scale(const Array& a, double factor);
// Sum over dimension `axis` (removed from the shape).
StatusOr<Array> reduce_sum(const Array& a, int axis);
// Sum of every element, as a scalar of the same dtype.
Array reduce_sum_all(const Array& a);
// Concatenation along `axis`; shapes must agree everywhere else. Zero-size parts are allowed.
StatusOr<Array> concat(std::span<const Array> parts, int axis);
// A new leading dimension: n arrays of shape S -> one of shape [n, S...].
StatusOr<Array> stack(std::span<const Array> parts);
// Casts every element to `dtype`.
Array cast(const Array& a, DType dtype);

// --- template definitions
// --------------------------------------------------------------------------
template <typename T>
StatusOr<Array> Array::from_vector(const std::vector<T>& values, Shape shape) {
  if (shape.size() == 1 && shape[0] == -1) shape = {static_cast<int64_t>(values.size())};
  if (shape_num_elements(shape) != static_cast<int64_t>(values.size())) {
    return invalid_argument("Array::from_vector: " + std::to_string(values.size()) +
                            " values do not fill shape " + shape_to_string(shape));
  }
  TRIBUTARY_ASSIGN_OR_RETURN(Array a, zeros(dtype_of<T>(), std::move(shape)));
  T* out = a.mutable_data<T>();
  for (size_t i = 0; i < values.size(); ++i) out[i] = values[i];
  return a;
}

template <typename T>
Array Array::scalar(T value) {
  StatusOr<Array> a = zeros(dtype_of<T>(), Shape{});
  assert(a.ok());
  *a->template mutable_data<T>() = value;
  return *a;
}

template <typename T>
std::vector<T> Array::to_vector() const {
  assert(dtype() == dtype_of<T>() && device().is_cpu());
  const T* p = data<T>();
  return std::vector<T>(p, p + num_elements());
}

}  // namespace tributary
TRIBUTARY_END_PUBLIC_API
