// The exact result of every collective, element by element: what a rank's receive buffer must hold
// after a call whose inputs follow a pattern. loom-perf's validation (-c, check.h) and the
// collective tests (tests/collectives/harness.h) both check with it, each with its own pattern.
// Built as loom_expected; it uses only the public C API's types and the core's datatype and
// collective helpers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "loom/loom.h"
#include "src/core/collective.h"

namespace loom {

// Whether values of type may be negative; whether they may have a fraction.
bool typeIsSigned(loomDataType_t type);
bool typeIsFloating(loomDataType_t type);

// Every rank's input, element by element, and how close a result must come to the exact one.
class InputPattern {
 public:
  InputPattern(loomDataType_t type, loomRedOp_t op, int nranks)
      : type_(type), op_(op), nranks_(nranks) {}
  virtual ~InputPattern() = default;

  // Input element i (index in the rank's send buffer) of rank r: a value the datatype holds.
  virtual double value(int rank, size_t i) const = 0;
  // Whether got, read from a receive buffer, is an acceptable result where exact is the exact one.
  // By default only exact as the datatype stores it is.
  virtual bool accepts(double got, double exact) const { return got == stored(exact); }

  // The op over every rank's value(r, i), computed exactly (avg of integers truncates toward zero).
  double reduced(size_t i) const;
  // v as the datatype stores it (integers wrap, floating types round).
  double stored(double v) const;

  loomDataType_t type() const { return type_; }
  loomRedOp_t op() const { return op_; }
  int nranks() const { return nranks_; }

 private:
  loomDataType_t type_;
  loomRedOp_t op_;
  int nranks_;
};

// One rank's call. count is what its C call takes (AllGather: sendcount; ReduceScatter:
// recvcount; AllToAll: elements per peer); SendRecv sends count elements to rank + 1 and receives
// as many from rank - 1.
struct ExpectedCall {
  CollKind coll = CollKind::kAllReduce;
  size_t count = 0;
  int root = 0;
  int rank = 0;
};

// Writes rank's input, pattern.value(rank, i) for i < count, into sendbuff.
void fillInput(const InputPattern& pattern, int rank, void* sendbuff, size_t count);

// Elements of rank's receive buffer that the pattern does not accept as the call's result (a
// Reduce's non-root ranks have none to check). *firstBad, when given, describes the first:
// "element i is X, expected Y".
int64_t countWrong(const InputPattern& pattern, const ExpectedCall& call, const void* recvbuff,
                   std::string* firstBad);

}  // namespace loom
