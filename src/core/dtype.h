// Datatypes and reduction ops: sizes, names, validation, and float16/bfloat16 conversions.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "loom/loom.h"

namespace loom {

inline bool validDataType(int dt) { return dt >= 0 && dt < loomNumTypes; }
inline bool validRedOp(int op) { return op >= 0 && op < loomNumOps; }

inline size_t dataTypeSize(loomDataType_t dt) {
  switch (dt) {
    case loomInt8:
    case loomUint8:
      return 1;
    case loomFloat16:
    case loomBfloat16:
      return 2;
    case loomInt32:
    case loomUint32:
    case loomFloat32:
      return 4;
    case loomInt64:
    case loomUint64:
    case loomFloat64:
      return 8;
    default:
      return 0;
  }
}

// nccl-tests names: int8 uint8 int32 uint32 int64 uint64 half float double bfloat16.
const char* dataTypeName(loomDataType_t dt);
const char* redOpName(loomRedOp_t op);
// Accepts nccl-tests names and common aliases (float32, fp16, bf16, ...). -1 if unknown.
int parseDataType(const char* name);
int parseRedOp(const char* name);

inline float halfToFloat(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even.
inline uint16_t floatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u)
    return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (absx < 0x38800000u) {  // zero or subnormal in half: units of 2^-24, exact scaling
    float a;
    std::memcpy(&a, &absx, 4);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(a * 16777216.0f)));
  }
  uint32_t e = (absx >> 23) - 127 + 15;
  uint32_t m = absx & 0x7fffffu;
  uint32_t h = (e << 10) | (m >> 13);
  uint32_t rem = m & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

inline float bf16ToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t floatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace loom
