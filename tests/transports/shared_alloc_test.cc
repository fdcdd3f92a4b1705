// loomMemAlloc's memory: allocation bookkeeping, and mapping by another process through /proc.
#include "transports/shm/shared_alloc.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

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

}  // namespace
}  // namespace loom::shm
