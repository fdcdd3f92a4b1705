// reduceBuffers (out of place, sum) against memcpy on the same buffer sizes. Throughput counts the
// bytes that cross the memory interface: reduce reads two buffers and writes one (3x size), memcpy
// reads one and writes one (2x size). Each ISA variant this CPU supports is measured.
//
//   loom-reduce-bench --benchmark_filter='float16'    one datatype
//   loom-reduce-bench --benchmark_filter='avx512|memcpy'
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "src/core/dtype.h"
#include "src/reduce/reduce.h"
#include "src/reduce/reduce_isa.h"

namespace loom {
namespace {

constexpr int64_t kMinBytes = 4 << 10;
constexpr int64_t kMaxBytes = 64 << 20;

// Buffers of `bytes` bytes each, filled with 1 in datatype dt (no NaN, subnormal or overflow).
struct Buffers {
  std::vector<uint8_t> a, b, dst;
  Buffers(size_t bytes, loomDataType_t dt) : a(bytes), b(bytes), dst(bytes) {
    const size_t n = bytes / dataTypeSize(dt);
    for (size_t i = 0; i < n; ++i) {
      switch (dt) {
        case loomFloat32:
          reinterpret_cast<float*>(a.data())[i] = 1.0f;
          break;
        case loomFloat16:
          reinterpret_cast<uint16_t*>(a.data())[i] = floatToHalf(1.0f);
          break;
        case loomBfloat16:
          reinterpret_cast<uint16_t*>(a.data())[i] = floatToBf16(1.0f);
          break;
        default:
          reinterpret_cast<int32_t*>(a.data())[i] = 1;
          break;
      }
    }
    b = a;
    std::memset(dst.data(), 0, bytes);  // fault the pages in before timing
  }
};

void reduceBench(benchmark::State& state, loomDataType_t dt, ReduceIsa isa) {
  if (!setReduceIsa(isa)) {
    state.SkipWithError("ISA not supported on this CPU");
    return;
  }
  const size_t bytes = static_cast<size_t>(state.range(0));
  Buffers buf(bytes, dt);
  const size_t count = bytes / dataTypeSize(dt);
  for (auto _ : state) {
    reduceBuffers(buf.dst.data(), buf.a.data(), buf.b.data(), count, dt, loomSum);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 3 * bytes);
}

void memcpyBench(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  Buffers buf(bytes, loomInt32);
  for (auto _ : state) {
    std::memcpy(buf.dst.data(), buf.a.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * bytes);
}

void registerAll() {
  benchmark::RegisterBenchmark("memcpy", memcpyBench)
      ->RangeMultiplier(4)
      ->Range(kMinBytes, kMaxBytes);
  for (loomDataType_t dt : {loomFloat32, loomFloat16, loomBfloat16, loomInt32}) {
    for (ReduceIsa isa : {ReduceIsa::kAvx512, ReduceIsa::kAvx2, ReduceIsa::kGeneric}) {
      if (!reduceIsaSupported(isa)) continue;
      const std::string dtName = dt == loomFloat16   ? "float16"
                                 : dt == loomFloat32 ? "float32"
                                                     : dataTypeName(dt);
      const std::string name = "reduce_sum/" + dtName + "/" + reduceIsaName(isa) +
                               (isa == bestReduceIsa() ? "(default)" : "");
      benchmark::RegisterBenchmark(name.c_str(), reduceBench, dt, isa)
          ->RangeMultiplier(4)
          ->Range(kMinBytes, kMaxBytes);
    }
  }
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  loom::registerAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
