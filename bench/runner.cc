// tributary-bench's measuring loop (see runner.h).
#include "bench/runner.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/lines.h"
#include "tributary/store.h"

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

// One dtype and op of the -d/-o lists.
struct Pair {
  DType dtype;
  ReduceOp op;
  std::string name() const {
    return std::string(dtype_name(dtype)) + " " + std::string(reduce_op_name(op));
  }
};

// A line of the report: a backend serves every pair it supports with one instance; a reference is
// made per pair (its dtype and op are fixed when it is made).
struct Slot {
  std::unique_ptr<Line> shared;
  std::vector<std::unique_ptr<Line>> per_pair;  // null where it cannot run
  std::vector<bool> runs;                       // per pair
  Line* line(size_t p) const {
    if (!runs[p]) return nullptr;
    return shared ? shared.get() : per_pair[p].get();
  }
};

class Runner::Impl {
 public:
  const BackendContext& context() const { return ctx_; }
  explicit Impl(const BenchOptions& o) : o_(o) {
    for (DType d : o.dtypes) {
      for (ReduceOp op : o.ops) pairs_.push_back({d, op});
    }
    if (o.timeout.count() > 0) timeout_ = o.timeout;
  }

  Status setup(Report* report) {
    uint64_t max_bytes = 0;
    for (DType d : o_.dtypes) {
      TRIBUTARY_ASSIGN_OR_RETURN(std::vector<uint64_t> sizes, bench_sizes(o_, d));
      max_bytes = std::max(max_bytes, sizes.back());
      sizes_.push_back(std::move(sizes));
    }
    std::vector<Device> devices;
    for (int r = 0; r < o_.replicas; ++r) {
      devices.push_back(o_.gpus > 0 ? Device::cuda(r) : Device::cpu(r));
    }
    TRIBUTARY_ASSIGN_OR_RETURN(Config config, Config::load());
    if (o_.timeout.count() > 0) {
      // -T bounds every backend's collectives and the rendezvous, as TRIBUTARY_TIMEOUT does (a
      // spec's own timeout= still wins for that backend).
      config.set("TRIBUTARY_TIMEOUT", std::to_string(o_.timeout.count()) + "ms", "-T/--timeout");
    }
    // Every spec checked before the rendezvous (registry.h): a misspelt name or option ends every
    // rank at once. Found when the line is made, it would end rank 0 alone, and with it the store
    // that the other ranks wait to reach.
    {
      const BackendRegistry registry = builtin_backends();
      for (const std::string& spec : o_.backends) {
        // Ranks with other settings (their environment) fail at once, told by this one.
        TRIBUTARY_RETURN_IF_ERROR(registry.check_everywhere(spec, config, devices));
      }
    }
    // One process, or one rank of several (under tributary-run, TF_CONFIG, torchrun, Slurm...).
    // The longest timeout= among the specs bounds the rendezvous too.
    TRIBUTARY_ASSIGN_OR_RETURN(ctx_,
                               make_backend_context(devices, config, spec_timeout(o_.backends)));
    report->processes = ctx_.world_size;
    report->rank = ctx_.rank;
    TRIBUTARY_RETURN_IF_ERROR(make_lines(report));
    for (int r = 0; r < o_.replicas; ++r) {
      Replica rep;
      const Shape shape{static_cast<int64_t>(max_bytes)};
      // -R 2 (CPU): memory the other processes of the host can map, as nccl-tests' -R 2 takes
      // its buffers from ncclMemAlloc.
      auto allocate = [&]() -> StatusOr<Buffer> {
        if (o_.local_register == 2 && ctx_.devices[r].is_cpu()) {
          return Buffer::allocate_shareable(DType::kUInt8, shape, ctx_.devices[r]);
        }
        return Buffer::allocate(DType::kUInt8, shape, ctx_.devices[r]);
      };
      TRIBUTARY_ASSIGN_OR_RETURN(rep.in, allocate());
      TRIBUTARY_ASSIGN_OR_RETURN(rep.out, allocate());
      if (o_.gpus > 0) {
        // Device buffers are written and read through a host copy (fill, check).
        TRIBUTARY_ASSIGN_OR_RETURN(rep.host, Buffer::allocate(DType::kUInt8, shape));
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

  // Pairs outer (as nccl-tests loops over -d all / -o all), then sizes, lines inner: drift on a
  // noisy machine hits every line alike.
  Status run(Report* report) {
    const bool progress = !o_.quiet && ctx_.rank == 0 && isatty(STDERR_FILENO);
    for (size_t p = 0; p < pairs_.size(); ++p) {
      const std::vector<uint64_t>& sizes = sizes_[p / o_.ops.size()];
      for (size_t si = 0; si < sizes.size(); ++si) {
        // --repeat: round r starts with line r, so that no line always runs first after a change
        // of size (the first line of a size read up to 30% slower on the development VM).
        // Only the lines that run this pair take turns (the same on every rank: the lines are).
        std::vector<size_t> live;
        for (size_t bi = 0; bi < slots_.size(); ++bi) {
          if (slots_[bi].line(p) != nullptr) live.push_back(bi);
        }
        std::vector<std::vector<Row>> rounds(slots_.size());
        for (int r = 0; r < o_.repeat && !live.empty(); ++r) {
          for (size_t j = 0; j < live.size(); ++j) {
            const size_t bi = live[(j + static_cast<size_t>(r)) % live.size()];
            Line* line = slots_[bi].line(p);
            if (progress) {
              std::fprintf(stderr, "\r\033[K[%zu/%zu] %s  %s %s (%zu/%zu sizes", bi + 1,
                           slots_.size(), line->spec().c_str(), pairs_[p].name().c_str(),
                           format_size(sizes[si]).c_str(), si + 1, sizes.size());
              if (o_.repeat > 1) std::fprintf(stderr, ", round %d/%d", r + 1, o_.repeat);
              std::fprintf(stderr, ")");
            }
            Row row;
            TRIBUTARY_RETURN_IF_ERROR(measure(*line, pairs_[p], sizes[si], r == 0, &row));
            rounds[bi].push_back(std::move(row));
          }
        }
        for (size_t bi : live) {
          const int n = slots_[bi].line(p)->num_replicas_in_sync();
          report->results[bi].rows.push_back(median_of(rounds[bi], n));
        }
      }
    }
    if (progress) std::fprintf(stderr, "\r\033[K");
    return Status();
  }

 private:
  std::vector<std::string> default_specs() const {
    // Every backend that serves this layout (in-process ones for one process; on CPUs, those that
    // take CPU tensors, so that a build with NCCL does not list nccl only to skip it); across
    // processes ring also over TCP, so that the same-host path's gain shows beside it. On GPUs:
    // every backend that serves GPUs (nccl serves one process too).
    std::vector<std::string> specs;
    const BackendRegistry registry = builtin_backends();  // outlives the loop over its list
    for (const BackendInfo& b : registry.backends()) {
      if (o_.gpus > 0) {
        if (b.capabilities.supports(DeviceType::kCuda) &&
            (b.capabilities.multi_process || ctx_.world_size == 1)) {
          specs.push_back(b.name);
        }
        continue;
      }
      if (b.capabilities.multi_process == (ctx_.world_size > 1) &&
          b.capabilities.supports(DeviceType::kCpu)) {
        specs.push_back(b.name);
      }
      if (b.name == "ring" && ctx_.world_size > 1) specs.push_back("ring:intra_host=net");
    }
    return specs;
  }

  // Whether every rank made the reference line that this rank made with `mine`
  // (internal::outcome_everywhere): lines are made in the same order on every rank, so the n-th
  // call meets under the same key everywhere.
  Status made_everywhere(const Status& mine) {
    if (ctx_.world_size == 1 || !ctx_.store) return mine;
    return internal::outcome_everywhere(
        *ctx_.store, "bench/reference/" + std::to_string(references_made_++) + "/", ctx_.rank,
        ctx_.world_size, mine);
  }

  // Creates one line; `why` receives, per pair, why it cannot run there (empty where it can).
  Slot make_slot(const BackendRegistry& registry, const std::string& spec, bool reference,
                 BackendResult* result, std::vector<std::string>* why) {
    Slot slot;
    slot.runs.assign(pairs_.size(), false);
    why->assign(pairs_.size(), "");
    if (reference) {
      auto parsed = BackendSpec::parse(spec);
      for (size_t p = 0; p < pairs_.size(); ++p) {
        auto made = parsed.ok() ? reference_line(*parsed, ctx_, pairs_[p].dtype, pairs_[p].op)
                                : StatusOr<std::unique_ptr<Line>>(parsed.status());
        if (Status all = made_everywhere(made.status()); !all.ok()) made = all;
        if (made.ok()) {
          result->spec = (*made)->spec();
          slot.per_pair.push_back(std::move(made).value());
          slot.runs[p] = true;
        } else {
          (*why)[p] = made.status().message();
          slot.per_pair.push_back(nullptr);
        }
      }
      return slot;
    }
    auto made = registry.create(spec, ctx_);
    if (!made.ok()) {
      // Another rank refused the line (its settings) or makes another one: it has left, so no
      // later line could meet it either. The run ends, rather than skipping the line.
      if (made.status().message().find("' too") != std::string::npos &&
          made.status().message().find(" gives up on '") != std::string::npos) {
        fatal_ = made.status();
      }
      why->assign(pairs_.size(), made.status().message());
      return slot;
    }
    result->spec = (*made)->spec();
    const Capabilities& caps = (*made)->capabilities();
    for (size_t p = 0; p < pairs_.size(); ++p) {
      if (caps.supports(Collective::kAllReduce) && caps.supports(pairs_[p].dtype) &&
          caps.supports(pairs_[p].op)) {
        slot.runs[p] = true;
      } else {
        (*why)[p] = "it cannot all_reduce " + pairs_[p].name() + " (" + caps.to_string() + ")";
      }
    }
    if (std::find(slot.runs.begin(), slot.runs.end(), true) != slot.runs.end()) {
      slot.shared = backend_line(std::move(made).value());
      if (!agreement_) agreement_ = slot.shared->backend();
    }
    return slot;
  }

  Status make_lines(Report* report) {
    BackendRegistry registry = builtin_backends();
    const std::vector<std::string> specs = o_.backends.empty() ? default_specs() : o_.backends;
    // The default lines meet the settings too (TRIBUTARY_<BACKEND>_<KEY>, the config file): a bad
    // value there is the user's error, as in a named spec, not a line to skip. A rank whose own
    // settings are refused tells the others (check_everywhere), which then end too.
    if (o_.backends.empty()) {
      for (const std::string& spec : specs) {
        if (Status s = registry.check_everywhere(spec, ctx_.config, ctx_.devices); !s.ok()) {
          return s.with_context("the default line '" + spec + "' cannot use the settings");
        }
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
      std::vector<std::string> why;
      Slot slot = make_slot(registry, spec, reference, &result, &why);
      size_t runs = 0;
      for (size_t p = 0; p < pairs_.size(); ++p) {
        if (slot.runs[p]) {
          ++runs;
        } else {
          result.notes.push_back(pairs_[p].name() + ": " + why[p]);
        }
      }
      if (runs == 0) {
        // Nothing to run: one reason (the first pair's; with a list, naming the pair).
        result.skipped = pairs_.size() == 1 ? why[0] : result.notes[0];
        result.notes.clear();
        last_error = result.spec + ": " + result.skipped;
      } else {
        ++usable;
      }
      slots_.push_back(std::move(slot));
      report->results.push_back(std::move(result));
    };
    for (const std::string& spec : specs) {
      add(spec, false);
      if (!fatal_.ok()) return fatal_;
    }
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
    return Status();
  }

  PerReplica<Tensor> views(DType dtype, int64_t count, bool out) const {
    PerReplica<Tensor> v;
    for (size_t r = 0; r < replicas_.size(); ++r) {
      const Buffer& b = out ? replicas_[r].out : replicas_[r].in;
      v.values().emplace_back(b.data(), dtype, count, ctx_.devices[r]);
    }
    return v;
  }

  Status fill(const Pair& pair, int64_t count) {
    for (int r = 0; r < o_.replicas; ++r) {
      const Replica& rep = replicas_[static_cast<size_t>(r)];
      void* p = o_.gpus > 0 ? rep.host.data() : rep.in.data();
      const int global = ctx_.rank * o_.replicas + r;
      for (int64_t i = 0; i < count; ++i)
        dtype_store(pair.dtype, p, i, check_value(pair.op, global, i));
      if (o_.gpus > 0) {
        const Tensor device(rep.in.data(), pair.dtype, count, ctx_.devices[static_cast<size_t>(r)]);
        const Tensor host(rep.host.data(), pair.dtype, count);
        TRIBUTARY_RETURN_IF_ERROR(copy_tensor(device, host, device.nbytes()));
      }
    }
    return Status();
  }

  // `calls` all-reduces, each waited for when -z asks (GPU lines otherwise queue them all).
  Status timed(Line& line, ReduceOp op, const PerReplica<Tensor>& in, const PerReplica<Tensor>& out,
               int64_t calls, double* seconds) {
    const auto wait_for = std::chrono::duration_cast<std::chrono::milliseconds>(timeout_);
    auto start = Clock::now();
    for (int64_t i = 0; i < calls; ++i) {
      Status s = line.enqueue(op, in, out, wait_for);
      if (s.ok() && o_.blocking) s = line.drain(wait_for);
      if (!s.ok()) return s.with_context(line.spec());
    }
    if (Status s = line.drain(wait_for); !s.ok()) return s.with_context(line.spec());
    *seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return Status();
  }

  // -w iterations, then (unless -w 0) more in rounds until the slowest rank's warm-up has lasted
  // --warmup-time, every round's count agreed so that every rank issues as many (the first
  // iterations are the slow ones, so each round is sized from the one before; at most 8 rounds).
  // A line that follows one whose waits sleep (Gloo's) can start with its ranks on one core,
  // where the scheduler put them as each woke the other, until the load balancer parts them:
  // measured on a 2-vCPU VM, 2 processes after the Gloo line, ring 8 KiB took 8.8 us and ucx 34
  // with 5 warm-up iterations, 2.9 and 4.3 with 500 (about 1-2 ms).
  Status warm_up(Line& line, ReduceOp op, const PerReplica<Tensor>& in,
                 const PerReplica<Tensor>& out) {
    double seconds = 0;
    TRIBUTARY_RETURN_IF_ERROR(timed(line, op, in, out, o_.warmup_iters, &seconds));
    if (o_.warmup_iters == 0 || o_.warmup_seconds <= 0) return Status();
    double elapsed = seconds;
    double each = std::max(seconds / o_.warmup_iters, 1e-8);
    for (int round = 0; round < 8; ++round) {
      TRIBUTARY_ASSIGN_OR_RETURN(const double slowest, agree(elapsed, ReduceOp::kMax));
      if (slowest >= o_.warmup_seconds) break;
      const double more = std::clamp(std::ceil((o_.warmup_seconds - slowest) / each), 1.0, 1e6);
      TRIBUTARY_ASSIGN_OR_RETURN(const double calls, agree(more, ReduceOp::kMax));
      TRIBUTARY_RETURN_IF_ERROR(timed(line, op, in, out, static_cast<int64_t>(calls), &seconds));
      elapsed += seconds;
      each = std::max(seconds / calls, 1e-8);
    }
    return Status();
  }

  // The same value on every rank: max, min (times, iteration counts) or sum (wrong elements),
  // through the backend under test itself.
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

  // The reported time from every rank's, as -a says (nccl-tests' 0 rank 0, 1 mean, 2 min, 3 max).
  StatusOr<double> combine_times(double seconds) {
    switch (o_.average) {
      case AverageMode::kRank0:
        return agree(ctx_.rank == 0 ? seconds : 0.0, ReduceOp::kSum);
      case AverageMode::kMean: {
        TRIBUTARY_ASSIGN_OR_RETURN(double sum, agree(seconds, ReduceOp::kSum));
        return sum / ctx_.world_size;
      }
      case AverageMode::kMin:
        return agree(seconds, ReduceOp::kMin);
      case AverageMode::kMax:
        break;
    }
    return agree(seconds, ReduceOp::kMax);
  }

  // One checked all-reduce: fresh inputs, poisoned outputs, every element compared; the wrong
  // elements of every rank.
  StatusOr<int64_t> check_once(Line& line, const Pair& pair, const PerReplica<Tensor>& in,
                               const PerReplica<Tensor>& out, bool in_place) {
    const int64_t count = in[0].num_elements();
    TRIBUTARY_RETURN_IF_ERROR(fill(pair, count));
    for (size_t r = 0; r < out.size() && !in_place; ++r) {
      const Tensor& t = out[r];
      if (o_.gpus == 0) {
        std::memset(t.data(), 0x5a, t.nbytes());
      } else {
        std::memset(replicas_[r].host.data(), 0x5a, t.nbytes());
        const Tensor host(replicas_[r].host.data(), pair.dtype, count);
        TRIBUTARY_RETURN_IF_ERROR(copy_tensor(t, host, t.nbytes()));
      }
    }
    Status s = line.all_reduce(pair.op, in, out,
                               std::chrono::duration_cast<std::chrono::milliseconds>(timeout_));
    if (!s.ok()) return s.with_context(line.spec());
    const int n = line.num_replicas_in_sync();
    int64_t wrong = 0;
    for (size_t r = 0; r < out.size(); ++r) {
      const Tensor& t = out[r];
      const void* data = t.data();
      if (o_.gpus > 0) {
        const Tensor host(replicas_[r].host.data(), pair.dtype, count);
        TRIBUTARY_RETURN_IF_ERROR(copy_tensor(host, t, t.nbytes()));
        data = host.data();
      }
      for (int64_t i = 0; i < count; ++i) {
        wrong += dtype_load(pair.dtype, data, i) != expected_value(pair.op, pair.dtype, n, i);
      }
    }
    TRIBUTARY_ASSIGN_OR_RETURN(double total, agree(static_cast<double>(wrong), ReduceOp::kSum));
    return static_cast<int64_t>(total);
  }

  // One row from the rounds of --repeat: per placement the median time (the mean of the middle
  // two for an even count) and the bandwidths at it; the first round's check and iteration count.
  static Row median_of(const std::vector<Row>& rounds, int n) {
    Row out = rounds.front();
    if (rounds.size() == 1) return out;
    for (int k = 0; k < 2; ++k) {
      std::vector<double> t;
      for (const Row& r : rounds) t.push_back(r.time_us[k]);
      out.rounds_us[k] = t;
      std::sort(t.begin(), t.end());
      const size_t m = t.size() / 2;
      const double median = t.size() % 2 ? t[m] : (t[m - 1] + t[m]) / 2;
      set_time(out, k, median, n);
    }
    return out;
  }

  // Placement k of `row` took `time_us` per call among n replicas: its time and bandwidths
  // (nccl-tests' algbw = bytes / time, busbw = algbw x bus_factor).
  static void set_time(Row& row, int k, double time_us, int n) {
    row.time_us[k] = time_us;
    row.algbw[k] = time_us > 0 ? static_cast<double>(row.bytes) / (time_us * 1e-6) / 1e9 : 0;
    row.busbw[k] = row.algbw[k] * bus_factor(n);
  }

  // `checked`: run -c's checks (the first round of --repeat only).
  Status measure(Line& line, const Pair& pair, uint64_t bytes, bool checked, Row* row) {
    const int64_t count = static_cast<int64_t>(bytes / dtype_size(pair.dtype));
    row->dtype = pair.dtype;
    row->op = pair.op;
    row->bytes = bytes;
    row->count = count;
    const int n = line.num_replicas_in_sync();
    for (int k = o_.in_place_only ? 1 : 0; k < 2; ++k) {
      const bool in_place = k == 1;
      PerReplica<Tensor> in = views(pair.dtype, count, false);
      PerReplica<Tensor> out = in_place ? in : views(pair.dtype, count, true);
      TRIBUTARY_RETURN_IF_ERROR(fill(pair, count));
      // -R 1: the results' buffers registered with the backend for this placement and size, and
      // out of place the CPU lines' inputs too (as nccl-tests registers its send and receive
      // buffers; GPU lines' inputs are staged through host memory that a registration would only
      // double).
      std::vector<BufferRegistration> registrations;
      if (o_.local_register && line.backend() != nullptr) {
        for (const PerReplica<Tensor>* buffers : {&in, &out}) {
          if (buffers == &in && (in_place || o_.gpus > 0)) continue;
          StatusOr<BufferRegistration> r = line.backend()->register_buffers(*buffers);
          if (!r.ok()) {
            return r.status().with_context(line.spec() + ": -R " +
                                           std::to_string(o_.local_register));
          }
          registrations.push_back(std::move(r).value());
        }
      }
      double seconds = 0;
      TRIBUTARY_RETURN_IF_ERROR(warm_up(line, pair.op, in, out));
      int iters = o_.iters;
      if (o_.target_seconds > 0) {
        // Size the count from a short probe so that each size takes about the target time (each
        // round of --repeat its share).
        const double target = o_.target_seconds / o_.repeat;
        TRIBUTARY_RETURN_IF_ERROR(timed(line, pair.op, in, out, 3, &seconds));
        iters = static_cast<int>(
            std::clamp(target / o_.agg_iters / std::max(seconds / 3, 1e-9), 5.0, 1e6));
        TRIBUTARY_ASSIGN_OR_RETURN(double agreed, agree(iters, ReduceOp::kMax));
        iters = static_cast<int>(agreed);
      }
      const int64_t calls = int64_t{iters} * o_.agg_iters;
      // Every rank starts the timed loop together, as nccl-tests' barrier before it: a rank that
      // started early would count its wait for the others as time of the line.
      TRIBUTARY_RETURN_IF_ERROR(agree(0.0, ReduceOp::kSum).status());
      TRIBUTARY_RETURN_IF_ERROR(timed(line, pair.op, in, out, calls, &seconds));
      TRIBUTARY_ASSIGN_OR_RETURN(seconds, combine_times(seconds));
      row->iters = iters;
      set_time(*row, k, seconds / static_cast<double>(calls) * 1e6, n);
      // nccl-tests' -c N: up to N checked runs, stopping at the first with a wrong element.
      for (int c = 0; c < (line.all_reduces() && checked ? o_.check : 0); ++c) {
        TRIBUTARY_ASSIGN_OR_RETURN(row->wrong[k], check_once(line, pair, in, out, in_place));
        if (row->wrong[k] > 0) break;
      }
    }
    return Status();
  }

  const BenchOptions& o_;
  std::vector<Pair> pairs_;                   // dtypes outer, ops inner
  std::vector<std::vector<uint64_t>> sizes_;  // per dtype, as o_.dtypes
  BackendContext ctx_;
  std::vector<Slot> slots_;  // one per report result
  // The backend through which ranks agree on counts and figures (a measured one, or its own).
  CrossDeviceOps* agreement_ = nullptr;
  std::unique_ptr<CrossDeviceOps> agreement_owned_;
  std::chrono::nanoseconds timeout_ = std::chrono::minutes(5);
  std::vector<Replica> replicas_;
  uint64_t references_made_ = 0;  // made_everywhere's calls, for its store keys
  Status fatal_;                  // a line another rank refused: the run ends (make_slot)
};

namespace internal {

Status outcome_everywhere(Store& store, const std::string& prefix, int rank, int world_size,
                          const Status& mine) {
  TRIBUTARY_RETURN_IF_ERROR(
      store.set(prefix + std::to_string(rank), mine.ok() ? "" : mine.message()));
  if (!mine.ok()) return mine;
  for (int r = 0; r < world_size; ++r) {
    if (r == rank) continue;
    StatusOr<std::string> theirs = store.get(prefix + std::to_string(r));
    if (!theirs.ok()) return theirs.status().with_context("rank " + std::to_string(r));
    if (!theirs->empty()) return unavailable("rank " + std::to_string(r) + ": " + *theirs);
  }
  return Status();
}

}  // namespace internal

Runner::Runner(const BenchOptions& o) : impl_(std::make_unique<Impl>(o)) {}
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

bool first_rank() {
  auto config = Config::load();
  if (!config.ok()) return true;
  auto cluster = resolve_cluster_spec(*config);
  return !cluster.ok() || cluster->rank == 0;
}

// Runs this benchmark again as `np` ranks under tributary-run (found next to this binary).
int relaunch(const char* tool, int np, const std::string& bind_to, int argc, char** argv) {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0)
    return fail(tool, "cannot find this executable to relaunch it under tributary-run", 1);
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
    return fail(tool,
                "--np " + std::to_string(np) + " needs tributary-run next to " + std::string(tool) +
                    " (" + dir + "); or start the ranks yourself with any launcher or TF_CONFIG",
                2);
  }
  std::vector<std::string> args = {launcher,    "-n",    std::to_string(np), "--no-prefix",
                                   "--bind-to", bind_to, "--",               self};
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--np" || a == "--bind-to") {
      ++i;  // and its value
      continue;
    }
    if (a.starts_with("--np=") || a.starts_with("--bind-to=")) continue;
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
