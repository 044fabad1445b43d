#include "algorithms/packing.h"

#include <cstring>
#include <map>
#include <string>

namespace tributary::algorithms {

StatusOr<std::vector<int64_t>> split_num_packs(int64_t total_elements, int64_t num_packs) {
  if (num_packs <= 0) {
    return invalid_argument("num_packs must be greater than zero, got " +
                            std::to_string(num_packs) +
                            " (use num_packs=0 at the call site to reduce tensors one by one)");
  }
  if (total_elements < 0) {
    return invalid_argument("total_elements must not be negative, got " +
                            std::to_string(total_elements) + " (is a shape not fully defined?)");
  }
  const int64_t split = total_elements / num_packs;
  std::vector<int64_t> sizes(static_cast<size_t>(num_packs), split);
  sizes.back() = total_elements - split * (num_packs - 1);  // the last pack gets the remainder
  return sizes;
}

std::vector<std::vector<size_t>> group_by_size(std::span<const uint64_t> sizes_bytes,
                                               uint64_t bytes_per_pack) {
  std::vector<std::vector<size_t>> packs;
  uint64_t last = 0;
  for (size_t i = 0; i < sizes_bytes.size(); ++i) {
    // Strictly greater: a pack of exactly bytes_per_pack is extended by the next tensor, as in TF.
    if (packs.empty() || (bytes_per_pack != 0 && last > bytes_per_pack)) {
      packs.emplace_back();
      last = 0;
    }
    packs.back().push_back(i);
    last += sizes_bytes[i];
  }
  return packs;
}

size_t packed_nbytes(std::span<const Tensor> tensors) {
  size_t total = 0;
  for (const Tensor& t : tensors) total += t.nbytes();
  return total;
}

void pack(std::span<const Tensor> tensors, void* dst) {
  auto* out = static_cast<std::byte*>(dst);
  for (const Tensor& t : tensors) {
    const size_t n = t.nbytes();
    if (n == 0) continue;  // memcpy with a null pointer is undefined even for 0 bytes
    std::memcpy(out, t.data(), n);
    out += n;
  }
}

void unpack(const void* src, std::span<const Tensor> tensors) {
  const auto* in = static_cast<const std::byte*>(src);
  for (const Tensor& t : tensors) {
    const size_t n = t.nbytes();
    if (n == 0) continue;
    std::memcpy(t.data(), in, n);
    in += n;
  }
}

Status packed_batch_reduce(const CallInfo& call, std::span<const ReducePair> pairs,
                           std::span<const Device> devices,
                           std::vector<std::vector<std::byte>>& packs,
                           const PackedBatchReduce& how) {
  std::map<DType, std::vector<size_t>> by_dtype;
  for (size_t i = 0; i < pairs.size(); ++i) by_dtype[pairs[i].value[0].dtype()].push_back(i);
  const size_t replicas = devices.size();
  for (const auto& [dtype, members] : by_dtype) {
    std::vector<uint64_t> sizes;
    for (size_t i : members) sizes.push_back(pairs[i].value[0].nbytes());
    for (const std::vector<size_t>& group : group_by_size(sizes, how.bytes_per_pack)) {
      int64_t total = 0;
      for (size_t g : group) total += pairs[members[g]].value[0].num_elements();
      CallInfo pack_call = call;
      pack_call.collective = how.collective;
      pack_call.dtype = dtype;
      pack_call.count = total;
      if (group.size() == 1) {
        TRIBUTARY_RETURN_IF_ERROR(how.reduce_one(pack_call, pairs[members[group[0]]]));
        continue;
      }
      const size_t bytes = static_cast<size_t>(total) * dtype_size(dtype);
      std::vector<Tensor> views;
      if (total > 0) {
        if (packs.size() < replicas) packs.resize(replicas);
        views.resize(replicas);
        for (size_t r = 0; r < replicas; ++r) {
          std::byte* buf = nullptr;
          if (r == 0 && how.first_pack_buffer) {
            TRIBUTARY_ASSIGN_OR_RETURN(buf, how.first_pack_buffer(pack_call, bytes));
          } else {
            if (packs[r].size() < bytes) packs[r].resize(bytes);
            buf = packs[r].data();
          }
          views[r] = Tensor(buf, dtype, Shape{total}, devices[r]);
          std::vector<Tensor> parts;
          for (size_t g : group) parts.push_back(pairs[members[g]].value[r]);
          pack(parts, buf);
        }
      }
      TRIBUTARY_ASSIGN_OR_RETURN(const std::byte* result, how.reduce_pack(pack_call, views));
      if (total == 0) continue;
      size_t offset = 0;
      for (size_t g : group) {
        const ReducePair& p = pairs[members[g]];
        const size_t nbytes = p.value[0].nbytes();
        for (const Tensor& d : p.destinations) {
          if (nbytes) std::memcpy(d.data(), result + offset, nbytes);
        }
        offset += nbytes;
      }
    }
  }
  return Status();
}

}  // namespace tributary::algorithms
