// The one pass's plain buffers on transparent huge pages (collapseReusedBuffer): a buffer used
// once is left alone, one used again is collapsed (all of what was seen, even when the second use
// is a part of it), with its contents and addresses unchanged, and only once.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "src/runtime/one_pass.h"

namespace loom {
namespace {

constexpr size_t kHuge = 2u << 20;

// Kilobytes of [p, p + bytes)'s mapping that are on anonymous huge pages (/proc/self/smaps), or
// -1 where the mapping is not found.
long hugeKib(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  const auto addr = reinterpret_cast<uintptr_t>(p);
  bool in = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      in = lo <= addr && addr < hi;
      continue;
    }
    if (in && line.rfind("AnonHugePages:", 0) == 0) return std::stol(line.substr(14));
  }
  return -1;
}

// An anonymous mapping of `bytes` whose start is 2 MiB-aligned, every page touched, a mapping of
// its own (inaccessible pages on both sides: the kernel does not merge it with a neighbour, so
// smaps describes it alone).
struct Buffer {
  explicit Buffer(size_t n) : bytes(n), rawBytes(n + 2 * kHuge) {
    raw = mmap(nullptr, rawBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return;
    const auto r = reinterpret_cast<uintptr_t>(raw);
    base = reinterpret_cast<char*>((r + 4096 + kHuge - 1) & ~(kHuge - 1));
    if (mprotect(raw, static_cast<size_t>(base - static_cast<char*>(raw)), PROT_NONE) != 0 ||
        mprotect(base + bytes, r + rawBytes - reinterpret_cast<uintptr_t>(base + bytes),
                 PROT_NONE) != 0) {
      base = nullptr;
      return;
    }
    for (size_t i = 0; i < bytes; ++i) base[i] = static_cast<char>(i * 7 + 3);
  }
  ~Buffer() {
    if (raw != MAP_FAILED) munmap(raw, rawBytes);
  }
  bool intact() const {
    for (size_t i = 0; i < bytes; ++i)
      if (base[i] != static_cast<char>(i * 7 + 3)) return false;
    return true;
  }
  size_t bytes, rawBytes;
  void* raw = MAP_FAILED;
  char* base = nullptr;
};

// Why these tests cannot run here ("" where they can): the kernel does not collapse (MADV_COLLAPSE
// is Linux 6.1; THP may be off), or page faults give huge pages already, leaving nothing to
// collapse.
std::string whyNoCollapse() {
  Buffer probe(2 * kHuge), fresh(2 * kHuge);
  if (probe.base == nullptr || fresh.base == nullptr) return "cannot map test buffers";
  if (madvise(probe.base, 2 * kHuge, 25 /* MADV_COLLAPSE */) != 0 || hugeKib(probe.base) <= 0)
    return std::string("this kernel does not collapse anonymous memory into huge pages here ") +
           "(madvise MADV_COLLAPSE: " + std::strerror(errno) +
           "; it needs Linux 6.1 and transparent huge pages not set to never)";
  if (hugeKib(fresh.base) != 0)
    return "page faults here give huge pages already (transparent huge pages: always): nothing "
           "is left to collapse";
  return "";
}

TEST(HugePages, ABufferUsedAgainIsCollapsedOnce) {
  const std::string why = whyNoCollapse();
  if (!why.empty()) GTEST_SKIP() << why;
  Buffer buf(8 * kHuge);
  ASSERT_NE(buf.base, nullptr);
  if (hugeKib(buf.base) != 0)
    GTEST_SKIP() << "page faults here give huge pages already (transparent huge pages: always): "
                 << "nothing is left to collapse";
  // First use: left alone.
  EXPECT_FALSE(collapseReusedBuffer(buf.base, buf.bytes));
  EXPECT_EQ(hugeKib(buf.base), 0);
  // Used again, through a part of it (a smaller call inside it, at an offset): all of it.
  EXPECT_TRUE(collapseReusedBuffer(buf.base + 3 * kHuge + 4096, kHuge / 2));
  EXPECT_GE(hugeKib(buf.base), static_cast<long>(8 * kHuge / 1024));
  EXPECT_TRUE(buf.intact());
  // Once: the next uses do nothing.
  EXPECT_FALSE(collapseReusedBuffer(buf.base, buf.bytes));
  EXPECT_FALSE(collapseReusedBuffer(buf.base + kHuge, kHuge));

  // A buffer without a whole aligned 2 MiB page is never collapsed.
  Buffer small(kHuge);
  ASSERT_NE(small.base, nullptr);
  EXPECT_FALSE(collapseReusedBuffer(small.base + 4096, kHuge - 8192));
  EXPECT_FALSE(collapseReusedBuffer(small.base + 4096, kHuge - 8192));
  EXPECT_EQ(hugeKib(small.base), 0);
  EXPECT_TRUE(small.intact());
}

// Used again, a buffer is collapsed with the rest of its mapping where the mapping is at most 4
// times what was seen (a benchmark's buffer whose calls rotate through it: collapsed piece by
// piece, each piece cost a timed call milliseconds), and nothing in it is tried again; a part of a
// much larger mapping (a heap, an arena) is collapsed alone.
// In a child process of its own: collapseReusedBuffer remembers the ranges it has seen for the
// life of the process, and the other tests' buffers, unmapped, may be mapped again at the same
// addresses.
TEST(HugePages, ASmallMappingIsCollapsedWhole) {
  const std::string why = whyNoCollapse();
  if (!why.empty()) GTEST_SKIP() << why;
  auto check = [] {
    std::string failed;
    auto expect = [&](bool ok, const char* what) {
      if (!ok) failed += std::string(what) + "; ";
    };
    Buffer whole(8 * kHuge), part(32 * kHuge);
    expect(whole.base != nullptr && part.base != nullptr, "mmap failed");
    if (failed.empty()) {
      // A quarter of `whole`, twice: all 16 MiB of its mapping.
      expect(!collapseReusedBuffer(whole.base, 2 * kHuge), "first use collapsed");
      expect(collapseReusedBuffer(whole.base + kHuge, kHuge), "second use not collapsed");
      expect(hugeKib(whole.base) == static_cast<long>(8 * kHuge / 1024),
             "not all of the 16 MiB mapping on huge pages");
      expect(whole.intact(), "contents changed");
      // Elsewhere in that mapping, twice: already done, not tried again.
      expect(!collapseReusedBuffer(whole.base + 6 * kHuge, kHuge), "tried again (1)");
      expect(!collapseReusedBuffer(whole.base + 6 * kHuge, kHuge), "tried again (2)");
      // An eighth of `part` (64 MiB), twice: only those 4 MiB.
      expect(!collapseReusedBuffer(part.base + 8 * kHuge, 2 * kHuge), "first use of part");
      expect(collapseReusedBuffer(part.base + 8 * kHuge, 2 * kHuge), "second use of part");
      expect(hugeKib(part.base) == static_cast<long>(2 * kHuge / 1024),
             "not exactly the 4 MiB used of the 64 MiB mapping on huge pages");
      expect(part.intact(), "part's contents changed");
    }
    std::fprintf(stderr, "%s\n", failed.empty() ? "all as expected" : failed.c_str());
    std::exit(failed.empty() ? 0 : 1);
  };
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(check(), ::testing::ExitedWithCode(0), "all as expected");
}

// Memory its owner asked to keep off huge pages stays off them, and is not tried again.
TEST(HugePages, NoHugePageMemoryIsLeftAlone) {
  Buffer buf(4 * kHuge);
  ASSERT_NE(buf.base, nullptr);
  ASSERT_EQ(madvise(buf.base, buf.bytes, MADV_NOHUGEPAGE), 0) << std::strerror(errno);
  EXPECT_FALSE(collapseReusedBuffer(buf.base, buf.bytes));
  EXPECT_FALSE(collapseReusedBuffer(buf.base, buf.bytes));
  EXPECT_EQ(hugeKib(buf.base), 0);
  EXPECT_TRUE(buf.intact());
}

}  // namespace
}  // namespace loom
