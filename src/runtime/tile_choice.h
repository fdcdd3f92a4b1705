// How the one pass moves the results of a cold out-of-place AllReduce or Broadcast between
// processes (src/runtime/one_pass.cc) where LOOM_SHM_RESULT_TILES is 1: through the shared result
// tiles, or with process_vm_writev. The tiles move each result from one core's cache to the
// other's, which is fast where the ranks' cores share a cache and slow where they do not;
// process_vm_writev goes through memory and does not care. On the 2-vCPU EPYC VM, whose host moves
// its vCPUs between cache domains (a cache-line round trip between them took 65-130 ns or
// 365-490 ns from one run to the next), the same 2-rank sweep (1-64 MiB) ran 8.4-9.3 GB/s busbw
// through the tiles, or 5.1-5.5, while process_vm_writev ran 5.9-7.3 either way.
//
// So each rank measures both: it keeps each way's rate over its last few calls, votes for the
// faster, and tries the other again once its measurement is some calls old, to notice a change. The
// ranks take the tiles only where all vote for them (one_pass.cc), so a rank that measured
// differently costs speed, not agreement.
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom {

class ResultTileChoice {
 public:
  // Where the tiles are chosen, process_vm_writev is tried again once its last measurement is
  // kRetryWritev measured calls old; where process_vm_writev is, the tiles are once theirs is
  // kRetryTiles calls old (theirs is the rate that moves). Only the calls where either way was
  // open count (record), and every rank records the same ones, so the ranks retry on the same
  // call.
  static constexpr uint64_t kRetryWritev = 64;
  static constexpr uint64_t kRetryTiles = 16;
  // A way's rate is the best of its last kKept calls: a few slow calls (a process's first; around
  // a new size in a sweep, where a benchmark refills its buffers, two or three) do not turn the
  // choice, kKept slow ones in a row do.
  static constexpr uint64_t kKept = 5;
  // The first calls take the two ways in turn until each has this many measurements.
  static constexpr uint64_t kFirst = 2;

  // Whether this rank votes for the tiles on its next call where either way is open.
  bool vote() const {
    if (count_[1] < kFirst || count_[0] < kFirst) return count_[1] <= count_[0];
    const bool tiles = rate(true) >= rate(false);
    const uint64_t age = calls_ - last_[tiles ? 0 : 1];
    return age >= (tiles ? kRetryWritev : kRetryTiles) ? !tiles : tiles;
  }

  // A call where either way was open moved its `bytes` in `seconds` (from its first round to its
  // last) by the tiles (tiles) or process_vm_writev.
  void record(bool tiles, size_t bytes, double seconds) {
    ++calls_;
    if (seconds <= 0 || bytes == 0) return;
    const int w = tiles ? 1 : 0;
    kept_[w][count_[w] % kKept] = static_cast<double>(bytes) / seconds;
    ++count_[w];
    last_[w] = calls_;
  }

  // Bytes per second of a way: the best of its last kKept calls; 0: not measured yet.
  double rate(bool tiles) const {
    const int w = tiles ? 1 : 0;
    double best = 0;
    for (double r : kept_[w]) best = r > best ? r : best;
    return best;
  }

 private:
  double kept_[2][kKept] = {};  // [0] process_vm_writev, [1] the tiles: the last rates
  uint64_t count_[2] = {0, 0};  // measurements of each
  uint64_t calls_ = 0;          // calls recorded
  uint64_t last_[2] = {0, 0};   // calls_ at each way's last measurement
};

}  // namespace loom
