#include "src/core/clock.h"

#include "src/core/params.h"

namespace loom {

int64_t defaultTimeoutMs() { return params::kTimeout.asInt() * 1000; }

}  // namespace loom
