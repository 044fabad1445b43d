#include "tributary/strategy/array.h"

#include <cmath>
#include <cstring>

namespace tributary {
namespace {

Status require_cpu(const Array& a, std::string_view what) {
  if (a.device().is_cpu()) return ok_status();
  return unimplemented(std::string(what) + ": needs a CPU array, got " + a.tensor().to_string() +
                       "; move it with to_device(Device::cpu())");
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

StatusOr<Array> elementwise(const Array& a, const Array& b, double sign, std::string_view what) {
  TRIBUTARY_RETURN_IF_ERROR(require_cpu(a, what));
  TRIBUTARY_RETURN_IF_ERROR(require_cpu(b, what));
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) {
    return invalid_argument(std::string(what) + ": operands differ: " + a.tensor().to_string() +
                            " and " + b.tensor().to_string());
  }
  TRIBUTARY_ASSIGN_OR_RETURN(Array out, Array::zeros(a.dtype(), a.shape()));
  const int64_t n = a.num_elements();
  for (int64_t i = 0; i < n; ++i) {
    dtype_store(a.dtype(), out.mutable_data<void>(), i, a.at(i) + sign * b.at(i));
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

Array Array::deep_copy() const {
  StatusOr<Array> a = copy_of(view_);
  assert(a.ok());
  return *a;
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

StatusOr<Array> add(const Array& a, const Array& b) { return elementwise(a, b, 1.0, "add"); }
StatusOr<Array> subtract(const Array& a, const Array& b) {
  return elementwise(a, b, -1.0, "subtract");
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

Array reduce_sum_all(const Array& a) {
  double total = 0;
  for (int64_t i = 0; i < a.num_elements(); ++i) total += a.at(i);
  double v[1] = {total};
  return *Array::from_doubles(a.dtype(), v, Shape{});
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

Array cast(const Array& a, DType dtype) {
  if (a.dtype() == dtype) return a;
  StatusOr<Array> out = Array::zeros(dtype, a.shape());
  assert(out.ok());
  for (int64_t i = 0; i < a.num_elements(); ++i) {
    dtype_store(dtype, out->mutable_data<void>(), i, a.at(i));
  }
  return *out;
}

}  // namespace tributary
