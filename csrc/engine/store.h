// The key-value store ranks rendezvous through. The torch binding adapts c10d::Store (torch hands every
// backend a prefixed TCPStore); the engine's tests use an in-process map. MCCL runs no server of its own.
#pragma once

#include <string>

namespace mccl {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Blocks until `key` exists. Throws mccl::Error (kTimeout) when the store gives up.
  virtual std::string get(const std::string& key) = 0;
};

}  // namespace mccl
