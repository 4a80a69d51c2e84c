// Ranks as threads in one process: an in-memory Store and a helper that builds one Communicator per
// thread and runs a function on each, collecting failures.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "communicator.h"
#include "error.h"
#include "store.h"

namespace mccl_test {

class MemoryStore : public mccl::Store {
 public:
  explicit MemoryStore(std::chrono::milliseconds timeout = std::chrono::seconds(30)) : timeout_(timeout) {}
  void set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      data_[key] = value;
    }
    cv_.notify_all();
  }
  std::string get(const std::string& key) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout_, [&] { return data_.count(key) > 0; }))
      mccl::fail(mccl::Error::Kind::kTimeout, "store key '", key, "' did not appear");
    return data_[key];
  }

 private:
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> data_;
};

// Every rank's copy of a result, filled from the ranks' threads (for checks that every rank holds the same bits).
struct Results {
  std::mutex mu;
  std::vector<std::vector<float>> of_rank;
};

// Runs fn(rank, comm) on `world` threads, rank r with configs[r]. Returns one message per rank ("" when
// that rank passed).
inline std::vector<std::string> run_world_configs(int world, const std::function<void(int, mccl::Communicator&)>& fn,
                                                  std::chrono::milliseconds timeout,
                                                  const std::vector<mccl::Config>& configs) {
  MemoryStore store(timeout);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        mccl::Communicator comm(store, rank, world, timeout, "127.0.0.1", configs[rank]);
        fn(rank, comm);
      } catch (const std::exception& e) {
        errors[rank] = e.what();
        if (errors[rank].empty()) errors[rank] = "exception with empty message";
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// The same with one config for every rank.
inline std::vector<std::string> run_world(int world, const std::function<void(int, mccl::Communicator&)>& fn,
                                          std::chrono::milliseconds timeout = std::chrono::seconds(30),
                                          const mccl::Config& config = mccl::Config::global()) {
  return run_world_configs(world, fn, timeout, std::vector<mccl::Config>(world, config));
}

}  // namespace mccl_test
