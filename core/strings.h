// Small string helpers shared by core's parsers (private to tributary).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tributary::internal {

std::string_view trim(std::string_view s);
std::string to_lower(std::string_view s);
std::string to_upper(std::string_view s);
bool iequals(std::string_view a, std::string_view b);
std::vector<std::string_view> split(std::string_view s, char sep);
// "a, b, c"
std::string join(const std::vector<std::string>& parts, std::string_view sep);
// Parses a whole string as a base-10 integer; false on anything else (sign allowed).
bool parse_int64(std::string_view s, long long* out);
bool parse_double(std::string_view s, double* out);

}  // namespace tributary::internal
