#include "algorithms/local_collectives.h"

#include <cstring>
#include <string>
#include <vector>

#include "algorithms/device_local_collectives.h"
#include "algorithms/parallel.h"
#include "algorithms/reduce_kernels.h"

namespace tributary::algorithms {
namespace {

bool all_host(std::span<const Tensor> ts) {
  for (const Tensor& t : ts) {
    if (!t.device().is_cpu()) return false;
  }
  return true;
}

}  // namespace

Status local_reduce(ReduceOp op, std::span<const Tensor> srcs, std::span<const Tensor> dsts,
                    int64_t mean_divisor, const std::optional<Device>& on) {
  if (srcs.empty()) return invalid_argument("local_reduce needs at least one source");
  if (!all_host(srcs) || !all_host(dsts) || (on && !on->is_cpu())) {
    // TF's ReductionToOneDevice: on `on`, else on the first destination's device.
    const Device target = on ? *on : dsts.empty() ? srcs[0].device() : dsts[0].device();
    return device_local_reduce(op, srcs, dsts, mean_divisor, target);
  }
  const int64_t count = srcs[0].num_elements();
  if (count == 0 || dsts.empty()) return Status();
  // One source: a copy (or nothing, in place), unless MEAN has a division to do.
  if (srcs.size() == 1 && (op != ReduceOp::kMean || mean_divisor == 1)) {
    return local_copy(srcs[0], dsts);
  }
  // Pointer arrays live on the stack for up to kInline replicas (no allocation per call).
  constexpr size_t kInline = 16;
  const void* s_inline[kInline];
  void* d_inline[kInline];
  std::vector<const void*> s_heap;
  std::vector<void*> d_heap;
  std::span<const void*> s(s_inline, srcs.size());
  std::span<void*> d(d_inline, dsts.size());
  if (srcs.size() > kInline) {
    s_heap.resize(srcs.size());
    s = s_heap;
  }
  if (dsts.size() > kInline) {
    d_heap.resize(dsts.size());
    d = d_heap;
  }
  for (size_t i = 0; i < srcs.size(); ++i) s[i] = srcs[i].data();
  for (size_t i = 0; i < dsts.size(); ++i) d[i] = dsts[i].data();
  parallel_reduce(op, srcs[0].dtype(), std::span<const void* const>(s.data(), s.size()),
                  std::span<void* const>(d.data(), d.size()), static_cast<size_t>(count),
                  mean_divisor);
  return Status();
}

Status local_copy(const Tensor& src, std::span<const Tensor> dsts) {
  if (!src.device().is_cpu() || !all_host(dsts)) return device_local_copy(src, dsts);
  const size_t bytes = src.nbytes();
  if (bytes * dsts.size() < kParallelMinBytes) {  // on this thread, without a list
    for (const Tensor& d : dsts) {
      if (bytes != 0 && d.data() != src.data()) std::memcpy(d.data(), src.data(), bytes);
    }
    return Status();
  }
  std::vector<CopyJob> copies;
  for (const Tensor& d : dsts) {
    if (d.data() != src.data()) copies.push_back({d.data(), src.data(), bytes});
  }
  parallel_copies(copies);
  return Status();
}

Status local_all_gather(std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  if (!all_host(inputs) || !all_host(outputs)) return device_local_all_gather(inputs, outputs);
  size_t total = 0;
  for (const Tensor& out : outputs) total += out.nbytes();
  std::vector<CopyJob> copies;
  if (total >= kParallelMinBytes) copies.reserve(outputs.size() * inputs.size());
  for (const Tensor& out : outputs) {
    for (size_t j = 0; j < inputs.size(); ++j) {
      const int64_t count = inputs[j].num_elements();
      Tensor slot = out.slice(static_cast<int64_t>(j) * count, count);
      if (count != 0 && slot.data() != inputs[j].data()) {
        if (total < kParallelMinBytes) {  // on this thread, without a list
          std::memcpy(slot.data(), inputs[j].data(), inputs[j].nbytes());
        } else {
          copies.push_back({slot.data(), inputs[j].data(), inputs[j].nbytes()});
        }
      }
    }
  }
  parallel_copies(copies);
  return Status();
}

Status local_reduce_scatter(ReduceOp op, std::span<const Tensor> inputs,
                            std::span<const Tensor> outputs, int64_t mean_divisor) {
  std::vector<Tensor> slices(inputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    const int64_t count = outputs[i].num_elements();
    for (size_t j = 0; j < inputs.size(); ++j) {
      slices[j] = inputs[j].slice(static_cast<int64_t>(i) * count, count);
    }
    TRIBUTARY_RETURN_IF_ERROR(
        local_reduce(op, slices, std::span<const Tensor>(&outputs[i], 1), mean_divisor));
  }
  return Status();
}

}  // namespace tributary::algorithms
