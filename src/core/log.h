// Logging to stderr with a level threshold (H2_LOG_LEVEL=debug|info|warn|error, default info).
// log_once() prints a message the first time its key is seen, for notices that would otherwise repeat per op.
#pragma once

#include <string>

#include "core/error.h"

namespace h2 {

enum class LogLevel { kDebug, kInfo, kWarn, kError };

void set_log_level(LogLevel level);
LogLevel log_level();
void log_message(LogLevel level, const std::string& message);
// Returns true when the message was printed (first time for this key), false when it was suppressed.
bool log_once(LogLevel level, const std::string& key, const std::string& message);

template <typename... Args>
void log_info(const Args&... args) {
  if (log_level() <= LogLevel::kInfo) log_message(LogLevel::kInfo, cat(args...));
}
template <typename... Args>
void log_warn(const Args&... args) {
  if (log_level() <= LogLevel::kWarn) log_message(LogLevel::kWarn, cat(args...));
}
template <typename... Args>
void log_debug(const Args&... args) {
  if (log_level() <= LogLevel::kDebug) log_message(LogLevel::kDebug, cat(args...));
}

}  // namespace h2
