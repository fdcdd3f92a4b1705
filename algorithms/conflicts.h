// Address spaces of one rank and range-conflict tracking, shared by the verifier and the lowering.
// Internal to algorithms/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "algorithms/schedule.h"

namespace loom {

// A rank's memory as up to three disjoint address spaces. When the layout aliases the input and the
// output (in place), both buffers map into one space, so a conflict between them is seen.
enum class Space : uint8_t { kIn = 0, kOut = 1, kScratch = 2 };
constexpr int kNumSpaces = 3;

struct Span {
  Space space = Space::kIn;
  size_t lo = 0;  // [lo, hi) in elements
  size_t hi = 0;
  bool empty() const { return lo >= hi; }
  bool overlaps(const Span& o) const {
    return space == o.space && lo < o.hi && o.lo < hi && !empty() && !o.empty();
  }
};

class AddressMap {
 public:
  explicit AddressMap(const BufferLayout& layout) : layout_(layout) {}
  // The span of count elements at ref. Input maps into the output space when inputInOutput; output
  // maps into the input space when outputInInput.
  Span map(BufRef ref, size_t count) const {
    size_t base = ref.offset;
    Space space = Space::kScratch;
    switch (ref.buf) {
      case BufKind::kInput:
        space = Space::kIn;
        if (layout_.inputInOutput) {
          space = Space::kOut;
          base += layout_.inputOffsetInOutput;
        }
        break;
      case BufKind::kOutput:
        space = Space::kOut;
        if (layout_.outputInInput) {
          space = Space::kIn;
          base += layout_.outputOffsetInInput;
        }
        break;
      case BufKind::kScratch:
        break;
    }
    return Span{space, base, base + count};
  }
  const BufferLayout& layout() const { return layout_; }

 private:
  BufferLayout layout_;
};

// The spans a step reads and writes (zero-count spans omitted). At most two reads and one write.
struct StepAccess {
  Span reads[2];
  int numReads = 0;
  Span write;
  bool writes = false;
};
StepAccess stepAccess(const Step& step, const AddressMap& map);

// Records operations in program order and answers, for each, the earlier operations it conflicts
// with (read-after-write, write-after-read, write-after-write on overlapping spans). The answer is
// reduced: a read depends on the last writer of each overlapping region, a write on the last writer
// and on every reader since; waiting for those implies (transitively) waiting for every earlier
// conflicting operation, because an operation starts only after its own dependencies complete.
// Cost per operation: O(log R + regions touched), R the number of tracked regions.
class ConflictTracker {
 public:
  // id must be larger than every id added before. deps is cleared, then filled sorted and unique.
  void add(uint32_t id, const StepAccess& access, std::vector<uint32_t>* deps);

 private:
  // The readers of a region since its writer, in order: the first few in place (most regions have
  // at most two, and a region is copied whenever a span splits it), the rest on the heap.
  class Readers {
   public:
    bool empty() const { return n_ == 0; }
    uint32_t back() const { return more_.empty() ? inl_[n_ - 1] : more_.back(); }
    void push_back(uint32_t id) {
      if (n_ < kInline) {
        inl_[n_++] = id;
      } else {
        more_.push_back(id);
      }
    }
    void appendTo(std::vector<uint32_t>* out) const {
      out->insert(out->end(), inl_, inl_ + n_);
      out->insert(out->end(), more_.begin(), more_.end());
    }

   private:
    static constexpr uint32_t kInline = 3;
    uint32_t inl_[kInline] = {};
    uint32_t n_ = 0;
    std::vector<uint32_t> more_;
  };
  struct Region {
    size_t hi = 0;
    int64_t writer = -1;
    Readers readers;
  };
  using RegionMap = std::map<size_t, Region>;  // keyed by lo; regions are disjoint
  static void splitAt(RegionMap& m, size_t pos);
  void collect(const Span& span, bool write, std::vector<uint32_t>* deps);
  void markRead(uint32_t id, const Span& span);
  void markWrite(uint32_t id, const Span& span);

  RegionMap spaces_[kNumSpaces];
};

}  // namespace loom
