#include "tests/strategy/strategy_test_util.h"

#include <memory>

namespace tributary {
namespace {

class FakeOps final : public CrossDeviceOps {
 public:
  FakeOps(const BackendContext& context, Options options, Capabilities caps,
          std::unique_ptr<CrossDeviceOps> inner, std::shared_ptr<FakeBackend::Shared> shared)
      : CrossDeviceOps("fake", context, std::move(options), std::move(caps)),
        inner_(std::move(inner)),
        shared_(std::move(shared)) {}

 protected:
  Work reduce_impl(const CallInfo&, ReduceOp op, const PerReplica<Tensor>& value,
                   const Mirrored<Tensor>& destinations) override {
    if (Work w; record(std::string("reduce ") + std::string(reduce_op_name(op)), w)) return w;
    return Work::completed(inner_->reduce(op, value, destinations).wait());
  }
  Work batch_reduce_impl(const CallInfo&, ReduceOp op, std::span<const ReducePair> pairs) override {
    if (Work w; record(
            "batch_reduce " + std::string(reduce_op_name(op)) + " x" + std::to_string(pairs.size()),
            w)) {
      return w;
    }
    return Work::completed(inner_->batch_reduce(op, pairs).wait());
  }
  Work all_reduce_impl(const CallInfo&, ReduceOp op, const PerReplica<Tensor>& inputs,
                       const PerReplica<Tensor>& outputs) override {
    if (Work w; record("all_reduce " + std::string(reduce_op_name(op)), w)) return w;
    return Work::completed(inner_->all_reduce(op, inputs, outputs).wait());
  }
  Work broadcast_impl(const CallInfo&, const Tensor& source, const Mirrored<Tensor>& destinations,
                      int root) override {
    if (Work w; record("broadcast", w)) return w;
    return Work::completed(inner_->broadcast(source, destinations, root).wait());
  }
  Work all_gather_impl(const CallInfo&, const PerReplica<Tensor>& inputs,
                       const PerReplica<Tensor>& outputs) override {
    if (Work w; record("all_gather", w)) return w;
    return Work::completed(inner_->all_gather(inputs, outputs).wait());
  }
  Work reduce_scatter_impl(const CallInfo&, ReduceOp op, const PerReplica<Tensor>& inputs,
                           const PerReplica<Tensor>& outputs) override {
    if (Work w; record("reduce_scatter", w)) return w;
    return Work::completed(inner_->reduce_scatter(op, inputs, outputs).wait());
  }

 private:
  // Logs the call; returns true (with a failed Work) when told to fail it.
  bool record(std::string what, Work& w) {
    std::lock_guard lock(shared_->mu);
    shared_->log.push_back(std::move(what));
    if (shared_->fail_next.ok()) return false;
    w = Work::completed(shared_->fail_next);
    shared_->fail_next = Status();
    return true;
  }
  std::unique_ptr<CrossDeviceOps> inner_;
  std::shared_ptr<FakeBackend::Shared> shared_;
};

}  // namespace

FakeBackend::FakeBackend() {
  BackendRegistry builtin = builtin_backends();
  const BackendInfo* real = builtin.find("reduction_to_one_device");
  BackendInfo info;
  info.name = "fake";
  info.summary = "test double: records calls, delegates to reduction_to_one_device";
  info.capabilities = real->capabilities;
  info.create = [caps = info.capabilities, shared = shared_](
                    const BackendContext& context,
                    Options options) -> StatusOr<std::unique_ptr<CrossDeviceOps>> {
    auto inner = builtin_backends().create("reduction_to_one_device", context);
    if (!inner.ok()) return inner.status();
    return std::unique_ptr<CrossDeviceOps>(
        std::make_unique<FakeOps>(context, std::move(options), caps, std::move(*inner), shared));
  };
  Status s = registry.add(std::move(info));
  (void)s;
}

std::vector<std::string> FakeBackend::log() const {
  std::lock_guard lock(shared_->mu);
  return shared_->log;
}

void FakeBackend::clear() {
  std::lock_guard lock(shared_->mu);
  shared_->log.clear();
}

void FakeBackend::fail_next(Status s) {
  std::lock_guard lock(shared_->mu);
  shared_->fail_next = std::move(s);
}

}  // namespace tributary
