// Distributed values, as in tf.distribute: PerReplica<T> holds one (possibly different) value per
// local replica; Mirrored<T> holds one value per device that are meant to be identical.
//
// In TF these are Python objects wrapping tensors. Here they are small templates over any T
// (usually Tensor). A one-component value is still a PerReplica/Mirrored: C++ has no "unwrap when
// there is one element" rule, so callers read values()[0] explicitly.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <utility>
#include <vector>

#include "tributary/export.h"

TRIBUTARY_BEGIN_PUBLIC_API
namespace tributary {

template <typename T>
class DistributedValues {
 public:
  DistributedValues() = default;
  explicit DistributedValues(std::vector<T> values) : values_(std::move(values)) {}
  DistributedValues(std::initializer_list<T> values) : values_(values) {}

  const std::vector<T>& values() const { return values_; }
  std::vector<T>& values() { return values_; }
  size_t size() const { return values_.size(); }
  bool empty() const { return values_.empty(); }
  const T& operator[](size_t i) const { return values_[i]; }
  T& operator[](size_t i) { return values_[i]; }
  auto begin() const { return values_.begin(); }
  auto end() const { return values_.end(); }

 private:
  std::vector<T> values_;
};

// One value per local replica, in replica order.
template <typename T>
class PerReplica : public DistributedValues<T> {
 public:
  using DistributedValues<T>::DistributedValues;
};

// One value per device, all holding the same contents.
template <typename T>
class Mirrored : public DistributedValues<T> {
 public:
  using DistributedValues<T>::DistributedValues;
};

}  // namespace tributary
TRIBUTARY_END_PUBLIC_API
