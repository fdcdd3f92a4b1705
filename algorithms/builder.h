// Helpers the generators use to write steps. Internal to algorithms/.
#pragma once

#include <algorithm>
#include <utility>

#include "algorithms/schedule.h"

namespace loom {

inline BufRef inputAt(size_t offset) { return BufRef{BufKind::kInput, offset}; }
inline BufRef outputAt(size_t offset) { return BufRef{BufKind::kOutput, offset}; }
inline BufRef scratchAt(size_t offset) { return BufRef{BufKind::kScratch, offset}; }

// Appends steps to one rank's schedule. Zero-count steps are dropped: both sides of a transfer
// compute the same block sizes, so an empty send and its empty receive disappear together.
class StepList {
 public:
  void send(int peer, BufRef src, size_t count, int channel = 0) {
    add(StepKind::kSend, peer, channel, src, BufRef{}, count);
  }
  void recv(int peer, BufRef dst, size_t count, int channel = 0) {
    add(StepKind::kRecv, peer, channel, BufRef{}, dst, count);
  }
  // dst = src (op) received.
  void recvReduce(int peer, BufRef src, BufRef dst, size_t count, int channel = 0) {
    add(StepKind::kRecvReduce, peer, channel, src, dst, count);
  }
  void copy(BufRef src, BufRef dst, size_t count) { add(StepKind::kCopy, -1, 0, src, dst, count); }
  // dst = dst (op) src.
  void reduce(BufRef src, BufRef dst, size_t count) {
    add(StepKind::kReduce, -1, 0, src, dst, count);
  }
  void needScratch(size_t count) { rs_.scratchCount = std::max(rs_.scratchCount, count); }
  RankSchedule finish() { return std::move(rs_); }

 private:
  void add(StepKind kind, int peer, int channel, BufRef src, BufRef dst, size_t count) {
    if (count == 0) return;
    rs_.steps.push_back(Step{kind, peer, channel, src, dst, count});
  }
  RankSchedule rs_;
};

// The cases every reducing generator shares: nothing to move (count 0), or one rank (a copy when
// out of place). Returns true when it built the whole schedule into b.
inline bool buildTrivial(const CollArgs& args, StepList& b) {
  if (args.count == 0) return true;
  if (args.nranks > 1) return false;
  if (!args.inPlace) b.copy(inputAt(0), outputAt(0), args.count);
  return true;
}

}  // namespace loom
