// The per-thread context stack: get_strategy(), get_replica_context(), scopes.
#include "strategy/internal.h"

namespace tributary {
namespace strategy_internal {

ThreadContext& thread_context() {
  thread_local ThreadContext context;
  return context;
}

Strategy* current_strategy() {
  const ThreadContext& t = thread_context();
  if (t.merge) return t.merge;
  if (t.replica) return &t.replica->strategy();
  return t.scope;
}

Status mixing_error(const Strategy& used, const Strategy& current) {
  return failed_precondition("Mixing different tf.distribute.Strategy objects: " + used.describe() +
                             " is not " + current.describe() +
                             "; call a strategy's methods inside its own scope() or run() only");
}

}  // namespace strategy_internal

using strategy_internal::thread_context;

Strategy& get_strategy() {
  Strategy* s = strategy_internal::current_strategy();
  return s ? *s : default_strategy();
}

bool has_strategy() {
  Strategy* s = strategy_internal::current_strategy();
  return s != nullptr && s->kind() != StrategyKind::kDefault;
}

ReplicaContext* get_replica_context() {
  const auto& t = thread_context();
  if (t.merge) return nullptr;
  if (t.replica) return t.replica;
  if (t.scope) return nullptr;
  return default_strategy().default_replica_context();
}

bool in_cross_replica_context() { return get_replica_context() == nullptr; }

StatusOr<StrategyScope> Strategy::scope() {
  auto& t = thread_context();
  Strategy* current = strategy_internal::current_strategy();
  if (current != nullptr && current != this) {
    return failed_precondition("Must not nest tf.distribute.Strategy scopes: " + describe() +
                               " was entered inside " + current->describe());
  }
  if (kind() == StrategyKind::kDefault && current == nullptr) {
    // The default strategy's scope changes nothing but is still counted, so that leaving it is
    // symmetric.
  }
  if (t.replica == nullptr && t.merge == nullptr) {
    t.scope = this;
    ++t.scope_depth;
  }
  return StrategyScope(this);
}

StrategyScope::StrategyScope(StrategyScope&& other) noexcept : strategy_(other.strategy_) {
  other.strategy_ = nullptr;
}

StrategyScope::~StrategyScope() {
  if (strategy_ == nullptr) return;
  auto& t = thread_context();
  if (t.scope == strategy_ && t.replica == nullptr && t.merge == nullptr && --t.scope_depth == 0) {
    t.scope = nullptr;
  }
}

}  // namespace tributary
