#include "backends/hierarchical_copy/hierarchical_copy_ops.h"

#include <algorithm>
#include <map>
#include <string>

#include "algorithms/local_collectives.h"
#include "algorithms/packing.h"
#include "core/gpu.h"

namespace tributary::backends {
namespace {

std::vector<std::vector<int>> make_groups(int n, int64_t group_size) {
  const int size = group_size > 0 ? static_cast<int>(std::min<int64_t>(group_size, n)) : (n + 1) / 2;
  std::vector<std::vector<int>> groups;
  for (int i = 0; i < n; ++i) {
    if (i % size == 0) groups.emplace_back();
    groups.back().push_back(i);
  }
  return groups;
}

// The driver's view of the context's GPUs; empty when a query fails (the caller then keeps the
// CPU default).
std::vector<std::vector<GpuLink>> query_links(const std::vector<Device>& devices) {
  const size_t n = devices.size();
  std::vector<std::vector<GpuLink>> links(n, std::vector<GpuLink>(n));
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      if (i == j) continue;
      auto l = gpu::peer_link(devices[i].index(), devices[j].index());
      if (!l.ok()) return {};
      links[i][j] = GpuLink{l->access, l->performance_rank};
    }
  }
  return links;
}

bool all_gpus(const std::vector<Device>& devices) {
  for (const Device& d : devices) {
    if (!d.is_cuda()) return false;
  }
  return true;
}

// Copies `parts` back to back into `packed` (or the reverse): host memcpy on CPUs, device copies
// otherwise.
Status pack_into(std::span<const Tensor> parts, const Tensor& packed) {
  if (packed.device().is_cpu()) {
    bool host = true;
    for (const Tensor& t : parts) host = host && t.device().is_cpu();
    if (host) {
      algorithms::pack(parts, packed.data());
      return Status();
    }
  }
  int64_t offset = 0;
  for (const Tensor& t : parts) {
    const Tensor slot = packed.slice(offset, t.num_elements());
    TRIBUTARY_RETURN_IF_ERROR(algorithms::local_copy(t, std::span<const Tensor>(&slot, 1)));
    offset += t.num_elements();
  }
  return Status();
}

Status unpack_from(const Tensor& packed, std::span<const Tensor> parts) {
  if (packed.device().is_cpu()) {
    bool host = true;
    for (const Tensor& t : parts) host = host && t.device().is_cpu();
    if (host) {
      algorithms::unpack(packed.data(), parts);
      return Status();
    }
  }
  int64_t offset = 0;
  for (const Tensor& t : parts) {
    TRIBUTARY_RETURN_IF_ERROR(algorithms::local_copy(packed.slice(offset, t.num_elements()),
                                                     std::span<const Tensor>(&t, 1)));
    offset += t.num_elements();
  }
  return Status();
}

// The stage-1 and stage-2 op: partial results combine with the op itself, MEAN as a sum.
ReduceOp partial_op(ReduceOp op) { return op == ReduceOp::kMean ? ReduceOp::kSum : op; }

}  // namespace

std::vector<std::vector<int>> groups_from_topology(const std::vector<std::vector<GpuLink>>& links) {
  const size_t n = links.size();
  int best = -1;  // the fastest rank among peer-accessible pairs
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      if (i == j || !links[i][j].peer_access) continue;
      const int r = links[i][j].performance_rank;
      if (best < 0 || (r >= 0 && r < best)) best = r < 0 ? 0 : r;
    }
  }
  auto fast = [&](size_t i, size_t j) {
    return links[i][j].peer_access && links[j][i].peer_access &&
           std::max(links[i][j].performance_rank, 0) <= best &&
           std::max(links[j][i].performance_rank, 0) <= best;
  };
  std::vector<std::vector<int>> groups;
  for (size_t i = 0; i < n; ++i) {
    bool placed = false;
    for (auto& g : groups) {
      bool all = true;
      for (int m : g) all = all && fast(i, static_cast<size_t>(m));
      if (all) {
        g.push_back(static_cast<int>(i));
        placed = true;
        break;
      }
    }
    if (!placed) groups.push_back({static_cast<int>(i)});
  }
  return groups;
}

HierarchicalCopyOps::HierarchicalCopyOps(BackendContext context, Options options,
                                         Capabilities caps)
    : CrossDeviceOps("hierarchical_copy", std::move(context), std::move(options),
                     std::move(caps)) {
  const int64_t group_size = this->options().get_int("group_size");
  if (group_size == 0 && all_gpus(devices())) {
    auto links = query_links(devices());
    if (!links.empty()) groups_ = groups_from_topology(links);
  }
  if (groups_.empty()) groups_ = make_groups(num_local_replicas(), group_size);
  num_packs_ = this->options().get_int("num_packs");
}

bool HierarchicalCopyOps::matches_replicas(const Mirrored<Tensor>& destinations) const {
  if (destinations.size() != devices().size()) return false;
  for (size_t i = 0; i < destinations.size(); ++i) {
    if (destinations[i].device() != devices()[i]) return false;
  }
  return true;
}

Status HierarchicalCopyOps::hierarchical_all_reduce(ReduceOp op, std::span<const Tensor> inputs,
                                                    std::span<const Tensor> outputs,
                                                    int64_t pack) const {
  const int64_t n = static_cast<int64_t>(inputs.size());
  if (inputs.empty() || inputs[0].num_elements() == 0) return Status();
  const size_t num_groups = groups_.size();
  const size_t root_group = static_cast<size_t>(pack) % num_groups;
  std::vector<Tensor> leader_outputs;
  std::vector<Tensor> members;
  size_t root_index = 0;
  // Stage 1: reduce each group into its leader's output.
  for (size_t g = 0; g < num_groups; ++g) {
    const std::vector<int>& group = groups_[g];
    const int leader = group[static_cast<size_t>(pack) % group.size()];
    members.clear();
    for (int r : group) members.push_back(inputs[static_cast<size_t>(r)]);
    TRIBUTARY_RETURN_IF_ERROR(algorithms::local_reduce(
        partial_op(op), members, std::span<const Tensor>(&outputs[static_cast<size_t>(leader)], 1),
        n));
    if (g == root_group) root_index = leader_outputs.size();
    leader_outputs.push_back(outputs[static_cast<size_t>(leader)]);
  }
  // Stage 2: the root leader reduces the partial results; the total goes back to every leader.
  // With one group the partial result is already the total except for MEAN's division.
  if (num_groups > 1 || op == ReduceOp::kMean) {
    std::swap(leader_outputs[0], leader_outputs[root_index]);  // the root reads first
    TRIBUTARY_RETURN_IF_ERROR(algorithms::local_reduce(op, leader_outputs, leader_outputs, n));
  }
  // Stage 3: each leader copies to its group.
  for (const std::vector<int>& group : groups_) {
    const int leader = group[static_cast<size_t>(pack) % group.size()];
    members.clear();
    for (int r : group) {
      if (r != leader) members.push_back(outputs[static_cast<size_t>(r)]);
    }
    TRIBUTARY_RETURN_IF_ERROR(
        algorithms::local_copy(outputs[static_cast<size_t>(leader)], members));
  }
  return Status();
}

Work HierarchicalCopyOps::all_reduce_impl(const CallInfo&, ReduceOp op,
                                          const PerReplica<Tensor>& inputs,
                                          const PerReplica<Tensor>& outputs) {
  return Work::completed(hierarchical_all_reduce(op, inputs.values(), outputs.values(), 0));
}

Work HierarchicalCopyOps::reduce_impl(const CallInfo& call, ReduceOp op,
                                      const PerReplica<Tensor>& value,
                                      const Mirrored<Tensor>& destinations) {
  if (matches_replicas(destinations)) {
    return Work::completed(hierarchical_all_reduce(op, value.values(), destinations.values(), 0));
  }
  // TF falls back to ReductionToOneDevice when the destinations are not the values' devices.
  log_debug(call.describe() + ": destinations differ from the replicas; reducing to one device");
  return Work::completed(algorithms::local_reduce(op, value.values(), destinations.values(),
                                                  static_cast<int64_t>(value.size())));
}

Work HierarchicalCopyOps::batch_reduce_impl(const CallInfo& call, ReduceOp op,
                                            std::span<const ReducePair> pairs) {
  bool all_match = num_packs_ > 0;
  for (const ReducePair& p : pairs) all_match = all_match && matches_replicas(p.destinations);
  if (!all_match) return CrossDeviceOps::batch_reduce_impl(call, op, pairs);

  // Pack per dtype: concatenation needs one element type.
  std::map<DType, std::vector<const ReducePair*>> by_dtype;
  for (const ReducePair& p : pairs) by_dtype[p.value[0].dtype()].push_back(&p);
  const size_t replicas = devices().size();
  int64_t pack_index = 0;
  for (const auto& [dtype, group] : by_dtype) {
    int64_t total = 0;
    for (const ReducePair* p : group) total += p->value[0].num_elements();
    if (total == 0) continue;
    auto sizes = algorithms::split_num_packs(total, num_packs_);
    if (!sizes.ok()) return Work::completed(sizes.status());
    std::vector<Buffer> packed(replicas);
    std::vector<Tensor> views(replicas);
    for (size_t r = 0; r < replicas; ++r) {
      auto b = Buffer::allocate(dtype, Shape{total}, devices()[r]);
      if (!b.ok()) return Work::completed(b.status());
      packed[r] = std::move(b).value();
      views[r] = packed[r].tensor();
      std::vector<Tensor> parts;
      for (const ReducePair* p : group) parts.push_back(p->value[r]);
      if (Status s = pack_into(parts, views[r]); !s.ok()) return Work::completed(s);
    }
    int64_t offset = 0;
    std::vector<Tensor> slices(replicas);
    for (int64_t size : *sizes) {
      for (size_t r = 0; r < replicas; ++r) slices[r] = views[r].slice(offset, size);
      Status s = hierarchical_all_reduce(op, slices, slices, pack_index++);
      if (!s.ok()) return Work::completed(s);
      offset += size;
    }
    for (size_t r = 0; r < replicas; ++r) {
      std::vector<Tensor> parts;
      for (const ReducePair* p : group) parts.push_back(p->destinations[r]);
      if (Status s = unpack_from(views[r], parts); !s.ok()) return Work::completed(s);
    }
  }
  log_debug("batch_all_reduce: " + std::to_string(pairs.size()) +
            " all-reduces with algorithm = hierarchical_copy, num_packs = " +
            std::to_string(num_packs_));
  return Work::completed();
}

Work HierarchicalCopyOps::broadcast_impl(const CallInfo&, const Tensor& source,
                                         const Mirrored<Tensor>& destinations, int) {
  return Work::completed(algorithms::local_copy(source, destinations.values()));
}

Work HierarchicalCopyOps::all_gather_impl(const CallInfo&, const PerReplica<Tensor>& inputs,
                                          const PerReplica<Tensor>& outputs) {
  // TF: "gather/all_gather with NCCL or HierarchicalCopy is not supported. Falling back to gather
  // on one device and then broadcast".
  return Work::completed(algorithms::local_all_gather(inputs.values(), outputs.values()));
}

Work HierarchicalCopyOps::reduce_scatter_impl(const CallInfo&, ReduceOp op,
                                              const PerReplica<Tensor>& inputs,
                                              const PerReplica<Tensor>& outputs) {
  return Work::completed(algorithms::local_reduce_scatter(op, inputs.values(), outputs.values(),
                                                          num_replicas_in_sync()));
}

}  // namespace tributary::backends
