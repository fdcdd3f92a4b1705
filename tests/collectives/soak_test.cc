// Randomized soak of small collectives interleaved with Send/Recv groups, empty calls and medium
// collectives, with random sleeps per rank so that ranks arrive out of step (issue 21: a rank still
// in a small collective judged a fast peer's next message a mismatch). Bounded by time:
// LOOMTEST_SOAK_SECONDS (default 12 s per test); LOOMTEST_SOAK_SEED repeats a sequence.
#include "tests/collectives/soak.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>

#include "tests/collectives/harness.h"
#include "tests/collectives/workers.h"

namespace loomtest {
namespace {

uint64_t soakSeed() {
  if (const char* e = getenv("LOOMTEST_SOAK_SEED")) return strtoull(e, nullptr, 10);
  return std::random_device()() % 1000000 + 1;
}

class SoakProcesses : public ::testing::TestWithParam<int> {};

TEST_P(SoakProcesses, SmallCollectivesGroupsAndSleeps) {
  const int n = GetParam();
  const uint64_t seed = soakSeed();
  const double seconds = soakSeconds(12);
  RecordProperty("seed", std::to_string(seed));
  std::string mode = "soak:" + std::to_string(seed) + ":" + std::to_string(seconds);
  WorkerResult res = runWorkers(n, mode, {{"LOOM_TIMEOUT", "60"}}, static_cast<int>(seconds) + 180);
  for (int r = 0; r < n; ++r)
    EXPECT_TRUE(res.exitedWith(r, 0))
        << "seed " << seed << ", rank " << r << ": " << res.describe(r);
  size_t at = res.output[0].find("soak: ");
  EXPECT_NE(at, std::string::npos) << res.output[0];
  if (at != std::string::npos)  // how much was checked, for the log
    std::cout << n << " processes, seed " << seed << ", " << seconds
              << " s: " << res.output[0].substr(at, res.output[0].find('\n', at) - at)
              << " per rank\n";
}

INSTANTIATE_TEST_SUITE_P(Ranks, SoakProcesses, ::testing::Values(3, 5),
                         [](const auto& p) { return std::to_string(p.param) + "ranks"; });

TEST(Soak, ThreadsSmallCollectivesGroupsAndSleeps) {
  const int n = 4;
  const uint64_t seed = soakSeed();
  ThreadRanks tr(n);
  ASSERT_TRUE(tr.ok()) << tr.error();
  SoakOptions o;
  o.seed = seed;
  o.seconds = soakSeconds(12) * 2 / 3;
  uint64_t calls = 0;
  std::string all = tr.run([&](int rank, loomComm_t comm) {
    return soak(comm, rank, n, o, rank == 0 ? &calls : nullptr);
  });
  EXPECT_EQ(all, "") << "seed " << seed;
  std::cout << n << " threads, seed " << seed << ", " << o.seconds << " s: soak: " << calls
            << " calls checked per rank\n";
}

}  // namespace
}  // namespace loomtest
