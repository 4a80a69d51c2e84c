// A minimal test harness for the engine's C++ tests: no dependency, one binary per test file.
// CHECK(cond) records a failure and continues; main() from MCCL_TEST_MAIN runs every TEST and prints
// "N passed, N failed" so the result is readable on its own, and exits non-zero on any failure.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace mccl_test {

struct Case {
  const char* name;
  std::function<void()> fn;
};

// MCCL_TEST_QUICK=1 (set for runs under emulation, e.g. `make test-arm64`, and under ASan): the same cases on
// smaller buffers (and test_collectives on fewer world sizes).
inline bool quick() {
  const char* q = std::getenv("MCCL_TEST_QUICK");
  return q != nullptr && *q != '\0' && *q != '0';
}
// `full` normally, `small` under MCCL_TEST_QUICK.
inline size_t sized(size_t full, size_t small) { return quick() ? small : full; }

inline std::vector<Case>& registry() {
  static std::vector<Case> cases;
  return cases;
}
inline int& failures() {
  static int count = 0;
  return count;
}
struct Registrar {
  Registrar(const char* name, std::function<void()> fn) { registry().push_back({name, std::move(fn)}); }
};

inline int run_all(int argc, char** argv) {
  int passed = 0, failed = 0;
  std::string filter = argc > 1 ? argv[1] : "";
  for (auto& c : registry()) {
    if (!filter.empty() && std::string(c.name).find(filter) == std::string::npos) continue;
    int before = failures();
    try {
      c.fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "  %s: unexpected exception: %s\n", c.name, e.what());
      ++failures();
    }
    if (failures() == before) {
      ++passed;
      std::fprintf(stderr, "[ ok ] %s\n", c.name);
    } else {
      ++failed;
      std::fprintf(stderr, "[FAIL] %s\n", c.name);
    }
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace mccl_test

#define MCCL_CONCAT_(a, b) a##b
#define MCCL_CONCAT(a, b) MCCL_CONCAT_(a, b)
#define TEST(name)                                                                  \
  static void name();                                                               \
  static ::mccl_test::Registrar MCCL_CONCAT(reg_, name)(#name, name);               \
  static void name()

#define CHECK(cond)                                                                  \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "  %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
      ++::mccl_test::failures();                                                     \
    }                                                                                \
  } while (0)

#define CHECK_MSG(cond, ...)                                                         \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "  %s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                             \
      std::fprintf(stderr, "\n");                                                    \
      ++::mccl_test::failures();                                                     \
    }                                                                                \
  } while (0)

#define MCCL_TEST_MAIN \
  int main(int argc, char** argv) { return ::mccl_test::run_all(argc, argv); }
