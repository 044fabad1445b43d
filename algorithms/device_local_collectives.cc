#include "algorithms/device_local_collectives.h"

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "algorithms/device_reduce.h"
#include "algorithms/local_collectives.h"
#include "core/gpu.h"

namespace tributary::algorithms {
namespace {

// One stream per GPU for the in-process collectives, made on first use and kept for the program's
// life (never destroyed: static destructors may run after the CUDA runtime has gone).
StatusOr<void*> stream_for(int device) {
  static std::mutex mu;
  static auto* streams = new std::map<int, gpu::Stream>();
  std::lock_guard lock(mu);
  auto it = streams->find(device);
  if (it == streams->end()) {
    TRIBUTARY_ASSIGN_OR_RETURN(gpu::Stream s, gpu::Stream::create(device));
    it = streams->emplace(device, std::move(s)).first;
  }
  return it->second.get();
}

bool same_memory_space(const Device& a, const Device& b) {
  if (a.is_cpu() || b.is_cpu()) return a.is_cpu() && b.is_cpu();
  return gpu::physical_device(a.index()) == gpu::physical_device(b.index());
}

// Whether a copy on a stream of `by` into `dst` writes another GPU's memory.
bool writes_another_gpu(const Device& dst, const Device& by) {
  return dst.is_cuda() && !same_memory_space(dst, by);
}

// What one synchronous call used: streams to wait for, scratch to free, events to keep alive.
class Session {
 public:
  ~Session() { (void)finish(); }

  StatusOr<void*> stream(const Device& d) {
    TRIBUTARY_ASSIGN_OR_RETURN(void* s, stream_for(d.index()));
    used_.insert(d.index());
    return s;
  }
  // Device scratch on `d`, ordered on `stream`.
  StatusOr<void*> scratch(size_t bytes, const Device& d, void* stream) {
    TRIBUTARY_ASSIGN_OR_RETURN(void* p, gpu::allocate_async(bytes, d.index(), stream));
    blocks_.push_back({p, d.index(), stream});
    return p;
  }
  // Makes `waiter` (a stream of GPU `waiter_device`) wait for what is queued on `s` so far.
  Status order(void* s, int s_device, void* waiter) {
    if (s == waiter) return Status();
    TRIBUTARY_ASSIGN_OR_RETURN(gpu::Event e, gpu::Event::create(s_device));
    TRIBUTARY_RETURN_IF_ERROR(e.record(s));
    TRIBUTARY_RETURN_IF_ERROR(e.block_stream(waiter));
    events_.push_back(std::move(e));
    return Status();
  }
  // Before `waiter` (a stream of another GPU) writes into GPU `d`'s memory: makes it wait for the
  // work pending on `d`, the caller's on `d`'s legacy default stream included (our stream of `d`
  // is an ordinary stream, so an event recorded there follows that work). Once per pair and call.
  // What the caller queues on `d` afterwards follows the write: every call returns only once its
  // streams are done (finish()).
  Status after_pending_on(const Device& d, void* waiter) {
    if (!ordered_.insert({d.index(), waiter}).second) return Status();
    TRIBUTARY_ASSIGN_OR_RETURN(void* theirs, stream(d));
    return order(theirs, d.index(), waiter);
  }
  // Frees the scratch (stream-ordered) and waits for every stream used.
  Status finish() {
    Status first;
    for (auto& b : blocks_) {
      Status s = gpu::free_async(b.ptr, b.device, b.stream);
      if (first.ok()) first = s;
    }
    blocks_.clear();
    for (int d : used_) {
      auto s = stream_for(d);
      Status r = s.ok() ? gpu::synchronize(*s, d) : s.status();
      if (first.ok()) first = r;
    }
    used_.clear();
    ordered_.clear();
    events_.clear();
    return first;
  }

 private:
  struct Block {
    void* ptr;
    int device;
    void* stream;
  };
  std::set<int> used_;
  std::set<std::pair<int, void*>> ordered_;  // after_pending_on()'s (device, waiter) pairs
  std::vector<Block> blocks_;
  std::vector<gpu::Event> events_;
};

// A host copy of `t` (for a reduction on the CPU).
StatusOr<Buffer> to_host(const Tensor& t, Session& session) {
  TRIBUTARY_ASSIGN_OR_RETURN(Buffer b, Buffer::allocate(t.dtype(), Shape{t.num_elements()}));
  TRIBUTARY_ASSIGN_OR_RETURN(void* s, session.stream(t.device()));
  TRIBUTARY_RETURN_IF_ERROR(gpu::copy_async(b.data(), Device::cpu(), t.data(), t.device(),
                                            t.nbytes(), s));
  return b;
}

}  // namespace

Status device_local_reduce(ReduceOp op, std::span<const Tensor> srcs, std::span<const Tensor> dsts,
                           int64_t mean_divisor, const Device& on) {
  if (srcs.empty()) return invalid_argument("local_reduce needs at least one source");
  const DType dtype = srcs[0].dtype();
  const int64_t count = srcs[0].num_elements();
  const size_t bytes = srcs[0].nbytes();
  if (count == 0 || dsts.empty()) return Status();
  gpu::CurrentDeviceGuard keep_callers_device;  // outlives the session
  Session session;
  if (on.is_cpu()) {
    // Reduce in host memory: stage GPU sources down, reduce, copy up to GPU destinations.
    std::vector<Buffer> staged;
    std::vector<Tensor> hsrcs;
    for (const Tensor& s : srcs) {
      if (s.device().is_cpu()) {
        hsrcs.push_back(s);
        continue;
      }
      TRIBUTARY_ASSIGN_OR_RETURN(Buffer b, to_host(s, session));
      hsrcs.push_back(b.tensor());
      staged.push_back(std::move(b));
    }
    TRIBUTARY_RETURN_IF_ERROR(session.finish());
    std::vector<Tensor> hdsts;
    for (const Tensor& d : dsts) {
      if (d.device().is_cpu()) hdsts.push_back(d);
    }
    TRIBUTARY_ASSIGN_OR_RETURN(Buffer result, Buffer::allocate(dtype, Shape{count}));
    if (hdsts.size() < dsts.size()) hdsts.push_back(result.tensor());
    TRIBUTARY_RETURN_IF_ERROR(local_reduce(op, hsrcs, hdsts, mean_divisor));
    const Tensor& from = hdsts.back();
    for (const Tensor& d : dsts) {
      if (d.device().is_cpu()) continue;
      TRIBUTARY_ASSIGN_OR_RETURN(void* s, session.stream(d.device()));
      TRIBUTARY_RETURN_IF_ERROR(
          gpu::copy_async(d.data(), d.device(), from.data(), Device::cpu(), bytes, s));
    }
    return session.finish();
  }
  // Reduce on GPU `on`: sources in its memory are read where they are, others are copied there
  // first (each on its own GPU's stream, so that the caller's work on that GPU comes first).
  TRIBUTARY_ASSIGN_OR_RETURN(void* main, session.stream(on));
  std::vector<const void*> dsrcs;
  for (const Tensor& s : srcs) {
    if (same_memory_space(s.device(), on)) {
      dsrcs.push_back(s.data());
      continue;
    }
    TRIBUTARY_ASSIGN_OR_RETURN(void* copy, session.scratch(bytes, on, main));
    if (s.device().is_cpu()) {
      TRIBUTARY_RETURN_IF_ERROR(gpu::copy_async(copy, on, s.data(), s.device(), bytes, main));
    } else {
      TRIBUTARY_ASSIGN_OR_RETURN(void* theirs, session.stream(s.device()));
      // The scratch exists in `main`'s order: let their stream see it before writing into it.
      TRIBUTARY_RETURN_IF_ERROR(session.order(main, on.index(), theirs));
      TRIBUTARY_RETURN_IF_ERROR(gpu::copy_async(copy, on, s.data(), s.device(), bytes, theirs));
      TRIBUTARY_RETURN_IF_ERROR(session.order(theirs, s.device().index(), main));
    }
    dsrcs.push_back(copy);
  }
  // Destinations in `on`'s memory are written by the kernel; the rest get copies of the first.
  std::vector<void*> ddsts;
  for (const Tensor& d : dsts) {
    if (same_memory_space(d.device(), on)) ddsts.push_back(d.data());
  }
  if (ddsts.empty()) {
    TRIBUTARY_ASSIGN_OR_RETURN(void* result, session.scratch(bytes, on, main));
    ddsts.push_back(result);
  }
  // A destination that is another replica's source is rewritten only after every read: the
  // copies above read their sources before the kernel runs, on `main`'s order. The kernel's device
  // is made current here, so that device_reduce() has no device of the caller's to switch back to
  // (one the thread never chose would get a context; the guard above restores the caller's).
  TRIBUTARY_RETURN_IF_ERROR(gpu::set_device(on.index()));
  TRIBUTARY_RETURN_IF_ERROR(device_reduce(op, dtype, dsrcs, ddsts, static_cast<size_t>(count),
                                          mean_divisor, gpu::physical_device(on.index()), main));
  for (const Tensor& d : dsts) {
    if (same_memory_space(d.device(), on)) continue;
    if (writes_another_gpu(d.device(), on)) {
      TRIBUTARY_RETURN_IF_ERROR(session.after_pending_on(d.device(), main));
    }
    TRIBUTARY_RETURN_IF_ERROR(gpu::copy_async(d.data(), d.device(), ddsts[0], on, bytes, main));
  }
  return session.finish();
}

Status device_local_copy(const Tensor& src, std::span<const Tensor> dsts) {
  const size_t bytes = src.nbytes();
  if (bytes == 0) return Status();
  gpu::CurrentDeviceGuard keep_callers_device;  // outlives the session
  Session session;
  for (const Tensor& d : dsts) {
    if (d.data() == src.data()) continue;
    // On the source's GPU when it has one (after the caller's work there), else the destination's;
    // a write into another GPU waits for the work pending there.
    const Device& by = src.device().is_cuda() ? src.device() : d.device();
    TRIBUTARY_ASSIGN_OR_RETURN(void* s, session.stream(by));
    if (writes_another_gpu(d.device(), by)) {
      TRIBUTARY_RETURN_IF_ERROR(session.after_pending_on(d.device(), s));
    }
    TRIBUTARY_RETURN_IF_ERROR(gpu::copy_async(d.data(), d.device(), src.data(), src.device(),
                                              bytes, s));
  }
  return session.finish();
}

Status device_local_all_gather(std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  gpu::CurrentDeviceGuard keep_callers_device;  // outlives the session
  Session session;
  for (const Tensor& out : outputs) {
    for (size_t j = 0; j < inputs.size(); ++j) {
      const int64_t count = inputs[j].num_elements();
      Tensor slot = out.slice(static_cast<int64_t>(j) * count, count);
      if (count == 0 || slot.data() == inputs[j].data()) continue;
      const Device& by = inputs[j].device().is_cuda() ? inputs[j].device() : out.device();
      TRIBUTARY_ASSIGN_OR_RETURN(void* s, session.stream(by));
      if (writes_another_gpu(out.device(), by)) {
        TRIBUTARY_RETURN_IF_ERROR(session.after_pending_on(out.device(), s));
      }
      TRIBUTARY_RETURN_IF_ERROR(gpu::copy_async(slot.data(), out.device(), inputs[j].data(),
                                                inputs[j].device(), inputs[j].nbytes(), s));
    }
  }
  return session.finish();
}

}  // namespace tributary::algorithms
