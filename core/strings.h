// Small string helpers shared by core's parsers (private to tributary).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tributary/status.h"

namespace tributary::internal {

std::string_view trim(std::string_view s);
std::string to_lower(std::string_view s);
std::string to_upper(std::string_view s);
bool iequals(std::string_view a, std::string_view b);
std::vector<std::string_view> split(std::string_view s, char sep);
// Lower-case hexadecimal of `n` bytes.
std::string hex(const void* data, size_t n);
// `text` for an error message: whole when short, else its first `max` bytes, "...", and its size
// (a 50 MB setting must not come back as a 50 MB message).
std::string excerpt(std::string_view text, size_t max = 80);
// "a, b, c"
std::string join(const std::vector<std::string>& parts, std::string_view sep);
// For "rank 1 is set up differently": the entries of two "key=value,key=value,..." layouts that
// differ, as "algorithm: auto here, ring at rank 1; ..." (`there` names the peer); the whole
// layouts when they do not read as such lists.
std::string layout_difference(std::string_view here, std::string_view theirs,
                              std::string_view there);
// Parses a whole string as a base-10 integer; false on anything else (sign allowed).
bool parse_int64(std::string_view s, long long* out);
bool parse_double(std::string_view s, double* out);

// The contents of the settings file `path` (config, secret, tuning): only a regular file (a FIFO,
// device or directory would block or never end), of at most `max_bytes`. `what` names it in
// errors ("config file"): NotFound when it cannot be opened, InvalidArgument otherwise.
StatusOr<std::string> read_settings_file(const std::string& path, size_t max_bytes,
                                         std::string_view what);

}  // namespace tributary::internal
