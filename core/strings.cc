#include "core/strings.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

namespace tributary::internal {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string to_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string to_upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

bool iequals(std::string_view a, std::string_view b) { return to_lower(a) == to_lower(b); }

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    if (pos == std::string_view::npos) {
      out.push_back(s.substr(start));
      return out;
    }
    out.push_back(s.substr(start, pos - start));
    start = pos + 1;
  }
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

bool parse_int64(std::string_view s, long long* out) {
  if (s.empty()) return false;
  if (s.front() == '+') s.remove_prefix(1);
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

bool parse_double(std::string_view s, double* out) {
  if (s.empty()) return false;
  std::string tmp(s);
  char* end = nullptr;
  *out = std::strtod(tmp.c_str(), &end);
  return end == tmp.c_str() + tmp.size();
}

std::string hex(const void* data, size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  const auto* p = static_cast<const unsigned char*>(data);
  std::string s;
  s.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    s += kHex[p[i] >> 4];
    s += kHex[p[i] & 15];
  }
  return s;
}

std::string excerpt(std::string_view text, size_t max) {
  if (text.size() <= max) return std::string(text);
  return std::string(text.substr(0, max)) + "... (" + std::to_string(text.size()) + " bytes)";
}

StatusOr<std::string> read_settings_file(const std::string& path, size_t max_bytes,
                                         std::string_view what) {
  const std::string name = std::string(what) + " '" + path + "'";
  // Non-blocking open: opening a FIFO with no writer would otherwise wait forever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    const std::string why = "cannot open " + name + ": " + std::strerror(e);
    return e == ENOENT || e == ENOTDIR ? not_found(why) : unavailable(why);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(name + " is not a regular file; give the path of a file");
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    return invalid_argument(name + " is " + std::to_string(st.st_size) + " bytes; it may be at most " +
                            std::to_string(max_bytes));
  }
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      return invalid_argument("reading " + name + " failed: " + std::strerror(e));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes) {  // grew while we read
      ::close(fd);
      return invalid_argument(name + " is larger than " + std::to_string(max_bytes) + " bytes");
    }
  }
  ::close(fd);
  return out;
}

std::string layout_difference(std::string_view here, std::string_view theirs,
                              std::string_view there) {
  // key -> value; an entry without '=' is a key of its own ("measured").
  const auto entries = [](std::string_view layout) {
    std::vector<std::pair<std::string_view, std::string_view>> out;
    for (std::string_view e : split(layout, ',')) {
      const size_t eq = e.find('=');
      out.emplace_back(e.substr(0, eq), eq == std::string_view::npos ? "" : e.substr(eq + 1));
    }
    return out;
  };
  const auto mine = entries(here);
  const auto other = entries(theirs);
  const auto find = [](const auto& list, std::string_view key) -> const std::string_view* {
    for (const auto& [k, v] : list) {
      if (k == key) return &v;
    }
    return nullptr;
  };
  const auto shown = [](const std::string_view* v) {
    return v == nullptr ? std::string("(none)") : "'" + excerpt(*v, 40) + "'";
  };
  std::vector<std::string> differ;
  for (const auto& [k, v] : mine) {
    const std::string_view* o = find(other, k);
    if (o == nullptr || *o != v) {
      differ.push_back(std::string(k) + ": " + shown(&v) + " here, " + shown(o) + " at " +
                       std::string(there));
    }
  }
  for (const auto& [k, v] : other) {
    if (find(mine, k) == nullptr) {
      differ.push_back(std::string(k) + ": (none) here, " + shown(&v) + " at " +
                       std::string(there));
    }
  }
  if (differ.empty()) {
    return "this rank: " + excerpt(here, 400) + "; " + std::string(there) + ": " +
           excerpt(theirs, 400);
  }
  return join(differ, "; ");
}

}  // namespace tributary::internal
