// Config: a snapshot of tributary's settings, read once from the environment and optionally from a
// config file, then passed around as a value (no hidden globals).
//
// Keys are environment-variable names (TRIBUTARY_CROSS_DEVICE_OPS, TRIBUTARY_LOG_LEVEL,
// TRIBUTARY_TIMEOUT, TRIBUTARY_<BACKEND>_<OPTION>, ...). A JSON config file maps onto the same keys:
//
//   { "cross_device_ops": "hierarchical_copy:num_packs=2",      -> TRIBUTARY_CROSS_DEVICE_OPS
//     "log_level": "info",                                      -> TRIBUTARY_LOG_LEVEL
//     "timeout": "30s",                                         -> TRIBUTARY_TIMEOUT
//     "tuning_file": "tuning.json",                             -> TRIBUTARY_TUNING_FILE
//     "timeline": "trace.json",                                 -> TRIBUTARY_TIMELINE
//     "stall_check_time": "60s",                                -> TRIBUTARY_STALL_CHECK_TIME
//     "flight_recorder_size": 256,                              -> TRIBUTARY_FLIGHT_RECORDER_SIZE
//     "flight_recorder_file": "/tmp/fr-{rank}.json",            -> TRIBUTARY_FLIGHT_RECORDER_FILE
//     "backends": { "hierarchical_copy": { "group_size": 4 } } } -> TRIBUTARY_HIERARCHICAL_COPY_GROUP_SIZE
//
// "cross_device_ops" may also be an object {"name": "...", "options": {...}}. Precedence, highest
// first: an explicit option (in code, or a command-line flag) > the environment > the config file >
// the built-in default, for one variable. A backend's options resolve by key first: its own key
// (TRIBUTARY_<BACKEND>_<KEY>, from either source) beats the shared one (TRIBUTARY_<KEY>), as
// Options::resolve does. Config::load() reads TRIBUTARY_CONFIG_FILE when set.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "tributary/export.h"
#include "tributary/status.h"

TRIBUTARY_BEGIN_PUBLIC_API
namespace tributary {

class Config {
 public:
  struct Entry {
    std::string value;
    std::string source;  // "environment", "file <path>", "code"
  };

  Config() = default;
  // Every TRIBUTARY_* variable of the process environment, plus TF_CONFIG and the launcher
  // variables the cluster spec reads (torchrun's RANK/WORLD_SIZE/..., SLURM_*, OMPI_COMM_WORLD_*).
  static Config from_environment();
  // For tests and embedding: entries given explicitly (source "code").
  static Config from_map(const std::map<std::string, std::string>& entries);
  // A JSON file in the format above; malformed JSON or an unknown top-level key is an error naming
  // the file and the key.
  static StatusOr<Config> from_file(const std::string& path);
  static StatusOr<Config> from_json(std::string_view json, std::string_view origin);
  // The environment over TRIBUTARY_CONFIG_FILE (if set) over nothing.
  static StatusOr<Config> load();

  std::optional<std::string> get(std::string_view key) const;
  const Entry* find(std::string_view key) const;
  void set(std::string key, std::string value, std::string source = "code");
  // Entries of `this` win over those of `lower`.
  Config merged_over(const Config& lower) const;
  const std::map<std::string, Entry, std::less<>>& entries() const { return entries_; }

  // One "KEY=value  (source)" line per entry, sorted.
  std::string dump() const;

 private:
  std::map<std::string, Entry, std::less<>> entries_;
};

}  // namespace tributary
TRIBUTARY_END_PUBLIC_API
