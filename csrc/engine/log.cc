#include "log.h"

#include <cstdlib>
#include <string>

namespace mccl {

int parse_log_level(const char* text) {
  const std::string level = text;
  if (level == "ERROR" || level == "0") return 0;
  if (level == "WARN" || level == "1") return 1;
  if (level == "INFO" || level == "2") return 2;
  if (level == "TRACE" || level == "3") return 3;
  return -1;
}

int log_level() {
  static const int level = [] {
    const char* value = std::getenv("MCCL_DEBUG");
    const int parsed = (value != nullptr && value[0] != '\0') ? parse_log_level(value) : -1;
    return parsed < 0 ? static_cast<int>(LogLevel::kWarn) : parsed;
  }();
  return level;
}

}  // namespace mccl
