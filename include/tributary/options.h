// Backend specs and typed options.
//
// A backend spec is `name[:key=value[,key=value...]]`, e.g. `hierarchical_copy:num_packs=2,group_size=4`
// or `ring:chunk_bytes=4MiB,timeout=30s`. The same grammar is used in code, in config files, on command
// lines and in TRIBUTARY_CROSS_DEVICE_OPS. Whitespace around names, keys and values is ignored.
//
// Every option is declared once (OptionDef) with a type, a default and help text. Value syntax:
//   bool      true/false/1/0/yes/no/on/off
//   int       a decimal integer, optionally bounded
//   size      bytes with an optional unit: B; K, KiB (1024); M, MiB; G, GiB; kB, KB (1000), MB, GB.
//             "4MiB", "4M", "512", "1.5GiB" (fractional values are rounded down to a byte)
//   duration  a number with a unit: ns, us, ms, s, m, h; a bare number means seconds. "30s", "500ms"
//   double    a decimal number
//   string    anything without ',' or '='
//   enum      one of the declared choices
// Resolution, highest first: the spec > TRIBUTARY_<BACKEND>_<KEY> > TRIBUTARY_<KEY> (for options
// shared by all backends, like timeout) > the default. An unknown key or a bad value is an error that
// lists the valid keys with their types.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tributary/config.h"
#include "tributary/export.h"
#include "tributary/status.h"

TRIBUTARY_BEGIN_PUBLIC_API
namespace tributary {

enum class OptionType { kBool, kInt, kSize, kDuration, kDouble, kString, kEnum };
std::string_view option_type_name(OptionType type);

struct OptionDef {
  std::string name;
  OptionType type = OptionType::kString;
  std::string default_value;  // in the option's own syntax; "" for a string means unset
  std::string help;
  std::vector<std::string> choices;  // for kEnum
  int64_t min = INT64_MIN;           // for kInt and kSize
  int64_t max = INT64_MAX;
  bool shared = false;  // also read from TRIBUTARY_<KEY> (options every backend has, like timeout)
};

// Parsers for the value syntaxes above, usable on their own (the bench uses them for its flags).
StatusOr<uint64_t> parse_size(std::string_view text);
StatusOr<std::chrono::nanoseconds> parse_duration(std::string_view text);
StatusOr<bool> parse_bool(std::string_view text);
std::string format_size(uint64_t bytes);                  // "4 MiB", "1000 B"
std::string format_duration(std::chrono::nanoseconds d);  // "30s", "250ms"

struct BackendSpec {
  std::string name;
  std::vector<std::pair<std::string, std::string>> options;  // in the order written

  static StatusOr<BackendSpec> parse(std::string_view text);
  std::string to_string() const;
};

// Resolved option values of one backend instance: every declared option has a value.
class Options {
 public:
  struct Value {
    std::string text;    // canonical text
    std::string source;  // "spec", "environment TRIBUTARY_X", "file ...", "default"
    OptionType type = OptionType::kString;
    int64_t i = 0;       // kInt, kSize (bytes), kDuration (ns), kBool (0/1)
    double d = 0;        // kDouble
  };

  // Resolves `spec` against `schema`, reading the environment part from `config`.
  static StatusOr<Options> resolve(std::string_view backend, const std::vector<OptionDef>& schema,
                                   const std::vector<std::pair<std::string, std::string>>& given,
                                   const Config& config);

  bool get_bool(std::string_view key) const;
  int64_t get_int(std::string_view key) const;
  uint64_t get_size(std::string_view key) const;
  std::chrono::nanoseconds get_duration(std::string_view key) const;
  double get_double(std::string_view key) const;
  const std::string& get_string(std::string_view key) const;
  const Value* find(std::string_view key) const;
  const std::map<std::string, Value, std::less<>>& values() const { return values_; }

  // "key=value,key=value" (every option, canonical text).
  std::string to_string() const;

 private:
  const Value& at(std::string_view key) const;
  std::map<std::string, Value, std::less<>> values_;
};

// "name (type, default X): help" lines, for errors and for tributary-info.
std::string describe_options(const std::vector<OptionDef>& schema);

}  // namespace tributary
TRIBUTARY_END_PUBLIC_API
