// Test oracles for float16/bfloat16 that share no code with src/core/dtype.h or the kernels: values
// come from ldexp, rounding from a binary search over the (monotonic) positive bit patterns.
#pragma once

#include <cmath>
#include <cstdint>

namespace loom {
namespace testing {

struct Format {
  int mantBits;
  int bias;
  uint16_t infBits;  // positive infinity; also the number of finite positive patterns
};
constexpr Format kHalfFormat{10, 15, 0x7c00};
constexpr Format kBf16Format{7, 127, 0x7f80};

inline bool isNanBits(uint16_t bits, const Format& f) { return (bits & 0x7fff) > f.infBits; }

// Value of a positive pattern k <= infBits; the infinity pattern reads as 2^(emax+1), which is what
// round-to-nearest-even overflows to.
inline double patternValue(uint32_t k, const Format& f) {
  const uint32_t e = k >> f.mantBits;
  const uint32_t m = k & ((1u << f.mantBits) - 1);
  if (e == 0) return std::ldexp(static_cast<double>(m), 1 - f.bias - f.mantBits);
  return std::ldexp(static_cast<double>((1u << f.mantBits) + m),
                    static_cast<int>(e) - f.bias - f.mantBits);
}

// The exact value of any pattern (inf for inf, NaN for NaN).
inline double decode(uint16_t bits, const Format& f) {
  const double sign = (bits & 0x8000) ? -1.0 : 1.0;
  const uint16_t mag = bits & 0x7fff;
  if (mag > f.infBits) return std::nan("");
  if (mag == f.infBits) return sign * INFINITY;
  return sign * patternValue(mag, f);
}

// Correctly rounded (nearest, ties to even) conversion of x. NaN gives a NaN pattern.
inline uint16_t roundTo(double x, const Format& f) {
  if (std::isnan(x)) return static_cast<uint16_t>(f.infBits | 0x7fff);
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double ax = std::fabs(x);
  if (ax >= patternValue(f.infBits, f)) return sign | f.infBits;
  uint32_t lo = 0, hi = f.infBits;  // value(lo) <= ax < value(hi)
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    (patternValue(mid, f) <= ax ? lo : hi) = mid;
  }
  const double dl = ax - patternValue(lo, f);
  const double dh = patternValue(hi, f) - ax;
  uint32_t k = dl < dh ? lo : dh < dl ? hi : ((lo & 1) == 0 ? lo : hi);
  return static_cast<uint16_t>(sign | k);
}

}  // namespace testing
}  // namespace loom
