// Element types and reduction operators the engine understands, and their names for messages.
// The numeric values travel in the wire header, so they are fixed: append, never renumber.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mccl {

enum class DataType : uint8_t {
  kFloat32 = 1,
  kFloat64 = 2,
  kFloat16 = 3,
  kBFloat16 = 4,
  kInt8 = 5,
  kUInt8 = 6,
  kInt32 = 7,
  kInt64 = 8,
  kBool = 9,
};

enum class ReduceOp : uint8_t {
  kSum = 1,
  kAvg = 2,  // SUM on the wire, divided by the world size once at the end
  kProduct = 3,
  kMin = 4,
  kMax = 5,
  kBand = 6,  // bitwise ops: integer types and bool only
  kBor = 7,
  kBxor = 8,
};

size_t dtype_size(DataType dtype);    // bytes per element; throws on an unknown value
const char* dtype_name(DataType dtype);  // "float32", ...; "dtype(<n>)" style text is never returned
const char* op_name(ReduceOp op);        // "sum", ...
bool is_valid_dtype(uint8_t value);
bool is_valid_op(uint8_t value);
bool is_floating(DataType dtype);

}  // namespace mccl
