// tributary-info: what this build of tributary offers and what it would do here, like ucc_info or
// ompi_info.
//
//   tributary-info [--replicas N | --devices CPU:0,CPU:1] [--json] [--version]
// Lists the build settings (CUDA, NCCL, UCX, Gloo as built), the GPUs, the backends compiled in
// with their capabilities, availability here and options; each setting of the environment and
// TRIBUTARY_CONFIG_FILE with what it sets (and a warning, with a "did you mean", for TRIBUTARY_*
// variables that nothing reads); the cluster this process is part of; and what `auto` chooses for
// the given local devices in that cluster (under tributary-run: what the job would get). --json
// gives the same as one JSON document.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/cpus.h"
#include "tributary/tributary.h"

namespace {

using namespace tributary;
using nlohmann::json;

// What the library's settings that are not backend options set. Backend options are read from
// TRIBUTARY_<BACKEND>_<OPTION> (and TRIBUTARY_<OPTION> for the shared ones) and listed from the
// registry. Keep in step with kGlobalVariables in core/registry.cc, which warns about the others.
struct Setting {
  std::string_view name;
  std::string_view sets;
};
constexpr Setting kGlobalSettings[] = {
    {"TRIBUTARY_CROSS_DEVICE_OPS", "the backend spec programs create when they name none"},
    {"TRIBUTARY_CONFIG_FILE", "a JSON config file, read beneath the environment"},
    {"TRIBUTARY_LOG_LEVEL", "the log level: trace, debug, info, warning (default), error, off"},
    {"TRIBUTARY_TUNING_FILE", "the tuning file that auto follows (from tributary-tune)"},
    {"TRIBUTARY_TIMELINE", "a Chrome trace of every collective, written to this path"},
    {"TRIBUTARY_STALL_CHECK_TIME", "when a pending collective is reported as stalled (0 = off)"},
    {"TRIBUTARY_FLIGHT_RECORDER_SIZE", "how many recent collectives each instance keeps"},
    {"TRIBUTARY_FLIGHT_RECORDER_FILE", "where flight-recorder dumps also go, as JSON"},
    {"TRIBUTARY_SECRET", "the job's shared secret (the store and peers authenticate)"},
    {"TRIBUTARY_SECRET_FILE", "a file holding the job's shared secret"},
    {"TRIBUTARY_HOST_ID", "this host's identity, which decides who shares memory"},
    {"TRIBUTARY_NUM_THREADS", "worker threads for large host reductions and copies"},
    {"TRIBUTARY_VIRTUAL_GPUS", "how many virtual GPUs each GPU appears as"},
    {"TRIBUTARY_RANK", "cluster: this process's rank (asked before any other provider)"},
    {"TRIBUTARY_WORLD_SIZE", "cluster: the number of processes"},
    {"TRIBUTARY_LOCAL_RANK", "cluster: this process's index on its host"},
    {"TRIBUTARY_LOCAL_WORLD_SIZE", "cluster: the processes on this host"},
    {"TRIBUTARY_MASTER_ADDR", "cluster: the rendezvous store's host (over any provider's)"},
    {"TRIBUTARY_MASTER_PORT", "cluster: the rendezvous store's port (over any provider's)"},
    {"TRIBUTARY_STORE_FD",
     "cluster: the inherited listening socket this process serves on (rank 0's store, or a "
     "parameter-server task's port; tributary-run sets it for rank 0)"},
    // The project's scripts' own (kScriptVariables in core/registry.cc).
    {"TRIBUTARY_BUILD_DIR",
     "scripts: the build folder of quickstart.sh, compare_mpi.sh and multihost.sh (the library "
     "does not read it)"},
    {"TRIBUTARY_OUT_DIR", "scripts: where quickstart.sh writes its figures and plots"},
    {"TRIBUTARY_TEST_BUILD_DIR", "scripts: the build folder of test.sh"},
    {"TRIBUTARY_CI_FUZZ_SECONDS", "scripts: how long .ci/run fuzzes each target"},
    {"TRIBUTARY_CI_SANITIZERS", "scripts: 0 makes .ci/run skip its sanitizer and fuzz stages"},
    {"TRIBUTARY_SANITIZE_TARGETS",
     "scripts: the targets 'sanitize.sh address' builds (default: all)"},
};

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

// Every TRIBUTARY_* name this build reads -> what it sets.
std::vector<std::pair<std::string, std::string>> known_settings(const BackendRegistry& registry) {
  std::vector<std::pair<std::string, std::string>> known;
  for (const Setting& s : kGlobalSettings) known.emplace_back(s.name, s.sets);
  for (const BackendInfo& b : registry.backends()) {
    for (const OptionDef& d : registry.options_of(b)) {
      const std::string what = " (" + std::string(option_type_name(d.type)) +
                               (d.default_value.empty() ? "" : ", default " + d.default_value) +
                               ")";
      known.emplace_back("TRIBUTARY_" + upper(b.name) + "_" + upper(d.name),
                         "option " + d.name + " of backend " + b.name + what);
      const std::string shared = "TRIBUTARY_" + upper(d.name);
      if (d.shared && std::none_of(known.begin(), known.end(),
                                   [&](const auto& k) { return k.first == shared; })) {
        known.emplace_back(shared, "option " + d.name + " of every backend" + what);
      }
    }
  }
  return known;
}

// What a variable that is not TRIBUTARY_* but read by the cluster spec sets.
std::string cluster_setting(std::string_view key) {
  if (key == "TF_CONFIG") return "cluster: TF_CONFIG (TensorFlow's cluster and task)";
  if (key.starts_with("OMPI_")) return "cluster: Open MPI's rank, size and local rank";
  if (key.starts_with("SLURM_")) return "cluster: Slurm's task layout (where it is one read)";
  return "cluster: torchrun's " + std::string(key);
}

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

// The known name closest to `key`, when it is a slip of a few letters (the library's rule).
std::string suggestion(std::string_view key,
                       const std::vector<std::pair<std::string, std::string>>& known) {
  const std::string* best = nullptr;
  size_t best_distance = 0;
  for (const auto& [name, _] : known) {
    const size_t d = edit_distance(key, name);
    if (best == nullptr || d < best_distance) {
      best = &name;
      best_distance = d;
    }
  }
  const size_t close = std::max<size_t>(2, (key.size() - 10) / 4);
  return best != nullptr && best_distance <= close ? *best : "";
}

// Why backend `b` cannot serve `ctx`, or "" (the registry's own check).
std::string unavailable(const BackendInfo& b, const BackendContext& ctx) {
  Status s = can_serve(b, ctx);
  return s.ok() ? "" : s.message();
}

// The capabilities line, saying when GPU tensors are staged through host memory.
std::string capabilities_text(const BackendInfo& b) {
  return b.capabilities.to_string() +
         (stages_gpu_through_host(b) ? " (GPU tensors: staged through pinned host memory)" : "");
}

struct Flags {
  int replicas = 2;
  std::string devices;
  bool json = false;
  bool version = false;
};

// Parses the command line; returns the exit status when it says to exit now.
std::optional<int> parse(int argc, char** argv, Flags& f, std::vector<Device>& devices) {
  CLI::App app("Lists tributary's build settings, backends (capabilities, availability, options), "
               "the settings of the environment and what each sets, the cluster, and what 'auto' "
               "chooses here.",
               "tributary-info");
  app.add_option("-r,--replicas", f.replicas, "local CPU replicas to ask 'auto' about")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--devices", f.devices, "local devices to ask 'auto' about instead")
      ->type_name("CPU:0,GPU:1,...");
  app.add_flag("--json", f.json, "print one JSON document instead of text");
  app.add_flag("--version", f.version, "print the version and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "tributary-info: %s (see --help)\n", e.what());
    return 2;
  }
  if (f.version) return std::nullopt;
  size_t start = 0;
  while (!f.devices.empty() && start <= f.devices.size()) {
    const size_t comma = f.devices.find(',', start);
    auto d = Device::parse(f.devices.substr(start, comma - start));
    if (!d.ok()) {
      std::fprintf(stderr, "tributary-info: --devices: %s\n", d.status().message().c_str());
      return 2;
    }
    devices.push_back(*d);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (devices.empty()) {
    for (int i = 0; i < f.replicas; ++i) devices.push_back(Device::cpu(i));
  }
  return std::nullopt;
}

json build_json(const BuildInfo& b) {
  return {{"type", b.build_type},
          {"compiler", b.compiler},
          {"cuda", {{"built", b.cuda}, {"toolkit", b.cuda_toolkit}, {"runtime", b.cuda_runtime},
                    {"driver", b.cuda_driver}}},
          {"nccl", {{"built", b.nccl}, {"version", b.nccl_version}}},
          {"ucx", {{"built", b.ucx}, {"version", b.ucx_version}}},
          {"gloo", {{"built", b.gloo}, {"version", b.gloo_version}}}};
}

std::string built_text(bool built, const std::string& version) {
  return built ? (version.empty() ? "yes" : version) : "no";
}

void print_build(const BuildInfo& b) {
  std::printf("build: %s, %s; CUDA %s, NCCL %s, UCX %s, Gloo %s\n", b.build_type.c_str(),
              b.compiler.c_str(), built_text(b.cuda, b.cuda_toolkit).c_str(),
              built_text(b.nccl, b.nccl_version).c_str(), built_text(b.ucx, b.ucx_version).c_str(),
              built_text(b.gloo, b.gloo_version).c_str());
  if (!b.cuda) {
    std::printf("CUDA: not built in (configure with -DTRIBUTARY_WITH_CUDA=ON)\n");
    return;
  }
  std::printf("CUDA: runtime %s, driver %s; %s\n", b.cuda_runtime.c_str(),
              b.cuda_driver.empty() ? "none found" : b.cuda_driver.c_str(),
              b.visible_devices.c_str());
  if (b.virtual_gpus_per_gpu > 1) {
    std::printf("  TRIBUTARY_VIRTUAL_GPUS=%d: each GPU appears as %d virtual ones\n",
                b.virtual_gpus_per_gpu, b.virtual_gpus_per_gpu);
  }
  for (const std::string& g : b.gpus) std::printf("  %s\n", g.c_str());
  if (b.gpus.empty()) std::printf("  no GPU visible: %s\n", b.gpu_error.c_str());
}

// The settings in `config`, each with what it sets; unknown TRIBUTARY_* ones get a warning.
// `known_only` receives the config without the unknown ones (so that the library, creating a
// backend below, does not warn a second time).
json settings_json(const Config& config, const BackendRegistry& registry, Config& known_only,
                   std::vector<std::string>& warnings) {
  const auto known = known_settings(registry);
  json out = json::array();
  for (const auto& [key, entry] : config.entries()) {
    json item = {{"name", key},
                 {"value", key.find("SECRET") != std::string::npos &&
                                       key != "TRIBUTARY_SECRET_FILE" && !entry.value.empty()
                               ? "<hidden>"
                               : entry.value},
                 {"source", entry.source}};
    auto it = std::find_if(known.begin(), known.end(),
                           [&key = key](const auto& k) { return k.first == key; });
    if (it != known.end()) {
      item["sets"] = it->second;
    } else if (!key.starts_with("TRIBUTARY_")) {
      item["sets"] = cluster_setting(key);
    } else {
      item["sets"] = nullptr;
      std::string warning = key + " (" + entry.source + ") is not read by tributary";
      if (std::string s = suggestion(key, known); !s.empty()) {
        item["did_you_mean"] = s;
        warning += "; did you mean " + s + "?";
      }
      warnings.push_back(warning);
      out.push_back(item);
      continue;
    }
    known_only.set(key, entry.value, entry.source);
    out.push_back(item);
  }
  return out;
}

json cluster_json(const StatusOr<ClusterSpec>& cluster) {
  if (!cluster.ok()) return {{"error", cluster.status().message()}};
  return {{"source", cluster->source},
          {"rank", cluster->rank},
          {"world_size", cluster->world_size},
          {"local_rank", cluster->local_rank ? json(*cluster->local_rank) : json(nullptr)},
          {"local_world_size",
           cluster->local_world_size ? json(*cluster->local_world_size) : json(nullptr)},
          {"coordinator", cluster->coordinator_address()},
          {"describe", cluster->describe()}};
}

// What `auto` resolves to for `ctx`: the tuning file's rules, else the cost model's choice.
json auto_json(const BackendRegistry& registry, const BackendContext& ctx) {
  json out;
  std::vector<std::string> names;
  for (const Device& d : ctx.devices) names.push_back(d.to_string());
  out["devices"] = names;
  out["processes"] = ctx.world_size;
  auto chosen = registry.choose_auto(ctx);
  out["cost_model"] = chosen.ok() ? json(*chosen) : json(nullptr);
  if (!chosen.ok()) out["cost_model_error"] = chosen.status().message();
  out["resolves_to"] = out["cost_model"];
  if (const Config::Entry* e = ctx.config.find("TRIBUTARY_TUNING_FILE")) {
    json t = {{"path", e->value}, {"source", e->source}};
    auto tuning = registry.tuning_for(ctx, std::nullopt);
    if (!tuning.ok()) {
      t["error"] = tuning.status().message();
    } else if (*tuning) {
      t["followed"] = true;
      t["rules"] = (*tuning)->summary();
      out["resolves_to"] = "tuned: " + (*tuning)->summary();
    } else {
      t["followed"] = false;
    }
    out["tuning_file"] = t;
  }
  return out;
}

// The backend programs get from the configuration. In a cluster it is only named: creating it
// would join the job.
json selected_json(const BackendRegistry& registry, const BackendContext& ctx,
                   const json& automatic) {
  const Config::Entry* e = ctx.config.find("TRIBUTARY_CROSS_DEVICE_OPS");
  json out = {{"from", e ? "TRIBUTARY_CROSS_DEVICE_OPS (" + e->source + ")" : "auto"}};
  if (ctx.world_size > 1) {
    auto spec = BackendSpec::parse(e ? e->value : "auto");
    if (!spec.ok()) {
      out["error"] = spec.status().message();
    } else if (spec->name == "auto") {
      out["spec"] = automatic["resolves_to"];
    } else {
      out["spec"] = spec->to_string();
    }
    out["created"] = false;
    return out;
  }
  auto selected = registry.create_from_config(ctx);
  out["created"] = selected.ok();
  if (selected.ok()) {
    out["spec"] = (*selected)->spec();
  } else {
    out["error"] = selected.status().message();
  }
  return out;
}

// The CPUs this process may run on (core/cpus.h): what sizes the in-process thread pool and, with
// the other ranks' on this machine, decides whether ring's and ucx's waits may poll.
json cpus_json() {
  std::string error;
  const std::vector<int> cpus = internal::affinity_cpus(&error);
  return {{"usable", internal::usable_cpus()},
          {"online", internal::online_cpus()},
          {"affinity", cpus.empty() ? json(nullptr) : json(internal::cpu_list_text(cpus))},
          {"error", error}};
}

void print_cpus(const json& c) {
  std::printf("CPUs: this process may run on %d of %d online (affinity %s)\n",
              c["usable"].get<int>(), c["online"].get<int>(),
              c["affinity"].is_null() ? ("unknown: " + c["error"].get<std::string>()).c_str()
                                      : c["affinity"].get<std::string>().c_str());
}

void print_human(const json& doc, const BackendRegistry& registry, const BuildInfo& build) {
  std::printf("tributary %s\n", std::string(version()).c_str());
  print_build(build);
  print_cpus(doc["cpus"]);
  std::printf("\n");
  for (const BackendInfo& b : registry.backends()) {
    const json& j = *std::find_if(doc["backends"].begin(), doc["backends"].end(),
                                  [&](const json& x) { return x["name"] == b.name; });
    std::printf("backend %s\n  %s\n  %s\n  available here: %s\n  options:\n%s\n", b.name.c_str(),
                b.summary.c_str(), capabilities_text(b).c_str(),
                j["available"].get<bool>()
                    ? "yes"
                    : ("no: " + j["why_not"].get<std::string>()).c_str(),
                describe_options(registry.options_of(b)).c_str());
  }
  std::printf("configuration (environment, TRIBUTARY_CONFIG_FILE):\n");
  if (doc["settings"].empty()) std::printf("  (nothing set)\n");
  for (const json& s : doc["settings"]) {
    std::string sets = s["sets"].is_null() ? "nothing: tributary does not read it" : s["sets"];
    if (s.contains("did_you_mean")) sets += "; did you mean " + s["did_you_mean"].get<std::string>() + "?";
    std::printf("  %s=%s  (%s)\n    sets: %s\n", s["name"].get<std::string>().c_str(),
                s["value"].get<std::string>().c_str(), s["source"].get<std::string>().c_str(),
                sets.c_str());
  }
  std::printf("\n");
  const json& c = doc["cluster"];
  if (c.contains("error")) {
    std::printf("cluster: error: %s\n", c["error"].get<std::string>().c_str());
  } else {
    std::printf("cluster: %s\n", c["describe"].get<std::string>().c_str());
  }
  const json& a = doc["auto"];
  std::string devices;
  for (const json& d : a["devices"]) {
    devices += (devices.empty() ? "" : ",") + d.get<std::string>();
  }
  const int processes = a["processes"].get<int>();
  if (processes > 1) devices += " in each of " + std::to_string(processes) + " processes";
  std::printf("auto's cost model, for devices %s: %s\n", devices.c_str(),
              a["cost_model"].is_null()
                  ? ("none (" + a["cost_model_error"].get<std::string>() + ")").c_str()
                  : a["cost_model"].get<std::string>().c_str());
  if (a.contains("tuning_file")) {
    const json& t = a["tuning_file"];
    const std::string head = "tuning file " + t["path"].get<std::string>() + " (" +
                             t["source"].get<std::string>() + "): ";
    if (t.contains("error")) {
      std::printf("%serror: %s\n", head.c_str(), t["error"].get<std::string>().c_str());
    } else if (t["followed"].get<bool>()) {
      std::printf("%sauto follows it: %s\n", head.c_str(), t["rules"].get<std::string>().c_str());
    } else {
      std::printf("%snot followed here (see the warning above)\n", head.c_str());
    }
  }
  const json& s = doc["selected"];
  if (s.contains("error")) {
    std::printf("selected (TRIBUTARY_CROSS_DEVICE_OPS or auto): error: %s\n",
                s["error"].get<std::string>().c_str());
  } else {
    std::printf("selected (TRIBUTARY_CROSS_DEVICE_OPS or auto): %s%s\n",
                s["spec"].get<std::string>().c_str(),
                s["created"].get<bool>() ? "" : " (in this job; not created here, which would "
                                                "join it)");
  }
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  std::vector<Device> devices;
  if (auto code = parse(argc, argv, flags, devices)) return *code;
  if (flags.version) {
    std::printf("tributary %s\n", std::string(version()).c_str());
    return 0;
  }
  auto config = Config::load();
  if (!config.ok()) {
    std::fprintf(stderr, "tributary-info: %s\n", config.status().message().c_str());
    return 1;
  }
  BackendRegistry registry = builtin_backends();
  const BuildInfo build = build_info();

  json doc;
  doc["version"] = std::string(version());
  doc["build"] = build_json(build);
  doc["cpus"] = cpus_json();
  doc["gpus"] = build.gpus;
  doc["gpu_error"] = build.gpu_error;
  doc["visible_devices"] = build.visible_devices;
  std::vector<std::string> warnings;
  Config known_only;
  doc["settings"] = settings_json(*config, registry, known_only, warnings);
  doc["warnings"] = warnings;

  // The context this process would get in its cluster, without joining it (no store).
  BackendContext ctx;
  ctx.devices = devices;
  ctx.config = known_only;
  auto cluster = resolve_cluster_spec(*config);
  doc["cluster"] = cluster_json(cluster);
  if (cluster.ok()) {
    ctx.rank = cluster->rank;
    ctx.world_size = cluster->world_size;
  }
  doc["backends"] = json::array();
  for (const BackendInfo& b : registry.backends()) {
    json options = json::array();
    for (const OptionDef& d : registry.options_of(b)) {
      options.push_back({{"name", d.name},
                         {"type", option_type_name(d.type)},
                         {"default", d.default_value},
                         {"help", d.help},
                         {"variable", "TRIBUTARY_" + upper(b.name) + "_" + upper(d.name)}});
    }
    const std::string why = unavailable(b, ctx);
    doc["backends"].push_back({{"name", b.name},
                               {"summary", b.summary},
                               {"capabilities", b.capabilities.to_string()},
                               {"multi_process", b.capabilities.multi_process},
                               {"gpu_staged_through_host", stages_gpu_through_host(b)},
                               {"available", why.empty()},
                               {"why_not", why},
                               {"options", options}});
  }
  doc["auto"] = auto_json(registry, ctx);
  doc["selected"] = cluster.ok() ? selected_json(registry, ctx, doc["auto"])
                                 : json{{"error", cluster.status().message()}, {"created", false}};

  for (const std::string& w : warnings) {
    std::fprintf(stderr, "tributary-info: warning: %s\n", w.c_str());
  }
  if (flags.json) {
    std::printf("%s\n", doc.dump(2).c_str());
  } else {
    print_human(doc, registry, build);
  }
  return doc["selected"].contains("error") ? 1 : 0;
}
