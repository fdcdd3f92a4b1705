#include "src/device/stream_signal.h"

#include <new>

#include "src/device/kernels.h"

namespace loom::device {

namespace {

// A host function's payload: sets ready = seq when the stream reaches it.
struct ReadyNote {
  std::atomic<uint64_t>* word;
  uint64_t seq;
};

void markReady(void* p) {
  auto* n = static_cast<ReadyNote*>(p);
  uint64_t cur = n->word->load(std::memory_order_relaxed);
  while (cur < n->seq && !n->word->compare_exchange_weak(cur, n->seq, std::memory_order_release)) {
  }
  delete n;
}

}  // namespace

Result<StreamSignal*> StreamSignal::create() {
  const cuda::Driver& drv = cuda::cudaDriver();
  LOOM_TRY(drv.status);
  const cuda::DriverApi& api = drv.api;
  std::unique_ptr<StreamSignal> s(new StreamSignal());
  void* host = nullptr;
  LOOM_CU(api.cuMemHostAlloc(&host, 2 * sizeof(uint64_t),
                             cuda::kMemHostAllocDeviceMap | cuda::kMemHostAllocPortable));
  s->words_ = new (host) std::atomic<uint64_t>[2];
  s->words_[kReady].store(0, std::memory_order_relaxed);
  s->words_[kDone].store(0, std::memory_order_release);
  LOOM_CU(api.cuMemHostGetDevicePointer(&s->devWords_, host, 0));
  cuda::CUdevice dev = 0;
  int memOps = 0;
  if (api.cuStreamWaitValue64 && api.cuStreamWriteValue64 &&
      api.cuCtxGetDevice(&dev) == cuda::kSuccess &&
      api.cuDeviceGetAttribute(&memOps, cuda::kAttrStreamMemOps64, dev) == cuda::kSuccess)
    s->memOps_ = memOps != 0;
  return s.release();
}

StreamSignal::~StreamSignal() {
  if (words_) cuda::cudaDriver().api.cuMemFreeHost(words_);
}

Status StreamSignal::enqueue(cuda::CUstream stream, uint64_t seq) {
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  if (memOps_) {
    LOOM_CU(api.cuStreamWriteValue64(stream, devWords_ + kReady * sizeof(uint64_t), seq,
                                     cuda::kStreamWriteValueDefault));
    LOOM_CU(api.cuStreamWaitValue64(stream, devWords_ + kDone * sizeof(uint64_t), seq,
                                    cuda::kStreamWaitValueGeq));
    return Status();
  }
  auto* note = new ReadyNote{&words_[kReady], seq};
  cuda::CUresult rc = api.cuLaunchHostFunc(stream, &markReady, note);
  if (rc != cuda::kSuccess) {
    delete note;
    return cuda::cudaError(rc, "cuLaunchHostFunc");
  }
  return launchWaitFlag(stream, reinterpret_cast<const uint64_t*>(devWords_ + kDone * 8), seq);
}

void StreamSignal::release(uint64_t seq) {
  uint64_t cur = words_[kDone].load(std::memory_order_relaxed);
  while (cur < seq && !words_[kDone].compare_exchange_weak(cur, seq, std::memory_order_release)) {
  }
}

}  // namespace loom::device
