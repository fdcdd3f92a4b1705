// The reduction kernels, written once and compiled once per ISA: reduce_generic.cc,
// reduce_avx2.cc and reduce_avx512.cc include this file under their own -m flags and export a
// KernelTable under their own name (LOOM_REDUCE_TABLE).
//
// Everything here has internal linkage, and nothing here calls an inline function with external
// linkage (std:: templates, the helpers of dtype.h): such a function may be emitted out of line in
// each translation unit, and the linker could then hand the AVX-512 copy to a generic caller on a
// CPU without AVX-512. Bit casts go through memcpy, NaN tests are x != x.
//
// Layout of the work:
//  - 1-, 4- and 8-byte types: plain loops over __restrict pointers that the compiler vectorises for
//    the ISA of the translation unit. Exact aliasing (dst == a or dst == b) goes to an in-place
//    loop so that __restrict stays true. Signed sum/prod run on the unsigned type (wrap, no UB).
//  - float16/bfloat16: explicit vectors of kLanes float lanes (GCC vector extensions), two per
//    block. Each element is widened to float32, combined, and rounded once to nearest even.
//    float16 uses F16C (vcvtph2ps/vcvtps2ph) when the ISA has it and a branch-free integer
//    conversion otherwise; bfloat16 always uses shifts. The tail (< one block) goes through a small
//    zero-padded local buffer so that it has exactly the arithmetic of the body.
//  - float max/min have fmax/fmin semantics: a NaN operand loses to a number; two NaNs give NaN.
//    The sign of a zero result of max(+0,-0) is unspecified (as for fmax).
// The loops stream once over their inputs, so there is nothing to gain from blocking beyond the
// vector width: each vector is loaded, combined and stored before the next one is touched.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__F16C__) && (defined(__AVX2__) || defined(__AVX512F__))
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "loom/loom.h"
#include "src/reduce/reduce_isa.h"

#ifndef LOOM_REDUCE_TABLE
#error "define LOOM_REDUCE_TABLE to the name of the KernelTable this translation unit exports"
#endif

namespace loom {
namespace reduce_internal {
namespace {

#if defined(__AVX512F__)
constexpr size_t kLanes = 16;
#elif defined(__AVX2__)
constexpr size_t kLanes = 8;
#else
constexpr size_t kLanes = 4;
#endif

using VecF = float __attribute__((vector_size(kLanes * 4)));
using VecU32 = uint32_t __attribute__((vector_size(kLanes * 4)));
// For comparisons of values below 2^31: SSE2/AVX2 compare signed integers only, and GCC emulates
// unsigned compares with extra work.
using VecI32 = int32_t __attribute__((vector_size(kLanes * 4)));

// ---- ops: each works on scalars and on GCC vectors alike ----

struct SumOp {
  template <class T>
  static T apply(T a, T b) {
    return static_cast<T>(a + b);
  }
};
struct ProdOp {
  template <class T>
  static T apply(T a, T b) {
    return static_cast<T>(a * b);
  }
};
// Integers only.
struct MaxOp {
  template <class T>
  static T apply(T a, T b) {
    return a > b ? a : b;
  }
};
struct MinOp {
  template <class T>
  static T apply(T a, T b) {
    return a < b ? a : b;
  }
};
// Floating point: fmax/fmin semantics (b != b is "b is NaN": then a wins; if a is NaN, b wins).
struct FMaxOp {
  template <class T>
  static T apply(T a, T b) {
    return ((a > b) | (b != b)) ? a : b;
  }
};
struct FMinOp {
  template <class T>
  static T apply(T a, T b) {
    return ((a < b) | (b != b)) ? a : b;
  }
};

// ---- 1-, 4- and 8-byte element types ----

template <class T, class Op>
void binaryLoop(T* __restrict d, const T* __restrict x, const T* __restrict y, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = Op::apply(x[i], y[i]);
}

template <class T, class Op>
void inplaceLoop(T* __restrict d, const T* __restrict y, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = Op::apply(d[i], y[i]);
}

// Every op is commutative (up to which NaN or which zero max/min return), so dst == b may run as
// dst = dst op a.
template <class T, class Op>
void combine(void* dst, const void* a, const void* b, size_t n) {
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  if (d == x) {
    inplaceLoop<T, Op>(d, y, n);
  } else if (d == y) {
    inplaceLoop<T, Op>(d, x, n);
  } else {
    binaryLoop<T, Op>(d, x, y, n);
  }
}

// Signed: sum/prod on the unsigned type U (two's complement wrap), max/min on S.
template <class S, class U>
void combineInt(void* dst, const void* a, const void* b, size_t n, loomRedOp_t op) {
  switch (op) {
    case loomSum:
    case loomAvg:
      combine<U, SumOp>(dst, a, b, n);
      break;
    case loomProd:
      combine<U, ProdOp>(dst, a, b, n);
      break;
    case loomMax:
      combine<S, MaxOp>(dst, a, b, n);
      break;
    case loomMin:
      combine<S, MinOp>(dst, a, b, n);
      break;
    default:
      break;
  }
}

template <class T>
void combineFloat(void* dst, const void* a, const void* b, size_t n, loomRedOp_t op) {
  switch (op) {
    case loomSum:
    case loomAvg:
      combine<T, SumOp>(dst, a, b, n);
      break;
    case loomProd:
      combine<T, ProdOp>(dst, a, b, n);
      break;
    case loomMax:
      combine<T, FMaxOp>(dst, a, b, n);
      break;
    case loomMin:
      combine<T, FMinOp>(dst, a, b, n);
      break;
    default:
      break;
  }
}

// Truncates toward zero for integers (C++ division), rounds to nearest for floats. The divisor has
// the promoted type (int for 1-byte integers) so that nranks > 255 stays exact.
template <class T>
void divideLoop(T* __restrict d, size_t n, int nranks) {
  using Promoted = decltype(T{} + T{});
  const Promoted divisor = static_cast<Promoted>(nranks);
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<T>(d[i] / divisor);
}

// ---- float16 / bfloat16: blocks of 2 * kLanes elements ----
//
// A block is read as kLanes 32-bit words; each word holds two elements. The codecs split a block
// into two float vectors and join them back in the same arrangement, so ops that work lane by lane
// need no shuffles: bfloat16 splits into even/odd elements with a shift and a mask, portable
// float16 likewise; F16C float16 converts the two halves of the block.

constexpr size_t kBlock = 2 * kLanes;

template <class To, class From>
inline To bitCast(From from) {
  static_assert(sizeof(To) == sizeof(From), "size mismatch");
  To to;
  std::memcpy(&to, &from, sizeof(to));
  return to;
}

inline VecU32 loadWords(const uint16_t* p) {
  VecU32 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void storeWords(uint16_t* p, VecU32 v) { std::memcpy(p, &v, sizeof(v)); }

struct Bf16Codec {
  static void load(const uint16_t* p, VecF& even, VecF& odd) {
    const VecU32 w = loadWords(p);  // store() puts the halves back where load() found them
    even = bitCast<VecF>(w << 16);
    odd = bitCast<VecF>(w & 0xffff0000u);
  }
  // The bfloat16 in the high half of the result: rounded to nearest even (overflow gives inf), NaN
  // kept NaN and made quiet. The low half is garbage.
  static VecU32 round(VecF f) {
    const VecU32 x = bitCast<VecU32>(f);
    const VecI32 isNan = bitCast<VecI32>(x & 0x7fffffffu) > 0x7f800000;
    return isNan ? (x | 0x00400000u) : x + 0x7fffu + ((x >> 16) & 1u);
  }
  static void store(uint16_t* p, VecF even, VecF odd) {
    storeWords(p, (round(even) >> 16) | (round(odd) & 0xffff0000u));
  }
};

struct HalfCodec {
#if defined(__AVX512F__) && defined(__F16C__)
  // The maskz forms with a full mask compile to the plain instructions; the plain intrinsics trip
  // GCC 12's -Wmaybe-uninitialized (_mm512_undefined_ps inside them).
  static VecF cvt(const uint16_t* p) {
    return _mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void cvt(uint16_t* p, VecF f) {
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(p),
        _mm512_maskz_cvtps_ph(0xffff, f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void load(const uint16_t* p, VecF& lo, VecF& hi) {
    lo = cvt(p);
    hi = cvt(p + kLanes);
  }
  static void store(uint16_t* p, VecF lo, VecF hi) {
    cvt(p, lo);
    cvt(p + kLanes, hi);
  }
#elif defined(__AVX2__) && defined(__F16C__)
  static VecF cvt(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void cvt(uint16_t* p, VecF f) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT));
  }
  static void load(const uint16_t* p, VecF& lo, VecF& hi) {
    lo = cvt(p);
    hi = cvt(p + kLanes);
  }
  static void store(uint16_t* p, VecF lo, VecF hi) {
    cvt(p, lo);
    cvt(p + kLanes, hi);
  }
#else
  // Branch-free conversions after F. Giesen ("half to float done quic", float_to_half_fast3_rtne):
  // exact for every half, round to nearest even for every float, NaN -> quiet NaN 0x7e00 | sign.
  // h holds one half per lane in its low 16 bits.
  static VecF toFloat(VecU32 h) {
    const VecU32 kExpMask = VecU32{} + (0x7c00u << 13);
    VecU32 o = (h & 0x7fffu) << 13;  // exponent and mantissa in float position
    const VecU32 exp = o & kExpMask;
    o += (127u - 15u) << 23;                               // rebias the exponent
    o = (exp == kExpMask) ? o + ((128u - 16u) << 23) : o;  // inf/NaN: exponent to 255
    // Zero/subnormal: build 2^-14 * (1 + m/1024) and subtract 2^-14, which is exact.
    const VecF kMagic = VecF{} + 6.103515625e-05f;  // 2^-14
    const VecU32 sub = bitCast<VecU32>(bitCast<VecF>(o + (1u << 23)) - kMagic);
    o = (exp == 0u) ? sub : o;
    return bitCast<VecF>(o | ((h & 0x8000u) << 16));
  }
  // One half per lane, in the low 16 bits (the high bits are zero).
  static VecU32 toHalf(VecF f) {
    VecU32 x = bitCast<VecU32>(f);
    const VecU32 sign = x & 0x80000000u;
    x ^= sign;
    const VecI32 xi = bitCast<VecI32>(x);  // |f| bits, < 2^31
    // |f| >= 65536 (or inf/NaN): inf, or quiet NaN.
    const VecU32 big = (xi > 0x7f800000) ? VecU32{} + 0x7e00u : VecU32{} + 0x7c00u;
    // |f| < 2^-14: add 0.5 so that the FPU rounds to a multiple of 2^-24, then read the units.
    const VecF kDenormMagic = VecF{} + 0.5f;
    const VecU32 small = bitCast<VecU32>(bitCast<VecF>(x) + kDenormMagic) - (126u << 23);
    // Normal: rebias, add half an ulp minus one plus the ulp's parity, and shift (a carry out of
    // the mantissa bumps the exponent, up to inf for [65520, 65536)).
    const VecU32 normal = (x + ((15u - 127u) << 23) + 0xfffu + ((x >> 13) & 1u)) >> 13;
    const VecU32 o = (xi >= ((127 + 16) << 23)) ? big : ((xi < (113 << 23)) ? small : normal);
    return o | (sign >> 16);
  }
  static void load(const uint16_t* p, VecF& even, VecF& odd) {
    const VecU32 w = loadWords(p);
    even = toFloat(w & 0xffffu);
    odd = toFloat(w >> 16);
  }
  static void store(uint16_t* p, VecF even, VecF odd) {
    storeWords(p, toHalf(even) | (toHalf(odd) << 16));
  }
#endif
};

// dst == a or dst == b exactly is safe: each block is loaded before it is stored.
template <class Codec, class Op>
void combineNarrow(void* dst, const void* a, const void* b, size_t n) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  auto block = [](uint16_t* bd, const uint16_t* bx, const uint16_t* by) {
    VecF x0, x1, y0, y1;
    Codec::load(bx, x0, x1);
    Codec::load(by, y0, y1);
    Codec::store(bd, Op::apply(x0, y0), Op::apply(x1, y1));
  };
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) block(d + i, x + i, y + i);
  if (i < n) {  // the same arithmetic on a zero-padded copy
    const size_t rest = (n - i) * sizeof(uint16_t);
    uint16_t tx[kBlock] = {}, ty[kBlock] = {}, td[kBlock];
    std::memcpy(tx, x + i, rest);
    std::memcpy(ty, y + i, rest);
    block(td, tx, ty);
    std::memcpy(d + i, td, rest);
  }
}

template <class Codec>
void combineNarrowOp(void* dst, const void* a, const void* b, size_t n, loomRedOp_t op) {
  switch (op) {
    case loomSum:
    case loomAvg:
      combineNarrow<Codec, SumOp>(dst, a, b, n);
      break;
    case loomProd:
      combineNarrow<Codec, ProdOp>(dst, a, b, n);
      break;
    case loomMax:
      combineNarrow<Codec, FMaxOp>(dst, a, b, n);
      break;
    case loomMin:
      combineNarrow<Codec, FMinOp>(dst, a, b, n);
      break;
    default:
      break;
  }
}

template <class Codec>
void divideNarrow(void* data, size_t n, int nranks) {
  uint16_t* d = static_cast<uint16_t*>(data);
  const float divisor = static_cast<float>(nranks);
  auto block = [divisor](uint16_t* p) {
    VecF v0, v1;
    Codec::load(p, v0, v1);
    Codec::store(p, v0 / divisor, v1 / divisor);
  };
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) block(d + i);
  if (i < n) {
    const size_t rest = (n - i) * sizeof(uint16_t);
    uint16_t t[kBlock] = {};
    std::memcpy(t, d + i, rest);
    block(t);
    std::memcpy(d + i, t, rest);
  }
}

// ---- entry points ----

void reduceImpl(void* dst, const void* a, const void* b, size_t n, loomDataType_t dt,
                loomRedOp_t op) {
  switch (dt) {
    case loomInt8:
      combineInt<int8_t, uint8_t>(dst, a, b, n, op);
      break;
    case loomUint8:
      combineInt<uint8_t, uint8_t>(dst, a, b, n, op);
      break;
    case loomInt32:
      combineInt<int32_t, uint32_t>(dst, a, b, n, op);
      break;
    case loomUint32:
      combineInt<uint32_t, uint32_t>(dst, a, b, n, op);
      break;
    case loomInt64:
      combineInt<int64_t, uint64_t>(dst, a, b, n, op);
      break;
    case loomUint64:
      combineInt<uint64_t, uint64_t>(dst, a, b, n, op);
      break;
    case loomFloat32:
      combineFloat<float>(dst, a, b, n, op);
      break;
    case loomFloat64:
      combineFloat<double>(dst, a, b, n, op);
      break;
    case loomFloat16:
      combineNarrowOp<HalfCodec>(dst, a, b, n, op);
      break;
    case loomBfloat16:
      combineNarrowOp<Bf16Codec>(dst, a, b, n, op);
      break;
    default:
      break;
  }
}

void finishAverageImpl(void* data, size_t n, loomDataType_t dt, int nranks) {
  switch (dt) {
    case loomInt8:
      divideLoop(static_cast<int8_t*>(data), n, nranks);
      break;
    case loomUint8:
      divideLoop(static_cast<uint8_t*>(data), n, nranks);
      break;
    case loomInt32:
      divideLoop(static_cast<int32_t*>(data), n, nranks);
      break;
    case loomUint32:
      divideLoop(static_cast<uint32_t*>(data), n, nranks);
      break;
    case loomInt64:
      divideLoop(static_cast<int64_t*>(data), n, nranks);
      break;
    case loomUint64:
      divideLoop(static_cast<uint64_t*>(data), n, nranks);
      break;
    case loomFloat32:
      divideLoop(static_cast<float*>(data), n, nranks);
      break;
    case loomFloat64:
      divideLoop(static_cast<double*>(data), n, nranks);
      break;
    case loomFloat16:
      divideNarrow<HalfCodec>(data, n, nranks);
      break;
    case loomBfloat16:
      divideNarrow<Bf16Codec>(data, n, nranks);
      break;
    default:
      break;
  }
}

// Whole lines from src to dst (64-byte aligned) around the caches, with the widest stores the ISA
// has.
void streamLines(char* dst, const char* src, size_t bytes) {
  for (size_t i = 0; i < bytes; i += 64) {
#if defined(__AVX512F__)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), _mm512_loadu_si512(src + i));
#elif defined(__AVX2__)
    for (size_t j = 0; j < 64; j += 32)
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + j),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + j)));
#elif defined(__SSE2__)
    for (size_t j = 0; j < 64; j += 16)
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + j),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + j)));
#else
    std::memcpy(dst + i, src + i, 64);
#endif
  }
}

// The result goes to copy a kilobyte at a time, and from there (still in the first-level cache)
// around the caches to nt: the streaming stores interleave with the reduction's loads.
void reduceTwiceImpl(void* nt, void* copy, const void* a, const void* b, size_t n,
                     loomDataType_t dt, size_t es, loomRedOp_t op) {
  constexpr size_t kPiece = 1024;
  auto* d = static_cast<char*>(nt);
  auto* c = static_cast<char*>(copy);
  const auto* x = static_cast<const char*>(a);
  const auto* y = static_cast<const char*>(b);
  const size_t pieceElems = kPiece / es;
  for (size_t i = 0; i < n; i += pieceElems) {
    const size_t m = n - i < pieceElems ? n - i : pieceElems, off = i * es, bytes = m * es;
    reduceImpl(c + off, x + off, y + off, m, dt, op);
    const size_t lines = bytes & ~static_cast<size_t>(63);
    streamLines(d + off, c + off, lines);
    std::memcpy(d + off + lines, c + off + lines, bytes - lines);
  }
}

}  // namespace

extern const KernelTable LOOM_REDUCE_TABLE;
const KernelTable LOOM_REDUCE_TABLE = {&reduceImpl, &finishAverageImpl, &reduceTwiceImpl};

}  // namespace reduce_internal
}  // namespace loom
