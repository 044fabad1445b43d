// Loss scaling for synchronous training, exactly as tf.nn.compute_average_loss and
// tf.nn.scale_regularization_loss define it: gradients are summed across replicas, so each
// replica's loss is divided by the global batch size (not its own).
#pragma once

#include <cstdint>
#include <optional>

#include "tributary/export.h"
#include "tributary/status.h"
#include "tributary/strategy/array.h"

TRIBUTARY_BEGIN_PUBLIC_API
namespace tributary {

// sum_i(w_i * loss_i) / global_batch_size, as a scalar of the loss's dtype. As in TF, only a given
// sample_weight goes through float32 (scale_losses_by_sample_weight casts loss and weight to
// float32, multiplies, and casts back); without one the loss keeps its dtype (float64 stays exact).
//  - per_example_loss must have rank >= 1 (TF's error otherwise);
//  - sample_weight: a scalar, the loss's shape, or [batch] broadcast over the loss's other dims;
//  - global_batch_size defaults to per_example_loss.dim0 * num_replicas_in_sync of the current
//    strategy, which needs replica context when a strategy is active (TF's error otherwise);
//    it must be >= 0, and 0 gives 0 (div_no_nan).
StatusOr<Array> compute_average_loss(const Array& per_example_loss,
                                     const std::optional<Array>& sample_weight = std::nullopt,
                                     std::optional<int64_t> global_batch_size = std::nullopt);

// sum(regularization_loss) / num_replicas_in_sync of the current strategy; replica context only
// when a strategy is active (TF's error otherwise).
StatusOr<Array> scale_regularization_loss(const Array& regularization_loss);

}  // namespace tributary
TRIBUTARY_END_PUBLIC_API
