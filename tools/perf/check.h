// Validation data for loom-perf (-c); expected.h computes and checks the results. Element i of
// rank r's input is a small integer chosen so that the exact result of every collective and op is
// representable in every datatype (for sums up to 64 ranks in bfloat16, 127 in int8 with values
// scaled down), so results are compared exactly; only avg of floating types allows (nranks + 2)
// units of rounding of the type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "tools/perf/collectives.h"
#include "tools/perf/expected.h"

namespace loom {
namespace perf {

// loom-perf's inputs: spread over 251 values (no op, max, min), a few small values (sum, avg),
// or ones with a 2 at one rank in a period (prod), sized to the rank count.
class Pattern final : public InputPattern {
 public:
  Pattern(CollKind kind, loomDataType_t type, loomRedOp_t op, int nranks);

  double value(int rank, size_t i) const override;
  // Within tolerance() of the exact value where that is above 0 (avg of floating types).
  bool accepts(double got, double exact) const override;
  // Largest absolute difference accepted between a result and reduced().
  double tolerance() const { return tolerance_; }

 private:
  enum class Mode { kSpread, kSum, kProd };
  Mode mode_;
  bool signed_;
  uint64_t modulus_ = 1;  // kSum: values 0..modulus_-1 (shifted down for signed types)
  uint64_t period_ = 1;   // kProd: one rank in period_ holds a 2 at each index
  double tolerance_ = 0;
};

// Describes one validation run on this rank: buffers as the call will see them.
struct CheckCall {
  CollCall call;  // sendbuff/recvbuff are the pointers passed (in-place ones included)
  CollCounts counts;
};

// Writes this rank's input into call.sendbuff and poisons the output region first so that a
// result the collective did not write is counted wrong.
void fillInputs(const CheckCall& c, const Pattern& pattern);

// Number of wrong elements of this rank's output; *firstBad describes the first one.
int64_t checkOutputs(const CheckCall& c, const Pattern& pattern, std::string* firstBad);

}  // namespace perf
}  // namespace loom
