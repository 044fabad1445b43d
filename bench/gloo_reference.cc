// The direct Gloo line of tributary-bench (see lines.h): Gloo's own API on the bench's buffers, with
// nothing of tributary's between them but the store used to meet.
#include <gloo/allreduce.h>
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>

#include "bench/lines.h"
#include "tributary/store.h"

namespace tributary::bench {
namespace {

// Gloo's store interface over the bench's tributary store.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  explicit StoreAdapter(std::shared_ptr<tributary::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    check(store_->set(key, std::string_view(data.data(), data.size())));
  }
  std::vector<char> get(const std::string& key) override {
    auto v = store_->get(key);
    check(v.status());
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override { check(store_->wait(keys)); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    check(store_->wait(keys, timeout));
  }

 private:
  static void check(const Status& s) {
    if (!s.ok()) throw std::runtime_error(s.to_string());
  }
  std::shared_ptr<tributary::Store> store_;
};

enum class Algo {
  kRing,
  kRingChunked,
  kHalvingDoubling,
  kBcube,
  kUnboundRing,
  kUnboundBcube,
  kAuto
};

template <typename T>
class GlooReference final : public Line {
 public:
  GlooReference(std::string spec, std::shared_ptr<gloo::Context> context, Algo algo,
                int world_size, int local)
      : spec_(std::move(spec)),
        context_(std::move(context)),
        algo_(algo),
        in_sync_(world_size * local) {}

  std::string spec() const override { return spec_; }
  bool reference() const override { return true; }
  int num_replicas_in_sync() const override { return in_sync_; }

  Status all_reduce(ReduceOp, const PerReplica<Tensor>& inputs, const PerReplica<Tensor>& outputs,
                    std::chrono::milliseconds timeout) override {
    // As a Gloo program would: out-of-place means copy in, then reduce in place.
    std::vector<T*> ptrs;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (inputs[i].data() != outputs[i].data()) {
        std::memcpy(outputs[i].data(), inputs[i].data(), inputs[i].nbytes());
      }
      ptrs.push_back(static_cast<T*>(outputs[i].data()));
    }
    const int64_t count = outputs[0].num_elements();
    if (count == 0) return Status();
    const size_t bytes = static_cast<size_t>(count) * sizeof(T);
    Algo algo = algo_;
    if (algo == Algo::kAuto) {
      algo = bytes < (size_t{4} << 20) ? Algo::kHalvingDoubling : Algo::kRingChunked;
    }
    try {
      if (algo == Algo::kUnboundRing || algo == Algo::kUnboundBcube) {
        gloo::AllreduceOptions opts(context_);
        opts.setOutputs(ptrs, static_cast<size_t>(count));
        opts.setAlgorithm(algo == Algo::kUnboundRing ? gloo::AllreduceOptions::Algorithm::RING
                                                     : gloo::AllreduceOptions::Algorithm::BCUBE);
        opts.setReduceFunction(
            static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<T>));
        opts.setTag(tag_++);
        opts.setTimeout(timeout);
        gloo::allreduce(opts);
        return Status();
      }
      if (bytes > (size_t{1} << 30)) {
        return invalid_argument("Gloo's classic algorithms count bytes in int: at most 1 GiB");
      }
      if (ptrs != bound_ptrs_ || count != bound_count_ || algo != bound_algo_) {
        bound_.reset();  // built here, in the untimed warm-up, once per buffer and size
        const int n = static_cast<int>(count);
        switch (algo) {
          case Algo::kRing:
            bound_ = std::make_unique<gloo::AllreduceRing<T>>(context_, ptrs, n);
            break;
          case Algo::kRingChunked:
            bound_ = std::make_unique<gloo::AllreduceRingChunked<T>>(context_, ptrs, n);
            break;
          case Algo::kHalvingDoubling:
            bound_ = std::make_unique<gloo::AllreduceHalvingDoubling<T>>(context_, ptrs, n);
            break;
          default:
            bound_ = std::make_unique<gloo::AllreduceBcube<T>>(context_, ptrs, n);
            break;
        }
        bound_ptrs_ = ptrs;
        bound_count_ = count;
        bound_algo_ = algo;
      }
      bound_->run();
      return Status();
    } catch (const std::exception& e) {
      bound_.reset();
      bound_ptrs_.clear();
      return unavailable(std::string("direct Gloo: ") + e.what());
    }
  }

 private:
  std::string spec_;
  std::shared_ptr<gloo::Context> context_;
  Algo algo_;
  int in_sync_;
  uint32_t tag_ = 1;
  std::unique_ptr<gloo::Algorithm> bound_;
  std::vector<T*> bound_ptrs_;
  int64_t bound_count_ = -1;
  Algo bound_algo_ = Algo::kAuto;
};

}  // namespace

bool gloo_reference_built() { return true; }

namespace internal {

StatusOr<std::unique_ptr<Line>> gloo_reference(const BackendSpec& spec,
                                               const BackendContext& context, DType dtype,
                                               ReduceOp op) {
  if (context.world_size < 2 || !context.store) {
    return invalid_argument("it needs several processes (--np 2 or more)");
  }
  if (op != ReduceOp::kSum || (dtype != DType::kFloat32 && dtype != DType::kFloat64)) {
    return invalid_argument("it measures float32 and float64 sum only");
  }
  Algo algo = Algo::kAuto;
  std::string algo_name = "auto";
  bool sync = false;
  for (const auto& [key, value] : spec.options) {
    if (key == "algorithm") {
      static const std::pair<std::string_view, Algo> kAlgos[] = {
          {"auto", Algo::kAuto},
          {"ring", Algo::kRing},
          {"ring_chunked", Algo::kRingChunked},
          {"halving_doubling", Algo::kHalvingDoubling},
          {"bcube", Algo::kBcube},
          {"unbound_ring", Algo::kUnboundRing},
          {"unbound_bcube", Algo::kUnboundBcube}};
      bool known = false;
      for (const auto& [name, a] : kAlgos) {
        if (value == name) {
          algo = a;
          known = true;
        }
      }
      if (!known) {
        return invalid_argument("unknown algorithm '" + value +
                                "' (auto, ring, ring_chunked, halving_doubling, bcube, "
                                "unbound_ring, unbound_bcube)");
      }
      algo_name = value;
    } else if (key == "mode") {
      if (value != "async" && value != "sync") {
        return invalid_argument("mode is async or sync, not '" + value + "'");
      }
      sync = value == "sync";
    } else {
      return invalid_argument("unknown option '" + key + "' (algorithm, mode)");
    }
  }
  if (sync && (algo == Algo::kUnboundRing || algo == Algo::kUnboundBcube)) {
    return invalid_argument(algo_name + " needs mode=async (Gloo's I/O thread)");
  }
  // Every rank creates its references in the same order, so the n-th one meets under the same
  // keys everywhere.
  static int instance = 0;
  const std::string prefix = "bench/gloo-direct/" + std::to_string(instance++);
  try {
    // Gloo's writes to a peer that has died raise SIGPIPE; as in the gloo backend, fail instead.
    signal(SIGPIPE, SIG_IGN);
    gloo::transport::tcp::attr attr;
    attr.hostname = internal::local_address_towards(context.coordinator_host);
    auto device = gloo::transport::tcp::CreateDevice(attr);
    // Bcube's base must divide the number of processes: the smallest divisor, as the gloo
    // backend takes by default.
    int base = context.world_size < 2 ? 2 : context.world_size;
    for (int d = 2; d * d <= context.world_size; ++d) {
      if (context.world_size % d == 0) {
        base = d;
        break;
      }
    }
    auto ctx = std::make_shared<gloo::rendezvous::Context>(context.rank, context.world_size, base);
    ctx->setTimeout(std::chrono::milliseconds(60000));
    StoreAdapter store(context.store);
    gloo::rendezvous::PrefixStore prefixed(prefix, store);
    ctx->connectFullMesh(prefixed, device);
    if (sync) {
      for (int r = 0; r < context.world_size; ++r) {
        if (r != context.rank) ctx->getPair(r)->setSync(true, /*busyPoll=*/false);
      }
    }
    const std::string name = "gloo-direct:algorithm=" + algo_name + ",mode=" +
                             (sync ? "sync" : "async");
    const int local = static_cast<int>(context.devices.size());
    if (dtype == DType::kFloat64) {
      return std::unique_ptr<Line>(
          new GlooReference<double>(name, std::move(ctx), algo, context.world_size, local));
    }
    return std::unique_ptr<Line>(
        new GlooReference<float>(name, std::move(ctx), algo, context.world_size, local));
  } catch (const std::exception& e) {
    return unavailable(std::string("Gloo's rendezvous failed: ") + e.what());
  }
}

}  // namespace internal
}  // namespace tributary::bench
