#include "algorithms/hierarchical_group.h"

#include <algorithm>
#include <cstring>

namespace tributary::algorithms {
namespace {

ReduceOp partial_op(ReduceOp op) { return op == ReduceOp::kMean ? ReduceOp::kSum : op; }

}  // namespace

HierarchicalGroup::HierarchicalGroup(int rank, std::vector<std::vector<int>> members,
                                     std::unique_ptr<ProcessGroup> local,
                                     std::unique_ptr<ProcessGroup> cross)
    : rank_(rank),
      members_(std::move(members)),
      hosts_(static_cast<int>(members_.size())),
      per_host_(members_.empty() ? 0 : static_cast<int>(members_[0].size())),
      local_group_(std::move(local)),
      cross_group_(std::move(cross)) {
  for (int h = 0; h < hosts_; ++h) {
    for (int l = 0; l < per_host_; ++l) {
      if (members_[static_cast<size_t>(h)][static_cast<size_t>(l)] == rank_) {
        host_ = h;
        local_ = l;
      }
    }
  }
}

std::string HierarchicalGroup::describe() const {
  return "hierarchical (" + std::to_string(hosts_) + " hosts x " + std::to_string(per_host_) +
         " processes; within a host: " +
         (local_group_ ? local_group_->describe() : std::string("-")) +
         "; across hosts: " + (cross_group_ ? cross_group_->describe() : std::string("-")) + ")";
}

void HierarchicalGroup::abort(const Status& why) {
  if (local_group_) local_group_->abort(why);
  if (cross_group_) cross_group_->abort(why);
}

void HierarchicalGroup::interrupt(const Status& why) {
  if (local_group_) local_group_->interrupt(why);
  if (cross_group_) cross_group_->interrupt(why);
}

Status HierarchicalGroup::error() const {
  if (local_group_) TRIBUTARY_RETURN_IF_ERROR(in_local(local_group_->error()));
  if (cross_group_) TRIBUTARY_RETURN_IF_ERROR(in_cross(cross_group_->error()));
  return Status();
}

template <typename Body>
Status HierarchicalGroup::guarded(Body&& body) {
  TRIBUTARY_RETURN_IF_ERROR(error());
  Status s = body();
  if (!s.ok()) abort(s);
  return s;
}

namespace {

// "ranks 0, 1 are ranks 1, 3 of the job"
std::string rank_key(const std::vector<int>& global) {
  std::string here, there;
  for (size_t i = 0; i < global.size(); ++i) {
    here += (i ? ", " : "") + std::to_string(i);
    there += (i ? ", " : "") + std::to_string(global[i]);
  }
  return "its ranks " + here + " are ranks " + there + " of the job";
}

}  // namespace

Status HierarchicalGroup::in_local(Status s) const {
  if (s.ok() || local_group_->names_global_ranks()) return s;
  return s.with_context("within host " + std::to_string(host_) + " (" +
                        rank_key(members_[static_cast<size_t>(host_)]) + ")");
}

Status HierarchicalGroup::in_cross(Status s) const {
  if (s.ok() || cross_group_->names_global_ranks()) return s;
  std::vector<int> peers;
  for (const auto& m : members_) peers.push_back(m[static_cast<size_t>(local_)]);
  return s.with_context("across hosts (the group of local rank " + std::to_string(local_) + ": " +
                        rank_key(peers) + ")");
}

std::byte* HierarchicalGroup::scratch(std::vector<std::byte>& buffer, size_t bytes) {
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer.data();
}

Status HierarchicalGroup::all_reduce(const GroupCall& call, void* data, int64_t count, DType dtype,
                                     ReduceOp op, int64_t mean_divisor, const void* source) {
  return guarded([&]() -> Status {
    const size_t esize = dtype_size(dtype);
    if (!local_group_ && !cross_group_) {
      if (source) std::memcpy(data, source, static_cast<size_t>(count) * esize);
      return Status();
    }
    if (!local_group_) {
      return in_cross(cross_group_->all_reduce(call, data, count, dtype, op, mean_divisor, source));
    }
    if (!cross_group_) {
      return in_local(local_group_->all_reduce(call, data, count, dtype, op, mean_divisor, source));
    }
    // L equal blocks of b elements; the last ones are padding when L does not divide count.
    const int64_t L = per_host_;
    const int64_t b = (count + L - 1) / L;
    const size_t block = static_cast<size_t>(b) * esize;
    const size_t bytes = static_cast<size_t>(count) * esize;
    std::byte* all = static_cast<std::byte*>(data);
    if (source || b * L != count) {  // a padded copy of the input
      all = scratch(a_, block * static_cast<size_t>(L));
      std::memcpy(all, source ? source : data, bytes);
      std::memset(all + bytes, 0, block * static_cast<size_t>(L) - bytes);
    }
    std::byte* mine = scratch(b_, block);
    TRIBUTARY_RETURN_IF_ERROR(
        in_local(local_group_->reduce_scatter(call, all, mine, b, dtype, partial_op(op), 1)));
    TRIBUTARY_RETURN_IF_ERROR(
        in_cross(cross_group_->all_reduce(call, mine, b, dtype, op, mean_divisor, nullptr)));
    std::memcpy(all + static_cast<size_t>(local_) * block, mine, block);
    TRIBUTARY_RETURN_IF_ERROR(in_local(local_group_->all_gather(call, all, block)));
    if (all != data) std::memcpy(data, all, bytes);
    return Status();
  });
}

Status HierarchicalGroup::broadcast(const GroupCall& call, void* data, size_t bytes, int root) {
  return guarded([&]() -> Status {
    int root_host = 0, root_local = 0;
    for (int h = 0; h < hosts_; ++h) {
      for (int l = 0; l < per_host_; ++l) {
        if (members_[static_cast<size_t>(h)][static_cast<size_t>(l)] == root) {
          root_host = h;
          root_local = l;
        }
      }
    }
    if (cross_group_ && local_ == root_local) {
      TRIBUTARY_RETURN_IF_ERROR(in_cross(cross_group_->broadcast(call, data, bytes, root_host)));
    }
    if (local_group_) {
      TRIBUTARY_RETURN_IF_ERROR(in_local(local_group_->broadcast(call, data, bytes, root_local)));
    }
    return Status();
  });
}

Status HierarchicalGroup::all_gather(const GroupCall& call, void* data, size_t bytes_per_rank) {
  return guarded([&]() -> Status {
    auto* out = static_cast<std::byte*>(data);
    const size_t H = static_cast<size_t>(hosts_), L = static_cast<size_t>(per_host_);
    // The blocks of this local rank on every host, in host order.
    std::byte* row = scratch(a_, H * bytes_per_rank);
    std::memcpy(row + static_cast<size_t>(host_) * bytes_per_rank,
                out + static_cast<size_t>(rank_) * bytes_per_rank, bytes_per_rank);
    if (cross_group_)
      TRIBUTARY_RETURN_IF_ERROR(in_cross(cross_group_->all_gather(call, row, bytes_per_rank)));
    // Every local rank's row: grid[l][h] is the block of members[h][l].
    std::byte* grid = scratch(b_, L * H * bytes_per_rank);
    std::memcpy(grid + static_cast<size_t>(local_) * H * bytes_per_rank, row, H * bytes_per_rank);
    if (local_group_) {
      TRIBUTARY_RETURN_IF_ERROR(in_local(local_group_->all_gather(call, grid, H * bytes_per_rank)));
    }
    for (size_t l = 0; l < L; ++l) {
      for (size_t h = 0; h < H; ++h) {
        const auto r = static_cast<size_t>(members_[h][l]);
        std::memcpy(out + r * bytes_per_rank, grid + (l * H + h) * bytes_per_rank, bytes_per_rank);
      }
    }
    return Status();
  });
}

Status HierarchicalGroup::reduce_scatter(const GroupCall& call, void* data, void* out,
                                         int64_t count, DType dtype, ReduceOp op,
                                         int64_t mean_divisor) {
  return guarded([&]() -> Status {
    const size_t block = static_cast<size_t>(count) * dtype_size(dtype);
    const size_t H = static_cast<size_t>(hosts_), L = static_cast<size_t>(per_host_);
    const auto* in = static_cast<const std::byte*>(data);
    // Regrouped by local rank: grid[l][h] is the block meant for members[h][l].
    std::byte* grid = scratch(a_, L * H * block);
    for (size_t l = 0; l < L; ++l) {
      for (size_t h = 0; h < H; ++h) {
        std::memcpy(grid + (l * H + h) * block, in + static_cast<size_t>(members_[h][l]) * block,
                    block);
      }
    }
    if (!local_group_ && !cross_group_) {
      std::memcpy(out, grid, block);
      return Status();
    }
    if (!local_group_) {  // one process per host: the rows are the cross group's blocks
      return in_cross(
          cross_group_->reduce_scatter(call, grid, out, count, dtype, op, mean_divisor));
    }
    if (!cross_group_) {
      return in_local(
          local_group_->reduce_scatter(call, grid, out, count, dtype, op, mean_divisor));
    }
    std::byte* row = scratch(b_, H * block);
    TRIBUTARY_RETURN_IF_ERROR(in_local(local_group_->reduce_scatter(
        call, grid, row, count * static_cast<int64_t>(H), dtype, partial_op(op), 1)));
    return in_cross(cross_group_->reduce_scatter(call, row, out, count, dtype, op, mean_divisor));
  });
}

}  // namespace tributary::algorithms
