// The one pass's measured choice between the result tiles and process_vm_writev
// (src/runtime/tile_choice.h): both ways measured first, then the faster taken, the other retried
// on a fixed cadence, a change of speed followed, one slow call not enough to turn it.
#include "src/runtime/tile_choice.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace loom {
namespace {

constexpr size_t kBytes = size_t(1) << 20;

// One call the way the choice votes, at `tilesGbs` or `writevGbs`; returns the way it took.
bool callAt(ResultTileChoice& c, double tilesGbs, double writevGbs) {
  const bool tiles = c.vote();
  c.record(tiles, kBytes, kBytes / ((tiles ? tilesGbs : writevGbs) * 1e9));
  return tiles;
}

TEST(ResultTileChoice, MeasuresBothWaysInTurnThenTakesTheFaster) {
  for (bool tilesFaster : {true, false}) {
    ResultTileChoice c;
    EXPECT_EQ(c.rate(true), 0.0);
    for (uint64_t i = 0; i < 2 * ResultTileChoice::kFirst; ++i) {
      const bool tiles = c.vote();
      EXPECT_EQ(tiles, i % 2 == 0) << "call " << i;
      c.record(tiles, kBytes, kBytes / ((tiles ? (tilesFaster ? 8e9 : 4e9) : 6e9)));
    }
    EXPECT_DOUBLE_EQ(c.rate(true), tilesFaster ? 8e9 : 4e9);
    EXPECT_DOUBLE_EQ(c.rate(false), 6e9);
    EXPECT_EQ(c.vote(), tilesFaster);
  }
}

// Where one way stays faster, the other is tried once its measurement is a retry period old: one
// call in every period + 1, no more.
TEST(ResultTileChoice, RetriesTheOtherWayOnItsCadence) {
  for (bool tilesFaster : {true, false}) {
    ResultTileChoice c;
    const double tiles = tilesFaster ? 8 : 4, writev = 6;
    for (uint64_t i = 0; i < 2 * ResultTileChoice::kFirst; ++i) callAt(c, tiles, writev);
    const uint64_t period =
        tilesFaster ? ResultTileChoice::kRetryWritev : ResultTileChoice::kRetryTiles;
    int other = 0;
    for (uint64_t i = 0; i < 10 * (period + 1); ++i)
      other += callAt(c, tiles, writev) != tilesFaster;
    EXPECT_EQ(other, 10) << (tilesFaster ? "writev" : "tiles") << " tried " << other << " times";
  }
}

// The tiles slow down (the host moved the ranks' cores apart): the choice moves to
// process_vm_writev once the last kKept calls were slow; they speed up again: it moves back at the
// next retry.
TEST(ResultTileChoice, FollowsAChangeOfSpeed) {
  ResultTileChoice c;
  for (int i = 0; i < 40; ++i) callAt(c, 8, 6);
  EXPECT_TRUE(c.vote());
  int calls = 0;
  while (c.vote() && calls < 10) {
    callAt(c, 4, 6);
    ++calls;
  }
  EXPECT_EQ(calls, static_cast<int>(ResultTileChoice::kKept))
      << "left the slow tiles after " << calls << " calls";
  for (int i = 0; i < 40; ++i) callAt(c, 4, 6);
  EXPECT_FALSE(c.vote());
  calls = 0;
  while (!c.vote() && calls < 100) {
    callAt(c, 8, 6);
    ++calls;
  }
  EXPECT_LE(calls, static_cast<int>(ResultTileChoice::kRetryTiles + 1))
      << "the fast tiles were not taken back in " << calls << " calls";
}

// One slow call of the chosen way (the first at a new size is) does not turn the choice.
TEST(ResultTileChoice, OneSlowCallDoesNotTurnIt) {
  ResultTileChoice c;
  for (int i = 0; i < 10; ++i) callAt(c, 9, 6);
  ASSERT_TRUE(c.vote());
  c.record(true, kBytes, kBytes / 4e9);
  EXPECT_TRUE(c.vote());
  EXPECT_GT(c.rate(true), c.rate(false));
}

// A call that took no time or moved nothing counts as a call but measures nothing.
TEST(ResultTileChoice, IgnoresEmptyMeasurements) {
  ResultTileChoice c;
  c.record(true, 0, 1.0);
  c.record(true, kBytes, 0.0);
  EXPECT_EQ(c.rate(true), 0.0);
  EXPECT_TRUE(c.vote());
}

}  // namespace
}  // namespace loom
