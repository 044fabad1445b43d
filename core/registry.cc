#include "tributary/registry.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "core/flight_recorder.h"
#include "core/gpu.h"
#include "core/host_staging.h"
#include "core/logging.h"
#include "core/rendezvous.h"
#include "core/strings.h"
#include "tributary/store.h"

namespace tributary {

const std::vector<OptionDef>& common_options() {
  static const std::vector<OptionDef> kCommon = {
      {.name = "timeout",
       .type = OptionType::kDuration,
       .default_value = "5m",
       .help = "how long any blocking step of a collective may wait before it fails with an error "
               "naming the collective (and the peer, for multi-process backends)",
       .shared = true},
  };
  return kCommon;
}

Status BackendRegistry::add(BackendInfo info) {
  if (info.name.empty() || info.name == "auto") {
    return invalid_argument("a backend needs a name other than '' and 'auto'");
  }
  if (find(info.name) != nullptr) {
    return invalid_argument("backend '" + info.name + "' is already registered");
  }
  if (!info.create) return invalid_argument("backend '" + info.name + "' has no create function");
  backends_.push_back(std::move(info));
  return Status();
}

const BackendInfo* BackendRegistry::find(std::string_view name) const {
  for (const BackendInfo& b : backends_) {
    if (b.name == name) return &b;
  }
  return nullptr;
}

std::vector<std::string> BackendRegistry::names() const {
  std::vector<std::string> out;
  for (const BackendInfo& b : backends_) out.push_back(b.name);
  return out;
}

std::vector<OptionDef> BackendRegistry::options_of(const BackendInfo& info) const {
  std::vector<OptionDef> all = info.options;
  for (const OptionDef& d : common_options()) all.push_back(d);
  return all;
}

namespace {

// The TRIBUTARY_* variables the library reads other than backend options (those are
// TRIBUTARY_<BACKEND>_<OPTION>, and TRIBUTARY_<OPTION> for options every backend shares). Keep in
// step with tributary-info's table of what each one sets (tools/tributary_info.cc).
// clang-format off
constexpr std::string_view kGlobalVariables[] = {
    "TRIBUTARY_CROSS_DEVICE_OPS", "TRIBUTARY_CONFIG_FILE", "TRIBUTARY_LOG_LEVEL",
    "TRIBUTARY_TUNING_FILE", "TRIBUTARY_TIMELINE", "TRIBUTARY_STALL_CHECK_TIME",
    "TRIBUTARY_FLIGHT_RECORDER_SIZE", "TRIBUTARY_FLIGHT_RECORDER_FILE", "TRIBUTARY_SECRET",
    "TRIBUTARY_SECRET_FILE", "TRIBUTARY_HOST_ID", "TRIBUTARY_NUM_THREADS",
    "TRIBUTARY_VIRTUAL_GPUS", "TRIBUTARY_RANK", "TRIBUTARY_WORLD_SIZE", "TRIBUTARY_LOCAL_RANK",
    "TRIBUTARY_LOCAL_WORLD_SIZE", "TRIBUTARY_MASTER_ADDR", "TRIBUTARY_MASTER_PORT",
    "TRIBUTARY_STORE_FD"};
// Read by the project's own scripts, not the library (scripts/quickstart.sh, test.sh and
// sanitize.sh, bench/compare_mpi.sh and multihost.sh, .ci/run): they reach the tools those scripts start, and
// are no misspelling. Also in tributary-info's table.
constexpr std::string_view kScriptVariables[] = {
    "TRIBUTARY_BUILD_DIR", "TRIBUTARY_OUT_DIR", "TRIBUTARY_TEST_BUILD_DIR",
    "TRIBUTARY_CI_FUZZ_SECONDS", "TRIBUTARY_CI_SANITIZERS", "TRIBUTARY_SANITIZE_TARGETS"};
// clang-format on

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// Each TRIBUTARY_* entry of `config` that nothing in this build reads, with the closest known
// name when one is close ("TRIBUTARY_RING_SEGMENT_BYTE (environment; did you mean ...?)").
std::vector<std::string> unknown_variables(const BackendRegistry& registry, const Config& config) {
  std::vector<std::string> known(std::begin(kGlobalVariables), std::end(kGlobalVariables));
  known.insert(known.end(), std::begin(kScriptVariables), std::end(kScriptVariables));
  for (const BackendInfo& b : registry.backends()) {
    for (const OptionDef& d : registry.options_of(b)) {
      known.push_back("TRIBUTARY_" + internal::to_upper(b.name) + "_" + internal::to_upper(d.name));
      if (d.shared) known.push_back("TRIBUTARY_" + internal::to_upper(d.name));
    }
  }
  std::vector<std::string> unknown;
  for (const auto& [key, entry] : config.entries()) {
    if (!key.starts_with("TRIBUTARY_") || std::ranges::find(known, key) != known.end()) continue;
    std::string text = key + " (" + entry.source;
    const std::string* best = nullptr;
    size_t best_distance = 0;
    for (const std::string& k : known) {
      const size_t d = edit_distance(key, k);
      if (best == nullptr || d < best_distance) {
        best = &k;
        best_distance = d;
      }
    }
    // Close: a slip of a few letters, not a different word.
    if (best != nullptr && best_distance <= std::max<size_t>(2, (key.size() - 10) / 4)) {
      text += "; did you mean " + *best + "?";
    }
    unknown.push_back(std::move(text) + ")");
  }
  return unknown;
}

// A misspelt variable does nothing, silently; say so once per process (not once per instance),
// at the first backend creation that sees one.
void warn_unknown_variables_once(const BackendRegistry& registry, const BackendContext& context) {
  static std::atomic<bool> warned{false};
  if (warned.load(std::memory_order_relaxed)) return;
  const std::vector<std::string> unknown = unknown_variables(registry, context.config);
  if (unknown.empty() || warned.exchange(true)) return;
  internal::Logger(internal::log_level_from(context.config),
                   "rank " + std::to_string(context.rank) + "/registry")
      .log(internal::LogLevel::kWarning,
           "{} not read by tributary (misspelt?): {}; tributary-info lists every variable and "
           "what it sets",
           unknown.size() == 1 ? "this setting is" : "these settings are",
           internal::join(unknown, ", "));
}

// Across processes: every rank publishes what its `auto` follows and compares the others'.
Status agree_on_auto(const BackendContext& context, const std::string& choice) {
  if (context.world_size <= 1 || !context.store) return Status();
  TRIBUTARY_ASSIGN_OR_RETURN(const uint64_t n,
                             internal::take_number(context, internal::Numbering::kInstances));
  const std::string prefix = "auto/" + std::to_string(n + 1) + "/";
  TRIBUTARY_RETURN_IF_ERROR(context.store->set(prefix + std::to_string(context.rank), choice));
  const auto wait = context.store->options().timeout;
  for (int r = 0; r < context.world_size; ++r) {
    if (r == context.rank) continue;
    auto theirs = context.store->get(prefix + std::to_string(r), wait);
    if (!theirs.ok()) {
      return theirs.status().with_context("'auto': waiting for rank " + std::to_string(r) +
                                          " to say what it follows; did every rank create "
                                          "'auto' in the same order?");
    }
    if (theirs->starts_with("!")) {
      return failed_precondition("rank " + std::to_string(r) + " could not create its backend (" +
                                 theirs->substr(1) + "); rank " + std::to_string(context.rank) +
                                 " gives up on 'auto' too");
    }
    if (*theirs != choice) {
      return failed_precondition("'auto' on rank " + std::to_string(context.rank) + " follows " +
                                 choice + " but rank " + std::to_string(r) + " follows " +
                                 *theirs +
                                 "; every rank must see the same TRIBUTARY_TUNING_FILE (the "
                                 "same file contents) and layout");
    }
  }
  return Status();
}

// Whether `info` serves the GPU replicas of `context` through host staging (core/host_staging.h).
bool stages_through_host(const BackendInfo& info, const BackendContext& context) {
  return stages_gpu_through_host(info) &&
         std::any_of(context.devices.begin(), context.devices.end(),
                     [](const Device& d) { return d.is_cuda(); });
}

// A backend's setup failed: name a rank that was lost meanwhile (internal::name_lost_ranks). After
// a deadline, without its grace: a peer that died while this rank waited out the whole timeout was
// recorded when its connection dropped, and waiting would make `timeout=2s` fail after 4 s.
Status name_setup_failure(const BackendContext& context, const Status& failure) {
  if (failure.code() == StatusCode::kDeadlineExceeded) {
    return internal::name_lost_ranks(context, failure, std::chrono::milliseconds(0));
  }
  return internal::name_lost_ranks(context, failure);
}

// Before a backend of several processes connects, its processes meet in the store: each says
// whether it got that far and with which backend ("setup/<n>/<rank>": "=ring", or "!ring: why");
// rank 0 reads them in rank order, at most until the backend's timeout= has passed, and publishes
// one verdict that every other rank reads (O(N) requests in all). A process whose settings were
// refused (a value in its own environment), or that creates another backend, then fails every
// process at once, named, instead of leaving them to wait out the setup's timeout for a peer that
// will never connect; one that never comes is named at the timeout ("rank 2 did not join").
Status meet_before_setup(const BackendContext& context, const std::string& backend,
                         const Status& mine,
                         std::optional<std::chrono::nanoseconds> timeout = std::nullopt) {
  if (context.world_size <= 1 || !context.store) return mine;
  using std::chrono::milliseconds;
  Store& store = *context.store;
  TRIBUTARY_ASSIGN_OR_RETURN(const uint64_t n,
                             internal::take_number(context, internal::Numbering::kSetups));
  const std::string prefix = "setup/" + std::to_string(n) + "/";
  const std::string me = std::to_string(context.rank);
  const milliseconds wait =
      timeout ? std::chrono::ceil<milliseconds>(*timeout) : store.options().timeout;
  const auto deadline = std::chrono::steady_clock::now() + wait;
  const auto left = [&](milliseconds extra = milliseconds(0)) {
    return std::max(milliseconds(0), std::chrono::ceil<milliseconds>(
                                         deadline + extra - std::chrono::steady_clock::now()));
  };
  const Status said = store.set(
      prefix + me, mine.ok() ? "=" + backend : "!" + backend + ": " + mine.message(), wait);
  // The verdict: "=" all met; "!why" (a refusal, a difference) or "?why" (a rank that never came).
  const auto from_verdict = [&](const std::string& v) -> Status {
    if (v.starts_with("=")) return Status();
    if (v.starts_with("?")) return name_setup_failure(context, deadline_exceeded(v.substr(1)));
    return failed_precondition(v.substr(1) + "; rank " + me + " gives up on '" + backend + "' too");
  };
  const auto publish = [&](const std::string& verdict) {
    (void)store.set(prefix + "verdict", verdict, wait);
    return from_verdict(verdict);
  };
  if (context.rank == 0) {
    if (!mine.ok()) {
      (void)publish("!rank 0 could not create its backend (" + backend + ": " + mine.message() +
                    ")");
      return mine;
    }
    TRIBUTARY_RETURN_IF_ERROR(said);
    for (int r = 1; r < context.world_size; ++r) {
      const std::string who = "rank " + std::to_string(r);
      StatusOr<std::string> theirs = store.get(prefix + std::to_string(r), left());
      if (!theirs.ok()) {
        if (theirs.status().code() != StatusCode::kDeadlineExceeded) return theirs.status();
        return publish("?" + who + " did not join: it did not reach the setup of backend '" +
                       backend + "' within " + format_duration(wait) +
                       " (timeout=); is it running, with the same secret, and creating the same "
                       "backends in the same order?");
      }
      if (theirs->starts_with("!")) {
        return publish("!" + who + " could not create its backend (" + theirs->substr(1) +
                       "); every process must be given settings its backend takes");
      }
      if (theirs->substr(1) != backend) {
        return publish("!" + who + " creates backend '" + theirs->substr(1) +
                       "' where rank 0 creates '" + backend +
                       "'; every process must create the same backends in the same order");
      }
    }
    return publish("=");
  }
  if (!mine.ok()) return mine;
  TRIBUTARY_RETURN_IF_ERROR(said);
  // Rank 0 decides by its own deadline, which starts when it arrives: wait for it to arrive, then
  // for its verdict a little longer than its deadline, so that no rank gives up before it decides.
  StatusOr<std::string> verdict = store.get(prefix + "0", left());
  if (verdict.ok()) verdict = store.get(prefix + "verdict", wait + milliseconds(2000));
  if (verdict.ok()) return from_verdict(*verdict);
  if (verdict.status().code() != StatusCode::kDeadlineExceeded) return verdict.status();
  // No verdict: name who never said anything (rank 0 among them, when it never came).
  std::vector<std::string> absent;
  for (int r = 0; r < context.world_size; ++r) {
    auto there = store.check({prefix + std::to_string(r)});
    if (there.ok() && !*there) absent.push_back(std::to_string(r));
  }
  return name_setup_failure(
      context,
      deadline_exceeded(
          (absent.empty() ? std::string("rank 0 gave no verdict")
                          : "rank " + internal::join(absent, ", rank ") + " did not join") +
          ": the setup of backend '" + backend + "' did not complete within " +
          format_duration(wait) +
          " (timeout=); is every process running, with the same secret, and creating the same "
          "backends in the same order?"));
}

}  // namespace

// Said by a process that will not create its backend (its spec or settings were refused before it
// joined): the others, waiting at the meeting, fail at once naming it.
Status internal::announce_setup_failure(const BackendContext& context, const std::string& backend,
                                        const Status& failure) {
  if (backend == "auto" && context.world_size > 1 && context.store) {
    // Peers creating 'auto' first agree on what it follows (agree_on_auto): say it there too.
    if (auto n = internal::take_number(context, internal::Numbering::kInstances); n.ok()) {
      (void)context.store->set(
          "auto/" + std::to_string(*n + 1) + "/" + std::to_string(context.rank),
          "!" + failure.message(), std::chrono::seconds(5));
    }
  }
  return meet_before_setup(context, backend, failure);
}

bool stages_gpu_through_host(const BackendInfo& info) {
  return gpu::built() && !info.capabilities.supports(DeviceType::kCuda) &&
         info.capabilities.supports(DeviceType::kCpu);
}

Status can_serve(const BackendInfo& info, const BackendContext& context) {
  if (context.devices.empty()) return invalid_argument("the context has no devices");
  // Sorted, so that thousands of replicas cost O(n log n), not O(n^2).
  std::vector<std::pair<int, int>> listed;
  listed.reserve(context.devices.size());
  for (const Device& d : context.devices) listed.emplace_back(static_cast<int>(d.type()), d.index());
  std::sort(listed.begin(), listed.end());
  for (size_t i = 1; i < listed.size(); ++i) {
    if (listed[i] == listed[i - 1]) {
      // As TF's MirroredStrategy: "No duplicates allowed in `devices` argument".
      const Device twice(static_cast<DeviceType>(listed[i].first), listed[i].second);
      return invalid_argument("device " + twice.to_string() +
                              " is listed twice; each local replica needs its own device");
    }
  }
  const bool staged = stages_through_host(info, context);
  for (const Device& d : context.devices) {
    if (!info.capabilities.supports(d.type()) && !(staged && d.is_cuda())) {
      return unimplemented("it does not support " + std::string(device_type_name(d.type())) +
                           " devices (" + d.to_string() + ")");
    }
  }
  for (const Device& d : context.devices) {
    // A GPU that this process cannot see: say so (and CUDA_VISIBLE_DEVICES) now, not at the first
    // collective.
    TRIBUTARY_RETURN_IF_ERROR(gpu::check_visible(d));
  }
  if (context.world_size > 1 && !info.capabilities.multi_process) {
    return unimplemented("it works within one process only, and the world size is " +
                         std::to_string(context.world_size));
  }
  if (info.check_available) {
    return info.check_available(staged ? internal::host_context(context) : context);
  }
  return Status();
}

StatusOr<std::string> BackendRegistry::choose_auto(const BackendContext& context) const {
  const BackendInfo* best = nullptr;
  std::string why;
  for (const BackendInfo& b : backends_) {
    Status s = can_serve(b, context);
    if (!s.ok()) {
      why += "\n  " + b.name + ": " + s.message();
      continue;
    }
    if (best == nullptr || b.auto_priority > best->auto_priority) best = &b;
  }
  if (best == nullptr) {
    return not_found("'auto' found no backend that can serve " +
                     std::to_string(context.devices.size()) + " local replica(s) x " +
                     std::to_string(context.world_size) + " process(es):" + why);
  }
  return best->name;
}

StatusOr<std::optional<TuningTable>> BackendRegistry::tuning_for(
    const BackendContext& context, const std::optional<std::string>& from_spec) const {
  std::string path, origin;
  if (from_spec) {
    path = *from_spec;
    origin = "auto:tuning_file=" + path;
  } else if (const Config::Entry* e = context.config.find("TRIBUTARY_TUNING_FILE")) {
    path = e->value;
    origin = "TRIBUTARY_TUNING_FILE (" + e->source + ")";
  }
  if (path.empty() || path == "none") return std::optional<TuningTable>();
  auto table = TuningTable::load(path);
  // The file's own messages name it; from the config, say which setting named it too.
  if (!table.ok()) return from_spec ? table.status() : table.status().with_context(origin);
  for (const std::string& s : table->specs()) {
    auto parsed = BackendSpec::parse(s);
    if (parsed.ok() && find(parsed->name) == nullptr) {
      return not_found(origin + ": tuning file '" + path + "' names backend '" + parsed->name +
                       "', which this build does not have; available: " +
                       internal::join(names(), ", "));
    }
  }
  Status applies = table->check_applies(tuning_layout_of(context));
  if (!applies.ok()) {
    const std::string why = "tuning file '" + path + "' does not apply here: " + applies.message();
    if (from_spec) return Status(applies.code(), why);
    internal::Logger(internal::log_level_from(context.config),
                     "rank " + std::to_string(context.rank) + "/auto")
        .log(internal::LogLevel::kWarning, "{} (from {}); 'auto' uses its cost model instead", why,
             origin);
    return std::optional<TuningTable>();
  }
  return std::optional<TuningTable>(std::move(table).value());
}

StatusOr<std::unique_ptr<CrossDeviceOps>> BackendRegistry::create_tuned(
    TuningTable table, const std::vector<std::pair<std::string, std::string>>& common,
    const BackendContext& context) const {
  std::vector<std::unique_ptr<CrossDeviceOps>> members;
  const std::string origin = table.summary();
  for (const std::string& s : table.specs()) {
    TRIBUTARY_ASSIGN_OR_RETURN(BackendSpec member, BackendSpec::parse(s));
    // Options given to auto (timeout) apply to every member that does not set its own.
    for (const auto& option : common) {
      const bool set = std::any_of(member.options.begin(), member.options.end(),
                                   [&](const auto& kv) { return kv.first == option.first; });
      if (!set) member.options.push_back(option);
    }
    auto made = create(member, context);
    if (!made.ok()) return made.status().with_context("tuning rule '" + s + "'");
    members.push_back(std::move(made).value());
  }
  if (members.size() == 1) return std::move(members[0]);
  std::string source = table.source.empty() ? origin : table.source;
  return internal::make_tuned_ops(context, std::move(table), std::move(source),
                                  std::move(members));
}

namespace {
// "auto"'s options: the ones every backend shares, passed on to the backend it picks, and
// tuning_file.
struct AutoOptions {
  std::vector<std::pair<std::string, std::string>> common;
  std::optional<std::string> tuning_file;
};
StatusOr<AutoOptions> auto_options(const BackendSpec& spec) {
  AutoOptions out;
  for (const auto& [key, value] : spec.options) {
    if (key == "tuning_file") {
      out.tuning_file = value;
      continue;
    }
    // (Not captured by reference: clang 14 cannot capture a structured binding.)
    bool common = std::any_of(common_options().begin(), common_options().end(),
                              [&key = key](const OptionDef& d) { return d.name == key; });
    if (!common) {
      return invalid_argument(
          "'auto' accepts only the options every backend has, and "
          "tuning_file (the tuning file it follows); '" +
          key + "' is not one of them. The options every backend has:\n" +
          describe_options(common_options()));
    }
    out.common.emplace_back(key, value);
  }
  return out;
}

Status check_timeout(const std::string& backend, const Options& options) {
  if (const Options::Value* t = options.find("timeout"); t && t->i <= 0) {
    return invalid_argument("backend '" + backend + "': timeout must be positive, not " + t->text +
                            " (from " + t->source + ")");
  }
  return Status();
}
}  // namespace

StatusOr<std::pair<const BackendInfo*, Options>> BackendRegistry::resolve(
    const BackendSpec& spec, const Config& config) const {
  const BackendInfo* info = find(spec.name);
  if (info == nullptr) {
    return not_found("unknown backend '" + spec.name + "'; available backends: auto, " +
                     internal::join(names(), ", "));
  }
  TRIBUTARY_ASSIGN_OR_RETURN(Options options,
                             Options::resolve(info->name, options_of(*info), spec.options, config));
  TRIBUTARY_RETURN_IF_ERROR(check_timeout(info->name, options));
  if (info->check_options) TRIBUTARY_RETURN_IF_ERROR(info->check_options(options));
  return std::pair<const BackendInfo*, Options>(info, std::move(options));
}

Status BackendRegistry::check(std::string_view spec, const Config& config) const {
  std::string text(spec);
  std::string source;
  if (text.empty()) {
    const Config::Entry* e = config.find("TRIBUTARY_CROSS_DEVICE_OPS");
    if (e == nullptr) return Status();  // auto, without options
    text = e->value;
    source = "TRIBUTARY_CROSS_DEVICE_OPS='" + e->value + "' (" + e->source + ")";
  }
  Status s = [&]() -> Status {
    TRIBUTARY_ASSIGN_OR_RETURN(BackendSpec parsed, BackendSpec::parse(text));
    if (parsed.name != "auto") return resolve(parsed, config).status();
    // auto's own options, and the values of those it passes on to the backend it picks.
    TRIBUTARY_ASSIGN_OR_RETURN(AutoOptions given, auto_options(parsed));
    TRIBUTARY_ASSIGN_OR_RETURN(Options common,
                               Options::resolve("auto", common_options(), given.common, config));
    return check_timeout("auto", common);
  }();
  return source.empty() || s.ok() ? s : s.with_context(source);
}

Status BackendRegistry::check_everywhere(std::string_view spec, const Config& config,
                                         const std::vector<Device>& devices) const {
  const Status checked = check(spec, config);
  return checked.ok() ? checked : internal::refuse_everywhere(devices, config, spec, checked);
}

StatusOr<std::unique_ptr<CrossDeviceOps>> BackendRegistry::create(
    const BackendSpec& spec, const BackendContext& context) const {
  warn_unknown_variables_once(*this, context);
  BackendSpec resolved = spec;
  if (spec.name == "auto") {
    TRIBUTARY_ASSIGN_OR_RETURN(AutoOptions given, auto_options(spec));
    resolved.options = std::move(given.common);
    TRIBUTARY_ASSIGN_OR_RETURN(std::optional<TuningTable> table,
                               tuning_for(context, given.tuning_file));
    if (!table) {
      TRIBUTARY_ASSIGN_OR_RETURN(resolved.name, choose_auto(context));
    }
    // Every rank must make the same choice before any backend connects: a rank following another
    // file (or none) would otherwise wait out the rendezvous timeout with an unrelated error.
    TRIBUTARY_RETURN_IF_ERROR(agree_on_auto(
        context, table ? "the tuning rules '" + table->summary() + "' (digest " +
                             std::to_string(table->digest()) + ")"
                       : "the cost model's choice '" + resolved.name + "' (no tuning file)"));
    internal::Logger(internal::log_level_from(context.config),
                     "rank " + std::to_string(context.rank) + "/auto")
        .log(internal::LogLevel::kInfo, "{}",
             table ? "follows tuning file '" + table->source + "': " + table->summary()
                   : "follows its cost model: " + resolved.name);
    if (table) return create_tuned(std::move(*table), resolved.options, context);
  }
  // The spec first: a misspelt option is reported as such wherever it is read, also on a machine
  // that cannot serve the backend.
  auto found = resolve(resolved, context.config);
  if (!found.ok()) return meet_before_setup(context, resolved.name, found.status());
  auto& [info, options] = *found;
  Status usable = can_serve(*info, context);
  if (!usable.ok()) {
    return meet_before_setup(
        context, info->name,
        Status(usable.code(),
               "backend '" + info->name + "' cannot be used here: " + usable.message()));
  }
  // Malformed observability settings (TRIBUTARY_FLIGHT_RECORDER_SIZE, ...) are reported here,
  // before any rank connects: the front door only reads them. The backend's timeout= bounds the
  // wait for the others, as it bounds its own setup.
  const Status met = meet_before_setup(context, info->name,
                                       internal::FlightSettings::from(context.config).status(),
                                       options.get_duration("timeout"));
  // A store that went away while the ranks met (its host, rank 0, failed: often for a reason every
  // rank meets in the backend's own checks, such as a value the world size refuses) leaves the
  // answer to the setup below, which finds that reason here too, or names rank 0.
  if (!met.ok() && met.code() != StatusCode::kUnavailable) return met;
  if (stages_through_host(*info, context)) {
    auto made = info->create(internal::host_context(context), std::move(options));
    if (!made.ok()) return name_setup_failure(context, made.status());
    return internal::make_host_staged_ops(context, std::move(made).value());
  }
  auto made = info->create(context, std::move(options));
  if (!made.ok()) return name_setup_failure(context, made.status());
  return made;
}

StatusOr<std::unique_ptr<CrossDeviceOps>> BackendRegistry::create(
    std::string_view spec, const BackendContext& context) const {
  TRIBUTARY_ASSIGN_OR_RETURN(BackendSpec parsed, BackendSpec::parse(spec));
  return create(parsed, context);
}

StatusOr<std::unique_ptr<CrossDeviceOps>> BackendRegistry::create_from_config(
    const BackendContext& context) const {
  const Config::Entry* e = context.config.find("TRIBUTARY_CROSS_DEVICE_OPS");
  if (e == nullptr) return create(std::string_view("auto"), context);
  auto made = create(std::string_view(e->value), context);
  if (!made.ok()) {
    return made.status().with_context("TRIBUTARY_CROSS_DEVICE_OPS='" + e->value + "' (" +
                                      e->source + ")");
  }
  return made;
}

}  // namespace tributary
