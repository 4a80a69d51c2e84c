// Diagnostics go to stderr, never stdout, and only at or below MCCL_DEBUG's level.
#pragma once

#include <cstdio>
#include <string>

#include "config.h"
#include "error.h"

namespace mccl {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kTrace = 3 };

inline bool log_enabled(LogLevel level) { return static_cast<int>(level) <= Config::global().debug_level; }

template <typename... Args>
void log(LogLevel level, Args&&... args) {
  if (!log_enabled(level)) return;
  static const char* names[] = {"ERROR", "WARN", "INFO", "TRACE"};
  std::string line = detail::concat("[mccl ", names[static_cast<int>(level)], "] ", std::forward<Args>(args)..., "\n");
  std::fputs(line.c_str(), stderr);
}

}  // namespace mccl
