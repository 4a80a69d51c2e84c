// Runs the wire fuzz target without libFuzzer (any compiler, e.g. g++ with ASan+UBSan in `make test`):
// first the seeds and any files named on the command line, then a fixed number of inputs made by
// mutating the seeds with a seeded PRNG, so every run checks the same inputs.
//
//   fuzz_wire_driver                       seeds + 200000 mutated inputs
//   fuzz_wire_driver --iterations N --seed S
//   fuzz_wire_driver crash-1234 ...        replay files (e.g. libFuzzer findings)
//   fuzz_wire_driver --write-seeds DIR     write the seeds as files, as a libFuzzer corpus
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_wire.h"

namespace {

// splitmix64: small, fast, and the same sequence on every platform.
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(next() % n); }
};

// Values that make parsers take unusual branches: boundaries of lengths, ranks, versions.
const uint64_t kInteresting[] = {0, 1, 2, 3, 7, 8, 15, 16, 63, 64, 255, 256, 1023, 1024, 65535, 65536,
                                 (1u << 20), (1u << 20) + 1, 0x7fffffff, 0x80000000u, 0xffffffffu,
                                 0x7fffffffffffffffull, 0xffffffffffffffffull, 0x1234, 0x4C43434D};

std::string mutate(const std::vector<std::string>& seeds, Rng& rng) {
  std::string s = seeds[rng.below(seeds.size())];
  const int edits = 1 + static_cast<int>(rng.below(6));
  for (int e = 0; e < edits; ++e) {
    switch (rng.below(8)) {
      case 0:  // flip a bit
        if (!s.empty()) s[rng.below(s.size())] ^= static_cast<char>(1u << rng.below(8));
        break;
      case 1:  // random byte
        if (!s.empty()) s[rng.below(s.size())] = static_cast<char>(rng.next());
        break;
      case 2: {  // overwrite 1, 2, 4 or 8 bytes with an interesting value
        size_t width = size_t(1) << rng.below(4);
        if (s.size() < width) break;
        uint64_t v = kInteresting[rng.below(sizeof(kInteresting) / sizeof(kInteresting[0]))];
        std::memcpy(&s[rng.below(s.size() - width + 1)], &v, width);
        break;
      }
      case 3:  // truncate
        s.resize(rng.below(s.size() + 1));
        break;
      case 4: {  // insert random bytes
        std::string extra(1 + rng.below(16), '\0');
        for (char& c : extra) c = static_cast<char>(rng.next());
        s.insert(rng.below(s.size() + 1), extra);
        break;
      }
      case 5:  // erase a range
        if (s.size() > 1) {
          size_t at = rng.below(s.size());
          s.erase(at, 1 + rng.below(std::min<size_t>(64, s.size() - at)));
        }
        break;
      case 6: {  // splice in part of another seed (keeping this input's mode byte)
        const std::string& other = seeds[rng.below(seeds.size())];
        if (other.size() < 2) break;
        size_t from = 1 + rng.below(other.size() - 1);
        s.insert(rng.below(s.size()) + (s.empty() ? 0 : 1), other.substr(from, 1 + rng.below(other.size() - from)));
        break;
      }
      case 7:  // change the mode / options byte
        if (!s.empty()) s[0] = static_cast<char>(rng.next());
        break;
    }
  }
  return s;
}

// The input being run, written to ./fuzz_wire-crash on abort (an invariant or a sanitizer) for replay.
const std::string* g_current = nullptr;

void save_current_input(int) {
  if (g_current != nullptr) {
    int fd = ::open("fuzz_wire-crash", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ssize_t ignored = ::write(fd, g_current->data(), g_current->size());
      (void)ignored;
      ::close(fd);
      const char note[] = "fuzz_wire_driver: the failing input is in ./fuzz_wire-crash\n";
      ignored = ::write(2, note, sizeof(note) - 1);
    }
  }
  std::signal(SIGABRT, SIG_DFL);
  std::raise(SIGABRT);
}

int run(const std::string& input) {
  g_current = &input;
  int rc = LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  g_current = nullptr;
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGABRT, save_current_input);
  long long iterations = 200000;
  uint64_t seed = 1;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--iterations" && i + 1 < argc) {
      iterations = std::atoll(argv[++i]);
    } else if (arg == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--write-seeds" && i + 1 < argc) {
      std::string dir = argv[++i];
      auto all = mccl_fuzz::seeds();
      for (size_t k = 0; k < all.size(); ++k) {
        std::ofstream out(dir + "/seed-" + std::to_string(k), std::ios::binary);
        out << all[k];
        if (!out) {
          std::fprintf(stderr, "cannot write %s/seed-%zu\n", dir.c_str(), k);
          return 2;
        }
      }
      std::printf("wrote %zu seeds to %s\n", all.size(), dir.c_str());
      return 0;
    } else {
      files.push_back(arg);
    }
  }
  if (!files.empty()) {
    for (const auto& path : files) {
      std::ifstream in(path, std::ios::binary);
      if (!in) {
        std::fprintf(stderr, "cannot read %s\n", path.c_str());
        return 2;
      }
      std::stringstream bytes;
      bytes << in.rdbuf();
      std::fprintf(stderr, "replaying %s (%zu bytes)\n", path.c_str(), bytes.str().size());
      run(bytes.str());
    }
    std::printf("%zu input(s) replayed without a finding\n", files.size());
    return 0;
  }
  const auto start = std::chrono::steady_clock::now();
  auto all = mccl_fuzz::seeds();
  for (const auto& s : all) run(s);
  Rng rng{seed};
  for (long long i = 0; i < iterations; ++i) run(mutate(all, rng));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("fuzz_wire: %zu seeds + %lld mutated inputs (seed %llu) in %.1f s without a finding\n", all.size(),
              iterations, static_cast<unsigned long long>(seed), secs);
  return 0;
}
