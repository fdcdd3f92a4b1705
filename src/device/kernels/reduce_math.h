// The element arithmetic of Loom's reductions, written once for the GPU kernels and for the host:
// nvcc compiles it into the device kernels (reduce_kernels.cu), and the host compiler into the
// emulated device (tests/device/fake_cuda) and the tests that check it bit for bit against the CPU
// kernels (src/reduce). It must give exactly the CPU path's bits:
//  - integers: sum and product wrap (on the unsigned type), max/min compare signed or unsigned;
//  - float32/float64: IEEE in the type; max/min have fmax/fmin semantics (a NaN operand loses to
//    a number);
//  - float16/bfloat16: each operand widened to float32 (exactly), combined in float32, and rounded
//    once to nearest even: an n-input reduction rounds after each pairwise step, as the CPU path
//    (which reduces two buffers at a time) does;
//  - avg: a sum, then one division by the rank count (integers truncate toward zero; half types
//    divide in float32 and round once).
// NaN payloads may differ from the CPU path's; every NaN stays a NaN.
#pragma once

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define LOOM_HD __host__ __device__ __forceinline__
#else
#define LOOM_HD inline
#endif

namespace loom {
namespace devk {

// loomDataType_t and loomRedOp_t values (include/loom/loom.h), repeated so that device code needs
// no host header.
enum DType : int {
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBfloat16 = 9,
  kNumDTypes = 10
};
enum ROp : int { kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4, kNumROps = 5 };

// The bits of `from` as a To of the same size.
template <class To, class From>
LOOM_HD To bitCast(From from) {
  static_assert(sizeof(To) == sizeof(From), "bitCast changes no size");
  union {
    From from;
    To to;
  } c;
  c.from = from;
  return c.to;
}
LOOM_HD uint32_t floatBits(float f) { return bitCast<uint32_t>(f); }
LOOM_HD float bitsFloat(uint32_t u) { return bitCast<float>(u); }

// Exact for every half; NaN stays NaN.
LOOM_HD float halfToFloat(uint16_t h) {
  const uint32_t expMask = 0x7c00u << 13;
  uint32_t o = (static_cast<uint32_t>(h) & 0x7fffu) << 13;
  const uint32_t exp = o & expMask;
  o += (127u - 15u) << 23;
  if (exp == expMask) {
    o += (128u - 16u) << 23;  // inf/NaN
  } else if (exp == 0) {
    // Zero/subnormal: 2^-14 * (1 + m/1024) - 2^-14, exact.
    o = floatBits(bitsFloat(o + (1u << 23)) - 6.103515625e-05f);
  }
  return bitsFloat(o | ((static_cast<uint32_t>(h) & 0x8000u) << 16));
}

// Round to nearest even; overflow gives inf; NaN gives a quiet NaN.
LOOM_HD uint16_t floatToHalf(float f) {
  uint32_t x = floatBits(f);
  const uint32_t sign = x & 0x80000000u;
  x ^= sign;
  uint32_t o;
  if (x >= ((127u + 16u) << 23)) {
    o = x > 0x7f800000u ? 0x7e00u : 0x7c00u;  // NaN, or inf (|f| >= 65536)
  } else if (x < (113u << 23)) {
    // |f| < 2^-14: let the FPU round to a multiple of 2^-24, then read the units.
    o = floatBits(bitsFloat(x) + 0.5f) - (126u << 23);
  } else {
    o = (x + ((15u - 127u) << 23) + 0xfffu + ((x >> 13) & 1u)) >> 13;
  }
  return static_cast<uint16_t>(o | (sign >> 16));
}

LOOM_HD float bf16ToFloat(uint16_t b) { return bitsFloat(static_cast<uint32_t>(b) << 16); }

LOOM_HD uint16_t floatToBf16(float f) {
  const uint32_t x = floatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x | 0x00400000u) >> 16);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// The combination of two values of a type (T is the storage type; floats combine as themselves).
template <class T>
LOOM_HD T fmaxOf(T a, T b) {
  return ((a > b) | (b != b)) ? a : b;
}
template <class T>
LOOM_HD T fminOf(T a, T b) {
  return ((a < b) | (b != b)) ? a : b;
}

template <class T, class U, int Op>
LOOM_HD T combineInt(T a, T b) {
  if (Op == kSum || Op == kAvg) return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  if (Op == kProd) return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  if (Op == kMax) return a > b ? a : b;
  return a < b ? a : b;
}

template <class F, int Op>
LOOM_HD F combineFloat(F a, F b) {
  if (Op == kSum || Op == kAvg) return a + b;
  if (Op == kProd) return a * b;
  if (Op == kMax) return fmaxOf(a, b);
  return fminOf(a, b);
}

// Storage type and element operations of each datatype.
template <int DT>
struct Elem;
#define LOOM_DEVK_INT(DT, T, U)                                     \
  template <>                                                       \
  struct Elem<DT> {                                                 \
    using Storage = T;                                              \
    template <int Op>                                               \
    static LOOM_HD T combine(T a, T b) {                            \
      return combineInt<T, U, Op>(a, b);                            \
    }                                                               \
    static LOOM_HD T divide(T a, int n) {                           \
      using P = decltype(T{} + T{});                                \
      return static_cast<T>(static_cast<P>(a) / static_cast<P>(n)); \
    }                                                               \
  };
LOOM_DEVK_INT(kInt8, int8_t, uint8_t)
LOOM_DEVK_INT(kUint8, uint8_t, uint8_t)
LOOM_DEVK_INT(kInt32, int32_t, uint32_t)
LOOM_DEVK_INT(kUint32, uint32_t, uint32_t)
LOOM_DEVK_INT(kInt64, int64_t, uint64_t)
LOOM_DEVK_INT(kUint64, uint64_t, uint64_t)
#undef LOOM_DEVK_INT

template <class F>
struct ElemFloat {
  using Storage = F;
  template <int Op>
  static LOOM_HD F combine(F a, F b) {
    return combineFloat<F, Op>(a, b);
  }
  static LOOM_HD F divide(F a, int n) { return a / static_cast<F>(n); }
};
template <>
struct Elem<kFloat32> : ElemFloat<float> {};
template <>
struct Elem<kFloat64> : ElemFloat<double> {};

// A 16-bit float (half, bfloat16) stored as its bits and computed in float: ToFloat and
// FromFloat convert.
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
struct Elem16 {
  using Storage = uint16_t;
  template <int Op>
  static LOOM_HD uint16_t combine(uint16_t a, uint16_t b) {
    return FromFloat(combineFloat<float, Op>(ToFloat(a), ToFloat(b)));
  }
  static LOOM_HD uint16_t divide(uint16_t a, int n) {
    return FromFloat(ToFloat(a) / static_cast<float>(n));
  }
};
template <>
struct Elem<kFloat16> : Elem16<halfToFloat, floatToHalf> {};
template <>
struct Elem<kBfloat16> : Elem16<bf16ToFloat, floatToBf16> {};

// What one reduction kernel launch computes: acc[i] = src[0][i] op src[1][i] op ... op
// src[nsrc-1][i] for i < count (pairwise, left to right), then / divideBy when divideBy > 0
// (avg's last step), stored into every one of dst[0..ndst-1] (one pass writes a result into every
// rank's output; one source and no op is a copy to them all). A dst may equal any src exactly.
// Passed by value as the kernel's one parameter.
constexpr int kMaxReduceInputs = 16;
constexpr int kMaxReduceOutputs = 16;
struct ReduceArgs {
  void* dst[kMaxReduceOutputs];
  const void* src[kMaxReduceInputs];
  int ndst;
  int nsrc;
  int divideBy;
  unsigned long long count;  // NOLINT(runtime/int): one layout for host and device
};

// Elements [begin, end) of a reduction (each GPU thread takes a stride of them; the host runs
// them all).
template <int DT, int Op>
LOOM_HD void reduceElements(const ReduceArgs& a, unsigned long long begin,      // NOLINT
                            unsigned long long end, unsigned long long step) {  // NOLINT
  using T = typename Elem<DT>::Storage;
  for (unsigned long long i = begin; i < end; i += step) {  // NOLINT
    T acc = static_cast<const T*>(a.src[0])[i];
    for (int s = 1; s < a.nsrc; ++s)
      acc = Elem<DT>::template combine<Op>(acc, static_cast<const T*>(a.src[s])[i]);
    if (a.divideBy > 0) acc = Elem<DT>::divide(acc, a.divideBy);
    for (int d = 0; d < a.ndst; ++d) static_cast<T*>(a.dst[d])[i] = acc;
  }
}

// 16 bytes of a type, for the vectorized body (every pointer 16-byte aligned).
template <class T>
struct alignas(16) Vec16 {
  T v[16 / sizeof(T)];
};

// Vectors [begin, end) of 16 bytes each (count / (16 / sizeof(T)) of them): the same arithmetic
// as reduceElements, element by element, with one 16-byte load per source and one store.
template <int DT, int Op>
LOOM_HD void reduceVectors(const ReduceArgs& a, unsigned long long begin,      // NOLINT
                           unsigned long long end, unsigned long long step) {  // NOLINT
  using T = typename Elem<DT>::Storage;
  using V = Vec16<T>;
  constexpr int kN = 16 / sizeof(T);
  for (unsigned long long i = begin; i < end; i += step) {  // NOLINT
    V acc = static_cast<const V*>(a.src[0])[i];
    for (int s = 1; s < a.nsrc; ++s) {
      const V x = static_cast<const V*>(a.src[s])[i];
      for (int k = 0; k < kN; ++k) acc.v[k] = Elem<DT>::template combine<Op>(acc.v[k], x.v[k]);
    }
    if (a.divideBy > 0)
      for (int k = 0; k < kN; ++k) acc.v[k] = Elem<DT>::divide(acc.v[k], a.divideBy);
    for (int d = 0; d < a.ndst; ++d) static_cast<V*>(a.dst[d])[i] = acc;
  }
}

// True when every pointer of a is 16-byte aligned (the vectorized body may run).
LOOM_HD bool aligned16(const ReduceArgs& a) {
  unsigned long long bits = 0;  // NOLINT
  for (int d = 0; d < a.ndst; ++d)
    bits |= reinterpret_cast<unsigned long long>(a.dst[d]);  // NOLINT
  for (int s = 0; s < a.nsrc; ++s)
    bits |= reinterpret_cast<unsigned long long>(a.src[s]);  // NOLINT
  return (bits & 15u) == 0;
}

// The whole reduction as `threads` workers numbered `tid` split it (a GPU grid; the host runs it
// with one worker): 16-byte vectors where every pointer allows, the tail element by element.
template <int DT, int Op>
LOOM_HD void reduceAll(const ReduceArgs& a, unsigned long long tid,  // NOLINT
                       unsigned long long threads) {                 // NOLINT
  using T = typename Elem<DT>::Storage;
  constexpr unsigned long long kN = 16 / sizeof(T);  // NOLINT
  unsigned long long head = 0;                       // NOLINT
  if (aligned16(a)) {
    const unsigned long long vecs = a.count / kN;  // NOLINT
    reduceVectors<DT, Op>(a, tid, vecs, threads);
    head = vecs * kN;
  }
  reduceElements<DT, Op>(a, head + tid, a.count, threads);
}

// The wait of a stream on a host-written flag, where the device has no stream memory operations:
// one thread spins until *flag >= value (the flag is host-mapped memory, written by Loom's host
// thread: src/device/stream_signal.h).
constexpr const char* kWaitFlagKernel = "loomWaitFlag";
struct WaitFlagArgs {
  const uint64_t* flag;
  uint64_t value;
};

// The kernel of (datatype, op): "loomReduce_<dtype>_<op>", as the device module exports it and
// the emulated device registers its host build.
// clang-format off
#define LOOM_DEVK_FOR_EACH_REDUCE(X)                                                  \
  X(kInt8, i8) X(kUint8, u8) X(kInt32, i32) X(kUint32, u32) X(kInt64, i64)            \
  X(kUint64, u64) X(kFloat16, f16) X(kFloat32, f32) X(kFloat64, f64) X(kBfloat16, bf16)
#define LOOM_DEVK_FOR_EACH_OP(X, DT, DN) \
  X(DT, DN, kSum, sum) X(DT, DN, kProd, prod) X(DT, DN, kMax, max) X(DT, DN, kMin, min)
// clang-format on

inline const char* reduceKernelName(int dt, int op) {
  // avg runs the sum kernel with divideBy set.
  static const char* const kNames[kNumDTypes][4] = {
      {"loomReduce_i8_sum", "loomReduce_i8_prod", "loomReduce_i8_max", "loomReduce_i8_min"},
      {"loomReduce_u8_sum", "loomReduce_u8_prod", "loomReduce_u8_max", "loomReduce_u8_min"},
      {"loomReduce_i32_sum", "loomReduce_i32_prod", "loomReduce_i32_max", "loomReduce_i32_min"},
      {"loomReduce_u32_sum", "loomReduce_u32_prod", "loomReduce_u32_max", "loomReduce_u32_min"},
      {"loomReduce_i64_sum", "loomReduce_i64_prod", "loomReduce_i64_max", "loomReduce_i64_min"},
      {"loomReduce_u64_sum", "loomReduce_u64_prod", "loomReduce_u64_max", "loomReduce_u64_min"},
      {"loomReduce_f16_sum", "loomReduce_f16_prod", "loomReduce_f16_max", "loomReduce_f16_min"},
      {"loomReduce_f32_sum", "loomReduce_f32_prod", "loomReduce_f32_max", "loomReduce_f32_min"},
      {"loomReduce_f64_sum", "loomReduce_f64_prod", "loomReduce_f64_max", "loomReduce_f64_min"},
      {"loomReduce_bf16_sum", "loomReduce_bf16_prod", "loomReduce_bf16_max",
       "loomReduce_bf16_min"}};
  if (dt < 0 || dt >= kNumDTypes || op < 0 || op >= kNumROps) return nullptr;
  return kNames[dt][op == kAvg ? kSum : op];
}

}  // namespace devk
}  // namespace loom
