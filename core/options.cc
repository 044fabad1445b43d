#include "tributary/options.h"

#include <cmath>
#include <string>

#include "core/strings.h"

namespace tributary {
namespace {

using internal::to_lower;
using internal::trim;

bool valid_name(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  }
  return true;
}

std::string option_line(const OptionDef& d) {
  std::string s = d.name + " (" + std::string(option_type_name(d.type));
  if (d.type == OptionType::kEnum) s += ": " + internal::join(d.choices, "|");
  if (d.type == OptionType::kInt && (d.min != INT64_MIN || d.max != INT64_MAX)) {
    s += " in [" + (d.min == INT64_MIN ? std::string("-inf") : std::to_string(d.min)) + ", " +
         (d.max == INT64_MAX ? std::string("inf") : std::to_string(d.max)) + "]";
  }
  s += ", default " + (d.default_value.empty() ? std::string("unset") : d.default_value) + ")";
  return s;
}

// Parses `text` as an option of type d.type into `out`.
Status parse_value(const OptionDef& d, std::string_view text, Options::Value* out) {
  std::string_view t = trim(text);
  out->type = d.type;
  auto bad = [&](std::string_view why) {
    return invalid_argument("bad value '" + internal::excerpt(text) + "' for option " +
                            option_line(d) +
                            ": " + std::string(why));
  };
  switch (d.type) {
    case OptionType::kBool: {
      auto b = parse_bool(t);
      if (!b.ok()) return bad("expected true or false");
      out->i = *b ? 1 : 0;
      out->text = *b ? "true" : "false";
      return Status();
    }
    case OptionType::kInt: {
      long long v = 0;
      if (!internal::parse_int64(t, &v)) return bad("expected an integer");
      if (v < d.min || v > d.max) return bad("out of range");
      out->i = v;
      out->text = std::to_string(v);
      return Status();
    }
    case OptionType::kSize: {
      auto v = parse_size(t);
      if (!v.ok()) return bad(v.status().message());
      if (static_cast<int64_t>(*v) < d.min || static_cast<int64_t>(*v) > d.max) {
        return bad("out of range");
      }
      out->i = static_cast<int64_t>(*v);
      out->text = format_size(*v);
      return Status();
    }
    case OptionType::kDuration: {
      auto v = parse_duration(t);
      if (!v.ok()) return bad(v.status().message());
      out->i = v->count();
      out->text = format_duration(*v);
      return Status();
    }
    case OptionType::kDouble: {
      double v = 0;
      if (!internal::parse_double(t, &v) || !std::isfinite(v)) return bad("expected a number");
      out->d = v;
      out->text = std::string(t);
      return Status();
    }
    case OptionType::kString:
      out->text = std::string(t);
      return Status();
    case OptionType::kEnum:
      for (const std::string& c : d.choices) {
        if (internal::iequals(c, t)) {
          out->text = c;
          return Status();
        }
      }
      return bad("expected one of " + internal::join(d.choices, ", "));
  }
  return internal_error("unhandled option type");
}

}  // namespace

std::string_view option_type_name(OptionType type) {
  switch (type) {
    case OptionType::kBool: return "bool";
    case OptionType::kInt: return "int";
    case OptionType::kSize: return "size";
    case OptionType::kDuration: return "duration";
    case OptionType::kDouble: return "double";
    case OptionType::kString: return "string";
    case OptionType::kEnum: return "enum";
  }
  return "?";
}

StatusOr<uint64_t> parse_size(std::string_view text) {
  std::string_view t = trim(text);
  size_t i = 0;
  while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.')) ++i;
  double number = 0;
  if (i == 0 || !internal::parse_double(t.substr(0, i), &number)) {
    return invalid_argument("'" + std::string(text) +
                            "' is not a size; expected e.g. 512, 64K, 4MiB, 1GB");
  }
  std::string unit(trim(t.substr(i)));
  double mult = 0;
  if (unit.empty() || unit == "B" || unit == "b") mult = 1;
  else if (unit == "K" || unit == "k" || unit == "KiB" || unit == "Ki") mult = 1024.0;
  else if (unit == "M" || unit == "m" || unit == "MiB" || unit == "Mi") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "g" || unit == "GiB" || unit == "Gi") mult = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TiB") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kB" || unit == "KB") mult = 1e3;
  else if (unit == "MB") mult = 1e6;
  else if (unit == "GB") mult = 1e9;
  else if (unit == "TB") mult = 1e12;
  else {
    return invalid_argument("'" + std::string(text) + "' has an unknown size unit '" + unit +
                            "'; use B, K/KiB, M/MiB, G/GiB (1024) or kB, MB, GB (1000)");
  }
  double bytes = number * mult;
  if (bytes >= 1.8e19) return invalid_argument("'" + std::string(text) + "' is too large");
  return static_cast<uint64_t>(bytes);
}

StatusOr<std::chrono::nanoseconds> parse_duration(std::string_view text) {
  std::string_view t = trim(text);
  size_t i = 0;
  while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.')) ++i;
  double number = 0;
  if (i == 0 || !internal::parse_double(t.substr(0, i), &number)) {
    return invalid_argument("'" + std::string(text) +
                            "' is not a duration; expected e.g. 30s, 500ms, 2m, 100us");
  }
  std::string unit(trim(t.substr(i)));
  double ns_per = 0;
  if (unit == "ns") ns_per = 1;
  else if (unit == "us") ns_per = 1e3;
  else if (unit == "ms") ns_per = 1e6;
  else if (unit.empty() || unit == "s") ns_per = 1e9;
  else if (unit == "m" || unit == "min") ns_per = 60e9;
  else if (unit == "h") ns_per = 3600e9;
  else {
    return invalid_argument("'" + std::string(text) + "' has an unknown duration unit '" + unit +
                            "'; use ns, us, ms, s, m or h");
  }
  double ns = number * ns_per;
  if (ns > 9.2e18) return invalid_argument("'" + std::string(text) + "' is too long");
  return std::chrono::nanoseconds(static_cast<int64_t>(ns));
}

StatusOr<bool> parse_bool(std::string_view text) {
  std::string s = to_lower(trim(text));
  if (s == "true" || s == "1" || s == "yes" || s == "on") return true;
  if (s == "false" || s == "0" || s == "no" || s == "off") return false;
  return invalid_argument("'" + std::string(text) + "' is not a boolean; use true or false");
}

std::string format_size(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  uint64_t v = bytes;
  while (u < 4 && v != 0 && v % 1024 == 0) {
    v /= 1024;
    ++u;
  }
  return std::to_string(v) + kUnits[u];
}

std::string format_duration(std::chrono::nanoseconds d) {
  int64_t ns = d.count();
  struct Unit {
    int64_t ns;
    const char* name;
  };
  static constexpr Unit kUnits[] = {
      {3600'000'000'000, "h"}, {60'000'000'000, "m"}, {1'000'000'000, "s"},
      {1'000'000, "ms"},       {1'000, "us"},         {1, "ns"}};
  if (ns == 0) return "0s";
  for (const Unit& u : kUnits) {
    if (ns % u.ns == 0) return std::to_string(ns / u.ns) + u.name;
  }
  return std::to_string(ns) + "ns";
}

StatusOr<BackendSpec> BackendSpec::parse(std::string_view text) {
  std::string_view t = trim(text);
  auto err = [&](std::string_view why) {
    return invalid_argument("cannot parse backend spec '" + std::string(text) + "': " +
                            std::string(why) + "; the grammar is name[:key=value[,key=value...]]");
  };
  if (t.empty()) return err("it is empty");
  BackendSpec spec;
  size_t colon = t.find(':');
  std::string_view name = trim(t.substr(0, colon));
  if (!valid_name(name)) return err("'" + std::string(name) + "' is not a backend name");
  spec.name = to_lower(name);
  if (colon == std::string_view::npos) return spec;
  std::string_view rest = t.substr(colon + 1);
  if (trim(rest).empty()) return err("':' is followed by no option");
  for (std::string_view item : internal::split(rest, ',')) {
    size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      return err("option '" + std::string(trim(item)) + "' has no '=value'");
    }
    std::string key = to_lower(trim(item.substr(0, eq)));
    std::string value(trim(item.substr(eq + 1)));
    if (!valid_name(key)) return err("'" + key + "' is not an option name");
    if (value.find('=') != std::string::npos) return err("option '" + key + "' has two '='");
    for (const auto& [k, _] : spec.options) {
      if (k == key) return err("option '" + key + "' is given twice");
    }
    spec.options.emplace_back(std::move(key), std::move(value));
  }
  return spec;
}

std::string BackendSpec::to_string() const {
  std::string s = name;
  char sep = ':';
  for (const auto& [k, v] : options) {
    s += sep + k + "=" + v;
    sep = ',';
  }
  return s;
}

StatusOr<Options> Options::resolve(std::string_view backend, const std::vector<OptionDef>& schema,
                                   const std::vector<std::pair<std::string, std::string>>& given,
                                   const Config& config) {
  // Unknown keys first, so that the message lists everything valid.
  for (const auto& [key, value] : given) {
    bool known = false;
    for (const OptionDef& d : schema) known = known || d.name == key;
    if (!known) {
      return invalid_argument("backend '" + std::string(backend) + "' has no option '" + key +
                              "'; its options are:\n" + describe_options(schema));
    }
  }
  Options out;
  const std::string scoped_prefix = "TRIBUTARY_" + internal::to_upper(backend) + "_";
  for (const OptionDef& d : schema) {
    std::string text = d.default_value;
    std::string source = "default";
    const std::string scoped = scoped_prefix + internal::to_upper(d.name);
    const std::string shared = "TRIBUTARY_" + internal::to_upper(d.name);
    if (const Config::Entry* e = d.shared ? config.find(shared) : nullptr) {
      text = e->value;
      source = e->source + " " + shared;
    }
    if (const Config::Entry* e = config.find(scoped)) {
      text = e->value;
      source = e->source + " " + scoped;
    }
    for (const auto& [key, value] : given) {
      if (key == d.name) {
        text = value;
        source = "spec";
      }
    }
    Value v;
    v.source = source;
    if (d.type == OptionType::kString && text.empty()) {
      v.type = d.type;
    } else {
      Status s = parse_value(d, text, &v);
      if (!s.ok()) {
        return invalid_argument("backend '" + std::string(backend) + "': " + s.message() +
                                " (from " + source + ")");
      }
    }
    out.values_[d.name] = std::move(v);
  }
  return out;
}

const Options::Value& Options::at(std::string_view key) const {
  auto it = values_.find(key);
  assert(it != values_.end() && "option not declared in the backend's schema");
  return it->second;
}

const Options::Value* Options::find(std::string_view key) const {
  auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

bool Options::get_bool(std::string_view key) const { return at(key).i != 0; }
int64_t Options::get_int(std::string_view key) const { return at(key).i; }
uint64_t Options::get_size(std::string_view key) const {
  return static_cast<uint64_t>(at(key).i);
}
std::chrono::nanoseconds Options::get_duration(std::string_view key) const {
  return std::chrono::nanoseconds(at(key).i);
}
double Options::get_double(std::string_view key) const { return at(key).d; }
const std::string& Options::get_string(std::string_view key) const { return at(key).text; }

std::string Options::to_string() const {
  std::string s;
  for (const auto& [k, v] : values_) {
    if (v.text.empty()) continue;
    if (!s.empty()) s += ",";
    s += k + "=" + v.text;
  }
  return s;
}

std::string describe_options(const std::vector<OptionDef>& schema) {
  std::string s;
  for (const OptionDef& d : schema) s += "  " + option_line(d) + ": " + d.help + "\n";
  return s;
}

}  // namespace tributary
