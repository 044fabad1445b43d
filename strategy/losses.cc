// tf.nn.compute_average_loss / scale_regularization_loss (nn_impl_distribute.py).
#include "tributary/strategy/losses.h"

#include "fmt/format.h"
#include "tributary/strategy/strategy.h"

namespace tributary {
namespace {

// Weight for element i of a loss of shape `loss_shape`.
StatusOr<std::vector<double>> broadcast_weights(const Array& loss, const Array& w) {
  const int64_t n = loss.num_elements();
  std::vector<double> out(static_cast<size_t>(n));
  if (w.num_elements() == 1) {
    std::fill(out.begin(), out.end(), w.at(0));
    return out;
  }
  if (w.num_elements() == n) {
    for (int64_t i = 0; i < n; ++i) out[i] = w.at(i);
    return out;
  }
  if (w.rank() == 1 && loss.rank() >= 1 && w.shape()[0] == loss.shape()[0]) {
    const int64_t per_row = loss.shape()[0] == 0 ? 0 : n / loss.shape()[0];
    for (int64_t i = 0; i < n; ++i) out[i] = w.at(i / per_row);
    return out;
  }
  return invalid_argument(fmt::format(
      "sample_weight {} cannot be broadcast to per_example_loss {}; pass a scalar, the loss's "
      "shape, or one weight per example",
      w.tensor().to_string(), loss.tensor().to_string()));
}

Status require_replica_context(std::string_view function) {
  if (has_strategy() && in_cross_replica_context()) {
    return failed_precondition(fmt::format(
        "You are calling `{}` in cross replica context, while it was expected to be called in "
        "replica context.",
        function));
  }
  return ok_status();
}

}  // namespace

StatusOr<Array> compute_average_loss(const Array& per_example_loss,
                                     const std::optional<Array>& sample_weight,
                                     std::optional<int64_t> global_batch_size) {
  const Array& loss = per_example_loss;
  if (loss.rank() == 0) {
    return invalid_argument(fmt::format(
        "Invalid value passed for `per_example_loss`. Expected a tensor with at least rank 1. "
        "Received per_example_loss={} with rank 0",
        loss.to_string()));
  }
  if (!loss.device().is_cpu()) return unimplemented("compute_average_loss needs a CPU loss");
  std::vector<double> weights;
  if (sample_weight) {
    // Weights from a distributed dataset may be on the replica's GPU.
    TRIBUTARY_ASSIGN_OR_RETURN(const Array w, sample_weight->to_device(Device::cpu()));
    TRIBUTARY_ASSIGN_OR_RETURN(weights, broadcast_weights(loss, w));
  }
  if (!global_batch_size) {
    TRIBUTARY_RETURN_IF_ERROR(require_replica_context("compute_average_loss"));
    global_batch_size = loss.shape()[0] * get_strategy().num_replicas_in_sync();
  }
  if (*global_batch_size < 0) return invalid_argument("global_batch_size must be non-negative.");
  double sum = 0;
  for (int64_t i = 0; i < loss.num_elements(); ++i) {
    if (sample_weight) {
      // TF's scale_losses_by_sample_weight multiplies in float32, then casts back to the loss's
      // dtype.
      sum += dtype_round(loss.dtype(),
                         static_cast<float>(loss.at(i)) * static_cast<float>(weights[i]));
    } else {
      sum += loss.at(i);  // no weight: no float32 round trip, the loss keeps its precision
    }
  }
  const double value =
      *global_batch_size == 0 ? 0.0 : sum / static_cast<double>(*global_batch_size);
  double v[1] = {value};
  return Array::from_doubles(loss.dtype(), v, Shape{});
}

StatusOr<Array> scale_regularization_loss(const Array& regularization_loss) {
  TRIBUTARY_RETURN_IF_ERROR(require_replica_context("scale_regularization_loss"));
  if (!regularization_loss.device().is_cpu()) {
    return unimplemented("scale_regularization_loss needs a CPU value");
  }
  double sum = 0;
  for (int64_t i = 0; i < regularization_loss.num_elements(); ++i) sum += regularization_loss.at(i);
  double v[1] = {sum / get_strategy().num_replicas_in_sync()};
  return Array::from_doubles(regularization_loss.dtype(), v, Shape{});
}

}  // namespace tributary
