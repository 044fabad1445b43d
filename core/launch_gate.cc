#include "core/launch_gate.h"

namespace tributary::internal {

LaunchGate::Launch::Launch(LaunchGate& gate, const CallInfo* call)
    : gate_(gate), hold_(gate.launch_mu_) {
  {
    std::lock_guard lock(gate_.mu_);
    gate_.inside_ = true;
    gate_.launching_ = call;
  }
  proceed_ = !gate_.failed();
}

LaunchGate::Launch::~Launch() {
  if (!finished_) (void)finish();
}

bool LaunchGate::Launch::finish() {
  if (finished_) return gate_.failed();
  finished_ = true;
  {
    std::lock_guard lock(gate_.mu_);
    gate_.inside_ = false;
    gate_.launching_ = nullptr;
  }
  if (!gate_.failed()) return false;
  gate_.teardown_once();  // hold_ is still held
  return true;
}

LaunchGate::Failed LaunchGate::fail() {
  if (failed_->exchange(true, std::memory_order_acq_rel)) return Failed::kAlreadyFailed;
  bool inside = false;
  {
    std::lock_guard lock(mu_);
    inside = inside_;
  }
  if (inside) return Failed::kDeferred;
  std::lock_guard hold(launch_mu_);
  teardown_once();
  return Failed::kTornDown;
}

void LaunchGate::tear_down() {
  std::lock_guard hold(launch_mu_);
  teardown_once();
}

void LaunchGate::teardown_once() {
  if (torn_down_) return;
  torn_down_ = true;
  if (teardown_) teardown_();
}

}  // namespace tributary::internal
