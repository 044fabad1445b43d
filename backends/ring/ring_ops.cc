#include "backends/ring/ring_ops.h"

#include <cstring>
#include <map>
#include <string>

#include "algorithms/local_collectives.h"
#include "algorithms/packing.h"

namespace tributary::backends {
namespace {

using algorithms::AllReduceAlgorithm;

ReduceOp partial_op(ReduceOp op) { return op == ReduceOp::kMean ? ReduceOp::kSum : op; }

AllReduceAlgorithm parse_algorithm(const std::string& name) {
  if (name == "ring") return AllReduceAlgorithm::kRing;
  if (name == "halving_doubling") return AllReduceAlgorithm::kHalvingDoubling;
  return AllReduceAlgorithm::kAuto;
}

}  // namespace

RingOps::RingOps(BackendContext context, Options options, Capabilities caps,
                 std::unique_ptr<algorithms::Transport> transport)
    : CrossDeviceOps("ring", std::move(context), std::move(options), std::move(caps)),
      transport_(std::move(transport)) {
  algorithm_ = parse_algorithm(this->options().get_string("algorithm"));
  segment_bytes_ = this->options().get_size("segment_bytes");
  bytes_per_pack_ = this->options().get_size("bytes_per_pack");
}

algorithms::AlgorithmContext RingOps::algorithm_context(const CallInfo& call) {
  // Saturate: a huge timeout must not overflow the clock.
  const auto timeout =
      std::min<std::chrono::nanoseconds>(call.timeout, std::chrono::hours(24 * 365));
  return algorithms::AlgorithmContext{*transport_, algorithms::MessageTag::of(call),
                                      std::chrono::steady_clock::now() + timeout, segment_bytes_,
                                      &scratch_};
}

void RingOps::abandon(const Status& why) {
  transport_->abort(
      aborted("rank " + std::to_string(rank()) + " refused its part: " + why.message()));
}

std::byte* RingOps::staging(size_t bytes) {
  if (staging_.size() < bytes) staging_.resize(bytes);
  return staging_.data();
}

Work RingOps::finish(Status s) {
  if (!s.ok() && transport_->error().ok()) {
    // A local failure (not the transport's): peers may be waiting for us, so fail them fast.
    transport_->abort(s);
  }
  return Work::completed(std::move(s));
}

Status RingOps::reduce_everywhere(const CallInfo& call, ReduceOp op, std::span<const Tensor> inputs,
                                  const Tensor& result) {
  TRIBUTARY_RETURN_IF_ERROR(transport_->error());
  const int64_t n = num_replicas_in_sync();
  const bool across = world_size() > 1;
  // One local replica out of place: the ring reads the input itself, no copy up front.
  const void* source = nullptr;
  if (across && inputs.size() == 1 && inputs[0].data() != result.data()) {
    source = inputs[0].data();
  } else {
    // Local stage: the full op (and MEAN's division) only when there is nothing else to do.
    TRIBUTARY_RETURN_IF_ERROR(algorithms::local_reduce(across ? partial_op(op) : op, inputs,
                                                       std::span<const Tensor>(&result, 1), n));
  }
  if (!across) return Status();
  auto ctx = algorithm_context(call);
  return algorithms::all_reduce(ctx, algorithm_, result.data(), result.num_elements(),
                                result.dtype(), op, n, source);
}

Work RingOps::all_reduce_impl(const CallInfo& call, ReduceOp op, const PerReplica<Tensor>& inputs,
                              const PerReplica<Tensor>& outputs) {
  Status s = reduce_everywhere(call, op, inputs.values(), outputs[0]);
  if (s.ok() && outputs.size() > 1) {
    s = algorithms::local_copy(outputs[0], std::span<const Tensor>(outputs.values()).subspan(1));
  }
  return finish(std::move(s));
}

Work RingOps::reduce_impl(const CallInfo& call, ReduceOp op, const PerReplica<Tensor>& value,
                          const Mirrored<Tensor>& destinations) {
  // As TF's CollectiveAllReduce: all-reduce, then place the result on every destination.
  Status s = reduce_everywhere(call, op, value.values(), destinations[0]);
  if (s.ok() && destinations.size() > 1) {
    s = algorithms::local_copy(destinations[0],
                               std::span<const Tensor>(destinations.values()).subspan(1));
  }
  return finish(std::move(s));
}

Work RingOps::batch_reduce_impl(const CallInfo& call, ReduceOp op,
                                std::span<const ReducePair> pairs) {
  // Pack by dtype (concatenation needs one element type) and by TF's bytes_per_pack rule, then one
  // inter-process all-reduce per pack; every rank packs the same way, so the packs match.
  std::map<DType, std::vector<size_t>> by_dtype;
  for (size_t i = 0; i < pairs.size(); ++i) by_dtype[pairs[i].value[0].dtype()].push_back(i);
  const size_t replicas = devices().size();
  for (const auto& [dtype, members] : by_dtype) {
    std::vector<uint64_t> sizes;
    for (size_t i : members) sizes.push_back(pairs[i].value[0].nbytes());
    for (const std::vector<size_t>& group : algorithms::group_by_size(sizes, bytes_per_pack_)) {
      int64_t total = 0;
      for (size_t g : group) total += pairs[members[g]].value[0].num_elements();
      if (total == 0) continue;
      const size_t bytes = static_cast<size_t>(total) * dtype_size(dtype);
      // Pack every replica's tensors, reduce them locally into the staging buffer.
      std::vector<Buffer> packed(replicas);
      std::vector<Tensor> views(replicas);
      for (size_t r = 0; r < replicas; ++r) {
        auto b = Buffer::allocate(dtype, Shape{total}, devices()[r]);
        if (!b.ok()) return finish(b.status());
        packed[r] = std::move(b).value();
        views[r] = packed[r].tensor();
        std::vector<Tensor> parts;
        for (size_t g : group) parts.push_back(pairs[members[g]].value[r]);
        algorithms::pack(parts, packed[r].data());
      }
      Tensor result(staging(bytes), dtype, Shape{total}, devices()[0]);
      CallInfo pack_call = call;
      pack_call.collective = Collective::kBatchReduce;
      pack_call.dtype = dtype;
      pack_call.count = total;
      Status s = reduce_everywhere(pack_call, op, views, result);
      if (!s.ok()) return finish(std::move(s));
      // Unpack into every destination of every pair of the group.
      size_t offset = 0;
      for (size_t g : group) {
        const ReducePair& p = pairs[members[g]];
        const size_t nbytes = p.value[0].nbytes();
        for (const Tensor& d : p.destinations) {
          if (nbytes)
            std::memcpy(d.data(), static_cast<std::byte*>(result.data()) + offset, nbytes);
        }
        offset += nbytes;
      }
    }
  }
  return finish(Status());
}

Work RingOps::broadcast_impl(const CallInfo& call, const Tensor& source,
                             const Mirrored<Tensor>& destinations, int root) {
  Status s = transport_->error();
  const Tensor& first = destinations[0];
  if (s.ok() && rank() == root)
    s = algorithms::local_copy(source, std::span<const Tensor>(&first, 1));
  if (s.ok() && world_size() > 1) {
    auto ctx = algorithm_context(call);
    s = algorithms::tree_broadcast(ctx, first.data(), first.nbytes(), root);
  }
  if (s.ok() && destinations.size() > 1) {
    s = algorithms::local_copy(first, std::span<const Tensor>(destinations.values()).subspan(1));
  }
  return finish(std::move(s));
}

Work RingOps::all_gather_impl(const CallInfo& call, const PerReplica<Tensor>& inputs,
                              const PerReplica<Tensor>& outputs) {
  Status s = transport_->error();
  const int64_t count = inputs[0].num_elements();
  const int64_t local = num_local_replicas();
  const Tensor& first = outputs[0];
  // This process's replicas fill their blocks of outputs[0]; the ring fills the rest.
  for (int64_t i = 0; s.ok() && i < local; ++i) {
    Tensor slot = first.slice((rank() * local + i) * count, count);
    s = algorithms::local_copy(inputs[static_cast<size_t>(i)], std::span<const Tensor>(&slot, 1));
  }
  if (s.ok() && world_size() > 1) {
    auto ctx = algorithm_context(call);
    s = algorithms::ring_all_gather(ctx, first.data(),
                                    static_cast<size_t>(local * count) * dtype_size(first.dtype()));
  }
  if (s.ok() && outputs.size() > 1) {
    s = algorithms::local_copy(first, std::span<const Tensor>(outputs.values()).subspan(1));
  }
  return finish(std::move(s));
}

Work RingOps::reduce_scatter_impl(const CallInfo& call, ReduceOp op,
                                  const PerReplica<Tensor>& inputs,
                                  const PerReplica<Tensor>& outputs) {
  Status s = transport_->error();
  const DType dtype = inputs[0].dtype();
  const int64_t count = outputs[0].num_elements();
  const int64_t local = num_local_replicas();
  const int64_t total = inputs[0].num_elements();
  const int64_t n = num_replicas_in_sync();
  const size_t elem = dtype_size(dtype);
  const bool across = world_size() > 1;
  // Reduce the local replicas' inputs into one buffer, then reduce-scatter blocks of `local`
  // outputs across processes; this process's block lands after the full buffer in staging.
  std::byte* buf = staging(static_cast<size_t>(total + local * count) * elem);
  Tensor full(buf, dtype, Shape{total}, devices()[0]);
  Tensor mine(buf + static_cast<size_t>(total) * elem, dtype, Shape{local * count}, devices()[0]);
  if (s.ok()) {
    s = algorithms::local_reduce(across ? partial_op(op) : op, inputs.values(),
                                 std::span<const Tensor>(&full, 1), n);
  }
  if (s.ok()) {
    if (across) {
      auto ctx = algorithm_context(call);
      s = algorithms::ring_reduce_scatter(ctx, full.data(), mine.data(), local * count, dtype, op,
                                          n);
    } else {
      std::memcpy(mine.data(), full.data(), mine.nbytes());
    }
  }
  for (int64_t i = 0; s.ok() && i < local; ++i) {
    Tensor part = mine.slice(i * count, count);
    s = algorithms::local_copy(part, std::span<const Tensor>(&outputs[static_cast<size_t>(i)], 1));
  }
  return finish(std::move(s));
}

}  // namespace tributary::backends
