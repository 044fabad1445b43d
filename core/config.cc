#include "tributary/config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/strings.h"

extern char** environ;

namespace tributary {
namespace {

using nlohmann::json;

// Scalars in a config file may be strings, numbers or booleans; all become option text.
StatusOr<std::string> scalar_text(const json& v, std::string_view where) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return std::string(v.get<bool>() ? "true" : "false");
  if (v.is_number_integer()) return std::to_string(v.get<long long>());
  if (v.is_number()) return v.dump();
  return invalid_argument(std::string(where) + " must be a string, number or boolean, not " +
                          v.dump());
}

std::string key_part(std::string_view name) { return internal::to_upper(name); }

}  // namespace

Config Config::from_environment() {
  // What launchers set, read by resolve_cluster_spec (tributary/cluster.h); SLURM_* besides.
  static constexpr std::string_view kLauncherKeys[] = {"TF_CONFIG",
                                                       "RANK",
                                                       "WORLD_SIZE",
                                                       "LOCAL_RANK",
                                                       "LOCAL_WORLD_SIZE",
                                                       "MASTER_ADDR",
                                                       "MASTER_PORT",
                                                       "OMPI_COMM_WORLD_RANK",
                                                       "OMPI_COMM_WORLD_SIZE",
                                                       "OMPI_COMM_WORLD_LOCAL_RANK",
                                                       "OMPI_COMM_WORLD_LOCAL_SIZE"};
  Config c;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view kv(*e);
    size_t eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    std::string_view key = kv.substr(0, eq);
    if (key.starts_with("TRIBUTARY_") || key.starts_with("SLURM_") ||
        std::ranges::find(kLauncherKeys, key) != std::end(kLauncherKeys)) {
      c.set(std::string(key), std::string(kv.substr(eq + 1)), "environment");
    }
  }
  return c;
}

Config Config::from_map(const std::map<std::string, std::string>& entries) {
  Config c;
  for (const auto& [k, v] : entries) c.set(k, v, "code");
  return c;
}

StatusOr<Config> Config::from_json(std::string_view text, std::string_view origin) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    // parse_error, and out_of_range for a number too large for any type (found by fuzz_config).
    return invalid_argument("config " + std::string(origin) + " is not valid JSON: " + e.what());
  }
  if (!doc.is_object()) {
    return invalid_argument("config " + std::string(origin) + " must hold a JSON object");
  }
  Config c;
  const std::string source = "file " + std::string(origin);
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string& key = it.key();
    const json& v = it.value();
    std::string where = "config " + std::string(origin) + ": '" + key + "'";
    if (key == "cross_device_ops") {
      if (v.is_object()) {
        // {"name": "...", "options": {...}} -> "name:k=v,..."
        if (!v.contains("name") || !v["name"].is_string()) {
          return invalid_argument(where + " needs a string \"name\"");
        }
        std::string spec = v["name"].get<std::string>();
        char sep = ':';
        if (v.contains("options")) {
          const json& opts = v.at("options");
          if (!opts.is_object()) return invalid_argument(where + ".options must be an object");
          for (auto o = opts.begin(); o != opts.end(); ++o) {
            TRIBUTARY_ASSIGN_OR_RETURN(std::string text,
                                       scalar_text(o.value(), where + "." + o.key()));
            spec += sep + o.key() + "=" + text;
            sep = ',';
          }
        }
        for (auto& [k, _] : v.items()) {
          if (k != "name" && k != "options") {
            return invalid_argument(where + " has unknown key '" + k +
                                    "'; valid keys: name, options");
          }
        }
        c.set("TRIBUTARY_CROSS_DEVICE_OPS", spec, source);
      } else {
        TRIBUTARY_ASSIGN_OR_RETURN(std::string text, scalar_text(v, where));
        c.set("TRIBUTARY_CROSS_DEVICE_OPS", text, source);
      }
    } else if (key == "log_level" || key == "timeout" || key == "tuning_file" ||
               key == "timeline" || key == "stall_check_time" || key == "flight_recorder_size" ||
               key == "flight_recorder_file") {
      TRIBUTARY_ASSIGN_OR_RETURN(std::string text, scalar_text(v, where));
      c.set("TRIBUTARY_" + key_part(key), text, source);
    } else if (key == "backends") {
      if (!v.is_object()) return invalid_argument(where + " must be an object of backend names");
      for (auto& [backend, opts] : v.items()) {
        if (!opts.is_object()) {
          return invalid_argument(where + "." + backend + " must be an object of options");
        }
        for (auto& [k, ov] : opts.items()) {
          TRIBUTARY_ASSIGN_OR_RETURN(std::string text,
                                     scalar_text(ov, where + "." + backend + "." + k));
          c.set("TRIBUTARY_" + key_part(backend) + "_" + key_part(k), text, source);
        }
      }
    } else {
      return invalid_argument(where + " is not a known key; valid keys: cross_device_ops, "
                              "log_level, timeout, tuning_file, timeline, stall_check_time, "
                              "flight_recorder_size, flight_recorder_file, backends");
    }
  }
  return c;
}

StatusOr<Config> Config::from_file(const std::string& path) {
  // A config is a few lines; 1 MiB leaves room without letting /dev/zero or a FIFO in.
  TRIBUTARY_ASSIGN_OR_RETURN(std::string text,
                             internal::read_settings_file(path, size_t{1} << 20, "config file"));
  return from_json(text, path);
}

StatusOr<Config> Config::load() {
  Config env = from_environment();
  auto file = env.get("TRIBUTARY_CONFIG_FILE");
  if (!file) return env;
  TRIBUTARY_ASSIGN_OR_RETURN(Config from_file_config, from_file(*file));
  return env.merged_over(from_file_config);
}

std::optional<std::string> Config::get(std::string_view key) const {
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second.value;
}

const Config::Entry* Config::find(std::string_view key) const {
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : &it->second;
}

void Config::set(std::string key, std::string value, std::string source) {
  entries_[std::move(key)] = Entry{std::move(value), std::move(source)};
}

Config Config::merged_over(const Config& lower) const {
  Config c = lower;
  for (const auto& [k, e] : entries_) c.entries_[k] = e;
  return c;
}

std::string Config::dump() const {
  std::string out;
  for (const auto& [k, e] : entries_) {
    std::string value = e.value;
    if (k.find("SECRET") != std::string::npos) value = "<hidden>";
    out += k + "=" + value + "  (" + e.source + ")\n";
  }
  return out;
}

}  // namespace tributary
