#include "algorithms/conflicts.h"

#include <algorithm>

namespace loom {

StepAccess stepAccess(const Step& step, const AddressMap& map) {
  StepAccess a;
  if (step.count == 0) return a;
  auto read = [&](BufRef ref) { a.reads[a.numReads++] = map.map(ref, step.count); };
  auto write = [&](BufRef ref) {
    a.write = map.map(ref, step.count);
    a.writes = true;
  };
  switch (step.kind) {
    case StepKind::kSend:
      read(step.src);
      break;
    case StepKind::kRecv:
      write(step.dst);
      break;
    case StepKind::kRecvReduce:
    case StepKind::kCopy:
      read(step.src);
      write(step.dst);
      break;
    case StepKind::kReduce:
      read(step.src);
      read(step.dst);
      write(step.dst);
      break;
  }
  return a;
}

void ConflictTracker::splitAt(RegionMap& m, size_t pos) {
  auto it = m.upper_bound(pos);
  if (it == m.begin()) return;
  --it;
  if (it->first < pos && pos < it->second.hi) {
    Region right = it->second;
    it->second.hi = pos;
    m.emplace_hint(std::next(it), pos, std::move(right));
  }
}

void ConflictTracker::collect(const Span& span, bool write, std::vector<uint32_t>* deps) {
  RegionMap& m = spaces_[static_cast<int>(span.space)];
  auto it = m.upper_bound(span.lo);
  if (it != m.begin()) {
    auto prev = std::prev(it);
    if (prev->second.hi > span.lo) it = prev;
  }
  for (; it != m.end() && it->first < span.hi; ++it) {
    const Region& r = it->second;
    if (r.writer >= 0) deps->push_back(static_cast<uint32_t>(r.writer));
    if (write) r.readers.appendTo(deps);
  }
}

void ConflictTracker::markRead(uint32_t id, const Span& span) {
  RegionMap& m = spaces_[static_cast<int>(span.space)];
  splitAt(m, span.lo);
  splitAt(m, span.hi);
  size_t pos = span.lo;
  auto it = m.lower_bound(span.lo);
  while (pos < span.hi) {
    if (it == m.end() || it->first > pos) {
      size_t end = (it == m.end()) ? span.hi : std::min(span.hi, it->first);
      Region r;
      r.hi = end;
      r.readers.push_back(id);
      m.emplace_hint(it, pos, std::move(r));
      pos = end;
    } else {
      Region& r = it->second;
      if (r.readers.empty() || r.readers.back() != id) r.readers.push_back(id);
      pos = r.hi;
      ++it;
    }
  }
}

void ConflictTracker::markWrite(uint32_t id, const Span& span) {
  RegionMap& m = spaces_[static_cast<int>(span.space)];
  splitAt(m, span.lo);
  splitAt(m, span.hi);
  auto first = m.lower_bound(span.lo);
  auto last = m.lower_bound(span.hi);
  auto hint = m.erase(first, last);
  Region r;
  r.hi = span.hi;
  r.writer = id;
  m.emplace_hint(hint, span.lo, std::move(r));
}

void ConflictTracker::add(uint32_t id, const StepAccess& access, std::vector<uint32_t>* deps) {
  deps->clear();
  for (int i = 0; i < access.numReads; ++i) {
    if (!access.reads[i].empty()) collect(access.reads[i], false, deps);
  }
  if (access.writes && !access.write.empty()) collect(access.write, true, deps);
  for (int i = 0; i < access.numReads; ++i) {
    if (!access.reads[i].empty()) markRead(id, access.reads[i]);
  }
  if (access.writes && !access.write.empty()) markWrite(id, access.write);
  std::sort(deps->begin(), deps->end());
  deps->erase(std::unique(deps->begin(), deps->end()), deps->end());
  // An operation never depends on itself (a Reduce reads the range it writes).
  if (!deps->empty() && deps->back() == id) deps->pop_back();
}

}  // namespace loom
