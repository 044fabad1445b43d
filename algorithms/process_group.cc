#include "algorithms/process_group.h"

namespace tributary::algorithms {

TransportGroup::TransportGroup(std::unique_ptr<Transport> transport, AllReduceAlgorithm algorithm,
                               size_t segment_bytes, size_t slice_bytes, std::string name)
    : transport_(std::move(transport)),
      algorithm_(algorithm),
      segment_bytes_(segment_bytes),
      slice_bytes_(slice_bytes),
      name_(std::move(name)) {}

std::string TransportGroup::describe() const {
  return name_ + " (" + std::to_string(size()) + " ranks, " +
         std::string(all_reduce_algorithm_name(algorithm_)) + " all-reduce)";
}

// After the collective: the transport may still be reading what it sent without copying
// (Transport::isend_zero_copy) until every rank has confirmed it took it.
Status TransportGroup::fenced(const GroupCall& call, Status done) {
  if (!done.ok()) return done;
  return transport_->fence(call.tag, call.deadline);
}

AlgorithmContext TransportGroup::context(const GroupCall& call) {
  return AlgorithmContext{.transport = *transport_,
                          .tag = call.tag,
                          .deadline = call.deadline,
                          .segment_bytes = segment_bytes_,
                          .scratch = &scratch_,
                          .slice_bytes = slice_bytes_};
}

Status TransportGroup::all_reduce(const GroupCall& call, void* data, int64_t count, DType dtype,
                                  ReduceOp op, int64_t mean_divisor, const void* source) {
  TRIBUTARY_RETURN_IF_ERROR(transport_->error());
  auto ctx = context(call);
  return fenced(
      call, algorithms::all_reduce(ctx, algorithm_, data, count, dtype, op, mean_divisor, source));
}

Status TransportGroup::broadcast(const GroupCall& call, void* data, size_t bytes, int root) {
  TRIBUTARY_RETURN_IF_ERROR(transport_->error());
  auto ctx = context(call);
  return fenced(call, tree_broadcast(ctx, data, bytes, root));
}

Status TransportGroup::all_gather(const GroupCall& call, void* data, size_t bytes_per_rank) {
  TRIBUTARY_RETURN_IF_ERROR(transport_->error());
  auto ctx = context(call);
  return fenced(call, ring_all_gather(ctx, data, bytes_per_rank));
}

Status TransportGroup::reduce_scatter(const GroupCall& call, void* data, void* out, int64_t count,
                                      DType dtype, ReduceOp op, int64_t mean_divisor) {
  TRIBUTARY_RETURN_IF_ERROR(transport_->error());
  auto ctx = context(call);
  return fenced(call, ring_reduce_scatter(ctx, data, out, count, dtype, op, mean_divisor));
}

}  // namespace tributary::algorithms
