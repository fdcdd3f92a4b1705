#include "tools/perf/check.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "src/core/dtype.h"

namespace loom {
namespace perf {
namespace {

// Storage of each datatype, converted through double (exact for every value the pattern makes).
template <typename Storage>
struct IntType {
  using T = Storage;
  static double get(T v) { return static_cast<double>(v); }
  static T put(double d) { return static_cast<T>(d); }
};
struct HalfType {
  using T = uint16_t;
  static double get(T v) { return halfToFloat(v); }
  static T put(double d) { return floatToHalf(static_cast<float>(d)); }
};
struct Bf16Type {
  using T = uint16_t;
  static double get(T v) { return bf16ToFloat(v); }
  static T put(double d) { return floatToBf16(static_cast<float>(d)); }
};
template <typename Storage>
struct FloatType {
  using T = Storage;
  static double get(T v) { return static_cast<double>(v); }
  static T put(double d) { return static_cast<T>(d); }
};

template <typename F>
void withType(loomDataType_t type, F&& f) {
  switch (type) {
    case loomInt8:
      f(IntType<int8_t>{});
      break;
    case loomUint8:
      f(IntType<uint8_t>{});
      break;
    case loomInt32:
      f(IntType<int32_t>{});
      break;
    case loomUint32:
      f(IntType<uint32_t>{});
      break;
    case loomInt64:
      f(IntType<int64_t>{});
      break;
    case loomUint64:
      f(IntType<uint64_t>{});
      break;
    case loomFloat16:
      f(HalfType{});
      break;
    case loomFloat32:
      f(FloatType<float>{});
      break;
    case loomFloat64:
      f(FloatType<double>{});
      break;
    case loomBfloat16:
      f(Bf16Type{});
      break;
    default:
      break;
  }
}

bool isSigned(loomDataType_t t) { return t != loomUint8 && t != loomUint32 && t != loomUint64; }

bool isFloating(loomDataType_t t) {
  return t == loomFloat16 || t == loomFloat32 || t == loomFloat64 || t == loomBfloat16;
}

// Largest |sum| every partial sum may reach and stay exact (integers: no overflow).
double sumLimit(loomDataType_t t) {
  switch (t) {
    case loomInt8:
      return 127;
    case loomUint8:
      return 255;
    case loomFloat16:
      return 2048;
    case loomBfloat16:
      return 256;
    default:
      return 1 << 30;
  }
}

// Most factors of 2 a product may hold and stay exact.
int maxTwos(loomDataType_t t) {
  switch (t) {
    case loomInt8:
      return 6;
    case loomUint8:
      return 7;
    case loomFloat16:
      return 15;
    case loomInt32:
      return 30;
    case loomUint32:
      return 31;
    case loomInt64:
      return 62;
    case loomUint64:
      return 63;
    default:
      return 30;
  }
}

int mantissaBits(loomDataType_t t) {
  switch (t) {
    case loomFloat16:
      return 10;
    case loomBfloat16:
      return 7;
    case loomFloat32:
      return 23;
    default:
      return 52;
  }
}

// Poison: 0x7b bytes are no value the pattern makes in any type wider than a byte.
constexpr int kPoison = 0x7b;

}  // namespace

Pattern::Pattern(CollKind kind, loomDataType_t type, loomRedOp_t op, int nranks)
    : op_(op), nranks_(nranks), signed_(isSigned(type)), floating_(isFloating(type)) {
  const bool reduces = collInfo(kind).hasOp;
  if (!reduces || op == loomMax || op == loomMin) {
    mode_ = Mode::kSpread;
  } else if (op == loomProd) {
    mode_ = Mode::kProd;
    uint64_t k = static_cast<uint64_t>(maxTwos(type));
    period_ = (static_cast<uint64_t>(nranks) + k - 1) / k;
    if (period_ < 1) period_ = 1;
  } else {
    mode_ = Mode::kSum;
    modulus_ = 4;
    auto maxAbs = [&](uint64_t m) { return static_cast<double>(signed_ ? m / 2 : m - 1); };
    while (modulus_ > 1 && nranks * maxAbs(modulus_) > sumLimit(type)) --modulus_;
    if (op == loomAvg && floating_) {
      // avg may be computed as a sum of pre-divided terms: each term and each partial sum rounds.
      double maxInput = std::max(1.0, maxAbs(modulus_));
      tolerance_ = (nranks + 2) * std::ldexp(maxInput, -mantissaBits(type));
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

double Pattern::reduced(size_t i) const {
  double acc = value(0, i);
  for (int r = 1; r < nranks_; ++r) {
    double v = value(r, i);
    switch (op_) {
      case loomSum:
      case loomAvg:
        acc += v;
        break;
      case loomProd:
        acc *= v;
        break;
      case loomMax:
        acc = std::max(acc, v);
        break;
      case loomMin:
        acc = std::min(acc, v);
        break;
      default:
        break;
    }
  }
  if (op_ == loomAvg) {
    acc /= nranks_;
    if (!floating_) acc = std::trunc(acc);  // integer avg truncates toward zero
  }
  return acc;
}

void fillInputs(const CheckCall& c, const Pattern& pattern) {
  const CollCall& call = c.call;
  const int rank = call.rank;
  withType(call.type, [&](auto tag) {
    using Tr = decltype(tag);
    using T = typename Tr::T;
    std::memset(call.recvbuff, kPoison, c.counts.recvCount * sizeof(T));
    T* in = static_cast<T*>(const_cast<void*>(call.sendbuff));
    for (size_t i = 0; i < c.counts.sendCount; ++i) in[i] = Tr::put(pattern.value(rank, i));
  });
}

int64_t checkOutputs(const CheckCall& c, const Pattern& pattern, std::string* firstBad) {
  const CollCall& call = c.call;
  const int rank = call.rank;
  const int n = call.nranks;
  const size_t cnt = c.counts.paramCount;
  int64_t wrong = 0;
  withType(call.type, [&](auto tag) {
    using Tr = decltype(tag);
    using T = typename Tr::T;
    const T* out = static_cast<const T*>(call.recvbuff);
    const double tol = pattern.tolerance();
    auto expectAt = [&](size_t pos, double expected) {
      double got = Tr::get(out[pos]);
      bool ok = tol > 0 ? std::fabs(got - expected) <= tol : got == Tr::get(Tr::put(expected));
      if (!ok) {
        if (wrong == 0 && firstBad)
          *firstBad = fmt::format("element {} is {}, expected {}", pos, got, expected);
        ++wrong;
      }
    };
    switch (call.kind) {
      case CollKind::kAllReduce:
        for (size_t i = 0; i < cnt; ++i) expectAt(i, pattern.reduced(i));
        break;
      case CollKind::kReduce:
        if (rank == call.root)
          for (size_t i = 0; i < cnt; ++i) expectAt(i, pattern.reduced(i));
        break;
      case CollKind::kBroadcast:
        for (size_t i = 0; i < cnt; ++i) expectAt(i, pattern.value(call.root, i));
        break;
      case CollKind::kAllGather:
        for (int r = 0; r < n; ++r)
          for (size_t i = 0; i < cnt; ++i) expectAt(r * cnt + i, pattern.value(r, i));
        break;
      case CollKind::kReduceScatter:
        for (size_t i = 0; i < cnt; ++i) expectAt(i, pattern.reduced(rank * cnt + i));
        break;
      case CollKind::kAllToAll:
        for (int r = 0; r < n; ++r)
          for (size_t i = 0; i < cnt; ++i) expectAt(r * cnt + i, pattern.value(r, rank * cnt + i));
        break;
      case CollKind::kSendRecv: {
        int prev = (rank - 1 + n) % n;
        for (size_t i = 0; i < cnt; ++i) expectAt(i, pattern.value(prev, i));
        break;
      }
    }
  });
  return wrong;
}

}  // namespace perf
}  // namespace loom
