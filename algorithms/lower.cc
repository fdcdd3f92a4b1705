// Lowering: steps split into pieces with explicit dependencies (see schedule.h).
#include <algorithm>

#include "algorithms/conflicts.h"
#include "algorithms/schedule.h"

namespace loom {

LoweredSchedule lowerSchedule(const RankSchedule& rs, size_t pieceElems) {
  return lowerSchedule(rs, BufferLayout{}, pieceElems);
}

LoweredSchedule lowerSchedule(const RankSchedule& rs, const BufferLayout& layout,
                              size_t pieceElems) {
  LoweredSchedule out;
  out.scratchCount = rs.scratchCount;
  const AddressMap map(layout);
  ConflictTracker tracker;
  size_t total = 0;
  for (const Step& st : rs.steps) {
    if (st.count == 0) continue;
    const size_t pe = pieceElems == 0 ? st.count : pieceElems;
    total += (st.count + pe - 1) / pe;
  }
  out.pieces.reserve(total);
  size_t staging = 0;
  for (const Step& st : rs.steps) {
    if (st.count == 0) continue;
    const size_t pe = pieceElems == 0 ? st.count : pieceElems;
    const bool hasSrc = st.kind != StepKind::kRecv;
    const bool hasDst = st.kind != StepKind::kSend;
    for (size_t off = 0; off < st.count; off += pe) {
      Piece p;
      p.step = st;
      p.step.count = std::min(pe, st.count - off);
      if (hasSrc) p.step.src.offset += off;
      if (hasDst) p.step.dst.offset += off;
      if (st.kind == StepKind::kRecvReduce) {
        p.stagingOffset = staging;
        staging += p.step.count;
      }
      tracker.add(static_cast<uint32_t>(out.pieces.size()), stepAccess(p.step, map), &p.deps);
      out.pieces.push_back(std::move(p));
    }
  }
  out.stagingCount = staging;
  return out;
}

}  // namespace loom
