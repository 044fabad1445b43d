#include "algorithms/host_layout.h"

#include <algorithm>

#include "algorithms/collectives.h"
#include "algorithms/hierarchical_group.h"
#include "core/cpus.h"
#include "core/kernel_id.h"
#include "core/rendezvous.h"
#include "core/strings.h"

namespace tributary::algorithms {

bool HostLayout::uniform() const {
  for (const auto& m : members) {
    if (m.size() != members.front().size()) return false;
  }
  return true;
}

size_t ring_slice_bytes(uint64_t configured, const HostLayout& layout,
                        const std::vector<int>& members) {
  if (configured != 0) return static_cast<size_t>(configured);
  auto all_alike = [&](const auto& of) {
    return std::all_of(members.begin(), members.end(), [&](int m) {
      return of.at(static_cast<size_t>(m)) == of.at(static_cast<size_t>(members.front()));
    });
  };
  if (all_alike(layout.host_of)) return 0;
  const bool one_kernel = !layout.kernel_of.empty() && !members.empty() &&
                          !layout.kernel_of.at(static_cast<size_t>(members.front())).empty() &&
                          all_alike(layout.kernel_of);
  return one_kernel ? 0 : kNoSlices;
}

namespace {

// The longest CPU list a rank may publish: 8192 CPUs (Linux's largest NR_CPUS) listed one by one
// take under 40 KiB.
constexpr size_t kMaxCpuListBytes = 64 << 10;

// The ranks that share `rank`'s machine: those with its kernel when that is known, else those of
// its host.
std::vector<int> machine_members(const HostLayout& layout, int rank) {
  const auto r = static_cast<size_t>(rank);
  if (r < layout.kernel_of.size() && !layout.kernel_of[r].empty()) {
    std::vector<int> same;
    for (size_t i = 0; i < layout.kernel_of.size(); ++i) {
      if (layout.kernel_of[i] == layout.kernel_of[r]) same.push_back(static_cast<int>(i));
    }
    return same;
  }
  return layout.members.at(static_cast<size_t>(layout.host_of.at(r)));
}

}  // namespace

internal::MachineShare HostLayout::machine_of(int rank) const {
  const std::vector<int> same = machine_members(*this, rank);
  std::string all;
  for (const int m : same) {
    const auto i = static_cast<size_t>(m);
    if (i >= cpus_of.size() || cpus_of[i].empty()) return {static_cast<int>(same.size()), 0};
    all += (all.empty() ? "" : ",") + cpus_of[i];
  }
  const auto cpus = internal::parse_cpu_list(all);
  return {static_cast<int>(same.size()), cpus ? static_cast<int>(cpus->size()) : 0};
}

std::vector<bool> HostLayout::same_kernel_as(int rank, const std::vector<int>& members) const {
  std::vector<bool> out(members.size(), false);
  const auto r = static_cast<size_t>(rank);
  if (r >= kernel_of.size() || kernel_of[r].empty()) return out;
  for (size_t i = 0; i < members.size(); ++i) {
    const auto m = static_cast<size_t>(members[i]);
    out[i] = m < kernel_of.size() && kernel_of[m] == kernel_of[r];
  }
  return out;
}

std::string host_entry(const Config& config, const std::string& agreement) {
  return agreement + "|" + internal::kernel_id() + "|" +
         internal::cpu_list_text(internal::affinity_cpus()) + "|" + internal::host_id(config);
}

StatusOr<HostLayout> learn_hosts(Store& store, const BackendContext& context,
                                 const std::string& backend, const std::string& agreement,
                                 std::chrono::nanoseconds timeout) {
  const std::string mine = host_entry(context.config, agreement);
  TRIBUTARY_RETURN_IF_ERROR(store.set("host/" + std::to_string(context.rank), mine));
  HostLayout layout;
  std::vector<std::string> ids;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int r = 0; r < context.world_size; ++r) {
    const auto left = std::chrono::duration_cast<Store::Duration>(std::max(
        std::chrono::steady_clock::duration::zero(), deadline - std::chrono::steady_clock::now()));
    auto got = store.get("host/" + std::to_string(r), left);
    if (!got.ok()) {
      return got.status().with_context(
          "backend '" + backend + "' (rank " + std::to_string(context.rank) + "): rank " +
          std::to_string(r) + " did not join (is it running, with the same secret?)");
    }
    std::string theirs = std::move(got).value();
    const size_t bar = theirs.find('|');
    const std::string choice = theirs.substr(0, bar);
    if (choice != agreement) {
      return invalid_argument("backend '" + backend + "': rank " + std::to_string(r) + " uses " +
                              choice + " but rank " + std::to_string(context.rank) + " " +
                              agreement + "; every process must use the same");
    }
    // "agreement|kernel|cpus|host": the host is what follows the CPUs; kernel and CPUs hold no '|'.
    const size_t second = bar == std::string::npos ? bar : theirs.find('|', bar + 1);
    const size_t third = second == std::string::npos ? second : theirs.find('|', second + 1);
    // The CPUs must be a cpulist ("" = unknown), which also refuses an older tributary's
    // "agreement|kernel|host" whose host holds a '|'.
    const std::string cpus =
        third == std::string::npos ? std::string() : theirs.substr(second + 1, third - second - 1);
    if (third == std::string::npos || cpus.size() > kMaxCpuListBytes ||
        !internal::parse_cpu_list(cpus)) {
      return invalid_argument("backend '" + backend + "': rank " + std::to_string(r) +
                              " published '" + internal::excerpt(theirs, 200) +
                              "' as its host, not agreement|kernel|cpus|host with its CPUs as a "
                              "list such as 0-3,8; is it running the same version of tributary?");
    }
    layout.kernel_of.push_back(theirs.substr(bar + 1, second - bar - 1));
    layout.cpus_of.push_back(cpus);
    theirs.erase(0, third + 1);
    auto it = std::find(ids.begin(), ids.end(), theirs);
    if (it == ids.end()) {
      ids.push_back(theirs);
      layout.members.emplace_back();
      it = ids.end() - 1;
    }
    const int h = static_cast<int>(it - ids.begin());
    layout.host_of.push_back(h);
    layout.members[static_cast<size_t>(h)].push_back(r);
  }
  return layout;
}

OptionDef hierarchy_option(const std::string& flat) {
  return {.name = "hierarchy",
          .type = OptionType::kEnum,
          .default_value = "auto",
          .help =
              "hierarchical all-reduce (reduce-scatter inside each host, all-reduce across "
              "hosts among the processes of the same local rank, all-gather inside each "
              "host): auto (when there are several hosts with the same number of processes "
              "each, more than one), on (always; hosts must run the same number of "
              "processes), off (" +
              flat + ")",
          .choices = {"auto", "on", "off"}};
}

StatusOr<bool> use_hierarchy(const std::string& backend, const std::string& mode,
                             const HostLayout& layout) {
  if (mode == "on" && !layout.uniform()) {
    std::string counts;
    for (const auto& m : layout.members)
      counts += (counts.empty() ? "" : ", ") + std::to_string(m.size());
    return invalid_argument("backend '" + backend +
                            "': hierarchy=on needs the same number of processes on every host, "
                            "but the hosts run " +
                            counts + "; use hierarchy=auto (a flat group for such layouts)");
  }
  return mode == "on" || (mode == "auto" && layout.uniform() && layout.hosts() > 1 &&
                          layout.members.front().size() > 1);
}

StatusOr<std::unique_ptr<ProcessGroup>> hierarchical_group(const std::shared_ptr<Store>& store,
                                                           const BackendContext& context,
                                                           const HostLayout& layout,
                                                           const GroupMaker& make_local,
                                                           const GroupMaker& make_cross) {
  const int h = layout.host_of[static_cast<size_t>(context.rank)];
  const std::vector<int>& mine = layout.members[static_cast<size_t>(h)];
  const int l = static_cast<int>(std::find(mine.begin(), mine.end(), context.rank) - mine.begin());
  std::unique_ptr<ProcessGroup> local, cross;
  if (mine.size() > 1) {
    PrefixStore scope("host" + std::to_string(h) + "/", store);
    TRIBUTARY_ASSIGN_OR_RETURN(local, make_local(scope, l, mine));
  }
  if (layout.hosts() > 1) {
    std::vector<int> peers;  // local rank l of every host
    for (const auto& m : layout.members) peers.push_back(m[static_cast<size_t>(l)]);
    PrefixStore scope("cross" + std::to_string(l) + "/", store);
    TRIBUTARY_ASSIGN_OR_RETURN(cross, make_cross(scope, h, peers));
  }
  return std::unique_ptr<ProcessGroup>(std::make_unique<HierarchicalGroup>(
      context.rank, layout.members, std::move(local), std::move(cross)));
}

}  // namespace tributary::algorithms
