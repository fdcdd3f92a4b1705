// The scalar float16/bfloat16 conversions of src/core/dtype.h against the oracles of reference.h:
// every 16-bit pattern, every midpoint (ties), one float ulp either side of it, overflow,
// subnormals and a million random floats.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "src/core/dtype.h"
#include "tests/reduce/reference.h"

namespace loom {
namespace {

using testing::decode;
using testing::Format;
using testing::kBf16Format;
using testing::kHalfFormat;
using testing::roundTo;

uint32_t floatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float bitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Converter {
  const char* name;
  const Format* format;
  float (*toFloat)(uint16_t);
  uint16_t (*fromFloat)(float);
};
const Converter kHalf{"half", &kHalfFormat, halfToFloat, floatToHalf};
const Converter kBf16{"bf16", &kBf16Format, bf16ToFloat, floatToBf16};

class ConversionTest : public ::testing::TestWithParam<const Converter*> {
 protected:
  // fromFloat(f) must equal the correctly rounded f (NaN: any NaN pattern).
  void expectRounds(float f) {
    const Converter& c = *GetParam();
    const uint16_t got = c.fromFloat(f);
    const uint16_t want = roundTo(static_cast<double>(f), *c.format);
    if (std::isnan(f)) {
      EXPECT_TRUE(testing::isNanBits(got, *c.format)) << std::hex << floatBits(f) << " -> " << got;
    } else {
      EXPECT_EQ(got, want) << c.name << " of float 0x" << std::hex << floatBits(f) << " ("
                           << std::hexfloat << f << ")";
    }
  }
};

TEST_P(ConversionTest, ToFloatIsExactForEveryPattern) {
  const Converter& c = *GetParam();
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const float f = c.toFloat(h);
    const double want = decode(h, *c.format);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << bits;
    } else {
      EXPECT_EQ(static_cast<double>(f), want) << std::hex << bits;
      EXPECT_EQ(std::signbit(f), (bits & 0x8000) != 0) << std::hex << bits;
    }
  }
}

TEST_P(ConversionTest, RoundTripsEveryPattern) {
  const Converter& c = *GetParam();
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const uint16_t back = c.fromFloat(c.toFloat(h));
    if (testing::isNanBits(h, *c.format)) {
      EXPECT_TRUE(testing::isNanBits(back, *c.format)) << std::hex << bits << " -> " << back;
      EXPECT_EQ(back & 0x8000, h & 0x8000) << "NaN sign, " << std::hex << bits;
    } else {
      EXPECT_EQ(back, h) << std::hex << bits;
    }
  }
}

TEST_P(ConversionTest, TiesRoundToEvenAndNeighboursRoundToNearest) {
  const Converter& c = *GetParam();
  // Between every pair of consecutive positive patterns (including max finite -> inf) and their
  // negatives. Midpoints are exact floats: both formats have far fewer bits than float.
  for (uint32_t k = 0; k < c.format->infBits; ++k) {
    const double lo = testing::patternValue(k, *c.format);
    const double hi = testing::patternValue(k + 1, *c.format);
    const float mid = static_cast<float>((lo + hi) / 2);
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      expectRounds(f);
      expectRounds(-f);
    }
  }
}

TEST_P(ConversionTest, SpecialValues) {
  const Converter& c = *GetParam();
  const uint16_t inf = c.format->infBits;
  EXPECT_EQ(c.fromFloat(INFINITY), inf);
  EXPECT_EQ(c.fromFloat(-INFINITY), 0x8000 | inf);
  EXPECT_EQ(c.fromFloat(0.0f), 0);
  EXPECT_EQ(c.fromFloat(-0.0f), 0x8000);
  EXPECT_EQ(c.fromFloat(std::numeric_limits<float>::max()), inf);  // rounds up for both formats
  EXPECT_TRUE(std::isnan(c.toFloat(c.fromFloat(std::nanf("")))));
  EXPECT_TRUE(std::isnan(c.toFloat(c.fromFloat(-std::nanf("")))));
  // A signalling NaN whose payload lies only in the low bits must not collapse into infinity.
  EXPECT_TRUE(std::isnan(c.toFloat(c.fromFloat(bitsFloat(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(c.toFloat(c.fromFloat(bitsFloat(0xff800001u)))));
  for (float f : {3.0e38f, 1e-45f, 1e-40f, 5.9604645e-08f, 2.9802322e-08f, 2.9802326e-08f,
                  6.1035156e-05f, 6.1028e-05f, 65504.0f, 65519.996f, 65520.0f, 65536.0f,
                  1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 1.0f + 1.0f / 256, 1.0f + 3.0f / 256}) {
    expectRounds(f);
    expectRounds(-f);
  }
}

TEST_P(ConversionTest, RandomFloats) {
  std::mt19937 rng(1234);
  for (int i = 0; i < 1000000; ++i) expectRounds(bitsFloat(static_cast<uint32_t>(rng())));
  // Concentrated where the formats' finite range is.
  std::uniform_real_distribution<float> exponent(-30.0f, 20.0f);
  for (int i = 0; i < 200000; ++i) expectRounds(std::exp2(exponent(rng)));
}

INSTANTIATE_TEST_SUITE_P(Formats, ConversionTest, ::testing::Values(&kHalf, &kBf16),
                         [](const ::testing::TestParamInfo<const Converter*>& p) {
                           return std::string(p.param->name);
                         });

}  // namespace
}  // namespace loom
