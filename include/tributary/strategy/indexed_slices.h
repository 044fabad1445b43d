// IndexedSlices: sparse rows of a dense tensor, as TF's tf.IndexedSlices. The gradient of an
// embedding lookup (or any gather) is one: only the rows a batch touched, `values[k]` being the
// slice at row `indices[k]` of a tensor of shape `dense_shape`. Indices may repeat; a repeated
// row counts once per occurrence (to_dense() and scatter_add sum them, as TF does).
//
// Reducing IndexedSlices across replicas (ReplicaContext::all_reduce, Strategy::reduce) follows
// TF's CrossDeviceOps: the result is the concatenation of every replica's values and indices, in
// global replica order (TF's aggregate_indexed_slices_gradients and its collective all-gather; rows
// are not merged), which to_dense() or a variable's scatter_add turns into the sum. MEAN divides
// the values by num_replicas_in_sync (an integer MEAN is TF's true division: float32 for int8 and
// uint8, float64 for int32 and int64). Only SUM and MEAN (TF's "`reduce_op` must be Reduce.SUM or
// Reduce.MEAN"). Replicas may hold different numbers of rows (each worker sends only its own rows:
// a padded all-gather, as TF's newest collective path); values' dtype, indices' dtype and
// dense_shape must agree on every replica, else every replica fails with kInvalidArgument naming
// the first that differs. With one replica in sync the value comes back as it is (TF's shortcut).
//
// Where C++ differs from TF: an IndexedSlices is checked when made (make()), so a malformed one
// cannot reach a collective; dense_shape is required (TF allows it unknown). Sparse values go
// through reduce() and all_reduce() only: reduce_to, batch_reduce_to and gather take dense values
// (TF's gather refuses IndexedSlices too; convert with to_dense() first).
#pragma once

#include <string>

#include "tributary/export.h"
#include "tributary/status.h"
#include "tributary/strategy/array.h"

TRIBUTARY_BEGIN_PUBLIC_API
namespace tributary {

class IndexedSlices {
 public:
  IndexedSlices();  // no rows of an empty tensor: float32 values [0], int64 indices [0],
                    // dense_shape [0]

  // values [n, d1, ..., dk] (rank >= 1); indices int32 or int64 [n]; dense_shape [rows, d1, ...,
  // dk] with rows >= 0. Indices are not checked against `rows` here (TF checks them where they are
  // used: to_dense() and the scatter updates refuse one out of range). kInvalidArgument otherwise.
  static StatusOr<IndexedSlices> make(Array values, Array indices, Shape dense_shape);

  const Array& values() const { return values_; }
  const Array& indices() const { return indices_; }
  const Shape& dense_shape() const { return dense_shape_; }
  DType dtype() const { return values_.dtype(); }
  int64_t num_rows() const { return values_.dim0(); }  // rows held (len(indices)), not dense rows

  // The indices as int64 values, read on the host (exactly, whatever their dtype).
  StatusOr<std::vector<int64_t>> index_values() const;
  // Values and indices copied to `device` (CPU devices share storage).
  StatusOr<IndexedSlices> to_device(const Device& device) const;
  // "IndexedSlices(indices=int64[2]{0, 3}, values=float32[2,2]{...}, dense_shape=[4,2])"
  std::string to_string() const;

 private:
  IndexedSlices(Array values, Array indices, Shape dense_shape)
      : values_(std::move(values)),
        indices_(std::move(indices)),
        dense_shape_(std::move(dense_shape)) {}
  Array values_;
  Array indices_;
  Shape dense_shape_;
};

// The dense tensor (TF's convert_to_tensor of an IndexedSlices, an unsorted_segment_sum): zeros of
// dense_shape, with every slice added at its row (repeated rows sum). On the CPU. An index outside
// [0, dense_shape[0]) is kInvalidArgument with TF's wording ("indices[2] = 9 is not in [0, 4)").
StatusOr<Array> to_dense(const IndexedSlices& slices);

}  // namespace tributary
TRIBUTARY_END_PUBLIC_API
