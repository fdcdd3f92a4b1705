// FNV-1a, 64 bits: the one hash Loom uses where all ranks must derive the same value from the same
// inputs (message tags, operation signatures, secrets). Not cryptographic.
#pragma once

#include <cstdint>
#include <string_view>

namespace loom {

class Fnv64 {
 public:
  Fnv64& mix(uint64_t v) {
    h_ ^= v;
    h_ *= 1099511628211ull;
    return *this;
  }
  Fnv64& mixBytes(std::string_view s) {
    for (char c : s) mix(static_cast<unsigned char>(c));
    return *this;
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 1469598103934665603ull;
};

}  // namespace loom
