// A fake backend for the tests of the layer above the backends (the front door, the registry, the
// tuning file): every *_impl hands the call to `on_call` and completes at once. Tests that need
// more (registration hooks) derive from it.
#pragma once

#include <functional>
#include <string>
#include <utility>

#include "tributary/cross_device_ops.h"

namespace tributary::fakes {

class RecordingOps : public CrossDeviceOps {
 public:
  using OnCall = std::function<void(const CrossDeviceOps& ops, const CallInfo& call)>;
  RecordingOps(std::string name, BackendContext ctx, Options options, Capabilities caps,
               OnCall on_call)
      : CrossDeviceOps(std::move(name), std::move(ctx), std::move(options), std::move(caps)),
        on_call_(std::move(on_call)) {}

 protected:
  Work record(const CallInfo& c) {
    on_call_(*this, c);
    return Work::completed();
  }
  Work reduce_impl(const CallInfo& c, ReduceOp, const PerReplica<Tensor>&,
                   const Mirrored<Tensor>&) override {
    return record(c);
  }
  Work all_reduce_impl(const CallInfo& c, ReduceOp, const PerReplica<Tensor>&,
                       const PerReplica<Tensor>&) override {
    return record(c);
  }
  Work broadcast_impl(const CallInfo& c, const Tensor&, const Mirrored<Tensor>&, int) override {
    return record(c);
  }
  Work all_gather_impl(const CallInfo& c, const PerReplica<Tensor>&,
                       const PerReplica<Tensor>&) override {
    return record(c);
  }
  Work reduce_scatter_impl(const CallInfo& c, ReduceOp, const PerReplica<Tensor>&,
                           const PerReplica<Tensor>&) override {
    return record(c);
  }

 private:
  OnCall on_call_;
};

}  // namespace tributary::fakes
