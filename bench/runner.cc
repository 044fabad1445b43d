// tributary-bench's measuring loop (see runner.h).
#include "bench/runner.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/lines.h"

namespace tributary::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Small integers whose reduction is exact in every dtype and any order (nccl-tests does the same).
double check_value(ReduceOp op, int replica, int64_t i) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean:
      return static_cast<double>((i + 2 * replica) % 3);
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      return static_cast<double>((i * 3 + replica * 5) % 7);
    case ReduceOp::kProd:
      return (i + replica) % 8 == 0 ? 2.0 : 1.0;
  }
  return 0;
}

double expected_value(ReduceOp op, DType dtype, int n, int64_t i) {
  double acc = check_value(op, 0, i);
  for (int r = 1; r < n; ++r) {
    double v = check_value(op, r, i);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMean:
        acc += v;
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
      case ReduceOp::kProd:
        acc *= v;
        break;
    }
  }
  if (op == ReduceOp::kMean) {
    acc /= n;
    if (!dtype_is_floating(dtype)) acc = std::trunc(acc);
  }
  return dtype_round(dtype, acc);
}

struct Replica {
  Buffer in, out;
  Buffer host;  // GPU runs: the host side of fills and checks
};

// Copies between a host tensor and a device one (synchronous), whole or the first `bytes`.
Status copy_tensor(const Tensor& dst, const Tensor& src, size_t bytes) {
  const Device& gpu = dst.device().is_cuda() ? dst.device() : src.device();
  TRIBUTARY_ASSIGN_OR_RETURN(Allocator * a, allocator_for(gpu));
  return a->copy(dst.data(), dst.device(), src.data(), src.device(), bytes);
}
Status upload(const Tensor& host, const Tensor& device) {
  return copy_tensor(device, host, device.nbytes());
}

}  // namespace

class Runner::Impl {
 public:
  const BackendContext& context() const { return ctx_; }
  Impl(const BenchOptions& o, std::vector<uint64_t> sizes) : o_(o), sizes_(std::move(sizes)) {}

  Status setup(Report* report) {
    std::vector<Device> devices;
    for (int r = 0; r < o_.replicas; ++r) {
      devices.push_back(o_.gpus > 0 ? Device::cuda(r) : Device::cpu(r));
    }
    TRIBUTARY_ASSIGN_OR_RETURN(Config config, Config::load());
    // One process, or one rank of several (under tributary-run, TF_CONFIG, torchrun, Slurm...).
    // The longest timeout= among the specs bounds the rendezvous too.
    TRIBUTARY_ASSIGN_OR_RETURN(ctx_,
                               make_backend_context(devices, config, spec_timeout(o_.backends)));
    report->processes = ctx_.world_size;
    report->rank = ctx_.rank;
    BackendRegistry registry = builtin_backends();
    std::vector<std::string> specs = o_.backends;
    if (specs.empty()) {
      // The default: every backend that serves this layout (in-process ones for one process);
      // across processes ring also over TCP, so that the same-host path's gain shows beside it.
      // On GPUs: every backend that serves GPUs (nccl serves one process too).
      for (const BackendInfo& b : registry.backends()) {
        if (o_.gpus > 0) {
          if (b.capabilities.supports(DeviceType::kCuda) &&
              (b.capabilities.multi_process || ctx_.world_size == 1)) {
            specs.push_back(b.name);
          }
          continue;
        }
        if (b.capabilities.multi_process == (ctx_.world_size > 1)) specs.push_back(b.name);
        if (b.name == "ring" && ctx_.world_size > 1) specs.push_back("ring:intra_host=net");
      }
    }
    std::vector<std::string> references = o_.references;
    if (references.empty() && o_.backends.empty()) {
      references = default_references(ctx_.world_size, o_.gpus > 0);
    }
    if (references == std::vector<std::string>{"none"}) references.clear();
    int usable = 0;
    std::string last_error;
    const auto add = [&](const std::string& spec, bool reference) {
      BackendResult result;
      result.requested = spec;
      result.spec = spec;
      result.reference = reference;
      result.processes = ctx_.world_size;
      result.replicas = o_.replicas;
      std::unique_ptr<Line> line;
      if (reference) {
        auto parsed = BackendSpec::parse(spec);
        auto made = parsed.ok() ? reference_line(*parsed, ctx_, o_.dtype, o_.op)
                                : StatusOr<std::unique_ptr<Line>>(parsed.status());
        if (made.ok()) {
          line = std::move(made).value();
          result.spec = line->spec();
        } else {
          result.skipped = made.status().message();
        }
      } else {
        auto made = registry.create(spec, ctx_);
        if (!made.ok()) {
          result.skipped = made.status().message();
        } else {
          result.spec = (*made)->spec();
          const Capabilities& caps = (*made)->capabilities();
          if (!caps.supports(Collective::kAllReduce) || !caps.supports(o_.dtype) ||
              !caps.supports(o_.op)) {
            result.skipped = "it cannot all_reduce " + std::string(dtype_name(o_.dtype)) + " " +
                             std::string(reduce_op_name(o_.op)) + " (" + caps.to_string() + ")";
          } else {
            line = backend_line(std::move(made).value());
            if (!agreement_) agreement_ = line->backend();
          }
        }
      }
      if (result.skipped.empty()) {
        ++usable;
      } else {
        last_error = result.spec + ": " + result.skipped;
      }
      lines_.push_back(std::move(line));
      report->results.push_back(std::move(result));
    };
    for (const std::string& spec : specs) add(spec, false);
    for (const std::string& spec : references) add(spec, true);
    if (usable == 0) {
      return specs.size() + references.size() == 1
                 ? invalid_argument(last_error)
                 : invalid_argument("no backend can run this benchmark; last: " + last_error);
    }
    if (!agreement_ && ctx_.world_size > 1) {
      // The ranks agree on iteration counts and figures through a backend; references only.
      TRIBUTARY_ASSIGN_OR_RETURN(agreement_owned_, registry.create("auto", ctx_));
      agreement_ = agreement_owned_.get();
    }
    const uint64_t max_bytes = sizes_.back();
    const int64_t max_count = static_cast<int64_t>(max_bytes / dtype_size(o_.dtype));
    for (int r = 0; r < o_.replicas; ++r) {
      Replica rep;
      TRIBUTARY_ASSIGN_OR_RETURN(rep.in,
                                 Buffer::allocate(o_.dtype, Shape{max_count}, ctx_.devices[r]));
      TRIBUTARY_ASSIGN_OR_RETURN(rep.out,
                                 Buffer::allocate(o_.dtype, Shape{max_count}, ctx_.devices[r]));
      if (o_.gpus > 0) {
        // Device buffers are written and read through a host copy (fill, check).
        TRIBUTARY_ASSIGN_OR_RETURN(rep.host, Buffer::allocate(o_.dtype, Shape{max_count}));
        std::memset(rep.host.data(), 0, rep.host.nbytes());
        TRIBUTARY_RETURN_IF_ERROR(upload(rep.host.tensor(), rep.in.tensor()));
        TRIBUTARY_RETURN_IF_ERROR(upload(rep.host.tensor(), rep.out.tensor()));
      } else {
        std::memset(rep.in.data(), 0, rep.in.nbytes());  // touch every page before timing
        std::memset(rep.out.data(), 0, rep.out.nbytes());
      }
      replicas_.push_back(std::move(rep));
    }
    return Status();
  }

  // Sizes outer, backends inner: drift on a noisy machine hits every backend alike.
  Status run(Report* report) {
    const bool progress = !o_.quiet && ctx_.rank == 0 && isatty(STDERR_FILENO);
    for (size_t si = 0; si < sizes_.size(); ++si) {
      for (size_t bi = 0; bi < lines_.size(); ++bi) {
        if (!lines_[bi]) continue;
        if (progress) {
          std::fprintf(stderr, "\r\033[K[%zu/%zu] %s  %s (%zu/%zu sizes)", bi + 1, lines_.size(),
                       lines_[bi]->spec().c_str(), format_size(sizes_[si]).c_str(), si + 1,
                       sizes_.size());
        }
        Row row;
        TRIBUTARY_RETURN_IF_ERROR(measure(*lines_[bi], sizes_[si], &row));
        report->results[bi].rows.push_back(row);
      }
    }
    if (progress) std::fprintf(stderr, "\r\033[K");
    return Status();
  }

 private:
  PerReplica<Tensor> views(int64_t count, bool out) const {
    PerReplica<Tensor> v;
    for (const Replica& r : replicas_)
      v.values().push_back((out ? r.out : r.in).tensor().slice(0, count));
    return v;
  }

  Status fill(int64_t count) {
    for (int r = 0; r < o_.replicas; ++r) {
      const Replica& rep = replicas_[static_cast<size_t>(r)];
      void* p = o_.gpus > 0 ? rep.host.data() : rep.in.data();
      const int global = ctx_.rank * o_.replicas + r;
      for (int64_t i = 0; i < count; ++i)
        dtype_store(o_.dtype, p, i, check_value(o_.op, global, i));
      if (o_.gpus > 0) {
        TRIBUTARY_RETURN_IF_ERROR(copy_tensor(rep.in.tensor(), rep.host.tensor(),
                                              static_cast<size_t>(count) * dtype_size(o_.dtype)));
      }
    }
    return Status();
  }

  Status timed(Line& line, const PerReplica<Tensor>& in, const PerReplica<Tensor>& out, int iters,
               double* seconds) {
    const auto wait_for = std::chrono::duration_cast<std::chrono::milliseconds>(timeout_);
    auto start = Clock::now();
    for (int i = 0; i < iters; ++i) {
      Status s = line.enqueue(o_.op, in, out, wait_for);
      if (!s.ok()) return s.with_context(line.spec());
    }
    if (Status s = line.drain(wait_for); !s.ok()) return s.with_context(line.spec());
    *seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return Status();
  }

  // The same value on every rank: max (times, iteration counts) or sum (wrong elements), through
  // the backend under test itself.
  StatusOr<double> agree(double value, ReduceOp op) {
    if (!agreement_ || ctx_.world_size == 1) return value;
    CrossDeviceOps& ops = *agreement_;
    std::vector<double> v(static_cast<size_t>(ops.num_local_replicas()),
                          op == ReduceOp::kSum ? 0.0 : value);
    v[0] = value;
    PerReplica<Tensor> views;
    for (size_t i = 0; i < v.size(); ++i) {
      views.values().emplace_back(&v[i], DType::kFloat64, int64_t{1}, ops.devices()[i]);
    }
    Status s = ops.all_reduce(op, views, views).wait();
    if (!s.ok()) return s.with_context(ops.spec() + ": agreeing on the figures across ranks");
    return v[0];
  }

  Status measure(Line& line, uint64_t bytes, Row* row) {
    const int64_t count = static_cast<int64_t>(bytes / dtype_size(o_.dtype));
    row->bytes = bytes;
    row->count = count;
    const int n = line.num_replicas_in_sync();
    for (int k = o_.in_place_only ? 1 : 0; k < 2; ++k) {
      const bool in_place = k == 1;
      PerReplica<Tensor> in = views(count, false);
      PerReplica<Tensor> out = in_place ? in : views(count, true);
      TRIBUTARY_RETURN_IF_ERROR(fill(count));
      double seconds = 0;
      TRIBUTARY_RETURN_IF_ERROR(timed(line, in, out, o_.warmup_iters, &seconds));
      int iters = o_.iters;
      if (o_.target_seconds > 0) {
        // Size the count from a short probe so that each size takes about the target time.
        TRIBUTARY_RETURN_IF_ERROR(timed(line, in, out, 3, &seconds));
        iters =
            static_cast<int>(std::clamp(o_.target_seconds / std::max(seconds / 3, 1e-9), 5.0, 1e6));
        TRIBUTARY_ASSIGN_OR_RETURN(double agreed, agree(iters, ReduceOp::kMax));
        iters = static_cast<int>(agreed);
      }
      TRIBUTARY_RETURN_IF_ERROR(timed(line, in, out, iters, &seconds));
      // nccl-tests reports the slowest rank's time.
      TRIBUTARY_ASSIGN_OR_RETURN(seconds, agree(seconds, ReduceOp::kMax));
      row->iters = iters;
      const double t = seconds / iters;
      row->time_us[k] = t * 1e6;
      row->algbw[k] = t > 0 ? static_cast<double>(bytes) / t / 1e9 : 0;
      row->busbw[k] = row->algbw[k] * bus_factor(n);
      if (o_.check) {
        TRIBUTARY_RETURN_IF_ERROR(fill(count));
        for (size_t r = 0; r < out.size() && !in_place; ++r) {
          const Tensor& t2 = out[r];
          if (o_.gpus == 0) {
            std::memset(t2.data(), 0x5a, t2.nbytes());
          } else {
            const Tensor& host = replicas_[r].host.tensor();
            std::memset(host.data(), 0x5a, t2.nbytes());
            TRIBUTARY_RETURN_IF_ERROR(copy_tensor(t2, host, t2.nbytes()));
          }
        }
        Status s = line.all_reduce(o_.op, in, out, std::chrono::duration_cast<std::chrono::milliseconds>(timeout_));
        if (!s.ok()) return s.with_context(line.spec());
        int64_t wrong = 0;
        for (size_t r = 0; r < out.size(); ++r) {
          const Tensor& t2 = out[r];
          const void* data = t2.data();
          if (o_.gpus > 0) {
            const Tensor& host = replicas_[r].host.tensor();
            TRIBUTARY_RETURN_IF_ERROR(copy_tensor(host, t2, t2.nbytes()));
            data = host.data();
          }
          for (int64_t i = 0; i < count; ++i) {
            wrong += dtype_load(o_.dtype, data, i) != expected_value(o_.op, o_.dtype, n, i);
          }
        }
        TRIBUTARY_ASSIGN_OR_RETURN(double total,
                                   agree(static_cast<double>(wrong), ReduceOp::kSum));
        row->wrong[k] = static_cast<int64_t>(total);
      }
    }
    return Status();
  }

  const BenchOptions& o_;
  std::vector<uint64_t> sizes_;
  BackendContext ctx_;
  std::vector<std::unique_ptr<Line>> lines_;  // null where skipped
  // The backend through which ranks agree on counts and figures (a measured one, or its own).
  CrossDeviceOps* agreement_ = nullptr;
  std::unique_ptr<CrossDeviceOps> agreement_owned_;
  std::chrono::nanoseconds timeout_ = std::chrono::minutes(5);
  std::vector<Replica> replicas_;
};


Runner::Runner(const BenchOptions& o, std::vector<uint64_t> sizes)
    : impl_(std::make_unique<Impl>(o, std::move(sizes))) {}
Runner::~Runner() = default;
Status Runner::setup(Report* report) { return impl_->setup(report); }
Status Runner::run(Report* report) { return impl_->run(report); }
const BackendContext& Runner::context() const { return impl_->context(); }

bool launched_as_rank() {
  auto config = Config::load();
  if (!config.ok()) return false;
  auto cluster = resolve_cluster_spec(*config);
  return cluster.ok() && cluster->world_size > 1;
}

// Runs this benchmark again as `np` ranks under tributary-run (found next to this binary).
int relaunch(const char* tool, int np, int argc, char** argv) {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return fail(tool, "cannot find this executable to relaunch it under tributary-run", 1);
  self[n] = '\0';
  const std::string dir = std::string(self).substr(0, std::string(self).rfind('/'));
  std::string launcher;
  for (const std::string& candidate : {dir + "/tributary-run", dir + "/../tools/tributary-run"}) {
    if (access(candidate.c_str(), X_OK) == 0) {
      launcher = candidate;
      break;
    }
  }
  if (launcher.empty()) {
    return fail(tool, "--np " + std::to_string(np) + " needs tributary-run next to " + std::string(tool) + " (" +
                    dir + "); or start the ranks yourself with any launcher or TF_CONFIG",
                2);
  }
  std::vector<std::string> args = {launcher, "-n", std::to_string(np), "--no-prefix", "--", self};
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--np") {
      ++i;  // and its value
      continue;
    }
    if (a.starts_with("--np=")) continue;
    args.emplace_back(a);
  }
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  std::fflush(stdout);
  execv(launcher.c_str(), cargs.data());
  return fail(tool, "cannot run " + launcher + ": " + std::strerror(errno), 1);
}

int fail(const char* tool, const std::string& message, int code) {
  std::fprintf(stderr, "%s: %s\n", tool, message.c_str());
  return code;
}


}  // namespace tributary::bench
