// The `tuned` backend: one instance per spec of a tuning file, each collective sent to the one whose
// size range holds it (tributary/tuning.h).
#include <algorithm>
#include <numeric>

#include "core/strings.h"
#include "tributary/tuning.h"

namespace tributary {
namespace {

const std::vector<OptionDef>& tuned_options() {
  static const std::vector<OptionDef> kDefs = {
      {.name = "file", .type = OptionType::kString, .help = "the tuning file it follows"},
      {.name = "rules", .type = OptionType::kString, .help = "its rules, as read"},
      {.name = "timeout",
       .type = OptionType::kDuration,
       .default_value = "5m",
       .help = "unused: each member backend runs under its own timeout"},
  };
  return kDefs;
}

template <typename T>
std::vector<T> intersect(const std::vector<T>& a, const std::vector<T>& b) {
  std::vector<T> out;
  for (const T& x : a) {
    if (std::find(b.begin(), b.end(), x) != b.end()) out.push_back(x);
  }
  return out;
}

class TunedOps final : public CrossDeviceOps {
 public:
  TunedOps(BackendContext context, Options options, Capabilities caps, TuningTable table,
           std::vector<std::unique_ptr<CrossDeviceOps>> members)
      : CrossDeviceOps("tuned", std::move(context), std::move(options), std::move(caps)),
        table_(std::move(table)),
        members_(std::move(members)) {
    leave_recording_to_members();
    const std::vector<std::string> specs = table_.specs();
    for (const TuningRule& r : table_.rules) {
      const auto at = std::find(specs.begin(), specs.end(), r.spec) - specs.begin();
      member_of_rule_.push_back(static_cast<size_t>(at));
    }
  }

 protected:
  Work reduce_impl(const CallInfo& call, ReduceOp op, const PerReplica<Tensor>& value,
                   const Mirrored<Tensor>& destinations) override {
    return pick(call).reduce(op, value, destinations);
  }
  Work batch_reduce_impl(const CallInfo& call, ReduceOp op,
                         std::span<const ReducePair> pairs) override {
    (void)call;
    uint64_t total = 0;
    for (const ReducePair& p : pairs) total += p.value[0].nbytes();
    return member_for(total).batch_reduce(op, pairs);
  }
  Work all_reduce_impl(const CallInfo& call, ReduceOp op, const PerReplica<Tensor>& inputs,
                       const PerReplica<Tensor>& outputs) override {
    return pick(call).all_reduce(op, inputs, outputs);
  }
  Work broadcast_impl(const CallInfo& call, const Tensor& source,
                      const Mirrored<Tensor>& destinations, int root) override {
    return pick(call).broadcast(source, destinations, root);
  }
  Work all_gather_impl(const CallInfo& call, const PerReplica<Tensor>& inputs,
                       const PerReplica<Tensor>& outputs) override {
    return pick(call).all_gather(inputs, outputs);
  }
  Work reduce_scatter_impl(const CallInfo& call, ReduceOp op, const PerReplica<Tensor>& inputs,
                           const PerReplica<Tensor>& outputs) override {
    (void)call;  // its count is per output; the ranges are by one replica's input
    return member_for(inputs[0].nbytes()).reduce_scatter(op, inputs, outputs);
  }
  void abandon(const Status& why) override {
    // Every member: peers may wait in any of them.
    for (auto& m : members_) m->abort(why);
  }
  // abort() from another thread: each member's abort() wakes its own call in flight.
  void interrupt(const Status& why) override { abandon(why); }

 private:
  CrossDeviceOps& member_for(uint64_t bytes) {
    for (size_t i = 0; i < table_.rules.size(); ++i) {
      if (bytes <= table_.rules[i].max_bytes) return *members_[member_of_rule_[i]];
    }
    return *members_[member_of_rule_.back()];
  }
  CrossDeviceOps& pick(const CallInfo& call) {
    return member_for(static_cast<uint64_t>(call.count) * dtype_size(call.dtype));
  }

  TuningTable table_;
  std::vector<std::unique_ptr<CrossDeviceOps>> members_;
  std::vector<size_t> member_of_rule_;
};

}  // namespace

namespace internal {

StatusOr<std::unique_ptr<CrossDeviceOps>> make_tuned_ops(
    const BackendContext& context, TuningTable table, std::string origin,
    std::vector<std::unique_ptr<CrossDeviceOps>> members) {
  if (members.empty() || members.size() != table.specs().size()) {
    return internal_error("tuned backend: one member per spec expected");
  }
  Capabilities caps = members[0]->capabilities();
  for (const auto& m : members) {
    const Capabilities& c = m->capabilities();
    caps.device_types = intersect(caps.device_types, c.device_types);
    caps.dtypes = intersect(caps.dtypes, c.dtypes);
    caps.ops = intersect(caps.ops, c.ops);
    caps.collectives = intersect(caps.collectives, c.collectives);
    caps.multi_process = caps.multi_process && c.multi_process;
  }
  const auto timeout = std::max_element(members.begin(), members.end(), [](const auto& a,
                                                                           const auto& b) {
                         return a->timeout() < b->timeout();
                       })->get()->timeout();
  TRIBUTARY_ASSIGN_OR_RETURN(
      Options options,
      Options::resolve("tuned", tuned_options(),
                       {{"file", origin},
                        {"rules", table.summary()},
                        {"timeout", std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                       timeout)
                                                       .count()) +
                                        "ms"}},
                       Config()));
  return std::unique_ptr<CrossDeviceOps>(new TunedOps(context, std::move(options), std::move(caps),
                                                      std::move(table), std::move(members)));
}

}  // namespace internal
}  // namespace tributary
