// Host staging of GPU tensors for host backends (core/host_staging.h).
#include <algorithm>
#include <map>
#include <mutex>
#include <numeric>
#include <set>

#include "core/gpu.h"
#include "core/host_staging.h"

namespace tributary::internal {

size_t StagingPlan::add(const Tensor& t, bool read, bool write, std::byte* fixed_host) {
  entries_.push_back(Entry{.tensor = t, .read = read, .write = write, .fixed = fixed_host});
  return entries_.size() - 1;
}

size_t StagingPlan::layout() {
  groups_.clear();
  reads_.clear();
  writes_.clear();
  auto begin_of = [&](size_t i) {
    return static_cast<const std::byte*>(entries_[i].tensor.data());
  };
  auto device_key = [&](size_t i) {
    const Device& d = entries_[i].tensor.device();
    return std::pair<int, int>(static_cast<int>(d.type()), d.index());
  };
  std::vector<size_t> order(entries_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  // By device, then address, the larger first: a group starts with the tensor that encloses it.
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (device_key(a) != device_key(b)) return device_key(a) < device_key(b);
    if (begin_of(a) != begin_of(b)) return std::less<>()(begin_of(a), begin_of(b));
    return entries_[a].tensor.nbytes() > entries_[b].tensor.nbytes();
  });
  // The group a tensor may join: the last one with bytes, on the tensor's device. Empty tensors get
  // groups of their own and never anchor one.
  size_t open = ~size_t{0};
  for (size_t k = 0; k < order.size(); ++k) {
    const size_t i = order[k];
    const std::byte* b = begin_of(i);
    const size_t n = entries_[i].tensor.nbytes();
    bool joins = false;
    if (n > 0 && open != ~size_t{0}) {
      const Group& g = groups_[open];
      joins = g.device == device_key(i) && std::less<>()(b, g.begin + g.bytes);
    }
    if (!joins) {
      groups_.push_back(Group{.begin = b, .bytes = n, .device = device_key(i)});
      if (n > 0) open = groups_.size() - 1;
    }
    const size_t at = joins ? open : groups_.size() - 1;
    Group& g = groups_[at];
    g.bytes = std::max(g.bytes, static_cast<size_t>(b - g.begin) + n);
    entries_[i].group = at;
    entries_[i].offset = static_cast<size_t>(b - g.begin);
  }
  // A registered twin stands for its group only when its tensor is the whole group.
  for (const Entry& e : entries_) {
    Group& g = groups_[e.group];
    if (e.fixed != nullptr && e.offset == 0 && e.tensor.nbytes() == g.bytes) g.fixed = e.fixed;
  }
  size_t total = 0;
  for (Group& g : groups_) {
    if (g.fixed != nullptr) continue;
    g.block_offset = total;
    total += (g.bytes + kAlignment - 1) / kAlignment * kAlignment;
  }
  auto list = [&](bool Entry::*flag, std::vector<size_t>& out) {
    for (size_t i = 0; i < entries_.size(); ++i) {
      const Entry& e = entries_[i];
      if (!(e.*flag) || e.tensor.nbytes() == 0) continue;
      const bool seen = std::any_of(out.begin(), out.end(), [&](size_t j) {
        return entries_[j].group == e.group && entries_[j].offset == e.offset &&
               entries_[j].tensor.nbytes() == e.tensor.nbytes();
      });
      if (!seen) out.push_back(i);
    }
  };
  list(&Entry::read, reads_);
  list(&Entry::write, writes_);
  return total;
}

std::byte* StagingPlan::host_data(size_t slot, std::byte* block) const {
  const Entry& e = entries_[slot];
  const Group& g = groups_[e.group];
  return (g.fixed != nullptr ? g.fixed : block + g.block_offset) + e.offset;
}

Tensor StagingPlan::host_tensor(size_t slot, std::byte* block, const Device& device) const {
  const Tensor& t = entries_[slot].tensor;
  return Tensor(host_data(slot, block), t.dtype(), t.shape(), device);
}

BackendContext host_context(const BackendContext& context) {
  BackendContext host = context;
  std::set<int> taken;
  for (const Device& d : context.devices) {
    if (!d.is_cuda()) taken.insert(d.index());
  }
  int next = 0;
  for (Device& d : host.devices) {
    if (!d.is_cuda()) continue;
    while (taken.count(next) != 0) ++next;
    d = Device::cpu(next);
    taken.insert(next);
  }
  return host;
}

namespace {

// Twins in CUDA's pinned host memory, copied on one stream per GPU and direction.
class CudaStaging final : public StagingDevice {
 public:
  bool stages(const Device& device) const override { return device.is_cuda(); }
  StatusOr<void*> allocate(size_t bytes) override { return gpu::allocate_pinned(bytes); }
  void free(void* host) noexcept override { gpu::free_pinned(host); }

  Status copy(const StagingPlan& plan, const std::vector<size_t>& slots, std::byte* block,
              bool to_host) override {
    gpu::CurrentDeviceGuard keep_callers_device;
    std::vector<std::pair<void*, int>> used;
    Status failed;
    for (size_t slot : slots) {
      const Tensor& d = plan.device_tensor(slot);
      const int device = d.device().index();
      auto stream = stream_of(device, to_host);
      if (!stream.ok()) {
        failed = stream.status();
        break;
      }
      if (failed = gpu::set_device(device); !failed.ok()) break;
      std::byte* host = plan.host_data(slot, block);
      failed =
          to_host ? gpu::copy_async(host, Device::cpu(), d.data(), d.device(), d.nbytes(), *stream)
                  : gpu::copy_async(d.data(), d.device(), host, Device::cpu(), d.nbytes(), *stream);
      if (std::find(used.begin(), used.end(), std::pair(*stream, device)) == used.end()) {
        used.emplace_back(*stream, device);
      }
      if (!failed.ok()) break;
    }
    // Whatever was queued is waited for, failure or not: the caller may free or reuse the buffers
    // once this returns.
    for (const auto& [stream, device] : used) {
      Status s = gpu::synchronize(stream, device);
      if (failed.ok()) failed = s;
    }
    return failed;
  }

 private:
  StatusOr<void*> stream_of(int device, bool to_host) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& streams = to_host ? to_host_ : to_device_;
    auto it = streams.find(device);
    if (it == streams.end()) {
      TRIBUTARY_ASSIGN_OR_RETURN(gpu::Stream s, gpu::Stream::create(device));
      it = streams.emplace(device, std::move(s)).first;
    }
    return it->second.get();
  }

  std::mutex mu_;
  std::map<int, gpu::Stream> to_host_;
  std::map<int, gpu::Stream> to_device_;
};

// Host blocks kept between calls, shared with the completions of the calls in flight (which may
// outlive the backend).
class Staging : public std::enable_shared_from_this<Staging> {
 public:
  // Free blocks kept for reuse; more are freed, the smallest first.
  static constexpr size_t kKeptBlocks = 4;
  static constexpr size_t kMinBlock = size_t{64} << 10;

  explicit Staging(std::shared_ptr<StagingDevice> device) : device_(std::move(device)) {}
  ~Staging() {
    for (const Block& b : free_) device_->free(b.data);
  }
  StagingDevice& device() { return *device_; }

  // A block of at least `bytes`, back in the pool when the last holder lets it go.
  StatusOr<std::shared_ptr<std::byte>> acquire(size_t bytes) {
    Block got{};
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->capacity >= bytes && (best == free_.end() || it->capacity < best->capacity)) {
          best = it;
        }
      }
      if (best != free_.end()) {
        got = *best;
        free_.erase(best);
      }
    }
    if (got.data == nullptr) {
      got.capacity = rounded(bytes);
      TRIBUTARY_ASSIGN_OR_RETURN(void* p, device_->allocate(got.capacity));
      got.data = static_cast<std::byte*>(p);
    }
    auto self = shared_from_this();
    return std::shared_ptr<std::byte>(got.data, [self, got](std::byte*) { self->give_back(got); });
  }

  // Memory of its own (a registration's twin), freed when the last holder lets it go.
  StatusOr<std::shared_ptr<std::byte>> dedicated(size_t bytes) {
    TRIBUTARY_ASSIGN_OR_RETURN(void* p, device_->allocate(bytes == 0 ? 1 : bytes));
    auto keep = device_;
    return std::shared_ptr<std::byte>(static_cast<std::byte*>(p),
                                      [keep](std::byte* q) { keep->free(q); });
  }

 private:
  struct Block {
    std::byte* data = nullptr;
    size_t capacity = 0;
  };

  // Powers of two up to 64 MiB, then multiples of 64 MiB: repeated calls of one size reuse a block.
  static size_t rounded(size_t bytes) {
    constexpr size_t kStep = size_t{64} << 20;
    if (bytes > kStep) return (bytes + kStep - 1) / kStep * kStep;
    size_t n = kMinBlock;
    while (n < bytes) n *= 2;
    return n;
  }

  void give_back(Block b) {
    Block evicted{};
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(b);
      if (free_.size() > kKeptBlocks) {
        auto smallest = std::min_element(
            free_.begin(), free_.end(),
            [](const Block& x, const Block& y) { return x.capacity < y.capacity; });
        evicted = *smallest;
        free_.erase(smallest);
      }
    }
    if (evicted.data != nullptr) device_->free(evicted.data);  // may synchronise: not under mu_
  }

  std::shared_ptr<StagingDevice> device_;
  std::mutex mu_;
  std::vector<Block> free_;
};

// One call's tensors as the host backend sees them: CPU tensors as they are, GPU tensors as their
// host twins; each relabelled with the host backend's device for it.
class StagedCall {
 public:
  explicit StagedCall(const StagingDevice& device) : device_(&device) {}
  size_t add(const Tensor& t, const Device& label, bool read, bool write,
             std::shared_ptr<std::byte> fixed = nullptr) {
    Item item{.tensor = t, .label = label};
    if (device_->stages(t.device())) {
      item.slot = plan_.add(t, read, write, fixed.get());
      if (fixed) keep_.push_back(std::move(fixed));
    }
    items_.push_back(item);
    return items_.size() - 1;
  }
  size_t layout() { return plan_.layout(); }
  bool stages() const { return !plan_.empty(); }
  Tensor host(size_t item, std::byte* block) const {
    const Item& it = items_[item];
    if (it.slot == kNone) {
      return Tensor(it.tensor.data(), it.tensor.dtype(), it.tensor.shape(), it.label);
    }
    return plan_.host_tensor(it.slot, block, it.label);
  }
  const StagingPlan& plan() const { return plan_; }

 private:
  static constexpr size_t kNone = ~size_t{0};
  struct Item {
    Tensor tensor;
    Device label;
    size_t slot = kNone;
  };
  const StagingDevice* device_;
  StagingPlan plan_;
  std::vector<Item> items_;
  std::vector<std::shared_ptr<std::byte>> keep_;  // registered twins this call uses
};

Capabilities with_gpu(Capabilities caps) {
  if (!caps.supports(DeviceType::kCuda)) caps.device_types.push_back(DeviceType::kCuda);
  return caps;
}

class HostStagedOps final : public CrossDeviceOps {
 public:
  HostStagedOps(BackendContext context, std::unique_ptr<CrossDeviceOps> inner,
                std::shared_ptr<StagingDevice> device)
      : CrossDeviceOps(inner->name(), std::move(context), inner->options(),
                       with_gpu(inner->capabilities())),
        inner_(std::move(inner)),
        staging_(std::make_shared<Staging>(std::move(device))) {
    leave_recording_to_members();
  }

  ~HostStagedOps() override {
    inner_.reset();       // completes what is in flight; the completions hold what they use
    registered_.clear();  // registration handles may outlive their backend
  }

 protected:
  Work all_reduce_impl(const CallInfo& call, ReduceOp op, const PerReplica<Tensor>& inputs,
                       const PerReplica<Tensor>& outputs) override {
    StagedCall c(staging_->device());
    const auto out = add_replicas(c, outputs, false, true, registered_for(outputs[0]));
    const auto in = add_replicas(c, inputs, true, false);
    return run(call, std::move(c), [&](const StagedCall& s, std::byte* block) {
      return inner_->all_reduce(op, host_replicas(s, in, block), host_replicas(s, out, block));
    });
  }

  Work reduce_impl(const CallInfo& call, ReduceOp op, const PerReplica<Tensor>& value,
                   const Mirrored<Tensor>& destinations) override {
    StagedCall c(staging_->device());
    const auto out = add_others(c, destinations.values(), registered_for(destinations[0]));
    const auto in = add_replicas(c, value, true, false);
    return run(call, std::move(c), [&](const StagedCall& s, std::byte* block) {
      return inner_->reduce(op, host_replicas(s, in, block),
                            Mirrored<Tensor>(host_values(s, out, block)));
    });
  }

  Work batch_reduce_impl(const CallInfo& call, ReduceOp op,
                         std::span<const ReducePair> pairs) override {
    StagedCall c(staging_->device());
    std::vector<std::pair<std::vector<size_t>, std::vector<size_t>>> items;
    for (const ReducePair& p : pairs) {
      // A registered destination runs on its twin, as in reduce: a backend that uses
      // registrations in batch_reduce (gloo, for a pack of one value) must see the same
      // registration on a rank that stages as on one that does not.
      auto out = add_others(c, p.destinations.values(),
                            p.destinations.empty() ? nullptr : registered_for(p.destinations[0]));
      items.emplace_back(add_replicas(c, p.value, true, false), std::move(out));
    }
    return run(call, std::move(c), [&](const StagedCall& s, std::byte* block) {
      std::vector<ReducePair> host;
      host.reserve(items.size());
      for (const auto& [in, out] : items) {
        host.push_back(ReducePair{.value = host_replicas(s, in, block),
                                  .destinations = Mirrored<Tensor>(host_values(s, out, block))});
      }
      return inner_->batch_reduce(op, host);
    });
  }

  Work broadcast_impl(const CallInfo& call, const Tensor& source,
                      const Mirrored<Tensor>& destinations, int root) override {
    StagedCall c(staging_->device());
    const auto out = add_others(c, destinations.values(), nullptr);
    // Off the root the source is ignored, so a GPU source is not staged there.
    const bool is_root = root == rank();
    const bool staged = is_root || !staging_->device().stages(source.device());
    const size_t src = c.add(staged ? source : Tensor(), label_of(source.device()), true, false);
    return run(call, std::move(c), [&](const StagedCall& s, std::byte* block) {
      return inner_->broadcast(s.host(src, block), Mirrored<Tensor>(host_values(s, out, block)),
                               root);
    });
  }

  Work all_gather_impl(const CallInfo& call, const PerReplica<Tensor>& inputs,
                       const PerReplica<Tensor>& outputs) override {
    StagedCall c(staging_->device());
    const auto out = add_replicas(c, outputs, false, true);
    const auto in = add_replicas(c, inputs, true, false);
    return run(call, std::move(c), [&](const StagedCall& s, std::byte* block) {
      return inner_->all_gather(host_replicas(s, in, block), host_replicas(s, out, block));
    });
  }

  Work reduce_scatter_impl(const CallInfo& call, ReduceOp op, const PerReplica<Tensor>& inputs,
                           const PerReplica<Tensor>& outputs) override {
    StagedCall c(staging_->device());
    const auto out = add_replicas(c, outputs, false, true);
    const auto in = add_replicas(c, inputs, true, false);
    return run(call, std::move(c), [&](const StagedCall& s, std::byte* block) {
      return inner_->reduce_scatter(op, host_replicas(s, in, block), host_replicas(s, out, block));
    });
  }

  // GPU buffers get twins of their own in pinned memory, registered with the host backend, so that
  // what it prepares for registered buffers (gloo's bound instances) serves them too.
  Status register_buffers_impl(const CallInfo& call, uint64_t id,
                               const PerReplica<Tensor>& buffers) override {
    (void)call;
    Registered r;
    r.buffers = buffers;
    std::vector<Tensor> host;
    for (size_t i = 0; i < buffers.size(); ++i) {
      const Tensor& b = buffers[i];
      std::shared_ptr<std::byte> twin;
      void* data = b.data();
      if (staging_->device().stages(b.device())) {
        auto p = staging_->dedicated(b.nbytes());
        if (!p.ok()) {
          inner_->abort(p.status());  // the peers are registering: tell them
          return p.status();
        }
        twin = std::move(p).value();
        data = twin.get();
      }
      host.emplace_back(data, b.dtype(), b.shape(), inner_->devices()[i]);
      r.twins.push_back(std::move(twin));
    }
    TRIBUTARY_ASSIGN_OR_RETURN(r.registration, inner_->register_buffers(PerReplica<Tensor>(host)));
    registered_.emplace(id, std::move(r));
    return Status();
  }

  void release_buffers_impl(uint64_t id) override { registered_.erase(id); }

  void abandon(const Status& why) override { inner_->abort(why); }
  // abort() from another thread: the inner backend's abort() wakes its call in flight.
  void interrupt(const Status& why) override { inner_->abort(why); }

 private:
  struct Registered {
    PerReplica<Tensor> buffers;
    std::vector<std::shared_ptr<std::byte>> twins;  // null for CPU buffers
    BufferRegistration registration;
  };

  static bool same(const Tensor& a, const Tensor& b) {
    return a.data() == b.data() && a.device() == b.device() && a.nbytes() == b.nbytes();
  }

  // The registration whose first buffer is `first_output`, if any.
  const Registered* registered_for(const Tensor& first_output) const {
    for (const auto& [id, r] : registered_) {
      if (same(r.buffers[0], first_output)) return &r;
    }
    return nullptr;
  }

  // Registration `reg`'s twin for tensor `i` of a call, when that tensor is its buffer `i`.
  static std::shared_ptr<std::byte> twin_of(const Registered* reg, size_t i, const Tensor& t) {
    if (reg == nullptr || i >= reg->buffers.size() || !same(reg->buffers[i], t)) return nullptr;
    return reg->twins[i];
  }

  // The host backend's device for `d`: the one of d's replica, else d itself when on the host.
  Device label_of(const Device& d) const {
    const auto& mine = devices();
    const auto at = std::find(mine.begin(), mine.end(), d);
    if (at != mine.end()) return inner_->devices()[static_cast<size_t>(at - mine.begin())];
    return d.is_cuda() ? inner_->devices()[0] : d;
  }

  std::vector<size_t> add_replicas(StagedCall& c, const PerReplica<Tensor>& values, bool read,
                                   bool write, const Registered* reg = nullptr) {
    std::vector<size_t> items;
    for (size_t i = 0; i < values.size(); ++i) {
      items.push_back(
          c.add(values[i], inner_->devices()[i], read, write, twin_of(reg, i, values[i])));
    }
    return items;
  }

  // Destinations (written), in any number and on any device.
  std::vector<size_t> add_others(StagedCall& c, const std::vector<Tensor>& values,
                                 const Registered* reg) {
    std::vector<size_t> items;
    for (size_t i = 0; i < values.size(); ++i) {
      items.push_back(
          c.add(values[i], label_of(values[i].device()), false, true, twin_of(reg, i, values[i])));
    }
    return items;
  }

  static std::vector<Tensor> host_values(const StagedCall& s, const std::vector<size_t>& items,
                                         std::byte* block) {
    std::vector<Tensor> out;
    out.reserve(items.size());
    for (size_t item : items) out.push_back(s.host(item, block));
    return out;
  }
  static PerReplica<Tensor> host_replicas(const StagedCall& s, const std::vector<size_t>& items,
                                          std::byte* block) {
    return PerReplica<Tensor>(host_values(s, items, block));
  }

  // Stages in, issues the host backend's call, and stages out when it completes.
  template <typename Issue>
  Work run(const CallInfo& call, StagedCall c, Issue issue) {
    const size_t bytes = c.layout();
    std::shared_ptr<std::byte> block;
    if (bytes > 0) {
      auto got = staging_->acquire(bytes);
      if (!got.ok()) return refuse(call, got.status());
      block = std::move(got).value();
    }
    if (Status s = staging_->device().copy(c.plan(), c.plan().reads(), block.get(),
                                           /*to_host=*/true);
        !s.ok()) {
      return refuse(call, s);
    }
    Work inner = issue(c, block.get());
    if (!c.stages()) return inner;
    Work outer;
    auto staging = staging_;
    auto staged = std::make_shared<StagedCall>(std::move(c));
    std::weak_ptr<CrossDeviceOps> backend = inner_;
    const std::string what = call.describe();
    inner.on_complete([staging, staged, block, outer, backend, what](const Status& done) mutable {
      Status s = done;
      if (s.ok() && !staged->plan().writes().empty()) {
        s = staging->device().copy(staged->plan(), staged->plan().writes(), block.get(),
                                   /*to_host=*/false);
        if (!s.ok()) {
          s = s.with_context(what + ": copying the results back to the GPUs");
          // The peers finished this collective, but this rank cannot go on: tell them now, rather
          // than let them wait out the timeout in the next one. (The host backends complete
          // their Work before returning, so this runs on the caller's thread.)
          if (auto b = backend.lock()) b->abort(s);
        }
      }
      block.reset();
      staged.reset();
      outer.complete(s);
    });
    return outer;
  }

  // This rank cannot take part (staging failed): the host backend's peers are told at once.
  Work refuse(const CallInfo& call, const Status& why) {
    Status s = why.with_context(call.describe() + ": staging GPU tensors through host memory");
    inner_->abort(s);
    return Work::completed(s);
  }

  std::shared_ptr<CrossDeviceOps> inner_;
  std::shared_ptr<Staging> staging_;
  std::map<uint64_t, Registered> registered_;
};

}  // namespace

std::shared_ptr<StagingDevice> cuda_staging() { return std::make_shared<CudaStaging>(); }

std::unique_ptr<CrossDeviceOps> make_host_staged_ops(const BackendContext& context,
                                                     std::unique_ptr<CrossDeviceOps> inner,
                                                     std::shared_ptr<StagingDevice> device) {
  return std::make_unique<HostStagedOps>(context, std::move(inner), std::move(device));
}

}  // namespace tributary::internal
