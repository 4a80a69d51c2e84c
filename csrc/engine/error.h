// The engine's one exception type.
//
// Every failure the engine reports is an mccl::Error carrying a Kind, so callers (the torch binding, the
// tests) can tell a timeout from a dead peer from a mismatched collective without parsing text, and the
// message always names the cause: which rank, which op, which sizes. There is deliberately no second
// hierarchy: system errors are wrapped, never thrown raw.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace mccl {

class Error : public std::runtime_error {
 public:
  enum class Kind {
    kInvalidArgument,  // the caller passed something we cannot do (bad dtype, sizes, ranks)
    kMismatch,         // ranks disagree about the collective (op, dtype, count, sequence)
    kTimeout,          // a peer did not answer within the deadline
    kConnection,       // a socket failed or a peer closed its end
    kProtocol,         // a peer sent bytes that are not MCCL frames (or a different version)
    kAborted,          // the communicator was aborted or shut down
    kInternal,         // a bug in MCCL
  };

  Error(Kind kind, std::string what) : std::runtime_error(std::move(what)), kind_(kind) {}

  Kind kind() const noexcept { return kind_; }
  static const char* kind_name(Kind kind) noexcept;

 private:
  Kind kind_;
};

inline const char* Error::kind_name(Kind kind) noexcept {
  switch (kind) {
    case Kind::kInvalidArgument: return "invalid argument";
    case Kind::kMismatch: return "collective mismatch";
    case Kind::kTimeout: return "timeout";
    case Kind::kConnection: return "connection error";
    case Kind::kProtocol: return "protocol error";
    case Kind::kAborted: return "aborted";
    case Kind::kInternal: return "internal error";
  }
  return "error";
}

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}
}  // namespace detail

// Throws mccl::Error(kind, "MCCL <kind>: " + pieces...).
template <typename... Args>
[[noreturn]] void fail(Error::Kind kind, Args&&... args) {
  throw Error(kind, detail::concat("MCCL ", Error::kind_name(kind), ": ", std::forward<Args>(args)...));
}

#define MCCL_CHECK_ARG(cond, ...) \
  do {                            \
    if (!(cond)) ::mccl::fail(::mccl::Error::Kind::kInvalidArgument, __VA_ARGS__); \
  } while (0)

}  // namespace mccl
