#include "src/core/dtype.h"

#include <strings.h>

namespace loom {

const char* dataTypeName(loomDataType_t dt) {
  switch (dt) {
    case loomInt8:
      return "int8";
    case loomUint8:
      return "uint8";
    case loomInt32:
      return "int32";
    case loomUint32:
      return "uint32";
    case loomInt64:
      return "int64";
    case loomUint64:
      return "uint64";
    case loomFloat16:
      return "half";
    case loomFloat32:
      return "float";
    case loomFloat64:
      return "double";
    case loomBfloat16:
      return "bfloat16";
    default:
      return "unknown";
  }
}

const char* redOpName(loomRedOp_t op) {
  switch (op) {
    case loomSum:
      return "sum";
    case loomProd:
      return "prod";
    case loomMax:
      return "max";
    case loomMin:
      return "min";
    case loomAvg:
      return "avg";
    default:
      return "unknown";
  }
}

int parseDataType(const char* name) {
  static const struct {
    const char* n;
    int t;
  } kNames[] = {{"int8", loomInt8},       {"char", loomInt8},     {"uint8", loomUint8},
                {"int32", loomInt32},     {"int", loomInt32},     {"uint32", loomUint32},
                {"int64", loomInt64},     {"uint64", loomUint64}, {"half", loomFloat16},
                {"float16", loomFloat16}, {"fp16", loomFloat16},  {"float", loomFloat32},
                {"float32", loomFloat32}, {"fp32", loomFloat32},  {"double", loomFloat64},
                {"float64", loomFloat64}, {"fp64", loomFloat64},  {"bfloat16", loomBfloat16},
                {"bf16", loomBfloat16}};
  for (const auto& e : kNames)
    if (strcasecmp(name, e.n) == 0) return e.t;
  return -1;
}

int parseRedOp(const char* name) {
  static const struct {
    const char* n;
    int o;
  } kNames[] = {
      {"sum", loomSum}, {"prod", loomProd}, {"max", loomMax}, {"min", loomMin}, {"avg", loomAvg}};
  for (const auto& e : kNames)
    if (strcasecmp(name, e.n) == 0) return e.o;
  return -1;
}

}  // namespace loom
