// The wire fuzz target: LLVMFuzzerTestOneInput (fuzz_wire.cc) and its seed inputs, shared by the
// libFuzzer build (MCCL_FUZZ=ON, clang) and the standalone driver (driver.cc, any compiler).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace mccl_fuzz {

// Valid and nearly valid inputs for every mode of the target, so mutations start deep in the parsers.
std::vector<std::string> seeds();

}  // namespace mccl_fuzz
