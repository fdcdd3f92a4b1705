// A key for the per-call caches (plans, compiled schedules): a few integers and a short name,
// compared and hashed without formatting text (the calls look them up every time).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "src/core/hash.h"

namespace loom {

struct CacheKey {
  std::array<uint64_t, 6> words{};
  std::string name;  // an algorithm or a filter spec

  bool operator==(const CacheKey& o) const { return words == o.words && name == o.name; }
};

struct CacheKeyHash {
  size_t operator()(const CacheKey& k) const {
    Fnv64 h;
    for (uint64_t w : k.words) h.mix(w);
    h.mixBytes(k.name);
    return static_cast<size_t>(h.value());
  }
};

}  // namespace loom
