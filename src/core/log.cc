// Logger state: one threshold and one set of seen keys, both guarded for use from many threads.
#include "core/log.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string_view>

namespace h2 {
namespace {

LogLevel level_from_env() {
  const char* env = std::getenv("H2_LOG_LEVEL");
  if (env == nullptr) return LogLevel::kInfo;
  std::string_view v(env);
  if (v == "debug") return LogLevel::kDebug;
  if (v == "warn") return LogLevel::kWarn;
  if (v == "error") return LogLevel::kError;
  return LogLevel::kInfo;
}

LogLevel g_level = level_from_env();
std::mutex g_mutex;

const char* level_tag(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kError:
      return "error";
  }
  return "?";
}

}  // namespace

void set_log_level(LogLevel level) { g_level = level; }
LogLevel log_level() { return g_level; }

void log_message(LogLevel level, const std::string& message) {
  if (level < g_level) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fprintf(stderr, "[h2 %s] %s\n", level_tag(level), message.c_str());
}

bool log_once(LogLevel level, const std::string& key, const std::string& message) {
  static std::set<std::string> seen;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (!seen.insert(key).second) return false;
  }
  log_message(level, message);
  return true;
}

}  // namespace h2
