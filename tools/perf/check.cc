#include "tools/perf/check.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "src/core/dtype.h"

namespace loom {
namespace perf {
namespace {

// What each datatype holds exactly: the largest |sum| every partial sum may reach (integers: no
// overflow), the most factors of 2 a product may hold, and the mantissa bits of floating types.
struct Exactness {
  loomDataType_t type;
  double sumLimit;
  int maxTwos;
  int mantissaBits;
};
constexpr Exactness kExactness[] = {
    {loomInt8, 127, 6, 0},          {loomUint8, 255, 7, 0},      {loomInt32, 1 << 30, 30, 0},
    {loomUint32, 1 << 30, 31, 0},   {loomInt64, 1 << 30, 62, 0}, {loomUint64, 1 << 30, 63, 0},
    {loomFloat16, 2048, 15, 10},    {loomBfloat16, 256, 30, 7},  {loomFloat32, 1 << 30, 30, 23},
    {loomFloat64, 1 << 30, 30, 52},
};
const Exactness& exactness(loomDataType_t type) {
  for (const Exactness& e : kExactness)
    if (e.type == type) return e;
  return kExactness[9];  // as float64
}

// Poison: 0x7b bytes are no value the pattern makes in any type wider than a byte.
constexpr int kPoison = 0x7b;

}  // namespace

Pattern::Pattern(CollKind kind, loomDataType_t type, loomRedOp_t op, int nranks)
    : InputPattern(type, op, nranks), signed_(typeIsSigned(type)) {
  const bool reduces = collInfo(kind).hasOp;
  if (!reduces || op == loomMax || op == loomMin) {
    mode_ = Mode::kSpread;
  } else if (op == loomProd) {
    mode_ = Mode::kProd;
    uint64_t k = static_cast<uint64_t>(exactness(type).maxTwos);
    period_ = (static_cast<uint64_t>(nranks) + k - 1) / k;
    if (period_ < 1) period_ = 1;
  } else {
    mode_ = Mode::kSum;
    modulus_ = 4;
    auto maxAbs = [&](uint64_t m) { return static_cast<double>(signed_ ? m / 2 : m - 1); };
    while (modulus_ > 1 && nranks * maxAbs(modulus_) > exactness(type).sumLimit) --modulus_;
    if (op == loomAvg && typeIsFloating(type)) {
      // avg may be computed as a sum of pre-divided terms: each term and each partial sum rounds.
      double maxInput = std::max(1.0, maxAbs(modulus_));
      tolerance_ = (nranks + 2) * std::ldexp(maxInput, -exactness(type).mantissaBits);
    }
  }
}

double Pattern::value(int rank, size_t i) const {
  const uint64_t r = static_cast<uint64_t>(rank);
  const uint64_t idx = static_cast<uint64_t>(i);
  switch (mode_) {
    case Mode::kSpread: {
      // 251 distinct values: exact in bfloat16 and in a byte, different across ranks and indices.
      double v = static_cast<double>(((idx % 251) * 7 + r * 131 + 1) % 251);
      return signed_ ? v - 125 : v;
    }
    case Mode::kSum: {
      double v = static_cast<double>(((idx % modulus_) * 7 + r * 13) % modulus_);
      return signed_ ? v - static_cast<double>(modulus_ / 2) : v;
    }
    case Mode::kProd: {
      double v = ((idx + r) % period_ == 0) ? 2 : 1;
      if (signed_ && ((idx % 7) * 3 + r * 5) % 7 == 0) v = -v;
      return v;
    }
  }
  return 0;
}

bool Pattern::accepts(double got, double exact) const {
  return tolerance_ > 0 ? std::fabs(got - exact) <= tolerance_ : InputPattern::accepts(got, exact);
}

void fillInputs(const CheckCall& c, const Pattern& pattern) {
  const CollCall& call = c.call;
  std::memset(call.recvbuff, kPoison, c.counts.recvCount * dataTypeSize(call.type));
  fillInput(pattern, call.rank, const_cast<void*>(call.sendbuff), c.counts.sendCount);
}

int64_t checkOutputs(const CheckCall& c, const Pattern& pattern, std::string* firstBad) {
  const CollCall& call = c.call;
  return countWrong(pattern, {call.kind, c.counts.paramCount, call.root, call.rank}, call.recvbuff,
                    firstBad);
}

}  // namespace perf
}  // namespace loom
