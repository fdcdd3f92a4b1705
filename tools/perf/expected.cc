#include "tools/perf/expected.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "src/core/dtype.h"

namespace loom {
namespace {

// Storage of each datatype, converted through double (exact for every value a pattern makes;
// integers wrap as the type does).
template <typename Storage>
struct IntType {
  using T = Storage;
  static double get(T v) { return static_cast<double>(v); }
  static T put(double d) { return static_cast<T>(static_cast<int64_t>(d)); }
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

// Calls f with the storage of type (nothing for an unknown type).
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

}  // namespace

bool typeIsSigned(loomDataType_t t) { return t != loomUint8 && t != loomUint32 && t != loomUint64; }

bool typeIsFloating(loomDataType_t t) {
  return t == loomFloat16 || t == loomFloat32 || t == loomFloat64 || t == loomBfloat16;
}

double InputPattern::reduced(size_t i) const {
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
    if (!typeIsFloating(type_)) acc = std::trunc(acc);  // integer avg truncates toward zero
  }
  return acc;
}

double InputPattern::stored(double v) const {
  double out = v;
  withType(type_, [&](auto tag) {
    using Tr = decltype(tag);
    out = Tr::get(Tr::put(v));
  });
  return out;
}

void fillInput(const InputPattern& pattern, int rank, void* sendbuff, size_t count) {
  withType(pattern.type(), [&](auto tag) {
    using Tr = decltype(tag);
    using T = typename Tr::T;
    T* in = static_cast<T*>(sendbuff);
    for (size_t i = 0; i < count; ++i) in[i] = Tr::put(pattern.value(rank, i));
  });
}

int64_t countWrong(const InputPattern& pattern, const ExpectedCall& call, const void* recvbuff,
                   std::string* firstBad) {
  const CollKind coll = call.coll;
  const int rank = call.rank;
  const int n = pattern.nranks();
  const size_t cnt = call.count;
  if (coll == CollKind::kReduce && rank != call.root) return 0;
  const size_t outCount = collCounts(coll, cnt, n).output;
  // The exact value of element pos: block r of an AllGather or AllToAll output comes from rank r
  // (an AllToAll's from its block `rank`); a ReduceScatter's output is block `rank` of the sum.
  auto exactAt = [&](size_t pos) {
    switch (coll) {
      case CollKind::kAllReduce:
      case CollKind::kReduce:
        return pattern.reduced(pos);
      case CollKind::kBroadcast:
        return pattern.value(call.root, pos);
      case CollKind::kAllGather:
        return pattern.value(static_cast<int>(pos / cnt), pos % cnt);
      case CollKind::kReduceScatter:
        return pattern.reduced(static_cast<size_t>(rank) * cnt + pos);
      case CollKind::kAllToAll:
        return pattern.value(static_cast<int>(pos / cnt),
                             static_cast<size_t>(rank) * cnt + pos % cnt);
      case CollKind::kSendRecv:
        return pattern.value((rank - 1 + n) % n, pos);
    }
    return 0.0;
  };
  int64_t wrong = 0;
  withType(pattern.type(), [&](auto tag) {
    using Tr = decltype(tag);
    using T = typename Tr::T;
    const T* out = static_cast<const T*>(recvbuff);
    for (size_t pos = 0; pos < outCount; ++pos) {
      const double got = Tr::get(out[pos]);
      const double exact = exactAt(pos);
      if (pattern.accepts(got, exact)) continue;
      if (wrong == 0 && firstBad)
        *firstBad = fmt::format("element {} is {}, expected {}", pos, got, pattern.stored(exact));
      ++wrong;
    }
  });
  return wrong;
}

}  // namespace loom
