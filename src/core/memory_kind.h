// The kinds of memory a buffer of a call can live in. Dispatch takes each buffer's kind as an
// input, and every path and transport states which kinds it accepts (dispatch refuses a path that
// cannot take the buffers).
#pragma once

#include <cstdint>

namespace loom {

enum class MemKind : uint8_t {
  kHost,        // plain host memory (malloc, the stack, a mapping of the caller's)
  kHostShared,  // host memory from loomMemAlloc: peers of the host can map it
  kCudaDevice,  // CUDA device memory (the slot the CUDA build fills; none without it)
};

inline const char* memKindName(MemKind k) {
  switch (k) {
    case MemKind::kHost:
      return "host";
    case MemKind::kHostShared:
      return "host (loomMemAlloc)";
    case MemKind::kCudaDevice:
      return "CUDA device";
  }
  return "unknown";
}

// A set of kinds, for what a path or transport accepts.
using MemKindSet = uint8_t;
constexpr MemKindSet memKindBit(MemKind k) {
  return static_cast<MemKindSet>(1u << static_cast<unsigned>(k));
}
constexpr MemKindSet kHostKinds = memKindBit(MemKind::kHost) | memKindBit(MemKind::kHostShared);
constexpr bool accepts(MemKindSet set, MemKind k) { return (set & memKindBit(k)) != 0; }

}  // namespace loom
