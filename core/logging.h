// Logging on fmt, private to tributary. One sink (stderr), levels from TRIBUTARY_LOG_LEVEL
// (trace, debug, info, warning, error, off; default warning), a "[rank r/backend]" prefix per logger.
// Keep it off hot paths: check enabled() before formatting anything costly.
#pragma once

#include <fmt/format.h>

#include <functional>
#include <string>
#include <string_view>

#include "tributary/config.h"
#include "tributary/status.h"

namespace tributary::internal {

enum class LogLevel : int { kTrace = 0, kDebug, kInfo, kWarning, kError, kOff };

StatusOr<LogLevel> parse_log_level(std::string_view text);
// The level configured in `config` (TRIBUTARY_LOG_LEVEL); warning when unset or malformed.
LogLevel log_level_from(const Config& config);
std::string_view log_level_name(LogLevel level);

// Writes one line "<level> [prefix] message" to stderr (or to the sink), atomically with respect to
// other lines.
void write_log_line(LogLevel level, std::string_view prefix, std::string_view message);

// Where the lines go instead of stderr (the C API's trib_set_log_callback): the sink gets each
// line a logger lets through, one call at a time (under the lock that keeps lines whole); an empty
// sink restores stderr. When set_log_sink returns, no call to the previous sink is running and
// none will start. A sink must not log, nor call set_log_sink. Process-wide, as stderr is.
using LogSink =
    std::function<void(LogLevel level, std::string_view prefix, std::string_view message)>;
void set_log_sink(LogSink sink);

class Logger {
 public:
  Logger() = default;
  Logger(LogLevel level, std::string prefix) : level_(level), prefix_(std::move(prefix)) {}
  bool enabled(LogLevel level) const { return level >= level_ && level_ != LogLevel::kOff; }
  template <typename... Args>
  void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) const {
    if (!enabled(level)) return;
    write_log_line(level, prefix_, fmt::format(format, std::forward<Args>(args)...));
  }
  LogLevel level() const { return level_; }
  const std::string& prefix() const { return prefix_; }

 private:
  LogLevel level_ = LogLevel::kWarning;
  std::string prefix_;
};

}  // namespace tributary::internal
