// reduceBuffers and finishAverage for every ISA variant this machine supports x every datatype x
// every op, against scalar references computed in double / 64-bit integers (reference.h for
// float16/bfloat16). Counts cover empty, tail-only and vector+tail; pointers are offset by one
// element to break vector alignment; dst aliases a or b.
#include "src/reduce/reduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "src/core/dtype.h"
#include "src/core/params.h"
#include "src/reduce/reduce_isa.h"
#include "tests/reduce/reference.h"

namespace loom {
namespace {

using Rng = std::mt19937_64;
using testing::Format;
using testing::kBf16Format;
using testing::kHalfFormat;

constexpr size_t kCounts[] = {0, 1, 7, 31, 33, 1000, 4097};
constexpr loomRedOp_t kOps[] = {loomSum, loomProd, loomMax, loomMin, loomAvg};
constexpr loomDataType_t kTypes[] = {loomInt8,    loomUint8,   loomInt32,   loomUint32,
                                     loomInt64,   loomUint64,  loomFloat16, loomFloat32,
                                     loomFloat64, loomBfloat16};

bool isMaxMin(loomRedOp_t op) { return op == loomMax || op == loomMin; }

// fmax/fmin as C99 describes them for quiet NaNs, applied to signalling NaNs too: a NaN operand
// loses to a number. (glibc's fmax returns NaN for a signalling NaN, following IEEE 754-2008
// maxNum; Loom, like CUDA's fmaxf used by NCCL, does not distinguish.)
template <class T>
T refMax(T a, T b) {
  return std::isnan(a) ? b : std::isnan(b) ? a : (a > b ? a : b);
}
template <class T>
T refMin(T a, T b) {
  return std::isnan(a) ? b : std::isnan(b) ? a : (a < b ? a : b);
}

// ---- per-type references ----

template <class T>
struct IntSpec {
  using Storage = T;
  static T random(Rng& rng) {
    constexpr T kEdges[] = {0,
                            1,
                            static_cast<T>(-1),
                            static_cast<T>(2),
                            std::numeric_limits<T>::min(),
                            std::numeric_limits<T>::max(),
                            static_cast<T>(std::numeric_limits<T>::min() + 1),
                            static_cast<T>(std::numeric_limits<T>::max() - 1)};
    if (rng() % 4 == 0) return kEdges[rng() % (sizeof(kEdges) / sizeof(T))];
    return static_cast<T>(rng());  // full range: sums and products wrap
  }
  // Wrap-around via 64-bit unsigned arithmetic, then truncation (modular) to T.
  static T combine(T a, T b, loomRedOp_t op) {
    const uint64_t ua = static_cast<uint64_t>(a), ub = static_cast<uint64_t>(b);
    const int64_t sa = static_cast<int64_t>(a), sb = static_cast<int64_t>(b);
    switch (op) {
      case loomProd:
        return static_cast<T>(ua * ub);
      case loomMax:
        if (std::is_same<T, uint64_t>::value) return static_cast<T>(ua > ub ? ua : ub);
        return static_cast<T>(sa > sb ? sa : sb);
      case loomMin:
        if (std::is_same<T, uint64_t>::value) return static_cast<T>(ua < ub ? ua : ub);
        return static_cast<T>(sa < sb ? sa : sb);
      default:
        return static_cast<T>(ua + ub);
    }
  }
  static bool same(T got, T want, loomRedOp_t) { return got == want; }
  static T divide(T x, int n) {
    if (std::is_same<T, uint64_t>::value) return static_cast<T>(static_cast<uint64_t>(x) / n);
    return static_cast<T>(static_cast<int64_t>(x) / n);  // C++ truncates toward zero
  }
  static std::string show(T x) { return std::to_string(x); }
};

template <class T>
struct FloatSpec {
  using Storage = T;
  static T random(Rng& rng) {
    constexpr T kEdges[] = {0,
                            -0.0,
                            1,
                            -1,
                            0.5,
                            3,
                            std::numeric_limits<T>::infinity(),
                            -std::numeric_limits<T>::infinity(),
                            std::numeric_limits<T>::quiet_NaN(),
                            -std::numeric_limits<T>::quiet_NaN(),
                            std::numeric_limits<T>::max(),
                            std::numeric_limits<T>::lowest(),
                            std::numeric_limits<T>::min(),
                            std::numeric_limits<T>::denorm_min(),
                            -std::numeric_limits<T>::denorm_min()};
    switch (rng() % 8) {
      case 0:
        return kEdges[rng() % (sizeof(kEdges) / sizeof(T))];
      case 1: {  // any bit pattern: NaN payloads, subnormals, huge and tiny values
        std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t> bits =
            static_cast<decltype(bits)>(rng());
        T t;
        std::memcpy(&t, &bits, sizeof(t));
        return t;
      }
      default:
        return static_cast<T>(std::uniform_real_distribution<double>(-1000, 1000)(rng));
    }
  }
  // In double: exact for float32 + and * before the one rounding to float; double itself is the
  // type under test for float64.
  static T combine(T a, T b, loomRedOp_t op) {
    const double da = a, db = b;
    switch (op) {
      case loomProd:
        return static_cast<T>(da * db);
      case loomMax:
        return refMax(a, b);
      case loomMin:
        return refMin(a, b);
      default:
        return static_cast<T>(da + db);
    }
  }
  static bool same(T got, T want, loomRedOp_t op) {
    if (std::isnan(want)) return std::isnan(got);
    if (isMaxMin(op) && got == 0 && want == 0) return true;  // fmax(+0, -0): either zero
    return std::memcmp(&got, &want, sizeof(T)) == 0;
  }
  static T divide(T x, int n) { return static_cast<T>(static_cast<double>(x) / n); }
  static std::string show(T x) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%a", static_cast<double>(x));
    return buf;
  }
};

// float16/bfloat16: widen to float, combine in float, round once to nearest even.
template <const Format& F>
struct NarrowSpec {
  using Storage = uint16_t;
  static uint16_t random(Rng& rng) {
    switch (rng() % 4) {
      case 0: {  // near 1 and with matching exponents: sums round, products stay finite
        return testing::roundTo(std::uniform_real_distribution<double>(-4, 4)(rng), F);
      }
      case 1: {
        constexpr uint16_t kEdges[] = {0x0000,
                                       0x8000,
                                       0x0001,
                                       0x8001,
                                       F.infBits,
                                       static_cast<uint16_t>(0x8000 | F.infBits),
                                       static_cast<uint16_t>(F.infBits + 1),
                                       static_cast<uint16_t>(F.infBits - 1)};
        return kEdges[rng() % (sizeof(kEdges) / sizeof(uint16_t))];
      }
      default:
        return static_cast<uint16_t>(rng());  // every pattern: NaN, inf, subnormal
    }
  }
  static float toFloat(uint16_t x) { return static_cast<float>(testing::decode(x, F)); }
  static uint16_t combine(uint16_t a, uint16_t b, loomRedOp_t op) {
    const float fa = toFloat(a), fb = toFloat(b);
    float r;
    switch (op) {
      case loomProd:
        r = static_cast<float>(static_cast<double>(fa) * fb);
        break;
      case loomMax:
        r = refMax(fa, fb);
        break;
      case loomMin:
        r = refMin(fa, fb);
        break;
      default:
        r = static_cast<float>(static_cast<double>(fa) + fb);
        break;
    }
    return testing::roundTo(r, F);
  }
  static bool same(uint16_t got, uint16_t want, loomRedOp_t op) {
    if (testing::isNanBits(want, F)) return testing::isNanBits(got, F);
    if (isMaxMin(op) && (got & 0x7fff) == 0 && (want & 0x7fff) == 0) return true;
    return got == want;
  }
  static uint16_t divide(uint16_t x, int n) {
    return testing::roundTo(static_cast<float>(testing::decode(x, F) / n), F);
  }
  static std::string show(uint16_t x) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "0x%04x (%a)", x, testing::decode(x, F));
    return buf;
  }
};

// Calls f(Spec{}) for the spec of dt.
template <class Fn>
void withSpec(loomDataType_t dt, Fn&& f) {
  switch (dt) {
    case loomInt8:
      f(IntSpec<int8_t>{});
      break;
    case loomUint8:
      f(IntSpec<uint8_t>{});
      break;
    case loomInt32:
      f(IntSpec<int32_t>{});
      break;
    case loomUint32:
      f(IntSpec<uint32_t>{});
      break;
    case loomInt64:
      f(IntSpec<int64_t>{});
      break;
    case loomUint64:
      f(IntSpec<uint64_t>{});
      break;
    case loomFloat16:
      f(NarrowSpec<kHalfFormat>{});
      break;
    case loomFloat32:
      f(FloatSpec<float>{});
      break;
    case loomFloat64:
      f(FloatSpec<double>{});
      break;
    case loomBfloat16:
      f(NarrowSpec<kBf16Format>{});
      break;
    default:
      FAIL() << "no spec for datatype " << dt;
  }
}

enum class Alias { kNone, kDstIsA, kDstIsB };
const char* aliasName(Alias a) {
  return a == Alias::kNone ? "dst apart" : a == Alias::kDstIsA ? "dst==a" : "dst==b";
}

// Runs reduceBuffers on a and b (count elements each, at element offset `offset` in buffers with
// one guard element on each side) and compares with Spec::combine; checks the guards too.
template <class Spec>
void checkCase(const std::vector<typename Spec::Storage>& ain,
               const std::vector<typename Spec::Storage>& bin, size_t offset, Alias alias,
               loomDataType_t dt, loomRedOp_t op, Rng& rng) {
  using S = typename Spec::Storage;
  const size_t count = ain.size();
  std::vector<S> a(count + 2), b(count + 2), d(count + 2);
  for (auto* v : {&a, &b, &d}) {
    for (S& x : *v) x = Spec::random(rng);
  }
  std::copy(ain.begin(), ain.end(), a.begin() + offset);
  std::copy(bin.begin(), bin.end(), b.begin() + offset);
  const std::vector<S> a0 = a, b0 = b, d0 = d;
  S* dst = alias == Alias::kNone ? d.data() : alias == Alias::kDstIsA ? a.data() : b.data();
  reduceBuffers(dst + offset, a.data() + offset, b.data() + offset, count, dt, op);

  int failures = 0;
  for (size_t i = 0; i < count && failures < 5; ++i) {
    const S want = Spec::combine(ain[i], bin[i], op);
    const S got = dst[offset + i];
    if (!Spec::same(got, want, op)) {
      ++failures;
      ADD_FAILURE() << dataTypeName(dt) << " " << redOpName(op) << " count " << count << " offset "
                    << offset << " " << aliasName(alias) << " [" << i << "]: " << Spec::show(ain[i])
                    << " op " << Spec::show(bin[i]) << " gave " << Spec::show(got) << ", want "
                    << Spec::show(want);
    }
  }
  // Nothing outside dst[0, count) changes; the inputs that are not dst do not change at all.
  auto unchanged = [&](const std::vector<S>& now, const std::vector<S>& before, bool isDst) {
    for (size_t i = 0; i < now.size(); ++i) {
      const bool inside = i >= offset && i < offset + count;
      if (isDst && inside) continue;
      if (std::memcmp(&now[i], &before[i], sizeof(S)) != 0) return false;
    }
    return true;
  };
  EXPECT_TRUE(unchanged(a, a0, dst == a.data())) << "a changed, count " << count;
  EXPECT_TRUE(unchanged(b, b0, dst == b.data())) << "b changed, count " << count;
  EXPECT_TRUE(unchanged(d, d0, dst == d.data())) << "d changed, count " << count;
}

// ---- fixture: one ISA variant at a time ----

class IsaTest : public ::testing::Test {
 protected:
  void useIsa(ReduceIsa isa) {
    if (!reduceIsaSupported(isa)) GTEST_SKIP() << reduceIsaName(isa) << " not supported here";
    ASSERT_TRUE(setReduceIsa(isa));
    ASSERT_EQ(activeReduceIsa(), isa);
  }
  void TearDown() override { setReduceIsa(bestReduceIsa()); }
};

using ReduceParam = std::tuple<ReduceIsa, loomDataType_t, loomRedOp_t>;

class ReduceTest : public IsaTest, public ::testing::WithParamInterface<ReduceParam> {
 protected:
  void SetUp() override { useIsa(std::get<0>(GetParam())); }
};

TEST_P(ReduceTest, MatchesReference) {
  const loomDataType_t dt = std::get<1>(GetParam());
  const loomRedOp_t op = std::get<2>(GetParam());
  withSpec(dt, [&](auto spec) {
    using Spec = decltype(spec);
    Rng rng(1000 * dt + op);
    for (size_t count : kCounts) {
      std::vector<typename Spec::Storage> a(count), b(count);
      for (size_t i = 0; i < count; ++i) {
        a[i] = Spec::random(rng);
        b[i] = Spec::random(rng);
      }
      for (size_t offset : {0, 1}) {
        for (Alias alias : {Alias::kNone, Alias::kDstIsA, Alias::kDstIsB}) {
          checkCase<Spec>(a, b, offset, alias, dt, op, rng);
        }
      }
    }
  });
}

// A 64-byte aligned byte buffer with random contents; at(k) is k bytes in.
struct RawBuffer {
  std::vector<unsigned char> mem;
  size_t base = 0;
  RawBuffer(size_t bytes, Rng& rng) : mem(bytes + 64) {
    for (auto& c : mem) c = static_cast<unsigned char>(rng());
    base = (64 - reinterpret_cast<uintptr_t>(mem.data()) % 64) % 64;
  }
  unsigned char* at(size_t k) { return mem.data() + base + k; }
};

// The streaming form runs the same kernels on tiles: the same bits as reduceBuffers for every
// datatype and op, NaN payloads included (the inputs are random bytes), at sizes below and above
// its threshold, with the destination off its 16-byte boundary, and with dst aliasing an operand;
// nothing outside the destination is written.
TEST_P(ReduceTest, StreamingFormWritesTheSameBits) {
  const loomDataType_t dt = std::get<1>(GetParam());
  const loomRedOp_t op = std::get<2>(GetParam());
  const size_t es = dataTypeSize(dt);
  Rng rng(7000 + 100 * dt + op);
  for (size_t count :
       {size_t(1), size_t(100), 4096 / es - 1, 4096 / es, 3 * 4096 / es + 7, size_t(20001)}) {
    for (size_t offset : {size_t(0), size_t(1), size_t(3)}) {
      for (Alias alias : {Alias::kNone, Alias::kDstIsA, Alias::kDstIsB}) {
        const size_t bytes = (count + 8) * es;
        RawBuffer a(bytes, rng), b(bytes, rng), d(bytes, rng);
        RawBuffer a2 = a, b2 = b, d2 = d;
        const size_t at = offset * es;
        auto dstOf = [&](RawBuffer& x, RawBuffer& y, RawBuffer& z) {
          return alias == Alias::kNone ? z.at(at) : alias == Alias::kDstIsA ? x.at(at) : y.at(at);
        };
        reduceBuffers(dstOf(a, b, d), a.at(at), b.at(at), count, dt, op);
        reduceBuffersStreaming(dstOf(a2, b2, d2), a2.at(at), b2.at(at), count, dt, op);
        const std::string what = std::string(dataTypeName(dt)) + " " + redOpName(op) + " count " +
                                 std::to_string(count) + " offset " + std::to_string(offset) + " " +
                                 aliasName(alias);
        EXPECT_TRUE(a.mem == a2.mem) << what << ": a differs";
        EXPECT_TRUE(b.mem == b2.mem) << what << ": b differs";
        EXPECT_TRUE(d.mem == d2.mem) << what << ": d differs";
      }
    }
  }
}

// The form that stores twice (the one pass's result tiles): both destinations get reduceBuffers'
// values, streamed or not, with the streamed destination off its line boundary (an ordinary head,
// then whole lines, then a tail) and the copy aliasing an operand; nothing else is written. The
// values as Spec::same compares them: the form runs the kernels on other pieces, and which NaN
// (or, for max/min, which zero) a floating-point op returns may differ between a block of a kernel
// and its tail where the compiler orders the operands differently (seen at -O1, float16 sum).
TEST_P(ReduceTest, TwiceFormWritesTheSameBitsToBoth) {
  const loomDataType_t dt = std::get<1>(GetParam());
  const loomRedOp_t op = std::get<2>(GetParam());
  const size_t es = dataTypeSize(dt);
  Rng rng(9000 + 100 * dt + op);
  for (size_t count : {size_t(1), 4096 / es - 1, 3 * 4096 / es + 7, size_t(20001)}) {
    for (size_t offset : {size_t(0), size_t(1), size_t(5)}) {
      for (bool streaming : {false, true}) {
        for (Alias alias : {Alias::kNone, Alias::kDstIsA, Alias::kDstIsB}) {
          const size_t bytes = (count + 8) * es;
          RawBuffer a(bytes, rng), b(bytes, rng), d(bytes, rng), c(bytes, rng);
          RawBuffer a2 = a, b2 = b, d2 = d, c2 = c, want = d;
          const size_t at = offset * es;
          {
            // What reduceBuffers gives with the same aliasing (which NaN payload wins may depend
            // on the operands' order, and an aliased call may swap them).
            RawBuffer a3 = a, b3 = b;
            unsigned char* t = alias == Alias::kNone     ? want.at(at)
                               : alias == Alias::kDstIsA ? a3.at(at)
                                                         : b3.at(at);
            reduceBuffers(t, a3.at(at), b3.at(at), count, dt, op);
            std::memcpy(want.at(at), t, count * es);
          }
          // The copy goes where the alias says (a or b, exactly), else to its own buffer.
          unsigned char* copy = alias == Alias::kNone     ? c2.at(at)
                                : alias == Alias::kDstIsA ? a2.at(at)
                                                          : b2.at(at);
          reduceBuffersTwice(d2.at(at), copy, a2.at(at), b2.at(at), count, dt, op, streaming);
          const std::string what = std::string(dataTypeName(dt)) + " " + redOpName(op) + " count " +
                                   std::to_string(count) + " offset " + std::to_string(offset) +
                                   (streaming ? " streaming " : " ") + aliasName(alias);
          auto sameValues = [&](const unsigned char* got) {
            bool same = true;
            withSpec(dt, [&](auto spec) {
              using Spec = decltype(spec);
              using S = typename Spec::Storage;
              static_assert(sizeof(S) <= 8, "an element");
              for (size_t i = 0; i < count && same; ++i) {
                S g, w;
                std::memcpy(&g, got + i * es, es);
                std::memcpy(&w, want.at(at) + i * es, es);
                same = Spec::same(g, w, op);
              }
            });
            return same;
          };
          RawBuffer& copied = alias == Alias::kNone ? c2 : alias == Alias::kDstIsA ? a2 : b2;
          EXPECT_TRUE(sameValues(d2.at(at))) << what << ": dst differs";
          EXPECT_TRUE(sameValues(copied.at(at))) << what << ": copy differs";
          auto outside = [&](RawBuffer& now, RawBuffer& before) {
            return std::memcmp(now.mem.data(), before.mem.data(), now.base + at) == 0 &&
                   std::equal(
                       now.mem.begin() + static_cast<long>(now.base + at + count * es),
                       now.mem.end(),
                       before.mem.begin() + static_cast<long>(before.base + at + count * es));
          };
          EXPECT_TRUE(outside(copied, alias == Alias::kNone     ? c
                                      : alias == Alias::kDstIsA ? a
                                                                : b))
              << what << ": written outside the copy";
          EXPECT_TRUE(outside(d2, d)) << what << ": written outside dst";
          if (alias != Alias::kDstIsA) {
            EXPECT_TRUE(a.mem == a2.mem) << what << ": a changed";
          }
          if (alias != Alias::kDstIsB) {
            EXPECT_TRUE(b.mem == b2.mem) << what << ": b changed";
          }
        }
      }
    }
  }
}

TEST(ReduceStreaming, CopyMatchesMemmoveAtEveryAlignmentAndOverlap) {
  Rng rng(99);
  for (size_t bytes : {size_t(0), size_t(1), size_t(100), size_t(4095), size_t(4096), size_t(4097),
                       size_t(65536 + 13)}) {
    for (size_t srcOff : {0, 1, 7, 16}) {
      for (size_t dstOff : {0, 3, 8, 15}) {
        RawBuffer src(bytes + 32, rng), dst(bytes + 32, rng);
        RawBuffer want = dst;
        std::memmove(want.at(dstOff), src.at(srcOff), bytes);
        copyStreaming(dst.at(dstOff), src.at(srcOff), bytes);
        EXPECT_TRUE(dst.mem == want.mem)
            << bytes << " bytes, src +" << srcOff << ", dst +" << dstOff;
      }
    }
    // Within one buffer, each way round: memmove's result.
    for (long shift : {-5L, 5L, -4096L, 4096L}) {
      RawBuffer buf(bytes + 8192, rng);
      RawBuffer want = buf;
      const size_t from = 4096, to = static_cast<size_t>(4096 + shift);
      std::memmove(want.at(to), want.at(from), bytes);
      copyStreaming(buf.at(to), buf.at(from), bytes);
      EXPECT_TRUE(buf.mem == want.mem) << bytes << " bytes moved by " << shift;
    }
  }
}

TEST(ReduceStreaming, LargeCallsStreamAboveTheThreshold) {
#if !defined(__SSE2__)
  GTEST_SKIP() << "this CPU has no non-temporal stores Loom uses (SSE2): calls never stream";
#else
  struct Restore {
    ~Restore() {
      unsetenv("LOOM_NT_MIN");
      reloadParams();
    }
  } restore;
  setenv("LOOM_NT_MIN", "1M", 1);
  reloadParams();
  EXPECT_FALSE(streamingStoresFor(size_t(1) << 20, 2, nullptr, 0));
  EXPECT_TRUE(streamingStoresFor((size_t(1) << 20) + 1, 2, nullptr, 0));
  // 0: the model over this machine's caches, which hold more than a byte and less than a TiB.
  setenv("LOOM_NT_MIN", "0", 1);
  reloadParams();
  EXPECT_FALSE(streamingStoresFor(1, 2, nullptr, 0));
  EXPECT_TRUE(streamingStoresFor(size_t(1) << 40, 2, nullptr, 0));
#endif
}

// Ranges the model only compares, never dereferences.
ByteRange at(uintptr_t mib, size_t bytes) {
  return ByteRange{reinterpret_cast<const void*>((mib + 1) << 20), bytes};
}

TEST(CacheModelTest, ASweepStreamsAndAReusedBufferDoesNot) {
  constexpr size_t M = size_t(1) << 20;
  // 480 MiB last level (a share of 120 MiB), 2 MiB of L2 per core, two ranks.
  CacheModel sweep(480 * M, 2 * M), reuse(480 * M, 2 * M);
  for (uintptr_t i = 0; i < 20; ++i) {
    // nccl-tests' sweep at 1 MiB: each iteration writes the next MiB of a 64 MiB buffer.
    ByteRange next = at(i % 64, M);
    EXPECT_TRUE(sweep.streamingFor(4 * M, 2, &next, 1)) << "iteration " << i;
    // The same size on one buffer: cold the first time only.
    ByteRange same = at(0, M);
    EXPECT_EQ(reuse.streamingFor(4 * M, 2, &same, 1), i == 0) << "iteration " << i;
  }
  // A buffer larger than the share streams even when reused.
  ByteRange big = at(1000, 64 * M);
  EXPECT_TRUE(reuse.streamingFor(256 * M, 2, &big, 1));
  EXPECT_TRUE(reuse.streamingFor(256 * M, 2, &big, 1));
  // Below the ranks' private caches nothing streams, cold or not.
  ByteRange small = at(2000, M / 4);
  EXPECT_FALSE(reuse.streamingFor(M, 2, &small, 1));
  EXPECT_FALSE(sweep.streamingFor(M, 2, &small, 1));
}

TEST(CacheModelTest, ABufferIsColdOnceTheShareHasBeenWrittenSince) {
  constexpr size_t M = size_t(1) << 20;
  CacheModel m(480 * M, 2 * M);
  const ByteRange a = at(0, 8 * M), b = at(100, 8 * M);
  EXPECT_TRUE(m.streamingFor(32 * M, 2, &a, 1));   // first use
  EXPECT_FALSE(m.streamingFor(32 * M, 2, &a, 1));  // again at once: cached
  // 3 calls of 32 MiB elsewhere: 128 MiB since a's call started, more than the 120 MiB share.
  for (int i = 0; i < 3; ++i) m.streamingFor(32 * M, 2, &b, 1);
  EXPECT_TRUE(m.streamingFor(32 * M, 2, &a, 1));
  // 2 of them (96 MiB) leave it cached.
  for (int i = 0; i < 2; ++i) m.streamingFor(32 * M, 2, &b, 1);
  EXPECT_FALSE(m.streamingFor(32 * M, 2, &a, 1));
  // A part of a recently written range is cached; a range reaching past it is not.
  const ByteRange part{static_cast<const char*>(a.base) + M, M}, past{a.base, 9 * M};
  EXPECT_FALSE(m.streamingFor(32 * M, 2, &part, 1));
  EXPECT_TRUE(m.streamingFor(32 * M, 2, &past, 1));
  // Several outputs (a group): cached only when every one is.
  const ByteRange group[2] = {a, at(300, 8 * M)};
  EXPECT_TRUE(m.streamingFor(32 * M, 2, group, 2));
  EXPECT_FALSE(m.streamingFor(32 * M, 2, group, 2));
  // A range written by a call larger than the share is not cached even at once.
  const ByteRange huge = at(500, 64 * M);
  EXPECT_TRUE(m.streamingFor(256 * M, 2, &huge, 1));
  const ByteRange inHuge = at(500, 8 * M);
  EXPECT_TRUE(m.streamingFor(32 * M, 2, &inHuge, 1));
}

using AverageParam = std::tuple<ReduceIsa, loomDataType_t>;

class FinishAverageTest : public IsaTest, public ::testing::WithParamInterface<AverageParam> {
 protected:
  void SetUp() override { useIsa(std::get<0>(GetParam())); }
};

TEST_P(FinishAverageTest, MatchesReference) {
  const loomDataType_t dt = std::get<1>(GetParam());
  withSpec(dt, [&](auto spec) {
    using Spec = decltype(spec);
    using S = typename Spec::Storage;
    Rng rng(77 + dt);
    for (size_t count : kCounts) {
      for (int nranks : {1, 2, 3, 7, 16, 300}) {
        for (size_t offset : {0, 1}) {
          std::vector<S> data(count + 2);
          for (S& x : data) x = Spec::random(rng);
          const std::vector<S> before = data;
          finishAverage(data.data() + offset, count, dt, nranks);
          int failures = 0;
          for (size_t i = 0; i < data.size() && failures < 5; ++i) {
            const bool inside = i >= offset && i < offset + count;
            const S want = inside && nranks > 1 ? Spec::divide(before[i], nranks) : before[i];
            if (!Spec::same(data[i], want, loomSum)) {
              ++failures;
              ADD_FAILURE() << dataTypeName(dt) << " count " << count << " nranks " << nranks
                            << " [" << i << "]: " << Spec::show(before[i]) << " gave "
                            << Spec::show(data[i]) << ", want " << Spec::show(want);
            }
          }
        }
      }
    }
  });
}

std::string paramName(const ::testing::TestParamInfo<ReduceParam>& info) {
  return std::string(reduceIsaName(std::get<0>(info.param))) + "_" +
         dataTypeName(std::get<1>(info.param)) + "_" + redOpName(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(All, ReduceTest,
                         ::testing::Combine(::testing::Values(ReduceIsa::kGeneric, ReduceIsa::kAvx2,
                                                              ReduceIsa::kAvx512),
                                            ::testing::ValuesIn(kTypes), ::testing::ValuesIn(kOps)),
                         paramName);

INSTANTIATE_TEST_SUITE_P(All, FinishAverageTest,
                         ::testing::Combine(::testing::Values(ReduceIsa::kGeneric, ReduceIsa::kAvx2,
                                                              ReduceIsa::kAvx512),
                                            ::testing::ValuesIn(kTypes)),
                         [](const ::testing::TestParamInfo<AverageParam>& p) {
                           return std::string(reduceIsaName(std::get<0>(p.param))) + "_" +
                                  dataTypeName(std::get<1>(p.param));
                         });

// ---- hand-picked cases with known answers, for every ISA ----

class ReduceIsaTest : public IsaTest, public ::testing::WithParamInterface<ReduceIsa> {
 protected:
  void SetUp() override { useIsa(GetParam()); }

  // Repeats the pair (a, b) 33 times (vector body and tail) and expects `want` everywhere.
  static void expectAll(loomDataType_t dt, loomRedOp_t op, uint16_t a, uint16_t b, uint16_t want) {
    std::vector<uint16_t> va(33, a), vb(33, b), vd(33, 0);
    reduceBuffers(vd.data(), va.data(), vb.data(), vd.size(), dt, op);
    for (size_t i = 0; i < vd.size(); ++i) {
      ASSERT_EQ(vd[i], want) << dataTypeName(dt) << " " << redOpName(op) << std::hex << " 0x" << a
                             << " 0x" << b << " [" << std::dec << i << "]";
    }
  }
};

TEST_P(ReduceIsaTest, HalfRoundingTiesOverflowAndSubnormals) {
  expectAll(loomFloat16, loomSum, 0x3c00, 0x1000, 0x3c00);   // 1 + 2^-11: tie, to even
  expectAll(loomFloat16, loomSum, 0x3c01, 0x1000, 0x3c02);   // (1 + 2^-10) + 2^-11: tie, up
  expectAll(loomFloat16, loomSum, 0x7bff, 0x4c00, 0x7c00);   // 65504 + 16 = 65520: tie -> inf
  expectAll(loomFloat16, loomSum, 0x7bff, 0x4800, 0x7bff);   // 65504 + 8: down
  expectAll(loomFloat16, loomSum, 0x0001, 0x0001, 0x0002);   // subnormals
  expectAll(loomFloat16, loomSum, 0x03ff, 0x0001, 0x0400);   // subnormal -> smallest normal
  expectAll(loomFloat16, loomProd, 0x0001, 0x3800, 0x0000);  // 2^-24 * 0.5: tie, to zero
  expectAll(loomFloat16, loomProd, 0x0003, 0x3800, 0x0002);  // 1.5 * 2^-24: tie, to even
  expectAll(loomFloat16, loomSum, 0x7c00, 0x7c00, 0x7c00);   // inf + inf
  expectAll(loomFloat16, loomProd, 0x7bff, 0xc000, 0xfc00);  // -131008 -> -inf
  expectAll(loomFloat16, loomMax, 0x7e00, 0x3c00, 0x3c00);   // NaN loses (fmax)
  expectAll(loomFloat16, loomMin, 0x3c00, 0x7e00, 0x3c00);
  expectAll(loomFloat16, loomMax, 0xc000, 0xbc00, 0xbc00);  // max(-2, -1)
}

TEST_P(ReduceIsaTest, Bf16RoundingTiesAndOverflow) {
  expectAll(loomBfloat16, loomSum, 0x3f80, 0x3b80, 0x3f80);  // 1 + 2^-8: tie, to even
  expectAll(loomBfloat16, loomSum, 0x3f81, 0x3b80, 0x3f82);  // tie, up to even
  expectAll(loomBfloat16, loomSum, 0x3f80, 0x3b81, 0x3f81);  // just above the tie: up
  expectAll(loomBfloat16, loomSum, 0x7f7f, 0x7f7f, 0x7f80);  // overflow -> inf
  expectAll(loomBfloat16, loomSum, 0xff7f, 0xff7f, 0xff80);
  expectAll(loomBfloat16, loomMax, 0x7fc0, 0xbf80, 0xbf80);  // NaN loses (fmax)
  expectAll(loomBfloat16, loomSum, 0x0001, 0x0001, 0x0002);  // subnormals
}

TEST_P(ReduceIsaTest, InvalidOperationsGiveNaN) {
  const uint16_t a[2] = {0x7c00, 0x7c00}, b[2] = {0xfc00, 0x0000};  // inf - inf, inf * 0
  for (loomDataType_t dt : {loomFloat16, loomBfloat16}) {
    const Format& f = dt == loomFloat16 ? kHalfFormat : kBf16Format;
    uint16_t sa[2], sb[2], d[2];
    for (int i = 0; i < 2; ++i) {  // same values in bf16: move the exponent field
      sa[i] = dt == loomFloat16 ? a[i] : static_cast<uint16_t>(a[i] == 0x7c00 ? 0x7f80 : a[i]);
      sb[i] = dt == loomFloat16 ? b[i] : static_cast<uint16_t>(b[i] == 0xfc00 ? 0xff80 : b[i]);
    }
    reduceBuffers(d, sa, sb, 1, dt, loomSum);
    EXPECT_TRUE(testing::isNanBits(d[0], f)) << dataTypeName(dt) << std::hex << " 0x" << d[0];
    reduceBuffers(d + 1, sa + 1, sb + 1, 1, dt, loomProd);
    EXPECT_TRUE(testing::isNanBits(d[1], f)) << dataTypeName(dt) << std::hex << " 0x" << d[1];
  }
}

// x + (-0) == x for every pattern: the widening and narrowing of every variant are exact on all
// 65536 inputs (NaN stays NaN with its sign; the sign of zero is kept).
TEST_P(ReduceIsaTest, EveryNarrowPatternSurvivesAddingNegativeZero) {
  for (loomDataType_t dt : {loomFloat16, loomBfloat16}) {
    const Format& f = dt == loomFloat16 ? kHalfFormat : kBf16Format;
    std::vector<uint16_t> a(65536), b(65536, 0x8000), d(65536);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint16_t>(i);
    reduceBuffers(d.data(), a.data(), b.data(), a.size(), dt, loomSum);
    for (size_t i = 0; i < a.size(); ++i) {
      if (testing::isNanBits(a[i], f)) {
        ASSERT_TRUE(testing::isNanBits(d[i], f)) << std::hex << i << " -> " << d[i];
        ASSERT_EQ(d[i] & 0x8000, a[i] & 0x8000) << std::hex << i;
      } else {
        ASSERT_EQ(d[i], a[i]) << dataTypeName(dt) << std::hex << " pattern 0x" << i;
      }
    }
  }
}

TEST_P(ReduceIsaTest, IntegersWrapAndAverageTruncatesTowardZero) {
  int8_t a8[9] = {127, -128, -128, 100, -7, 7, 0, 1, -1};
  int8_t b8[9] = {1, -1, 2, 100, 0, 0, 0, 0, 0};
  int8_t d8[9];
  reduceBuffers(d8, a8, b8, 9, loomInt8, loomSum);
  EXPECT_EQ(d8[0], -128);
  EXPECT_EQ(d8[1], 127);
  reduceBuffers(d8, a8, b8, 9, loomInt8, loomProd);
  EXPECT_EQ(d8[2], 0);   // -256 mod 256
  EXPECT_EQ(d8[3], 16);  // 10000 mod 256
  finishAverage(a8, 9, loomInt8, 2);
  const int8_t want[9] = {63, -64, -64, 50, -3, 3, 0, 0, 0};
  for (int i = 0; i < 9; ++i) EXPECT_EQ(a8[i], want[i]) << i;

  uint64_t a64[3] = {~0ull, 1ull << 63, 5}, b64[3] = {1, 1ull << 63, 3};
  reduceBuffers(a64, a64, b64, 3, loomUint64, loomSum);
  EXPECT_EQ(a64[0], 0u);
  EXPECT_EQ(a64[1], 0u);
  EXPECT_EQ(a64[2], 8u);
  int64_t s64[2] = {INT64_MIN, -3};
  finishAverage(s64, 2, loomInt64, 2);
  EXPECT_EQ(s64[0], INT64_MIN / 2);
  EXPECT_EQ(s64[1], -1);
}

TEST_P(ReduceIsaTest, UnknownDatatypeOrOpAndEmptyWritesNothing) {
  float a[4] = {1, 2, 3, 4}, b[4] = {1, 1, 1, 1}, d[4] = {9, 9, 9, 9};
  reduceBuffers(d, a, b, 4, static_cast<loomDataType_t>(loomNumTypes), loomSum);
  reduceBuffers(d, a, b, 4, static_cast<loomDataType_t>(-1), loomSum);
  reduceBuffers(d, a, b, 4, loomFloat32, static_cast<loomRedOp_t>(loomNumOps));
  reduceBuffers(d, a, b, 4, loomFloat32, static_cast<loomRedOp_t>(-3));
  reduceBuffers(nullptr, nullptr, nullptr, 0, loomFloat32, loomSum);
  finishAverage(d, 4, static_cast<loomDataType_t>(loomNumTypes), 2);
  finishAverage(d, 4, loomFloat32, 0);
  finishAverage(d, 4, loomFloat32, -2);
  finishAverage(nullptr, 0, loomFloat32, 2);
  for (float x : d) EXPECT_EQ(x, 9.0f);
}

INSTANTIATE_TEST_SUITE_P(All, ReduceIsaTest,
                         ::testing::Values(ReduceIsa::kGeneric, ReduceIsa::kAvx2,
                                           ReduceIsa::kAvx512),
                         [](const ::testing::TestParamInfo<ReduceIsa>& p) {
                           return std::string(reduceIsaName(p.param));
                         });

TEST(ReduceDispatch, PicksASupportedIsaAndRefusesUnsupportedOnes) {
  EXPECT_TRUE(reduceIsaSupported(ReduceIsa::kGeneric));
  EXPECT_TRUE(reduceIsaSupported(bestReduceIsa()));
  for (int i = 0; i < kNumReduceIsas; ++i) {
    const ReduceIsa isa = static_cast<ReduceIsa>(i);
    EXPECT_EQ(setReduceIsa(isa), reduceIsaSupported(isa)) << reduceIsaName(isa);
  }
  ASSERT_TRUE(setReduceIsa(bestReduceIsa()));
  EXPECT_EQ(activeReduceIsa(), bestReduceIsa());
  std::printf("reduce ISA on this machine: %s\n", reduceIsaName(bestReduceIsa()));
}

}  // namespace
}  // namespace loom
