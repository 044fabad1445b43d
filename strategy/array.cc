#include "tributary/strategy/array.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "strategy/internal.h"

namespace tributary {
namespace {

Status require_cpu(const Array& a, std::string_view what) {
  if (a.device().is_cpu()) return ok_status();
  return unimplemented(std::string(what) + ": needs a CPU array, got " + a.tensor().to_string() +
                       "; move it with to_device(Device::cpu())");
}

// For the helpers that return no Status (reduce_sum_all, reduce_mean_all, cast): a GPU array is
// copied to the host, and the result back to its device; a copy that fails (out of memory on the
// device, a CUDA error) ends the process with its error rather than reading device memory.
Array moved_or_die(StatusOr<Array> moved, std::string_view what) {
  if (!moved.ok()) {
    std::fprintf(stderr, "tributary: %.*s: %s\n", static_cast<int>(what.size()), what.data(),
                 moved.status().to_string().c_str());
    std::abort();
  }
  return std::move(*moved);
}
Array host_of(const Array& a, std::string_view what) {
  return a.device().is_cpu() ? a : moved_or_die(a.to_device(Device::cpu()), what);
}
Array back_on(const Array& out, const Device& device, std::string_view what) {
  return device.is_cpu() ? out : moved_or_die(out.to_device(device), what);
}

Status check_axis(int axis, int rank, std::string_view what) {
  if (axis >= 0 && axis < rank) return ok_status();
  return invalid_argument(std::string(what) + ": `axis` = " + std::to_string(axis) +
                          " out of range for `value` with rank " + std::to_string(rank));
}

// Splits a shape around `axis`: elements before it, its size, elements after it.
struct AxisSplit {
  int64_t outer = 1, size = 1, inner = 1;
};
AxisSplit split_at(const Shape& shape, int axis) {
  AxisSplit s;
  for (int i = 0; i < axis; ++i) s.outer *= shape[i];
  s.size = shape[axis];
  for (size_t i = axis + 1; i < shape.size(); ++i) s.inner *= shape[i];
  return s;
}

std::string dims_text(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

// TF's and NumPy's broadcasting: a (op) b over the broadcast shape of the two.
template <typename Op>
StatusOr<Array> broadcast_binary(const Array& a, const Array& b, std::string_view what, Op op) {
  TRIBUTARY_RETURN_IF_ERROR(require_cpu(a, what));
  TRIBUTARY_RETURN_IF_ERROR(require_cpu(b, what));
  if (a.dtype() != b.dtype()) {
    return invalid_argument(std::string(what) + ": operands have different dtypes, " +
                            a.tensor().to_string() + " and " + b.tensor().to_string() +
                            "; cast() one of them first");
  }
  const size_t rank = std::max(a.shape().size(), b.shape().size());
  // Both shapes padded on the left with 1s to the common rank.
  auto padded = [rank](const Shape& s) {
    Shape p(rank - s.size(), 1);
    p.insert(p.end(), s.begin(), s.end());
    return p;
  };
  const Shape pa = padded(a.shape()), pb = padded(b.shape());
  Shape out_shape(rank);
  for (size_t d = 0; d < rank; ++d) {
    if (pa[d] != pb[d] && pa[d] != 1 && pb[d] != 1) {
      return invalid_argument(std::string(what) + ": Incompatible shapes: " +
                              dims_text(a.shape()) + " vs. " + dims_text(b.shape()));
    }
    out_shape[d] = pa[d] == 1 ? pb[d] : pa[d];
  }
  TRIBUTARY_ASSIGN_OR_RETURN(Array out, Array::zeros(a.dtype(), out_shape));
  const int64_t n = out.num_elements();
  if (n == 0) return out;
  // Strides of each operand over the output's index space (0 where it broadcasts).
  std::vector<int64_t> sa(rank, 0), sb(rank, 0);
  for (int64_t d = static_cast<int64_t>(rank) - 1, ea = 1, eb = 1; d >= 0; --d) {
    if (pa[d] != 1) sa[d] = ea;
    if (pb[d] != 1) sb[d] = eb;
    ea *= pa[d];
    eb *= pb[d];
  }
  std::vector<int64_t> index(rank, 0);
  int64_t ia = 0, ib = 0;
  const bool integral = !dtype_is_floating(a.dtype());
  const DType dtype = a.dtype();
  for (int64_t i = 0; i < n; ++i) {
    // Integers exactly in int64 (wrapping as TF's kernels), floats in double.
    if (integral) {
      using strategy_internal::load_integer;
      const StatusOr<int64_t> v =
          op(load_integer(dtype, a.data<void>(), ia), load_integer(dtype, b.data<void>(), ib));
      if (!v.ok()) return v.status();
      strategy_internal::store_integer(dtype, out.mutable_data<void>(), i, *v);
    } else {
      const StatusOr<double> v = op(a.at(ia), b.at(ib));
      if (!v.ok()) return v.status();
      dtype_store(dtype, out.mutable_data<void>(), i, *v);
    }
    // Advance the multi-index (last dimension fastest) and both operands' offsets.
    for (int64_t d = static_cast<int64_t>(rank) - 1; d >= 0; --d) {
      ia += sa[d];
      ib += sb[d];
      if (++index[d] < out_shape[d]) break;
      ia -= sa[d] * out_shape[d];
      ib -= sb[d] * out_shape[d];
      index[d] = 0;
    }
  }
  return out;
}

template <typename Op>
StatusOr<Array> unary(const Array& a, std::string_view what, bool floating_only, Op op) {
  TRIBUTARY_RETURN_IF_ERROR(require_cpu(a, what));
  if (floating_only && !dtype_is_floating(a.dtype())) {
    return invalid_argument(std::string(what) + ": needs a floating dtype, got " +
                            a.tensor().to_string() + "; cast() it first");
  }
  TRIBUTARY_ASSIGN_OR_RETURN(Array out, Array::zeros(a.dtype(), a.shape()));
  for (int64_t i = 0; i < a.num_elements(); ++i) {
    dtype_store(a.dtype(), out.mutable_data<void>(), i, op(a.at(i)));
  }
  return out;
}

}  // namespace

Array::Array() : Array(*zeros(DType::kFloat32, Shape{0})) {}

Array::Array(std::shared_ptr<Buffer> storage, Tensor view)
    : storage_(std::move(storage)), view_(std::move(view)) {}

StatusOr<Array> Array::zeros(DType dtype, Shape shape, Device device) {
  TRIBUTARY_ASSIGN_OR_RETURN(Buffer buffer, Buffer::allocate(dtype, std::move(shape), device));
  if (buffer.nbytes() > 0) {
    if (device.is_cpu()) {
      std::memset(buffer.data(), 0, buffer.nbytes());
    } else {
      std::vector<unsigned char> zero(buffer.nbytes(), 0);
      TRIBUTARY_ASSIGN_OR_RETURN(Allocator * alloc, allocator_for(device));
      TRIBUTARY_RETURN_IF_ERROR(
          alloc->copy(buffer.data(), device, zero.data(), Device::cpu(), buffer.nbytes()));
    }
  }
  auto storage = std::make_shared<Buffer>(std::move(buffer));
  Tensor view = storage->tensor();
  return Array(std::move(storage), std::move(view));
}

StatusOr<Array> Array::copy_of(const Tensor& tensor) {
  TRIBUTARY_ASSIGN_OR_RETURN(Array a, zeros(tensor.dtype(), tensor.shape(), tensor.device()));
  if (a.nbytes() == 0) return a;
  if (tensor.device().is_cpu()) {
    std::memcpy(a.view_.data(), tensor.data(), a.nbytes());
    return a;
  }
  TRIBUTARY_ASSIGN_OR_RETURN(Allocator * alloc, allocator_for(tensor.device()));
  TRIBUTARY_RETURN_IF_ERROR(
      alloc->copy(a.view_.data(), a.device(), tensor.data(), tensor.device(), a.nbytes()));
  return a;
}

StatusOr<Array> Array::from_doubles(DType dtype, std::span<const double> values, Shape shape) {
  if (shape_num_elements(shape) != static_cast<int64_t>(values.size())) {
    return invalid_argument("Array::from_doubles: " + std::to_string(values.size()) +
                            " values do not fill shape " + shape_to_string(shape));
  }
  TRIBUTARY_ASSIGN_OR_RETURN(Array a, zeros(dtype, std::move(shape)));
  for (size_t i = 0; i < values.size(); ++i) {
    dtype_store(dtype, a.view_.data(), static_cast<int64_t>(i), values[i]);
  }
  return a;
}

double Array::at(int64_t i) const {
  assert(device().is_cpu() && i >= 0 && i < num_elements());
  return dtype_load(dtype(), view_.data(), i);
}

std::vector<double> Array::to_doubles() const {
  assert(device().is_cpu());
  std::vector<double> out(static_cast<size_t>(num_elements()));
  for (int64_t i = 0; i < num_elements(); ++i) out[i] = at(i);
  return out;
}

StatusOr<Array> Array::to_device(const Device& device) const {
  if (device == this->device()) return *this;
  if (device.is_cpu() && this->device().is_cpu()) {
    // CPU "devices" are replicas of one address space: relabel, do not copy.
    return Array(storage_, Tensor(view_.data(), dtype(), shape(), device));
  }
  TRIBUTARY_ASSIGN_OR_RETURN(Array a, zeros(dtype(), shape(), device));
  if (nbytes() == 0) return a;
  const Device& other = device.is_cpu() ? this->device() : device;
  TRIBUTARY_ASSIGN_OR_RETURN(Allocator * alloc, allocator_for(other));
  TRIBUTARY_RETURN_IF_ERROR(
      alloc->copy(a.view_.data(), device, view_.data(), this->device(), nbytes()));
  return a;
}

StatusOr<Array> Array::reshape(Shape shape) const {
  TRIBUTARY_ASSIGN_OR_RETURN(Tensor t, view_.reshaped(std::move(shape)));
  return Array(storage_, std::move(t));
}

StatusOr<Array> Array::rows(int64_t begin, int64_t end) const {
  if (rank() == 0) return invalid_argument("Array::rows: a scalar has no rows");
  if (begin < 0 || end < begin || end > shape()[0]) {
    return invalid_argument("Array::rows: [" + std::to_string(begin) + ", " + std::to_string(end) +
                            ") is outside dimension 0 of " + view_.to_string());
  }
  const int64_t row = shape()[0] == 0 ? 0 : num_elements() / shape()[0];
  Shape s = shape();
  s[0] = end - begin;
  auto* base = static_cast<unsigned char*>(view_.data());
  Tensor t(base + begin * row * static_cast<int64_t>(dtype_size(dtype())), dtype(), std::move(s),
           device());
  return Array(storage_, std::move(t));
}

bool Array::equals(const Array& other) const {
  if (dtype() != other.dtype() || shape() != other.shape()) return false;
  if (!device().is_cpu() || !other.device().is_cpu()) return false;
  return nbytes() == 0 || std::memcmp(view_.data(), other.view_.data(), nbytes()) == 0;
}

std::string Array::to_string(int64_t max_elements) const {
  std::string s = std::string(dtype_name(dtype())) + shape_to_string(shape());
  if (!device().is_cpu()) return s + "@" + device().to_string();
  s += "{";
  const int64_t n = num_elements();
  for (int64_t i = 0; i < n && i < max_elements; ++i) {
    if (i) s += ", ";
    double v = at(i);
    if (dtype_is_floating(dtype())) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g", v);
      s += buf;
    } else {
      s += std::to_string(static_cast<int64_t>(v));
    }
  }
  if (n > max_elements) s += ", ...";
  return s + "}";
}

// The element operations take (double, double) for floating dtypes and (int64_t, int64_t) for
// integer ones, returning the same type or a Status.
StatusOr<Array> add(const Array& a, const Array& b) {
  return broadcast_binary(a, b, "add", [](auto x, auto y) -> decltype(x) {
    if constexpr (std::is_integral_v<decltype(x)>) return strategy_internal::wrapping_add(x, y);
    return x + y;
  });
}
StatusOr<Array> subtract(const Array& a, const Array& b) {
  return broadcast_binary(a, b, "subtract", [](auto x, auto y) -> decltype(x) {
    if constexpr (std::is_integral_v<decltype(x)>) return strategy_internal::wrapping_sub(x, y);
    return x - y;
  });
}
StatusOr<Array> multiply(const Array& a, const Array& b) {
  return broadcast_binary(a, b, "multiply", [](auto x, auto y) -> decltype(x) {
    if constexpr (std::is_integral_v<decltype(x)>) return strategy_internal::wrapping_mul(x, y);
    return x * y;
  });
}
StatusOr<Array> divide(const Array& a, const Array& b) {
  return broadcast_binary(a, b, "divide", [](auto x, auto y) -> StatusOr<decltype(x)> {
    if constexpr (std::is_integral_v<decltype(x)>) {
      if (y == 0) return invalid_argument("divide: Integer division by zero");
      return strategy_internal::truncating_div(x, y);
    }
    return x / y;
  });
}
StatusOr<Array> maximum(const Array& a, const Array& b) {
  return broadcast_binary(a, b, "maximum", [](auto x, auto y) -> decltype(x) {
    if constexpr (std::is_integral_v<decltype(x)>) return std::max(x, y);
    return std::isnan(x) || x > y ? x : y;
  });
}
StatusOr<Array> minimum(const Array& a, const Array& b) {
  return broadcast_binary(a, b, "minimum", [](auto x, auto y) -> decltype(x) {
    if constexpr (std::is_integral_v<decltype(x)>) return std::min(x, y);
    return std::isnan(x) || x < y ? x : y;
  });
}
StatusOr<Array> squared_difference(const Array& a, const Array& b) {
  return broadcast_binary(a, b, "squared_difference", [](auto x, auto y) -> decltype(x) {
    if constexpr (std::is_integral_v<decltype(x)>) {
      const int64_t d = strategy_internal::wrapping_sub(x, y);
      return strategy_internal::wrapping_mul(d, d);
    }
    return (x - y) * (x - y);
  });
}

StatusOr<Array> negative(const Array& a) {
  return unary(a, "negative", false, [](double x) { return -x; });
}
StatusOr<Array> abs(const Array& a) {
  return unary(a, "abs", false, [](double x) { return std::fabs(x); });
}
StatusOr<Array> square(const Array& a) {
  return unary(a, "square", false, [](double x) { return x * x; });
}
StatusOr<Array> sqrt(const Array& a) {
  return unary(a, "sqrt", true, [](double x) { return std::sqrt(x); });
}
StatusOr<Array> exp(const Array& a) {
  return unary(a, "exp", true, [](double x) { return std::exp(x); });
}
StatusOr<Array> log(const Array& a) {
  return unary(a, "log", true, [](double x) { return std::log(x); });
}
StatusOr<Array> sigmoid(const Array& a) {
  return unary(a, "sigmoid", true, [](double x) { return 1.0 / (1.0 + std::exp(-x)); });
}

StatusOr<Array> matmul(const Array& a, const Array& b, bool transpose_a, bool transpose_b) {
  TRIBUTARY_RETURN_IF_ERROR(require_cpu(a, "matmul"));
  TRIBUTARY_RETURN_IF_ERROR(require_cpu(b, "matmul"));
  if (a.rank() != 2 || b.rank() != 2 || a.dtype() != b.dtype()) {
    return invalid_argument("matmul: needs two rank-2 arrays of one dtype, got " +
                            a.tensor().to_string() + " and " + b.tensor().to_string());
  }
  const int64_t m = a.shape()[transpose_a ? 1 : 0], k = a.shape()[transpose_a ? 0 : 1];
  const int64_t kb = b.shape()[transpose_b ? 1 : 0], n = b.shape()[transpose_b ? 0 : 1];
  if (k != kb) {
    return invalid_argument("matmul: Matrix size-incompatible: In[0]: " + dims_text(a.shape()) +
                            ", In[1]: " + dims_text(b.shape()) +
                            (transpose_a || transpose_b ? " (after transposing)" : ""));
  }
  const std::vector<double> x = a.to_doubles(), y = b.to_doubles();
  auto xa = [&](int64_t i, int64_t j) { return transpose_a ? x[j * m + i] : x[i * k + j]; };
  auto yb = [&](int64_t i, int64_t j) { return transpose_b ? y[j * k + i] : y[i * n + j]; };
  std::vector<double> out(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p) {
      const double v = xa(i, p);
      for (int64_t j = 0; j < n; ++j) out[i * n + j] += v * yb(p, j);
    }
  return Array::from_doubles(a.dtype(), out, Shape{m, n});
}

StatusOr<Array> reduce_mean(const Array& a, int axis) {
  TRIBUTARY_ASSIGN_OR_RETURN(Array sum, reduce_sum(a, axis));
  const double count = static_cast<double>(a.shape()[axis]);
  return unary(sum, "reduce_mean", false, [count](double x) { return x / count; });
}

Array reduce_mean_all(const Array& in) {
  const Array a = host_of(in, "reduce_mean_all");
  double total = 0;
  for (int64_t i = 0; i < a.num_elements(); ++i) total += a.at(i);
  double v[1] = {total / static_cast<double>(a.num_elements())};
  return back_on(*Array::from_doubles(a.dtype(), v, Shape{}), in.device(), "reduce_mean_all");
}

StatusOr<Array> scale(const Array& a, double factor) {
  TRIBUTARY_RETURN_IF_ERROR(require_cpu(a, "scale"));
  TRIBUTARY_ASSIGN_OR_RETURN(Array out, Array::zeros(a.dtype(), a.shape()));
  for (int64_t i = 0; i < a.num_elements(); ++i) {
    double v = a.at(i) * factor;
    if (!dtype_is_floating(a.dtype())) v = std::trunc(v);
    dtype_store(a.dtype(), out.mutable_data<void>(), i, v);
  }
  return out;
}

StatusOr<Array> reduce_sum(const Array& a, int axis) {
  TRIBUTARY_RETURN_IF_ERROR(require_cpu(a, "reduce_sum"));
  TRIBUTARY_RETURN_IF_ERROR(check_axis(axis, a.rank(), "reduce_sum"));
  AxisSplit s = split_at(a.shape(), axis);
  Shape out_shape = a.shape();
  out_shape.erase(out_shape.begin() + axis);
  std::vector<double> acc(static_cast<size_t>(s.outer * s.inner), 0.0);
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t k = 0; k < s.size; ++k)
      for (int64_t i = 0; i < s.inner; ++i)
        acc[o * s.inner + i] += a.at((o * s.size + k) * s.inner + i);
  return Array::from_doubles(a.dtype(), acc, std::move(out_shape));
}

Array reduce_sum_all(const Array& in) {
  const Array a = host_of(in, "reduce_sum_all");
  double total = 0;
  for (int64_t i = 0; i < a.num_elements(); ++i) total += a.at(i);
  double v[1] = {total};
  return back_on(*Array::from_doubles(a.dtype(), v, Shape{}), in.device(), "reduce_sum_all");
}

StatusOr<Array> concat(std::span<const Array> parts, int axis) {
  if (parts.empty()) return invalid_argument("concat: no arrays to concatenate");
  const Array& first = parts[0];
  TRIBUTARY_RETURN_IF_ERROR(check_axis(axis, first.rank(), "concat"));
  Shape out_shape = first.shape();
  out_shape[axis] = 0;
  for (size_t p = 0; p < parts.size(); ++p) {
    const Array& a = parts[p];
    TRIBUTARY_RETURN_IF_ERROR(require_cpu(a, "concat"));
    bool compatible = a.dtype() == first.dtype() && a.rank() == first.rank();
    for (int d = 0; compatible && d < a.rank(); ++d) {
      if (d != axis && a.shape()[d] != first.shape()[d]) compatible = false;
    }
    if (!compatible) {
      return invalid_argument("concat: part " + std::to_string(p) + " " + a.tensor().to_string() +
                              " does not match part 0 " + first.tensor().to_string() +
                              " outside axis " + std::to_string(axis));
    }
    out_shape[axis] += a.shape()[axis];
  }
  TRIBUTARY_ASSIGN_OR_RETURN(Array out, Array::zeros(first.dtype(), out_shape));
  const size_t elem = dtype_size(first.dtype());
  AxisSplit o = split_at(out_shape, axis);
  auto* dst = out.mutable_data<unsigned char>();
  int64_t offset = 0;  // along axis
  for (const Array& a : parts) {
    AxisSplit s = split_at(a.shape(), axis);
    const auto* src = a.data<unsigned char>();
    const size_t block = static_cast<size_t>(s.size * s.inner) * elem;
    for (int64_t r = 0; r < s.outer && block > 0; ++r) {
      std::memcpy(dst + ((r * o.size + offset) * o.inner) * elem, src + r * block, block);
    }
    offset += s.size;
  }
  return out;
}

StatusOr<Array> stack(std::span<const Array> parts) {
  if (parts.empty()) return invalid_argument("stack: no arrays to stack");
  std::vector<Array> expanded;
  expanded.reserve(parts.size());
  for (const Array& a : parts) {
    Shape s = a.shape();
    s.insert(s.begin(), 1);
    TRIBUTARY_ASSIGN_OR_RETURN(Array r, a.reshape(std::move(s)));
    expanded.push_back(std::move(r));
  }
  return concat(expanded, 0);
}

Array cast(const Array& in, DType dtype) {
  if (in.dtype() == dtype) return in;
  const Array a = host_of(in, "cast");
  Array out = moved_or_die(Array::zeros(dtype, a.shape()), "cast");
  for (int64_t i = 0; i < a.num_elements(); ++i) {
    dtype_store(dtype, out.mutable_data<void>(), i, a.at(i));
  }
  return back_on(out, in.device(), "cast");
}

}  // namespace tributary
