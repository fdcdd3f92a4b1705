// How the one pass moves the results of a cold out-of-place AllReduce or Broadcast between
// processes (src/runtime/one_pass.cc) where LOOM_SHM_RESULT_TILES is 1: through the shared result
// tiles, or with process_vm_writev. The tiles move each result from one core's cache to the
// other's, which is fast where the ranks' cores share a cache and slow where they do not;
// process_vm_writev goes through memory and does not care. On the 2-vCPU EPYC VM, whose host moves
// its vCPUs between cache domains (a cache-line round trip between them took 65-130 ns or
// 365-490 ns from one run to the next), the same 2-rank sweep (1-64 MiB) ran 8.4-9.3 GB/s busbw
// through the tiles, or 5.1-5.5, while process_vm_writev ran 5.9-7.3 either way.
//
// So each rank measures both: it keeps each way's recent rate, votes for the faster, and tries
// the other again once its measurement is some calls old, to notice a change. The ranks take the
// tiles only where all vote for them (one_pass.cc), so a rank that measured differently costs
// speed, not agreement.
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

  // Whether this rank votes for the tiles on its next call where either way is open. Until both
  // are measured: the tiles first, then process_vm_writev.
  bool vote() const {
    if (rate_[1] <= 0) return true;
    if (rate_[0] <= 0) return false;
    const bool tiles = rate_[1] >= rate_[0];
    const uint64_t age = calls_ - last_[tiles ? 0 : 1];
    return age >= (tiles ? kRetryWritev : kRetryTiles) ? !tiles : tiles;
  }

  // A call where either way was open moved its `bytes` in `seconds` (from its first round to its
  // last) by the tiles (tiles) or process_vm_writev. A way's rate follows its last calls: an
  // average that halves a call's weight with each newer one, so that one slow call (the first at
  // a new size is) does not turn the choice by itself.
  void record(bool tiles, size_t bytes, double seconds) {
    ++calls_;
    if (seconds <= 0 || bytes == 0) return;
    const double r = static_cast<double>(bytes) / seconds;
    const int w = tiles ? 1 : 0;
    rate_[w] = rate_[w] > 0 ? (rate_[w] + r) / 2 : r;
    last_[w] = calls_;
  }

  // Bytes per second of each way over its recent calls; 0: not measured yet.
  double rate(bool tiles) const { return rate_[tiles ? 1 : 0]; }

 private:
  double rate_[2] = {0, 0};    // [0] process_vm_writev, [1] the tiles
  uint64_t calls_ = 0;         // calls recorded
  uint64_t last_[2] = {0, 0};  // calls_ at each way's last measurement
};

}  // namespace loom
