// IndexedSlices: construction checks and the dense form (TF's indexed_slices.py and
// convert_to_tensor's unsorted_segment_sum).
#include "tributary/strategy/indexed_slices.h"

#include <cstring>

#include "fmt/format.h"

namespace tributary {

IndexedSlices::IndexedSlices()
    : values_(*Array::zeros(DType::kFloat32, Shape{0})),
      indices_(*Array::zeros(DType::kInt64, Shape{0})),
      dense_shape_{0} {}

StatusOr<IndexedSlices> IndexedSlices::make(Array values, Array indices, Shape dense_shape) {
  if (values.rank() < 1) {
    return invalid_argument(
        fmt::format("IndexedSlices: values must have rank >= 1 (one slice per index), got {}",
                    values.tensor().to_string()));
  }
  if (indices.dtype() != DType::kInt32 && indices.dtype() != DType::kInt64) {
    return invalid_argument(fmt::format("IndexedSlices: indices must be int32 or int64, got {}",
                                        indices.tensor().to_string()));
  }
  if (indices.rank() != 1 || indices.shape()[0] != values.shape()[0]) {
    return invalid_argument(fmt::format(
        "IndexedSlices: indices must be a vector with one entry per row of values; indices are "
        "{}, values {}",
        indices.tensor().to_string(), values.tensor().to_string()));
  }
  if (dense_shape.size() != values.shape().size() || dense_shape[0] < 0 ||
      !std::equal(dense_shape.begin() + 1, dense_shape.end(), values.shape().begin() + 1)) {
    return invalid_argument(fmt::format(
        "IndexedSlices: dense_shape {} does not fit values {}: it must be [rows >= 0] followed by "
        "the shape of one slice ({})",
        shape_to_string(dense_shape), values.tensor().to_string(),
        shape_to_string(Shape(values.shape().begin() + 1, values.shape().end()))));
  }
  return IndexedSlices(std::move(values), std::move(indices), std::move(dense_shape));
}

StatusOr<IndexedSlices> IndexedSlices::to_device(const Device& device) const {
  TRIBUTARY_ASSIGN_OR_RETURN(Array v, values_.to_device(device));
  TRIBUTARY_ASSIGN_OR_RETURN(Array i, indices_.to_device(device));
  return IndexedSlices(std::move(v), std::move(i), dense_shape_);
}

StatusOr<std::vector<int64_t>> IndexedSlices::index_values() const {
  TRIBUTARY_ASSIGN_OR_RETURN(Array host, indices_.to_device(Device::cpu()));
  if (host.dtype() == DType::kInt64) return host.to_vector<int64_t>();
  const std::vector<int32_t> narrow = host.to_vector<int32_t>();
  return std::vector<int64_t>(narrow.begin(), narrow.end());
}

std::string IndexedSlices::to_string() const {
  return fmt::format("IndexedSlices(indices={}, values={}, dense_shape={})", indices_.to_string(),
                     values_.to_string(), shape_to_string(dense_shape_));
}

StatusOr<Array> to_dense(const IndexedSlices& slices) {
  TRIBUTARY_ASSIGN_OR_RETURN(Array values, slices.values().to_device(Device::cpu()));
  TRIBUTARY_ASSIGN_OR_RETURN(std::vector<int64_t> indices, slices.index_values());
  const int64_t rows = slices.dense_shape()[0];
  const int64_t n = values.dim0();
  const int64_t row_elems = n == 0 ? 0 : values.num_elements() / n;
  std::vector<double> sum(static_cast<size_t>(shape_num_elements(slices.dense_shape())), 0.0);
  for (int64_t k = 0; k < n; ++k) {
    const int64_t row = indices[static_cast<size_t>(k)];
    if (row < 0 || row >= rows) {
      return invalid_argument(fmt::format("indices[{}] = {} is not in [0, {})", k, row, rows));
    }
    for (int64_t e = 0; e < row_elems; ++e) {
      sum[static_cast<size_t>(row * row_elems + e)] += values.at(k * row_elems + e);
    }
  }
  return Array::from_doubles(values.dtype(), sum, slices.dense_shape());
}

}  // namespace tributary
