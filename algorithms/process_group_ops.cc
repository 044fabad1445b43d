#include "algorithms/process_group_ops.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "algorithms/local_collectives.h"
#include "algorithms/packing.h"
#include "core/rendezvous.h"

namespace tributary::algorithms {
namespace {

ReduceOp partial_op(ReduceOp op) { return op == ReduceOp::kMean ? ReduceOp::kSum : op; }

std::span<const Tensor> one(const Tensor& t) { return std::span<const Tensor>(&t, 1); }

}  // namespace

std::vector<OptionDef> transport_group_options() {
  return {
      {.name = "algorithm",
       .type = OptionType::kEnum,
       .default_value = "auto",
       .help = "all-reduce algorithm: auto (the cost model picks by size and world), ring "
               "(bandwidth-optimal), halving_doubling (few steps, little data), "
               "recursive_doubling (fewest steps, for small messages)",
       .choices = {"auto", "ring", "halving_doubling", "recursive_doubling"}},
      {.name = "segment_bytes",
       .type = OptionType::kSize,
       .default_value = "0",
       .help = "ring steps move their chunk in segments of this size, so that receiving the next "
               "segment overlaps reducing this one; 0 = auto (a quarter of the chunk, 256KiB to "
               "1MiB)",
       .min = 0},
      {.name = "slice_bytes",
       .type = OptionType::kSize,
       .default_value = "0",
       .help = "the ring all-reduce takes a larger message a slice of this size at a time, so "
               "that each slice's data is sent on while still in cache; 0 = auto (2MiB per rank "
               "when every rank of the ring is on one host or one machine's kernel, as containers "
               "or network namespaces of one machine are, else whole messages, since each slice "
               "pays its round trips again); a size at least the largest message turns slicing "
               "off. Shared memory has its own chunks (ring's shm_chunk_bytes)",
       .min = 0},
      {.name = "bytes_per_pack",
       .type = OptionType::kSize,
       .default_value = "0",
       .help = "batch_reduce packs tensors into groups of at least this many bytes (TF's rule); "
               "0 = one pack per dtype"},
      {.name = "poll",
       .type = OptionType::kEnum,
       .default_value = "auto",
       .help = "whether a wait polls before sleeping (ring 50 us, ucx 1 ms; yielding the core "
               "between looks after the first 2 us, ucx 20 us, to a peer placed on it): on "
               "(lowest latency), "
               "off, or auto (on unless this machine runs more ranks than it has cores, counting "
               "those of other containers or network namespaces on the same kernel, where "
               "polling would steal the CPU from the peers: it then yields the core between polls "
               "for up to 1 ms); "
               "always polls through the whole wait without yielding, as Open MPI does (a core per "
               "waiting rank)",
       .choices = {"auto", "on", "off", "always"}},
      internal::secret_file_option(),
  };
}

Capabilities process_group_capabilities() {
  Capabilities caps;
  caps.device_types = {DeviceType::kCpu};
  caps.dtypes.assign(all_dtypes().begin(), all_dtypes().end());
  caps.ops.assign(all_reduce_ops().begin(), all_reduce_ops().end());
  caps.collectives.assign(all_collectives().begin(), all_collectives().end());
  caps.multi_process = true;
  return caps;
}

AllReduceAlgorithm parse_algorithm(const std::string& name) {
  if (name == "ring") return AllReduceAlgorithm::kRing;
  if (name == "halving_doubling") return AllReduceAlgorithm::kHalvingDoubling;
  if (name == "recursive_doubling") return AllReduceAlgorithm::kRecursiveDoubling;
  return AllReduceAlgorithm::kAuto;
}

Status check_transport_group_options(const std::string& backend, const Options& options) {
  if (const uint64_t seg = options.get_size("segment_bytes"); seg != 0 && seg < 4096) {
    return invalid_argument("backend '" + backend +
                            "': segment_bytes must be 0 (auto) or at least 4KiB, not " +
                            options.find("segment_bytes")->text);
  }
  if (const uint64_t slice = options.get_size("slice_bytes"); slice != 0 && slice < 4096) {
    return invalid_argument("backend '" + backend +
                            "': slice_bytes must be 0 (auto) or at least 4KiB, not " +
                            options.find("slice_bytes")->text);
  }
  return Status();
}

std::string transport_group_layout(const BackendContext& context, const Options& options) {
  return "local_replicas=" + std::to_string(context.devices.size()) +
         ",algorithm=" + options.get_string("algorithm") +
         ",segment_bytes=" + options.find("segment_bytes")->text +
         ",slice_bytes=" + options.find("slice_bytes")->text +
         ",bytes_per_pack=" + options.find("bytes_per_pack")->text;
}

ProcessGroupOps::ProcessGroupOps(std::string name, BackendContext context, Options options,
                                 Capabilities caps, std::unique_ptr<ProcessGroup> group,
                                 uint64_t bytes_per_pack)
    : CrossDeviceOps(std::move(name), std::move(context), std::move(options), std::move(caps)),
      group_(std::move(group)),
      bytes_per_pack_(bytes_per_pack) {
  if (group_) {
    group_->set_refusal_publisher([this](const Status& why) { publish_refusal(why); });
    // Which path the data takes between processes (shared memory, TCP, both; single copy or not),
    // for TRIBUTARY_LOG_LEVEL=info.
    log_info("across processes: " + group_->describe());
  }
}

GroupCall ProcessGroupOps::group_call(const CallInfo& call) const {
  // Saturate: a huge timeout must not overflow the clock.
  const auto timeout =
      std::min<std::chrono::nanoseconds>(call.timeout, std::chrono::hours(24 * 365));
  return GroupCall{MessageTag::of(call), std::chrono::steady_clock::now() + timeout};
}

namespace {
Status refused(int rank, const Status& why) {
  return aborted("rank " + std::to_string(rank) + " refused its part: " + why.message());
}
}  // namespace

void ProcessGroupOps::abandon(const Status& why) {
  if (group_) group_->abort(refused(rank(), why));
}

void ProcessGroupOps::interrupt(const Status& why) {
  if (group_) group_->interrupt(refused(rank(), why));
}

std::byte* ProcessGroupOps::staging(size_t bytes) {
  if (staging_.size() < bytes) staging_.resize(bytes);
  return staging_.data();
}

// The id of pack_staging's registration with the group, apart from register_buffers' 1, 2, ...
constexpr uint64_t kPackStagingRegistration = ~uint64_t{0};

StatusOr<std::byte*> ProcessGroupOps::pack_staging(const CallInfo& call, size_t bytes) {
  if (bytes > pack_staging_bytes_) {
    // Grown in powers of two from 64 KiB, so that packs of varying sizes register rarely.
    size_t grown = size_t{64} << 10;
    while (grown < bytes) grown *= 2;
    shared_staging_ = Buffer();
    std::vector<std::byte>().swap(fallback_staging_);
    auto b = Buffer::allocate_shareable(DType::kUInt8, Shape{static_cast<int64_t>(grown)});
    if (b.ok()) {
      shared_staging_ = std::move(b).value();
    } else {
      // Still registered below (every rank must take the step): as ordinary memory, so that no
      // rank takes the direct path.
      log_info("batch_reduce stages its packs in ordinary memory: " + b.status().message());
      fallback_staging_.resize(grown);
    }
    pack_staging_bytes_ = grown;
    std::byte* data = b.ok() ? static_cast<std::byte*>(shared_staging_.data())
                             : fallback_staging_.data();
    TRIBUTARY_RETURN_IF_ERROR(group_->register_buffer(group_call(call), kPackStagingRegistration,
                                                      data, static_cast<int64_t>(grown),
                                                      DType::kUInt8));
    if (std::string what = group_->describe_registration(kPackStagingRegistration);
        !what.empty()) {
      log_info("batch_reduce's packs, staged in " + format_size(grown) + ": " + what);
    }
  }
  return shared_staging_.data() != nullptr ? static_cast<std::byte*>(shared_staging_.data())
                                           : fallback_staging_.data();
}

Work ProcessGroupOps::finish(Status s) {
  if (!s.ok() && group_ && group_->error().ok()) {
    // A local failure (not the group's): peers may be waiting for us, so fail them fast.
    group_->abort(s);
  }
  return Work::completed(std::move(s));
}

Status ProcessGroupOps::reduce_everywhere(const CallInfo& call, ReduceOp op,
                                          std::span<const Tensor> inputs, const Tensor& result) {
  TRIBUTARY_RETURN_IF_ERROR(group_error());
  const int64_t n = num_replicas_in_sync();
  const bool across = group_ != nullptr && world_size() > 1;
  // One local replica out of place: the group reads the input itself, no copy up front.
  const void* source = nullptr;
  if (across && inputs.size() == 1 && inputs[0].data() != result.data()) {
    source = inputs[0].data();
  } else {
    // Local stage: the full op (and MEAN's division) only when there is nothing else to do.
    TRIBUTARY_RETURN_IF_ERROR(local_reduce(across ? partial_op(op) : op, inputs, one(result), n));
  }
  if (!across) return Status();
  return group_->all_reduce(group_call(call), result.data(), result.num_elements(), result.dtype(),
                            op, n, source);
}

Status ProcessGroupOps::reduce_to_all(const CallInfo& call, ReduceOp op,
                                      std::span<const Tensor> inputs,
                                      std::span<const Tensor> outputs) {
  Status s = reduce_everywhere(call, op, inputs, outputs[0]);
  if (s.ok() && outputs.size() > 1) s = local_copy(outputs[0], outputs.subspan(1));
  return s;
}

Work ProcessGroupOps::all_reduce_impl(const CallInfo& call, ReduceOp op,
                                      const PerReplica<Tensor>& inputs,
                                      const PerReplica<Tensor>& outputs) {
  return finish(reduce_to_all(call, op, inputs.values(), outputs.values()));
}

Work ProcessGroupOps::reduce_impl(const CallInfo& call, ReduceOp op,
                                  const PerReplica<Tensor>& value,
                                  const Mirrored<Tensor>& destinations) {
  return finish(reduce_to_all(call, op, value.values(), destinations.values()));
}

Status ProcessGroupOps::batch_reduce_packs(const CallInfo& call, ReduceOp op,
                                           std::span<const ReducePair> pairs) {
  PackedBatchReduce how;
  how.bytes_per_pack = bytes_per_pack_;
  how.reduce_one = [&](const CallInfo& pack_call, const ReducePair& p) -> Status {
    if (pack_call.count == 0) return Status();
    return reduce_to_all(pack_call, op, p.value.values(), p.destinations.values());
  };
  // Where the group wants it, replica 0's pack is built in the registered shareable staging
  // buffer and reduced there in place: no copy between the pack and the group's buffer.
  const bool shareable = group_ && world_size() > 1 && group_->wants_shareable_staging();
  if (shareable) {
    how.first_pack_buffer = [&](const CallInfo& pack_call, size_t bytes) {
      return pack_staging(pack_call, bytes);
    };
  }
  how.reduce_pack = [&](const CallInfo& pack_call,
                        std::span<const Tensor> views) -> StatusOr<const std::byte*> {
    if (pack_call.count == 0) return nullptr;
    const Tensor result =
        shareable ? views[0]
                  : Tensor(staging(static_cast<size_t>(pack_call.count) *
                                   dtype_size(pack_call.dtype)),
                           pack_call.dtype, Shape{pack_call.count}, devices()[0]);
    TRIBUTARY_RETURN_IF_ERROR(reduce_everywhere(pack_call, op, views, result));
    return static_cast<const std::byte*>(result.data());
  };
  return packed_batch_reduce(call, pairs, devices(), packs_, how);
}

Work ProcessGroupOps::batch_reduce_impl(const CallInfo& call, ReduceOp op,
                                        std::span<const ReducePair> pairs) {
  return finish(batch_reduce_packs(call, op, pairs));
}

Work ProcessGroupOps::broadcast_impl(const CallInfo& call, const Tensor& source,
                                     const Mirrored<Tensor>& destinations, int root) {
  Status s = group_error();
  const Tensor& first = destinations[0];
  if (s.ok() && rank() == root) s = local_copy(source, one(first));
  if (s.ok() && group_ && world_size() > 1) {
    GroupCall gc = group_call(call);
    gc.tag.root = root;
    if (!group_->checks_roots()) {
      s = agree_on_root(call, gc, root);
      if (!s.ok() && group_->error().ok()) {
        // Roots that differ, seen by every rank from the same agreed result: no peer waits for
        // this one, so the group is not aborted (finish() would close its connections, which can
        // fail a peer still reading the agreement's last message with a lost connection instead
        // of this mismatch). The front door refuses the instance from here on either way.
        return Work::completed(std::move(s));
      }
    }
    if (s.ok()) s = group_->broadcast(gc, first.data(), first.nbytes(), root);
  }
  if (s.ok() && destinations.size() > 1) {
    s = local_copy(first, std::span<const Tensor>(destinations.values()).subspan(1));
  }
  return finish(std::move(s));
}

Status ProcessGroupOps::agree_on_root(const CallInfo& call, const GroupCall& gc, int root) {
  // Every rank must name the same root. Data flows one way in a broadcast, so a leaf naming
  // another root could only notice it alone while the others succeed; a small all-reduce of the
  // root first makes every rank see a difference (the root also rides in every tag, so over TCP
  // and UCX the mismatch is reported by the transport, naming both sides).
  int64_t roots[2] = {root, -root};  // max, and -min
  TRIBUTARY_RETURN_IF_ERROR(
      group_->all_reduce(gc, roots, 2, DType::kInt64, ReduceOp::kMax, 1, nullptr));
  if (roots[0] != -roots[1]) {
    return aborted("collective mismatch: " + call.describe() + ": rank " +
                   std::to_string(rank()) + " named root " + std::to_string(root) +
                   " but other ranks named roots from " + std::to_string(-roots[1]) + " to " +
                   std::to_string(roots[0]) + "; every rank must name the same root");
  }
  return Status();
}

Status ProcessGroupOps::register_buffers_impl(const CallInfo& call, uint64_t id,
                                              const PerReplica<Tensor>& buffers) {
  if (!group_ || world_size() <= 1) return Status();
  const Tensor& t = buffers[0];
  Status s = group_->register_buffer(group_call(call), id, t.data(), t.num_elements(), t.dtype());
  if (!s.ok() && group_->error().ok()) group_->abort(s);
  if (s.ok()) {
    if (std::string what = group_->describe_registration(id); !what.empty()) {
      log_info("registration #" + std::to_string(id) + ": " + what);
    }
  }
  return s;
}

void ProcessGroupOps::release_buffers_impl(uint64_t id) {
  if (group_) group_->release_buffer(id);
}

Work ProcessGroupOps::all_gather_impl(const CallInfo& call, const PerReplica<Tensor>& inputs,
                                      const PerReplica<Tensor>& outputs) {
  Status s = group_error();
  const int64_t count = inputs[0].num_elements();
  const int64_t local = num_local_replicas();
  const Tensor& first = outputs[0];
  // This process's replicas fill their blocks of outputs[0]; the group fills the rest.
  for (int64_t i = 0; s.ok() && i < local; ++i) {
    Tensor slot = first.slice((rank() * local + i) * count, count);
    s = local_copy(inputs[static_cast<size_t>(i)], one(slot));
  }
  if (s.ok() && group_ && world_size() > 1) {
    s = group_->all_gather(group_call(call), first.data(),
                           static_cast<size_t>(local * count) * dtype_size(first.dtype()));
  }
  if (s.ok() && outputs.size() > 1) {
    s = local_copy(first, std::span<const Tensor>(outputs.values()).subspan(1));
  }
  return finish(std::move(s));
}

Work ProcessGroupOps::reduce_scatter_impl(const CallInfo& call, ReduceOp op,
                                          const PerReplica<Tensor>& inputs,
                                          const PerReplica<Tensor>& outputs) {
  Status s = group_error();
  const DType dtype = inputs[0].dtype();
  const int64_t count = outputs[0].num_elements();
  const int64_t local = num_local_replicas();
  const int64_t total = inputs[0].num_elements();
  const int64_t n = num_replicas_in_sync();
  const size_t elem = dtype_size(dtype);
  const bool across = group_ != nullptr && world_size() > 1;
  // One local replica, where the group only reads its input: straight from the input into the
  // output (apart from it, or in place its own block of it; the front door allows no other).
  const Tensor& in0 = inputs[0];
  const Tensor& out0 = outputs[0];
  const auto in_at = reinterpret_cast<uintptr_t>(in0.data());
  const auto out_at = reinterpret_cast<uintptr_t>(out0.data());
  const bool apart = out_at + out0.nbytes() <= in_at || in_at + in0.nbytes() <= out_at;
  const bool own_block =
      across && out_at == in_at + static_cast<uintptr_t>(group_->rank() * count) * elem;
  if (s.ok() && across && local == 1 && group_->reduce_scatter_reads_only() &&
      (apart || own_block)) {
    return finish(group_->reduce_scatter(group_call(call), const_cast<void*>(in0.data()),
                                         out0.data(), count, dtype, op, n));
  }
  // Reduce the local replicas' inputs into one buffer, then reduce-scatter blocks of `local`
  // outputs across processes; this process's block lands after the full buffer in staging.
  std::byte* buf = staging(static_cast<size_t>(total + local * count) * elem);
  Tensor full(buf, dtype, Shape{total}, devices()[0]);
  Tensor mine(buf + static_cast<size_t>(total) * elem, dtype, Shape{local * count}, devices()[0]);
  if (s.ok()) s = local_reduce(across ? partial_op(op) : op, inputs.values(), one(full), n);
  if (s.ok()) {
    if (across) {
      s = group_->reduce_scatter(group_call(call), full.data(), mine.data(), local * count, dtype,
                                 op, n);
    } else if (mine.nbytes() > 0) {  // staging of 0 bytes is null: no memcpy from it
      std::memcpy(mine.data(), full.data(), mine.nbytes());
    }
  }
  for (int64_t i = 0; s.ok() && i < local; ++i) {
    Tensor part = mine.slice(i * count, count);
    s = local_copy(part, one(outputs[static_cast<size_t>(i)]));
  }
  return finish(std::move(s));
}

}  // namespace tributary::algorithms
