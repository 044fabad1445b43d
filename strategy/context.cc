// The per-thread context stack: get_strategy(), get_replica_context(), scopes.
#include "fmt/format.h"
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

Strategy* Strategy::identity() const {
  if (parts_.default_handle) return &default_strategy();
  return const_cast<Strategy*>(this);
}

StatusOr<StrategyScope> Strategy::scope() {
  auto& t = thread_context();
  Strategy* current = strategy_internal::current_strategy();
  if (kind() == StrategyKind::kDefault) {
    // TF's _DefaultDistributionContext: refused while another strategy is current, and otherwise
    // it pushes no context, so the default replica context stays current inside it.
    if (current != nullptr && current->kind() != StrategyKind::kDefault) {
      return failed_precondition("Must not nest tf.distribute.Strategy scopes. (" + describe() +
                                 " was entered inside " + current->describe() +
                                 "; leave that strategy's scope or run() first)");
    }
    return StrategyScope(nullptr);
  }
  if (t.replica != nullptr && t.merge == nullptr &&
      t.replica->strategy().kind() != StrategyKind::kDefault) {
    // Inside run(): TF's _CurrentDistributionContext requires cross-replica context.
    Strategy& running = t.replica->strategy();
    if (&running != this) return strategy_internal::mixing_error(*this, running);
    return failed_precondition(fmt::format(
        "Method requires being in cross-replica context, use get_replica_context().merge_call() "
        "(scope() of {} was entered inside its run(), on replica {}; enter the scope outside "
        "run(), or do the cross-replica work in a merge_call function)",
        describe(), t.replica->local_replica_id()));
  }
  if (current != nullptr && current != this) {
    return failed_precondition("Must not nest tf.distribute.Strategy scopes: " + describe() +
                               " was entered inside " + current->describe());
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
