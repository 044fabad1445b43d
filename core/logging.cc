#include "core/logging.h"

#include <atomic>
#include <cstdio>
#include <mutex>

#include "core/strings.h"

namespace tributary::internal {

StatusOr<LogLevel> parse_log_level(std::string_view text) {
  std::string s = to_lower(trim(text));
  if (s == "trace") return LogLevel::kTrace;
  if (s == "debug") return LogLevel::kDebug;
  if (s == "info") return LogLevel::kInfo;
  if (s == "warning" || s == "warn") return LogLevel::kWarning;
  if (s == "error") return LogLevel::kError;
  if (s == "off" || s == "none") return LogLevel::kOff;
  return invalid_argument("unknown log level '" + excerpt(text) +
                          "'; valid levels: trace, debug, info, warning, error, off");
}

LogLevel log_level_from(const Config& config) {
  auto v = config.get("TRIBUTARY_LOG_LEVEL");
  if (!v) return LogLevel::kWarning;
  auto level = parse_log_level(*v);
  if (!level.ok()) {
    // Once per process: every logger made from the config reads it again.
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      write_log_line(LogLevel::kWarning, "tributary",
                     "TRIBUTARY_LOG_LEVEL: " + level.status().message() + "; using warning");
    }
    return LogLevel::kWarning;
  }
  return *level;
}

std::string_view log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return "trace";
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
    case LogLevel::kOff: return "off";
  }
  return "?";
}

namespace {
// Both outlive every logger: never destroyed, so that a line logged during static destruction
// (a backend torn down at exit) still finds them.
std::mutex& log_mutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
LogSink& log_sink() {
  static auto* sink = new LogSink;
  return *sink;
}
}  // namespace

void set_log_sink(LogSink sink) {
  std::lock_guard lock(log_mutex());
  log_sink() = std::move(sink);
}

void write_log_line(LogLevel level, std::string_view prefix, std::string_view message) {
  std::lock_guard lock(log_mutex());
  if (const LogSink& sink = log_sink()) {
    sink(level, prefix, message);
    return;
  }
  std::string line = fmt::format("tributary {} [{}] {}\n", log_level_name(level), prefix, message);
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace tributary::internal
