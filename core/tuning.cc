// Tuning files and the `tuned` backend (tributary/tuning.h).
#include "tributary/tuning.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/crypto/crypto.h"
#include "core/strings.h"
#include "tributary/cluster.h"
#include "tributary/options.h"
#include "tributary/store.h"
#include "tributary/version.h"

namespace tributary {
namespace {

using nlohmann::json;

constexpr int kFormat = 1;

StatusOr<int> int_field(const json& j, const char* key, std::string_view where) {
  if (!j.contains(key) || !j.at(key).is_number_integer()) {
    return invalid_argument(std::string(where) + ": '" + key + "' must be an integer");
  }
  return j.at(key).get<int>();
}

StatusOr<std::string> string_field(const json& j, const char* key, std::string_view where) {
  if (!j.contains(key) || !j.at(key).is_string()) {
    return invalid_argument(std::string(where) + ": '" + key + "' must be a string");
  }
  return j.at(key).get<std::string>();
}

double number_or_zero(const json& j, const char* key) {
  return j.contains(key) && j.at(key).is_number() ? j.at(key).get<double>() : 0.0;
}

}  // namespace

std::string TuningLayout::to_string() const {
  std::string s = std::to_string(processes) + " process(es)";
  if (processes_per_host > 0) s += " (" + std::to_string(processes_per_host) + " per host)";
  return s + " x " + std::to_string(local_replicas) + " " + device + " replica(s)";
}

TuningLayout tuning_layout_of(const BackendContext& context) {
  TuningLayout l;
  l.processes = context.world_size;
  l.local_replicas = static_cast<int>(context.devices.size());
  l.device = context.devices.empty() ? "CPU"
                                     : std::string(device_type_name(context.devices[0].type()));
  if (context.world_size == 1) {
    l.processes_per_host = 1;
  } else if (auto cluster = resolve_cluster_spec(context.config); cluster.ok()) {
    l.processes_per_host = cluster->local_world_size.value_or(0);
  }
  return l;
}

StatusOr<TuningTable> TuningTable::from_measurements(TuningLayout layout, DType dtype, ReduceOp op,
                                                     std::vector<TuningMeasurement> measurements,
                                                     const std::string& preferred) {
  TuningTable t;
  t.library_version = std::string(version());
  t.layout = std::move(layout);
  t.dtype = dtype;
  t.op = op;
  char host[256] = "";
  if (gethostname(host, sizeof host - 1) == 0) t.host = host;
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  t.created = when;
  std::stable_sort(
      measurements.begin(), measurements.end(),
      [](const TuningMeasurement& a, const TuningMeasurement& b) { return a.bytes < b.bytes; });
  // One measurement per size (the first given): ranges need strictly increasing bounds.
  measurements.erase(std::unique(measurements.begin(), measurements.end(),
                                 [](const TuningMeasurement& a, const TuningMeasurement& b) {
                                   return a.bytes == b.bytes;
                                 }),
                     measurements.end());
  t.measurements = std::move(measurements);
  // Per size, the specs within kTie of the fastest count as equally good (the noise of one
  // machine is larger than their difference); among them, take `preferred` (what the cost model
  // picks: the file overrides it only where a measurement shows a real gain), else keep the
  // current range's spec, else the one that stays good for the most following sizes. Fewer,
  // wider ranges follow.
  constexpr double kTie = 1.05;
  std::vector<const TuningMeasurement*> measured;
  for (const TuningMeasurement& m : t.measurements) {
    if (std::any_of(m.time_us.begin(), m.time_us.end(), [](const auto& x) { return x.second > 0; })) {
      measured.push_back(&m);
    }
  }
  if (measured.empty()) return invalid_argument("no candidate produced a figure at any size");
  const auto time_of = [](const TuningMeasurement& m, const std::string& spec) {
    for (const auto& [s, time] : m.time_us) {
      if (s == spec && time > 0) return time;
    }
    return 0.0;
  };
  const auto best_of = [](const TuningMeasurement& m) {
    double best = 0;
    for (const auto& [s, time] : m.time_us) {
      if (time > 0 && (best == 0 || time < best)) best = time;
    }
    return best;
  };
  // The slowest pass of the spec that was fastest at this size (0 when unknown).
  const auto leader_worst = [&](const TuningMeasurement& m) {
    const double best = best_of(m);
    for (const auto& [s, time] : m.time_us) {
      if (time != best) continue;
      for (const auto& [w, worst] : m.worst_us) {
        if (w == s) return worst;
      }
    }
    return 0.0;
  };
  // Tied with the fastest: within kTie of it, or no slower than the fastest's own slowest pass
  // (its lead did not hold from one pass to the next).
  const auto good = [&](size_t i, const std::string& spec) {
    const double time = time_of(*measured[i], spec);
    return time > 0 && (time <= best_of(*measured[i]) * kTie ||
                        time <= leader_worst(*measured[i]));
  };
  for (size_t i = 0; i < measured.size(); ++i) {
    const TuningMeasurement& m = *measured[i];
    std::string chosen;
    if (!preferred.empty() && good(i, preferred)) {
      chosen = preferred;
    } else if (!t.rules.empty() && good(i, t.rules.back().spec)) {
      chosen = t.rules.back().spec;
    } else {
      size_t longest = 0;
      double fastest = 0;
      for (const auto& [spec, time] : m.time_us) {
        if (!good(i, spec)) continue;
        size_t run = 0;
        while (i + run < measured.size() && good(i + run, spec)) ++run;
        if (run > longest || (run == longest && time < fastest)) {
          chosen = spec;
          longest = run;
          fastest = time;
        }
      }
    }
    if (t.rules.empty() || t.rules.back().spec != chosen) {
      if (!t.rules.empty()) {
        // The boundary between the previous measured size and this one: their geometric mean.
        const double mid = std::sqrt(static_cast<double>(measured[i - 1]->bytes) *
                                     static_cast<double>(m.bytes));
        t.rules.back().max_bytes =
            std::max<uint64_t>(measured[i - 1]->bytes, static_cast<uint64_t>(mid));
      }
      TuningRule r;
      r.spec = chosen;
      t.rules.push_back(std::move(r));
    }
    // The range's figures: those of the largest size measured in it, beside the fastest other.
    TuningRule& r = t.rules.back();
    r.time_us = time_of(m, chosen);
    r.runner_up.clear();
    r.runner_up_time_us = 0;
    for (const auto& [spec, time] : m.time_us) {
      if (spec != chosen && time > 0 && (r.runner_up.empty() || time < r.runner_up_time_us)) {
        r.runner_up = spec;
        r.runner_up_time_us = time;
      }
    }
    r.measured_bytes.push_back(m.bytes);
  }
  t.rules.back().max_bytes = TuningRule::kRest;
  return t;
}

StatusOr<TuningTable> TuningTable::parse(std::string_view text, std::string_view origin) {
  const std::string where = "tuning file " + std::string(origin);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    // nlohmann's text says where: "parse error at line 2, column 0: syntax error ...".
    std::string why = e.what();
    if (const size_t at = why.find("parse error"); at != std::string::npos) why = why.substr(at);
    return invalid_argument(where + " is not valid JSON (" + why + "); write it with tributary-tune");
  }
  if (!j.is_object()) {
    return invalid_argument(where + " is not a JSON object; write it with tributary-tune");
  }
  TRIBUTARY_ASSIGN_OR_RETURN(int format, int_field(j, "tributary_tuning", where));
  if (format != kFormat) {
    return invalid_argument(where + " has format " + std::to_string(format) + "; this library reads " +
                            std::to_string(kFormat) + ": measure again with this tributary-tune");
  }
  TuningTable t;
  TRIBUTARY_ASSIGN_OR_RETURN(t.library_version, string_field(j, "library_version", where));
  if (!j.contains("layout") || !j.at("layout").is_object()) {
    return invalid_argument(where + ": 'layout' must be an object");
  }
  const json& l = j.at("layout");
  TRIBUTARY_ASSIGN_OR_RETURN(t.layout.processes, int_field(l, "processes", where + " layout"));
  TRIBUTARY_ASSIGN_OR_RETURN(t.layout.local_replicas,
                             int_field(l, "local_replicas", where + " layout"));
  TRIBUTARY_ASSIGN_OR_RETURN(t.layout.processes_per_host,
                             int_field(l, "processes_per_host", where + " layout"));
  TRIBUTARY_ASSIGN_OR_RETURN(t.layout.device, string_field(l, "device", where + " layout"));
  TRIBUTARY_ASSIGN_OR_RETURN(std::string dtype, string_field(j, "dtype", where));
  TRIBUTARY_ASSIGN_OR_RETURN(t.dtype, parse_dtype(dtype));
  TRIBUTARY_ASSIGN_OR_RETURN(std::string op, string_field(j, "op", where));
  TRIBUTARY_ASSIGN_OR_RETURN(t.op, parse_reduce_op(op));
  if (j.contains("host") && j.at("host").is_string()) t.host = j.at("host").get<std::string>();
  if (j.contains("created") && j.at("created").is_string()) {
    t.created = j.at("created").get<std::string>();
  }
  if (!j.contains("rules") || !j.at("rules").is_array() || j.at("rules").empty()) {
    return invalid_argument(where + ": 'rules' must be a non-empty array");
  }
  const json& rules = j.at("rules");
  for (size_t i = 0; i < rules.size(); ++i) {
    const json& r = rules[i];
    const std::string rw = where + " rule " + std::to_string(i);
    if (!r.is_object()) return invalid_argument(rw + " must be an object");
    TuningRule rule;
    TRIBUTARY_ASSIGN_OR_RETURN(rule.spec, string_field(r, "spec", rw));
    if (auto parsed = BackendSpec::parse(rule.spec); !parsed.ok()) {
      return invalid_argument(rw + ": " + parsed.status().message());
    } else if (parsed->name == "auto") {
      return invalid_argument(rw + ": a rule names a backend, not 'auto'");
    }
    const bool last = i + 1 == rules.size();
    if (!r.contains("max_bytes")) return invalid_argument(rw + ": 'max_bytes' is missing");
    const json& m = r.at("max_bytes");
    if (last) {
      if (!m.is_null()) {
        return invalid_argument(rw + ": the last rule's max_bytes must be null (every larger size)");
      }
    } else if (!m.is_number_unsigned()) {
      return invalid_argument(rw + ": max_bytes must be a byte count (a whole number), or null in "
                                   "the last rule");
    } else if (!t.rules.empty() && m.get<uint64_t>() <= t.rules.back().max_bytes) {
      return invalid_argument(rw + ": max_bytes must be above the previous rule's (" +
                              std::to_string(t.rules.back().max_bytes) + ")");
    } else {
      rule.max_bytes = m.get<uint64_t>();
    }
    rule.time_us = number_or_zero(r, "time_us");
    if (r.contains("runner_up") && r.at("runner_up").is_string()) {
      rule.runner_up = r.at("runner_up").get<std::string>();
    }
    rule.runner_up_time_us = number_or_zero(r, "runner_up_time_us");
    if (r.contains("measured_bytes") && r.at("measured_bytes").is_array()) {
      for (const json& b : r.at("measured_bytes")) {
        if (b.is_number_unsigned()) rule.measured_bytes.push_back(b.get<uint64_t>());
      }
    }
    t.rules.push_back(std::move(rule));
  }
  if (j.contains("measurements") && j.at("measurements").is_array()) {
    for (const json& m : j.at("measurements")) {
      if (!m.is_object() || !m.contains("bytes") || !m.at("bytes").is_number_unsigned()) continue;
      TuningMeasurement tm;
      tm.bytes = m.at("bytes").get<uint64_t>();
      if (m.contains("time_us") && m.at("time_us").is_object()) {
        for (auto it = m.at("time_us").begin(); it != m.at("time_us").end(); ++it) {
          if (it.value().is_number()) tm.time_us.emplace_back(it.key(), it.value().get<double>());
        }
      }
      if (m.contains("worst_us") && m.at("worst_us").is_object()) {  // optional
        for (auto it = m.at("worst_us").begin(); it != m.at("worst_us").end(); ++it) {
          if (it.value().is_number()) tm.worst_us.emplace_back(it.key(), it.value().get<double>());
        }
      }
      t.measurements.push_back(std::move(tm));
    }
  }
  return t;
}

StatusOr<TuningTable> TuningTable::load(const std::string& path) {
  auto text = internal::read_settings_file(path, size_t{16} << 20, "tuning file");
  if (!text.ok()) {
    return Status(text.status().code(),
                  text.status().message() +
                      "; write one with tributary-tune, or name another (auto:tuning_file=, "
                      "TRIBUTARY_TUNING_FILE, or a config file's \"tuning_file\")");
  }
  auto table = parse(*text, "'" + path + "'");
  if (table.ok()) table->source = path;
  return table;
}

std::string TuningTable::to_json() const {
  json j;
  j["tributary_tuning"] = kFormat;
  j["library_version"] = library_version;
  j["layout"] = {{"processes", layout.processes},
                 {"local_replicas", layout.local_replicas},
                 {"processes_per_host", layout.processes_per_host},
                 {"device", layout.device}};
  j["dtype"] = std::string(dtype_name(dtype));
  j["op"] = std::string(reduce_op_name(op));
  j["host"] = host;
  j["created"] = created;
  json jrules = json::array();
  for (const TuningRule& r : rules) {
    json jr = {{"spec", r.spec}, {"time_us", r.time_us}};
    jr["max_bytes"] = r.max_bytes == TuningRule::kRest ? json(nullptr) : json(r.max_bytes);
    if (!r.runner_up.empty()) {
      jr["runner_up"] = r.runner_up;
      jr["runner_up_time_us"] = r.runner_up_time_us;
    }
    jr["measured_bytes"] = r.measured_bytes;
    jrules.push_back(std::move(jr));
  }
  j["rules"] = std::move(jrules);
  json ms = json::array();
  for (const TuningMeasurement& m : measurements) {
    json times = json::object();
    for (const auto& [spec, t] : m.time_us) times[spec] = t;
    json jm = {{"bytes", m.bytes}, {"time_us", std::move(times)}};
    if (!m.worst_us.empty()) {
      json worst = json::object();
      for (const auto& [spec, t] : m.worst_us) worst[spec] = t;
      jm["worst_us"] = std::move(worst);
    }
    ms.push_back(std::move(jm));
  }
  j["measurements"] = std::move(ms);
  return j.dump(2) + "\n";
}

Status TuningTable::save(const std::string& path) const {
  std::ofstream out(path);
  if (!out) return unavailable("cannot write tuning file '" + path + "'");
  out << to_json();
  out.close();
  return out ? Status() : unavailable("writing tuning file '" + path + "' failed");
}

const TuningRule& TuningTable::rule_for(uint64_t bytes) const {
  for (const TuningRule& r : rules) {
    if (bytes <= r.max_bytes) return r;
  }
  return rules.back();
}

std::vector<std::string> TuningTable::specs() const {
  std::vector<std::string> out;
  for (const TuningRule& r : rules) {
    if (std::find(out.begin(), out.end(), r.spec) == out.end()) out.push_back(r.spec);
  }
  return out;
}

Status TuningTable::check_applies(const TuningLayout& here) const {
  if (library_version != version()) {
    return failed_precondition("it was measured with tributary " + library_version +
                               " and this is " + std::string(version()) +
                               "; measure again with tributary-tune");
  }
  // An unknown processes-per-host on either side does not count against the file.
  TuningLayout a = layout, b = here;
  if (a.processes_per_host == 0 || b.processes_per_host == 0) {
    a.processes_per_host = b.processes_per_host = 0;
  }
  if (!(a == b)) {
    return failed_precondition("it was measured for " + layout.to_string() + " and this is " +
                               here.to_string() + "; measure this layout with tributary-tune");
  }
  return Status();
}

std::string TuningTable::summary() const {
  std::string s;
  for (const TuningRule& r : rules) {
    if (!s.empty()) s += "; ";
    s += r.max_bytes == TuningRule::kRest ? std::string(rules.size() == 1 ? "every size" : "rest")
                                          : "<= " + format_size(r.max_bytes);
    s += ": " + r.spec;
  }
  return s;
}

uint64_t TuningTable::digest() const {
  std::string canonical;
  for (const TuningRule& r : rules) canonical += std::to_string(r.max_bytes) + "=" + r.spec + "\n";
  return internal::digest64(canonical);
}

}  // namespace tributary
