#include "errors.hpp"

namespace lightning_mccl {

std::string torch_message(const mccl::Error& e) {
  std::string m = e.what();
  if (e.kind() != mccl::Error::Kind::kTimeout || m.find("Timed out") != std::string::npos) return m;
  size_t colon = m.find(": ");
  return colon == std::string::npos ? m + " (Timed out)" : m.insert(colon, " (Timed out)");
}

[[noreturn]] void throw_torch(const mccl::Error& e) {
  if (e.kind() == mccl::Error::Kind::kInvalidArgument) C10_THROW_ERROR(ValueError, e.what());
  C10_THROW_ERROR(DistBackendError, torch_message(e));
}

std::exception_ptr to_torch(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const mccl::Error& e) {
    try {
      throw_torch(e);
    } catch (...) {
      return std::current_exception();
    }
  } catch (...) {
    return std::current_exception();
  }
}

}  // namespace lightning_mccl
