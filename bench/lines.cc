// tributary-bench's lines: a backend, or a reference (see lines.h).
#include "bench/lines.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "core/cpus.h"

namespace tributary::bench {
namespace {

class BackendLine final : public Line {
 public:
  explicit BackendLine(std::unique_ptr<CrossDeviceOps> ops) : ops_(std::move(ops)) {
    // GPU replicas on a host backend are staged through host memory, and its Works complete on the
    // host: issuing them all before one wait would hold one staging block per call in flight.
    const BackendRegistry registry = builtin_backends();
    const BackendInfo* info = registry.find(ops_->name());
    completes_on_device_ = ops_->devices()[0].is_cuda() &&
                           !(info != nullptr && stages_gpu_through_host(*info));
  }
  std::string spec() const override { return ops_->spec(); }
  bool reference() const override { return false; }
  int num_replicas_in_sync() const override { return ops_->num_replicas_in_sync(); }
  Status all_reduce(ReduceOp op, const PerReplica<Tensor>& inputs,
                    const PerReplica<Tensor>& outputs,
                    std::chrono::milliseconds) override {
    // The backend's own timeout (its spec's timeout=, else TRIBUTARY_TIMEOUT).
    return ops_->all_reduce(op, inputs, outputs).wait();
  }
  Status enqueue(ReduceOp op, const PerReplica<Tensor>& inputs, const PerReplica<Tensor>& outputs,
                 std::chrono::milliseconds timeout) override {
    if (!completes_on_device_) return all_reduce(op, inputs, outputs, timeout);
    // On GPUs the Work completes on the device: keep issuing, wait once (drain).
    Work w = ops_->all_reduce(op, inputs, outputs);
    // A refusal or an error found at issue (error() reads no device state, unlike test()).
    if (Status s = w.error(); !s.ok()) return s;
    in_flight_.push_back(std::move(w));
    return Status();
  }
  Status drain(std::chrono::milliseconds) override {
    Status first;
    for (const Work& w : in_flight_) {
      Status s = w.wait();
      if (first.ok()) first = s;
    }
    in_flight_.clear();
    return first;
  }
  CrossDeviceOps* backend() override { return ops_.get(); }

 private:
  std::unique_ptr<CrossDeviceOps> ops_;
  bool completes_on_device_ = false;
  std::vector<Work> in_flight_;
};

// The in-process yardstick: a plain two-pass reduction (sum into the first output, block by block,
// then copy that block to the other outputs while it is in cache), the element range split evenly
// across `threads` threads that wait on a condition variable between calls.
template <typename T>
class Yardstick final : public Line {
 public:
  Yardstick(std::string spec, int replicas, int threads)
      : spec_(std::move(spec)), replicas_(replicas) {
    for (int t = 1; t < threads; ++t) pool_.emplace_back([this, t] { worker(t); });
    threads_ = threads;
  }
  ~Yardstick() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : pool_) t.join();
  }

  std::string spec() const override { return spec_; }
  bool reference() const override { return true; }
  int num_replicas_in_sync() const override { return replicas_; }

  Status all_reduce(ReduceOp, const PerReplica<Tensor>& inputs, const PerReplica<Tensor>& outputs,
                    std::chrono::milliseconds) override {
    in_.clear();
    out_.clear();
    for (const Tensor& t : inputs.values()) in_.push_back(static_cast<const T*>(t.data()));
    for (const Tensor& t : outputs.values()) out_.push_back(static_cast<T*>(t.data()));
    count_ = static_cast<size_t>(inputs[0].num_elements());
    const size_t total_bytes = count_ * sizeof(T) * in_.size();
    if (threads_ == 1 || total_bytes < (size_t{1} << 20)) {
      range(0, count_);
      return Status();
    }
    {
      std::lock_guard lock(mu_);
      ++generation_;
      pending_ = threads_ - 1;
    }
    cv_.notify_all();
    part(0);
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    return Status();
  }

 private:
  void part(int t) {
    const size_t per = (count_ / static_cast<size_t>(threads_) + 1023) / 1024 * 1024;
    const size_t lo = std::min(count_, per * static_cast<size_t>(t));
    const size_t hi = t + 1 == threads_ ? count_ : std::min(count_, lo + per);
    range(lo, hi);
  }

  void range(size_t lo, size_t hi) {
    constexpr size_t kBlock = 16384 / sizeof(T);  // 16 KiB of each input: stays in L1/L2
    for (size_t b = lo; b < hi; b += kBlock) {
      const size_t e = std::min(hi, b + kBlock);
      T* dst = out_[0];
      const T* a = in_[0];
      const T* c = in_[1 % in_.size()];
      if (in_.size() == 1) {
        if (dst != a) std::memcpy(dst + b, a + b, (e - b) * sizeof(T));
      } else {
        for (size_t i = b; i < e; ++i) dst[i] = a[i] + c[i];
        for (size_t k = 2; k < in_.size(); ++k) {
          const T* x = in_[k];
          for (size_t i = b; i < e; ++i) dst[i] += x[i];
        }
      }
      for (size_t k = 1; k < out_.size(); ++k) {
        std::memcpy(out_[k] + b, dst + b, (e - b) * sizeof(T));
      }
    }
  }

  void worker(int t) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      part(t);
      std::lock_guard lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }

  std::string spec_;
  int replicas_;
  int threads_ = 1;
  std::vector<const T*> in_;
  std::vector<T*> out_;
  size_t count_ = 0;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<std::thread> pool_;
};

StatusOr<std::unique_ptr<Line>> yardstick(const BackendSpec& spec, const BackendContext& context,
                                          DType dtype, ReduceOp op) {
  if (context.world_size > 1) return invalid_argument("it is for one process (no --np)");
  if (op != ReduceOp::kSum || (dtype != DType::kFloat32 && dtype != DType::kFloat64)) {
    return invalid_argument("it measures float32 and float64 sum only");
  }
  int threads = tributary::internal::usable_cpus();
  for (const auto& [key, value] : spec.options) {
    if (key != "threads") return invalid_argument("unknown option '" + key + "' (threads)");
    char* end = nullptr;
    const long n = std::strtol(value.c_str(), &end, 10);
    if (value.empty() || *end || n < 1 || n > 1024) {
      return invalid_argument("threads is an integer from 1 to 1024, not '" + value + "'");
    }
    threads = static_cast<int>(n);
  }
  const std::string name = "yardstick:threads=" + std::to_string(threads);
  const int replicas = static_cast<int>(context.devices.size());
  if (dtype == DType::kFloat64) {
    return std::unique_ptr<Line>(new Yardstick<double>(name, replicas, threads));
  }
  return std::unique_ptr<Line>(new Yardstick<float>(name, replicas, threads));
}

}  // namespace

std::unique_ptr<Line> backend_line(std::unique_ptr<CrossDeviceOps> ops) {
  return std::make_unique<BackendLine>(std::move(ops));
}

StatusOr<std::unique_ptr<Line>> reference_line(const BackendSpec& spec,
                                               const BackendContext& context, DType dtype,
                                               ReduceOp op) {
  if (spec.name == "yardstick") return yardstick(spec, context, dtype, op);
  if (spec.name == "gloo") return internal::gloo_reference(spec, context, dtype, op);
  if (spec.name == "nccl") return internal::nccl_reference(spec, context, dtype, op);
  if (spec.name == "tcp") return internal::tcp_reference(spec, context);
  return invalid_argument("unknown reference '" + spec.name + "' (yardstick, gloo, nccl, tcp)");
}

std::vector<std::string> default_references(int world_size, bool gpus) {
  if (gpus) return nccl_reference_built() ? std::vector<std::string>{"nccl"} : std::vector<std::string>{};
  if (world_size == 1) return {"yardstick"};
  if (gloo_reference_built()) return {"gloo"};
  return {};
}

}  // namespace tributary::bench
