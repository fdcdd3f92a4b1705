// The test controls of fake_cuda.h.
#include <cstring>

#include "tests/device/fake_cuda/fake_cuda.h"
#include "tests/device/fake_cuda/streams.h"

using namespace fakecuda;  // NOLINT(build/namespaces)

extern "C" {

int loomtest_fakecuda_inject(const char* kind, int afterLaunches) {
  if (kind == nullptr || afterLaunches < 0) return -1;
  FaultKind k;
  if (std::strcmp(kind, "illegal_address") == 0)
    k = FaultKind::kIllegalAddress;
  else if (std::strcmp(kind, "lost_device") == 0)
    k = FaultKind::kLostDevice;
  else if (std::strcmp(kind, "none") == 0)
    k = FaultKind::kNone;
  else
    return -1;
  State& s = state();
  std::lock_guard<std::mutex> lk(s.faultMu);
  s.faultKind = k;
  s.faultAt = s.launches + afterLaunches + 1;
  return 0;
}

long long loomtest_fakecuda_count(const char* what) {
  if (what == nullptr) return -1;
  for (int i = 0; i < kNumCounters; ++i)
    if (std::strcmp(what, kCounterNames[i]) == 0)
      return state().counters[i].load(std::memory_order_relaxed);
  return -1;
}

int loomtest_fakecuda_set_capturing(void* stream, int capturing) {
  if (entryCheck() != loom::cuda::kSuccess) return -1;
  std::shared_ptr<Stream> s;
  streamOf(static_cast<CUstream>(stream), false, &s);
  if (s == nullptr) return -1;
  s->capture.store(capturing ? loom::cuda::kCaptureStatusActive : loom::cuda::kCaptureStatusNone);
  return 0;
}

}  // extern "C"
