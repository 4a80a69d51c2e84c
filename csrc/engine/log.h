// Diagnostics go to stderr, never stdout, and only at or below MCCL_DEBUG's level. The logger reads that
// one variable, once per process, and nothing else of the environment.
#pragma once

#include <cstdio>
#include <string>

#include "error.h"

namespace mccl {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kTrace = 3 };

// MCCL_DEBUG: ERROR or 0 (errors only), WARN or 1 (the default), INFO or 2 (connections), TRACE or 3
// (every collective). -1 when `text` is none of these.
int parse_log_level(const char* text);
// MCCL_DEBUG's level in this process (WARN when unset or invalid: making a group rejects an invalid one).
int log_level();
inline bool log_enabled(LogLevel level) { return static_cast<int>(level) <= log_level(); }

template <typename... Args>
void log(LogLevel level, Args&&... args) {
  if (!log_enabled(level)) return;
  static const char* names[] = {"ERROR", "WARN", "INFO", "TRACE"};
  std::string line = detail::concat("[mccl ", names[static_cast<int>(level)], "] ", std::forward<Args>(args)..., "\n");
  std::fputs(line.c_str(), stderr);
}

}  // namespace mccl
