// loomMemAlloc's memory: allocation bookkeeping, and mapping by another process through /proc.
#include "transports/shm/shared_alloc.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "loom/loom.h"

namespace loom::shm {
namespace {

TEST(SharedAlloc, FindsRangesInsideAllocationsOnly) {
  Result<void*> a = sharedAlloc(10000);
  ASSERT_TRUE(a.isOk()) << a.status().message();
  char* p = static_cast<char*>(a.value());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
  EXPECT_EQ(p[0], 0);
  EXPECT_EQ(p[9999], 0);
  SharedRef ref;
  ASSERT_TRUE(findShared(p + 100, 200, &ref));
  EXPECT_EQ(ref.offset, 100u);
  EXPECT_NE(ref.serial, 0u);
  EXPECT_GE(ref.fd, 0);
  // Rounded up to a page: the whole page is the allocation's.
  EXPECT_TRUE(findShared(p, 12288, &ref));
  EXPECT_FALSE(findShared(p, 12289, &ref));
  EXPECT_FALSE(findShared(p - 1, 1, &ref));
  int local = 0;
  EXPECT_FALSE(findShared(&local, sizeof(local), &ref));

  Result<void*> b = sharedAlloc(1);
  ASSERT_TRUE(b.isOk());
  SharedRef rb;
  ASSERT_TRUE(findShared(b.value(), 1, &rb));
  EXPECT_NE(rb.serial, ref.serial);

  EXPECT_TRUE(sharedFree(p).isOk());
  EXPECT_FALSE(findShared(p, 1, &ref));
  Status again = sharedFree(p);
  EXPECT_EQ(again.code(), Code::kInvalidArgument);
  EXPECT_NE(again.message().find("loomMemAlloc"), std::string::npos) << again.message();
  EXPECT_TRUE(sharedFree(b.value()).isOk());
}

TEST(SharedAlloc, PublicApiChecksItsArguments) {
  EXPECT_EQ(loomMemAlloc(nullptr, 16), loomInvalidArgument);
  EXPECT_NE(std::string(loomGetLastError()).find("NULL"), std::string::npos);
  void* p = reinterpret_cast<void*>(1);
  EXPECT_EQ(loomMemAlloc(&p, 0), loomInvalidArgument);
  EXPECT_EQ(p, nullptr);
  p = reinterpret_cast<void*>(1);
  EXPECT_EQ(loomMemAlloc(&p, SIZE_MAX - 100), loomInvalidArgument);
  EXPECT_NE(std::string(loomGetLastError()).find("too large"), std::string::npos);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(loomMemFree(nullptr), loomSuccess);
  int x = 0;
  EXPECT_EQ(loomMemFree(&x), loomInvalidArgument);
  ASSERT_EQ(loomMemAlloc(&p, 1 << 20), loomSuccess);
  std::memset(p, 7, 1 << 20);
  EXPECT_EQ(loomMemFree(p), loomSuccess);
}

// A child process maps the parent's allocation by (pid, fd, serial), reads what the parent wrote
// and writes back; a wrong serial (a reused fd) is refused.
TEST(SharedAlloc, AnotherProcessMapsReadsAndWrites) {
  Result<void*> a = sharedAlloc(1 << 16);
  ASSERT_TRUE(a.isOk());
  char* p = static_cast<char*>(a.value());
  std::memset(p, 0x33, 1 << 16);
  SharedRef ref;
  ASSERT_TRUE(findShared(p + 4096, 4096, &ref));
  pid_t parent = getpid();
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(pipefd[1]);
    char go;
    if (read(pipefd[0], &go, 1) != 1) _exit(9);
    int rc = 0;
    {
      PeerMappings maps;
      Result<const char*> m = maps.map(parent, ref.fd, ref.serial, ref.offset, 4096);
      if (!m.isOk()) {
        fprintf(stderr, "%s\n", m.status().message().c_str());
        rc = 1;
      } else if (m.value()[0] != 0x33 || m.value()[4095] != 0x33) {
        rc = 2;
      } else {
        const_cast<char*>(m.value())[0] = 0x44;  // mapped read-write
      }
      Result<const char*> wrong = maps.map(parent, ref.fd, ref.serial + 1000, 0, 1);
      if (wrong.isOk() ||
          wrong.status().message().find("not the peer's shared buffer") == std::string::npos)
        rc = rc ? rc : 3;
      Result<const char*> tooFar = maps.map(parent, ref.fd, ref.serial, 1 << 16, 1);
      if (tooFar.isOk()) rc = rc ? rc : 4;
    }
    _exit(rc);
  }
  close(pipefd[0]);
  ASSERT_EQ(write(pipefd[1], "g", 1), 1);
  close(pipefd[1]);
  int st = 0;
  ASSERT_EQ(waitpid(child, &st, 0), child);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0);
  EXPECT_EQ(p[4096], 0x44);
  EXPECT_EQ(p[4097], 0x33);
  EXPECT_TRUE(sharedFree(p).isOk());
}

// Whether the page of this process at address p is mapped (present in its page table).
bool pagePresent(const void* p) {
  FILE* f = std::fopen("/proc/self/pagemap", "rb");
  if (!f) return false;
  uint64_t entry = 0;
  const long page = sysconf(_SC_PAGESIZE);
  const bool ok =
      std::fseek(f, static_cast<long>(reinterpret_cast<uintptr_t>(p) / page * 8), SEEK_SET) == 0 &&
      std::fread(&entry, sizeof(entry), 1, f) == 1;
  std::fclose(f);
  return ok && (entry >> 63) != 0;
}

// A peer's buffer is mapped with the page tables of the range a call asks for filled (in 2 MiB
// chunks), so the call does not fault once per page; the rest of a large allocation stays
// untouched.
TEST(SharedAlloc, AMappedRangeIsPopulatedAndTheRestIsNot) {
#ifndef MADV_POPULATE_WRITE
  GTEST_SKIP() << "these headers have no MADV_POPULATE_WRITE (Linux 5.14)";
#else
  void* probe = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(probe, MAP_FAILED);
  const bool kernelHasIt = madvise(probe, 4096, MADV_POPULATE_WRITE) == 0;
  munmap(probe, 4096);
  if (!kernelHasIt) GTEST_SKIP() << "this kernel has no MADV_POPULATE_WRITE (Linux 5.14)";
  const size_t mib = size_t(1) << 20;
  Result<void*> a = sharedAlloc(16 * mib);
  ASSERT_TRUE(a.isOk());
  SharedRef ref;
  ASSERT_TRUE(findShared(a.value(), 16 * mib, &ref));
  {
    PeerMappings maps;  // this process's own allocation, mapped as a peer's would be
    Result<const char*> m = maps.map(getpid(), ref.fd, ref.serial, 5 * mib, mib);
    ASSERT_TRUE(m.isOk()) << m.status().message();
    const char* base = m.value() - 5 * mib;
    // The chunk [4 MiB, 6 MiB) holds the range: every page of it is there.
    for (size_t off = 4 * mib; off < 6 * mib; off += 4096)
      ASSERT_TRUE(pagePresent(base + off)) << "page at " << off << " not populated";
    EXPECT_FALSE(pagePresent(base + 10 * mib)) << "populated beyond what the call asked for";
  }
  EXPECT_TRUE(sharedFree(a.value()).isOk());
#endif
}

}  // namespace
}  // namespace loom::shm
