// Public entry points: validate nothing (the caller does), ignore what is unknown, and forward to
// the kernel table of the best instruction set this CPU supports, chosen once at first use.
#include "src/reduce/reduce.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <string>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(LOOM_REDUCE_X86)
#include <cpuid.h>
#endif

#include "src/core/dtype.h"
#include "src/core/params.h"
#include "src/reduce/reduce_isa.h"

namespace loom {
namespace {

using reduce_internal::KernelTable;

const KernelTable* tableFor(ReduceIsa isa) {
  switch (isa) {
#if defined(LOOM_REDUCE_X86)
    case ReduceIsa::kAvx512:
      return &reduce_internal::kAvx512Kernels;
    case ReduceIsa::kAvx2:
      return &reduce_internal::kAvx2Kernels;
#endif
    default:
      return &reduce_internal::kGenericKernels;
  }
}

// The table in force; null until first use. Tables are immutable constants, so relaxed loads and
// stores suffice.
std::atomic<const KernelTable*> activeTable{nullptr};

const KernelTable* table() {
  const KernelTable* t = activeTable.load(std::memory_order_relaxed);
  if (t == nullptr) {
    t = tableFor(bestReduceIsa());
    activeTable.store(t, std::memory_order_relaxed);
  }
  return t;
}

#if defined(LOOM_REDUCE_X86)
// F16C (half-precision conversions) from CPUID leaf 1: not every compiler's
// __builtin_cpu_supports knows it (clang 14 does not).
bool hasF16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}
#endif

}  // namespace

const char* reduceIsaName(ReduceIsa isa) {
  switch (isa) {
    case ReduceIsa::kGeneric:
      return "generic";
    case ReduceIsa::kAvx2:
      return "avx2";
    case ReduceIsa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

bool reduceIsaSupported(ReduceIsa isa) {
  switch (isa) {
    case ReduceIsa::kGeneric:
      return true;
#if defined(LOOM_REDUCE_X86)
    // __builtin_cpu_supports also checks that the OS saves the YMM/ZMM state (XCR0).
    case ReduceIsa::kAvx2:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2") && hasF16c();
    case ReduceIsa::kAvx512:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx2") && hasF16c();
#endif
    default:
      return false;
  }
}

ReduceIsa bestReduceIsa() {
  static const ReduceIsa best = [] {
    for (ReduceIsa isa : {ReduceIsa::kAvx512, ReduceIsa::kAvx2}) {
      if (reduceIsaSupported(isa)) return isa;
    }
    return ReduceIsa::kGeneric;
  }();
  return best;
}

ReduceIsa activeReduceIsa() {
  const KernelTable* t = table();
  for (ReduceIsa isa : {ReduceIsa::kAvx512, ReduceIsa::kAvx2}) {
    if (reduceIsaSupported(isa) && t == tableFor(isa)) return isa;
  }
  return ReduceIsa::kGeneric;
}

bool setReduceIsa(ReduceIsa isa) {
  if (!reduceIsaSupported(isa)) return false;
  activeTable.store(tableFor(isa), std::memory_order_relaxed);
  return true;
}

void reduceBuffers(void* dst, const void* a, const void* b, size_t count, loomDataType_t dt,
                   loomRedOp_t op) {
  if (count == 0 || !validDataType(dt) || !validRedOp(op)) return;
  table()->reduce(dst, a, b, count, dt, op);
}

namespace {

// Below this many bytes the ordinary stores win: the fence and the lines that stay cached matter
// more than the reads the streaming stores save.
constexpr size_t kStreamMinBytes = 4096;
// Results go through a tile this large (in L1) on their way to the destination.
constexpr size_t kStreamTileBytes = 1024;

#if defined(__SSE2__)
constexpr bool kHaveStreamingStores = true;

// dst 16-byte aligned, bytes a multiple of 64: written a cache line at a time around the caches.
void streamLines(char* dst, const char* src, size_t bytes) {
  for (size_t i = 0; i < bytes; i += 64) {
    const __m128i x0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i x1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i x2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i x3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), x0);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), x1);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), x2);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), x3);
  }
}

void storeFence() { _mm_sfence(); }
#else
constexpr bool kHaveStreamingStores = false;
void streamLines(char* dst, const char* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void storeFence() {}
#endif

// Bytes before dst reaches a 16-byte boundary.
size_t headToAlign(const void* dst) { return (16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16; }

// The caches cpu0 has, from sysfs (what this machine, or this VM, says; glibc's sysconf reports
// the whole socket's L3 on some VMs): the largest (32 MiB where sysfs says nothing) and the
// level-2 one (1 MiB where unknown).
struct CacheSizes {
  size_t lastLevel = 0, level2 = 0;
};
size_t readSize(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return 0;
  unsigned long long v = 0;
  char unit = 0;
  int got = std::fscanf(f, "%llu%c", &v, &unit);
  std::fclose(f);
  if (got < 1) return 0;
  size_t bytes = static_cast<size_t>(v);
  if (got == 2 && (unit == 'K' || unit == 'k')) bytes <<= 10;
  if (got == 2 && unit == 'M') bytes <<= 20;
  return bytes;
}
CacheSizes cacheSizes() {
  CacheSizes c;
  for (int i = 0; i < 8; ++i) {
    std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    const size_t bytes = readSize(dir + "size");
    c.lastLevel = std::max(c.lastLevel, bytes);
    if (readSize(dir + "level") == 2) c.level2 = std::max(c.level2, bytes);
  }
  if (c.lastLevel == 0) c.lastLevel = size_t(32) << 20;
  if (c.level2 == 0) c.level2 = size_t(1) << 20;
  return c;
}

}  // namespace

void copyStreaming(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  if (d == s || bytes == 0) return;
  const bool overlap = d < s + bytes && s < d + bytes;
  if (!kHaveStreamingStores || bytes < kStreamMinBytes || overlap) {
    std::memmove(d, s, bytes);
    return;
  }
  const size_t head = headToAlign(d);
  std::memcpy(d, s, head);
  const size_t body = (bytes - head) & ~static_cast<size_t>(63);
  streamLines(d + head, s + head, body);
  std::memcpy(d + head + body, s + head + body, bytes - head - body);
  storeFence();
}

CacheModel::CacheModel(size_t lastLevelBytes, size_t privateBytes)
    : share_(lastLevelBytes / 4), private_(privateBytes) {}

bool CacheModel::cached(const ByteRange& r) const {
  const auto b = reinterpret_cast<uintptr_t>(r.base);
  for (const Entry& e : recent_)
    if (e.bytes && e.base <= b && b + r.bytes <= e.base + e.bytes && clock_ - e.stamp <= share_)
      return true;
  return false;
}

bool CacheModel::streamingFor(size_t hostBytes, int localRanks, const ByteRange* written,
                              size_t nWritten) {
  const uint64_t start = clock_;
  // Below the private caches: never streamed, and not worth a place among the recent writes.
  if (hostBytes < private_ * static_cast<size_t>(std::max(localRanks, 1))) {
    clock_ += hostBytes;
    return false;
  }
  bool warm = nWritten > 0;
  for (size_t i = 0; i < nWritten; ++i) warm = warm && cached(written[i]);
  clock_ += hostBytes;
  for (size_t i = 0; i < nWritten; ++i) {
    if (!written[i].base || !written[i].bytes) continue;
    // The entry of the same range, else the oldest.
    Entry* slot = &recent_[0];
    for (Entry& e : recent_) {
      if (e.base == reinterpret_cast<uintptr_t>(written[i].base) && e.bytes == written[i].bytes) {
        slot = &e;
        break;
      }
      if (e.stamp < slot->stamp) slot = &e;
    }
    *slot = Entry{reinterpret_cast<uintptr_t>(written[i].base), written[i].bytes, start};
  }
  return !warm || hostBytes > share_;
}

bool streamingStoresFor(size_t hostBytes, int localRanks, const ByteRange* written,
                        size_t nWritten) {
  if (!kHaveStreamingStores) return false;
  const int64_t set = params::kNtMin.asInt();
  if (set > 0) return hostBytes > static_cast<size_t>(set);
  static std::mutex mu;
  static CacheModel model = [] {
    const CacheSizes c = cacheSizes();
    return CacheModel(c.lastLevel, c.level2);
  }();
  std::lock_guard<std::mutex> lock(mu);
  return model.streamingFor(hostBytes, localRanks, written, nWritten);
}

void reduceBuffersStreaming(void* dst, const void* a, const void* b, size_t count,
                            loomDataType_t dt, loomRedOp_t op) {
  if (count == 0 || !validDataType(dt) || !validRedOp(op)) return;
  const size_t es = dataTypeSize(dt);
  const size_t head = headToAlign(dst);
  // A destination that is also an operand is in the cache once read: ordinary stores cost no
  // extra read there, and streaming ones would only push it out (slower on AMD Zen 4 in place).
  const bool alias = dst == a || dst == b;
  if (!kHaveStreamingStores || alias || count * es < kStreamMinBytes || head % es != 0) {
    table()->reduce(dst, a, b, count, dt, op);
    return;
  }
  auto* d = static_cast<char*>(dst);
  const auto* x = static_cast<const char*>(a);
  const auto* y = static_cast<const char*>(b);
  const size_t headElems = head / es;
  table()->reduce(d, x, y, headElems, dt, op);
  alignas(64) char tile[kStreamTileBytes];
  const size_t tileElems = kStreamTileBytes / es;
  for (size_t i = headElems; i < count;) {
    const size_t n = std::min(tileElems, count - i), off = i * es;
    table()->reduce(tile, x + off, y + off, n, dt, op);
    const size_t lines = (n * es) & ~static_cast<size_t>(63);
    streamLines(d + off, tile, lines);
    std::memcpy(d + off + lines, tile + lines, n * es - lines);
    i += n;
  }
  storeFence();
}

void reduceBuffersTwice(void* dst, void* copy, const void* a, const void* b, size_t count,
                        loomDataType_t dt, loomRedOp_t op, bool streaming) {
  if (count == 0 || !validDataType(dt) || !validRedOp(op)) return;
  const size_t es = dataTypeSize(dt);
  auto* d = static_cast<char*>(dst);
  auto* c = static_cast<char*>(copy);
  const auto* x = static_cast<const char*>(a);
  const auto* y = static_cast<const char*>(b);
  // Up to dst's first cache line boundary with ordinary stores, the rest through the kernel that
  // stores twice (its streaming stores take whole aligned lines).
  const size_t head = (64 - reinterpret_cast<uintptr_t>(dst) % 64) % 64;
  if (!streaming || !kHaveStreamingStores || count * es < kStreamMinBytes || head % es != 0) {
    table()->reduce(c, x, y, count, dt, op);
    std::memcpy(d, c, count * es);
    return;
  }
  const size_t headElems = head / es;
  table()->reduce(c, x, y, headElems, dt, op);
  std::memcpy(d, c, head);
  table()->reduceTwice(d + head, c + head, x + head, y + head, count - headElems, dt, es, op);
  storeFence();
}

void finishAverage(void* data, size_t count, loomDataType_t dt, int nranks) {
  if (count == 0 || nranks <= 1 || !validDataType(dt)) return;
  table()->finishAverage(data, count, dt, nranks);
}

}  // namespace loom
