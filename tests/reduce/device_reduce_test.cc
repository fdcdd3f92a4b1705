// The device reduction kernels' arithmetic (src/device/kernels/reduce_math.h), built for the host,
// against the CPU kernels (src/reduce) bit for bit: every datatype and op, n-input reductions as
// the CPU path runs them (two buffers at a time, left to right), avg's final division, every
// float16 and bfloat16 pattern but NaNs (whose payloads may differ: both must stay NaN), and
// counts and offsets that exercise the 16-byte vector body and its tail.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "src/core/dtype.h"
#include "src/device/kernels/reduce_host.h"
#include "src/reduce/reduce.h"

namespace loom {
namespace {

constexpr loomRedOp_t kOps[] = {loomSum, loomProd, loomMax, loomMin, loomAvg};

bool isFloatType(loomDataType_t dt) {
  return dt == loomFloat16 || dt == loomBfloat16 || dt == loomFloat32 || dt == loomFloat64;
}

// Equal bits, or both NaN.
bool sameElement(const char* a, const char* b, loomDataType_t dt) {
  const size_t es = dataTypeSize(dt);
  if (std::memcmp(a, b, es) == 0) return true;
  if (dt == loomFloat32) {
    float x, y;
    std::memcpy(&x, a, 4);
    std::memcpy(&y, b, 4);
    return std::isnan(x) && std::isnan(y);
  }
  if (dt == loomFloat64) {
    double x, y;
    std::memcpy(&x, a, 8);
    std::memcpy(&y, b, 8);
    return std::isnan(x) && std::isnan(y);
  }
  if (dt == loomFloat16 || dt == loomBfloat16) {
    uint16_t x, y;
    std::memcpy(&x, a, 2);
    std::memcpy(&y, b, 2);
    const uint16_t inf = dt == loomFloat16 ? 0x7c00 : 0x7f80;
    return (x & 0x7fff) > inf && (y & 0x7fff) > inf;
  }
  return false;
}

// Random bytes; for floats, values that keep products and sums interesting (small magnitudes,
// some zeros, negative zeros, infinities and subnormals).
void fill(std::vector<char>& buf, loomDataType_t dt, std::mt19937_64& g) {
  const size_t es = dataTypeSize(dt), n = buf.size() / es;
  for (size_t i = 0; i < n; ++i) {
    char* p = buf.data() + i * es;
    uint64_t r = g();
    if (!isFloatType(dt)) {
      std::memcpy(p, &r, es);
      continue;
    }
    double v = static_cast<double>(static_cast<int64_t>(r % 2001) - 1000) / 64.0;
    switch (r >> 60) {
      case 0:
        v = 0.0;
        break;
      case 1:
        v = -0.0;
        break;
      case 2:
        v = (r & 1) ? INFINITY : -INFINITY;
        break;
      case 3:
        v = std::ldexp(static_cast<double>(r % 7 + 1), -20);  // subnormal for float16
        break;
      default:
        break;
    }
    if (dt == loomFloat32) {
      float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
    } else if (dt == loomFloat64) {
      std::memcpy(p, &v, 8);
    } else {
      float f = static_cast<float>(v);
      uint16_t h = dt == loomFloat16 ? devk::floatToHalf(f) : devk::floatToBf16(f);
      std::memcpy(p, &h, 2);
    }
  }
}

// The CPU path: dst = in0 op in1, then dst = dst op in_k; avg divides once at the end.
std::vector<char> onCpu(const std::vector<std::vector<char>>& in, size_t n, loomDataType_t dt,
                        loomRedOp_t op, size_t offset) {
  const size_t es = dataTypeSize(dt);
  std::vector<char> out(in[0].size());
  std::memcpy(out.data() + offset, in[0].data() + offset, n * es);
  for (size_t k = 1; k < in.size(); ++k)
    reduceBuffers(out.data() + offset, out.data() + offset, in[k].data() + offset, n, dt, op);
  if (op == loomAvg) finishAverage(out.data() + offset, n, dt, static_cast<int>(in.size()));
  return out;
}

std::vector<char> onDeviceCode(const std::vector<std::vector<char>>& in, size_t n,
                               loomDataType_t dt, loomRedOp_t op, size_t offset) {
  std::vector<char> out(in[0].size());
  devk::ReduceArgs a{};
  a.dst[0] = out.data() + offset;
  a.ndst = 1;
  for (size_t k = 0; k < in.size(); ++k) a.src[k] = in[k].data() + offset;
  a.nsrc = static_cast<int>(in.size());
  a.divideBy = op == loomAvg ? static_cast<int>(in.size()) : 0;
  a.count = n;
  devk::runReduceOnHost(static_cast<int>(dt), static_cast<int>(op), a);
  return out;
}

TEST(DeviceReduce, EveryDatatypeAndOpMatchesTheCpuKernelsBitForBit) {
  std::mt19937_64 g(12345);
  for (int dti = 0; dti < loomNumTypes; ++dti) {
    const auto dt = static_cast<loomDataType_t>(dti);
    const size_t es = dataTypeSize(dt);
    for (loomRedOp_t op : kOps)
      for (int inputs : {1, 2, 3, 5, 8})
        for (size_t n : {size_t(1), size_t(7), size_t(64), size_t(1000), size_t(4099)})
          for (size_t offsetElems : {size_t(0), size_t(1)}) {  // aligned and not: vector or not
            const size_t offset = offsetElems * es;
            std::vector<std::vector<char>> in(inputs, std::vector<char>((n + 2) * es));
            for (auto& b : in) fill(b, dt, g);
            std::vector<char> cpu = onCpu(in, n, dt, op, offset);
            std::vector<char> dev = onDeviceCode(in, n, dt, op, offset);
            for (size_t i = 0; i < n; ++i) {
              const char* c = cpu.data() + offset + i * es;
              const char* d = dev.data() + offset + i * es;
              ASSERT_TRUE(sameElement(c, d, dt))
                  << dataTypeName(dt) << " " << redOpName(op) << " inputs " << inputs << " n " << n
                  << " offset " << offsetElems << " element " << i;
            }
          }
  }
}

// One launch storing its result into several outputs (the device one pass's way to write every
// rank's output): each output holds the CPU kernels' bits, with and without the vector body, and
// with one output being an input (in place); one input and no op is a copy to them all.
TEST(DeviceReduce, SeveralOutputsEachGetTheSameResult) {
  std::mt19937_64 g(777);
  for (loomDataType_t dt : {loomFloat32, loomBfloat16, loomInt8, loomFloat64}) {
    const size_t es = dataTypeSize(dt);
    for (int inputs : {1, 3})
      for (size_t n : {size_t(5), size_t(1000)})
        for (size_t offsetElems : {size_t(0), size_t(1)})
          for (bool inPlace : {false, true}) {
            const size_t offset = offsetElems * es;
            std::vector<std::vector<char>> in(inputs, std::vector<char>((n + 2) * es));
            for (auto& b : in) fill(b, dt, g);
            std::vector<char> cpu = onCpu(in, n, dt, loomSum, offset);
            const int outputs = 4;
            std::vector<std::vector<char>> out(outputs, std::vector<char>((n + 2) * es, 0x5a));
            devk::ReduceArgs a{};
            for (int d = 0; d < outputs; ++d) a.dst[d] = out[d].data() + offset;
            if (inPlace) a.dst[outputs - 1] = in[0].data() + offset;  // the last output is input 0
            a.ndst = outputs;
            for (int k = 0; k < inputs; ++k) a.src[k] = in[k].data() + offset;
            a.nsrc = inputs;
            a.count = n;
            devk::runReduceOnHost(static_cast<int>(dt), static_cast<int>(loomSum), a);
            for (int d = 0; d < outputs; ++d) {
              const char* got = inPlace && d == outputs - 1 ? in[0].data() : out[d].data();
              for (size_t i = 0; i < n; ++i)
                ASSERT_TRUE(sameElement(cpu.data() + offset + i * es, got + offset + i * es, dt))
                    << dataTypeName(dt) << " inputs " << inputs << " n " << n << " offset "
                    << offsetElems << (inPlace ? " in place" : "") << " output " << d << " element "
                    << i;
              if (!(inPlace && d == outputs - 1)) {
                EXPECT_EQ(out[d][offset + n * es], 0x5a) << "written past the end, output " << d;
              }
            }
          }
  }
}

// Every float16 and bfloat16 pattern (against every other pattern of a sample) through the
// conversions and each op.
TEST(DeviceReduce, EveryHalfPatternMatchesTheCpuKernels) {
  for (loomDataType_t dt : {loomFloat16, loomBfloat16}) {
    const size_t n = 65536;
    std::vector<std::vector<char>> in(2, std::vector<char>(n * 2));
    for (size_t i = 0; i < n; ++i) {
      const uint16_t a = static_cast<uint16_t>(i);
      const uint16_t b = static_cast<uint16_t>(i * 40503u + 12345u);  // another pattern
      std::memcpy(in[0].data() + 2 * i, &a, 2);
      std::memcpy(in[1].data() + 2 * i, &b, 2);
    }
    for (loomRedOp_t op : kOps) {
      std::vector<char> cpu = onCpu(in, n, dt, op, 0);
      std::vector<char> dev = onDeviceCode(in, n, dt, op, 0);
      for (size_t i = 0; i < n; ++i)
        ASSERT_TRUE(sameElement(cpu.data() + 2 * i, dev.data() + 2 * i, dt))
            << dataTypeName(dt) << " " << redOpName(op) << " pattern " << i;
    }
  }
}

TEST(DeviceReduce, KernelNamesCoverEveryDatatypeAndOp) {
  for (int dt = 0; dt < devk::kNumDTypes; ++dt)
    for (int op = 0; op < devk::kNumROps; ++op) {
      const char* name = devk::reduceKernelName(dt, op);
      ASSERT_NE(name, nullptr) << dt << " " << op;
      devk::ReduceArgs a{};
      EXPECT_TRUE(devk::runReduceKernelOnHost(name, a)) << name;  // count 0: nothing to do
    }
  EXPECT_EQ(devk::reduceKernelName(devk::kNumDTypes, 0), nullptr);
  EXPECT_FALSE(devk::runReduceKernelOnHost("loomReduce_nope", devk::ReduceArgs{}));
  // avg runs the sum kernel (with divideBy).
  EXPECT_STREQ(devk::reduceKernelName(devk::kFloat32, devk::kAvg), "loomReduce_f32_sum");
}

}  // namespace
}  // namespace loom
