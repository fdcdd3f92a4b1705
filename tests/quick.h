// LOOMTEST_QUICK=1: set by tools/test.sh's sanitizer stage and tools/tsan_check.sh, which run after
// the first stage ran every test in full. Tests whose cost is in their size (the largest messages,
// the most rank counts, every layout) run a smaller part of it there; the code paths stay.
#pragma once

#include <cstdlib>
#include <cstring>

namespace loomtest {

inline bool quick() {
  const char* q = std::getenv("LOOMTEST_QUICK");
  return q != nullptr && std::strcmp(q, "1") == 0;
}

}  // namespace loomtest
