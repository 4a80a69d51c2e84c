// Engine errors as torch exceptions.
//
// Bad input becomes a Python ValueError; everything else (mismatch, timeout, dead peer) a
// torch.distributed.DistBackendError, which is a RuntimeError, as NCCL raises it. torch has no timeout
// type, and its DistNetworkError (the Store's sockets) is a sibling of DistBackendError, not a kind of
// it: raising it for a dead peer would slip past every `except DistBackendError` written for NCCL.
// Tools tell a timeout from other failures by torch's phrase "Timed out" (Gloo: "Timed out waiting
// ... for recv", the Store: "Timed out after ..."), so a timeout's message carries it after our prefix:
// "MCCL timeout (Timed out): rank 0 timed out in barrier ...". A peer that closed its end reads
// "Connection closed by peer", as in Gloo (the engine's wording).
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <string>

#include "error.h"

namespace lightning_mccl {

std::string torch_message(const mccl::Error& e);
[[noreturn]] void throw_torch(const mccl::Error& e);
// Any exception, with an engine error replaced by its torch exception.
std::exception_ptr to_torch(std::exception_ptr error);

// f(), with an engine error rethrown as its torch exception.
template <typename F>
auto translated(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const mccl::Error& e) {
    throw_torch(e);
  }
}

#define MCCL_TORCH_CHECK(cond, ...) \
  if (!(cond)) C10_THROW_ERROR(ValueError, c10::str("MCCL invalid argument: ", __VA_ARGS__))

}  // namespace lightning_mccl
