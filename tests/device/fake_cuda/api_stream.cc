// Entry points: streams, events, and the work enqueued on streams but kernels (copies, memset,
// stream memory operations, host functions).
#include <chrono>
#include <cstring>
#include <vector>

#include "tests/device/fake_cuda/memory.h"
#include "tests/device/fake_cuda/streams.h"

using namespace fakecuda;    // NOLINT(build/namespaces)
using namespace loom::cuda;  // NOLINT(build/namespaces): the driver's types and constants

namespace {

bool deviceReachable(const Resolved& r) {
  return r.target == Target::kDevice || r.target == Target::kHost;
}

// Whether a 64-bit stream wait of kind `cmp` (CU_STREAM_WAIT_VALUE_*) is satisfied by v.
bool waitSatisfied(unsigned cmp, uint64_t v, uint64_t value) {
  switch (cmp) {
    case 0:
      return static_cast<int64_t>(v - value) >= 0;  // GEQ, wrapping as the driver's
    case 1:
      return v == value;  // EQ
    case 2:
      return (v & value) != 0;  // AND
    default:
      return ~(v | value) != 0;  // NOR
  }
}

// Answers a query about the stream of handle h that does not need a healthy context (its error is
// not returned while the stream itself is known): *out = answer(stream).
template <class T, class F>
CUresult askStream(CUstream h, T* out, F answer) {
  if (out == nullptr) return kErrorInvalidValue;
  return guarded([&] {
    std::shared_ptr<Stream> s;
    const CUresult rc = streamOf(h, false, &s);
    if (s == nullptr) return rc;
    *out = answer(*s);
    return kSuccess;
  });
}

// guarded() for an entry point on an event: body(e) runs with the event of handle h, else
// CUDA_ERROR_INVALID_HANDLE is returned.
template <class F>
CUresult onEvent(CUevent h, F&& body) noexcept {
  return guarded([&] {
    std::shared_ptr<Event> e;
    FAKECUDA_TRY(eventOf(h, &e));
    return body(e);
  });
}

}  // namespace

extern "C" {

CUresult cuStreamCreate(CUstream* stream, unsigned flags) {
  FAKECUDA_ENTRY();
  if (stream == nullptr || (flags & ~kStreamNonBlocking) != 0) return kErrorInvalidValue;
  return inContext([&](Context* c) {
    auto s = std::make_shared<Stream>(c, c->gen.load(), flags);
    handles().add(&Handles::streams, s);
    s->start();
    count(kStreams);
    *stream = reinterpret_cast<CUstream>(s.get());
    return kSuccess;
  });
}

CUresult cuStreamDestroy_v2(CUstream stream) {
  FAKECUDA_ENTRY();
  return guarded([&] {
    std::shared_ptr<Stream> s = handles().take(&Handles::streams, stream);
    if (s == nullptr) return kErrorInvalidHandle;  // also the NULL stream
    s->close();
    count(kStreams, -1);
    return kSuccess;
  });
}

CUresult cuStreamSynchronize(CUstream stream) {
  FAKECUDA_ENTRY();
  return onStream(stream, false, [&](Stream* s) {
    // A capturing stream's own answer (the capture is invalidated), else what captures forbid.
    if (s->capture.load() == kCaptureStatusNone) FAKECUDA_TRY(captureForbids());
    return s->synchronize();
  });
}

CUresult cuStreamQuery(CUstream stream) {
  FAKECUDA_ENTRY();
  return onStream(stream, false, [&](Stream* s) {
    // A capturing stream's own answer (the capture is invalidated), else what captures forbid.
    if (s->capture.load() == kCaptureStatusNone) FAKECUDA_TRY(captureForbids());
    return s->query();
  });
}

CUresult cuStreamGetCtx(CUstream stream, CUcontext* ctx) {
  FAKECUDA_ENTRY();
  return askStream(stream, ctx, [](Stream& s) { return s.ctx()->handle(); });
}

CUresult cuStreamIsCapturing(CUstream stream, int* status) {
  FAKECUDA_ENTRY();
  return askStream(stream, status, [](Stream& s) { return s.capture.load(); });
}

CUresult cuEventCreate(CUevent* event, unsigned flags) {
  FAKECUDA_ENTRY();
  if (event == nullptr || (flags & ~kEventFlags) != 0) return kErrorInvalidValue;
  if ((flags & kEventInterprocess) != 0 && (flags & kEventDisableTiming) == 0)
    return kErrorInvalidValue;
  return inContext([&](Context* c) {
    auto e = std::make_shared<Event>();
    e->ctx = c;
    e->gen = c->gen.load();
    e->flags = flags;
    handles().add(&Handles::events, e);
    count(kEvents);
    *event = reinterpret_cast<CUevent>(e.get());
    return kSuccess;
  });
}

CUresult cuEventDestroy_v2(CUevent event) {
  FAKECUDA_ENTRY();
  return guarded([&] {
    // Records still queued hold the event until they ran.
    return handles().drop(&Handles::events, event, kEvents) ? kSuccess : kErrorInvalidHandle;
  });
}

CUresult cuEventRecord(CUevent event, CUstream stream) {
  FAKECUDA_ENTRY();
  return onEvent(event, [&](const std::shared_ptr<Event>& e) {
    std::shared_ptr<Stream> s;
    FAKECUDA_TRY(streamOf(stream, true, &s));
    if (e->ctx != s->ctx() || e->gen != s->gen()) return kErrorInvalidHandle;
    if (s->capture.load() != kCaptureStatusNone) return recordInCapture(s, e);
    uint64_t target = 0;
    {
      std::lock_guard<std::mutex> lk(e->mu);
      target = ++e->recorded;
      e->capturedIn.reset();
    }
    return s->enqueue([e, target](Stream&) {
      {
        std::lock_guard<std::mutex> lk(e->mu);
        if (e->completed < target) e->completed = target;
      }
      e->cv.notify_all();
      count(kEventRecords);
      return kSuccess;
    });
  });
}

CUresult cuEventQuery(CUevent event) {
  FAKECUDA_ENTRY();
  FAKECUDA_TRY(captureForbids());
  return onEvent(event, [&](const std::shared_ptr<Event>& e) {
    FAKECUDA_TRY(e->ctx->error());
    std::lock_guard<std::mutex> lk(e->mu);
    return e->completed >= e->recorded ? kSuccess : kErrorNotReady;
  });
}

CUresult cuEventSynchronize(CUevent event) {
  FAKECUDA_ENTRY();
  FAKECUDA_TRY(captureForbids());
  return onEvent(event, [&](const std::shared_ptr<Event>& e) {
    std::unique_lock<std::mutex> lk(e->mu);
    const uint64_t target = e->recorded;
    // A failed context drops the record: stop waiting then (its error is the answer).
    while (e->completed < target && e->ctx->healthy(e->gen))
      e->cv.wait_for(lk, std::chrono::milliseconds(2));
    lk.unlock();
    if (!e->ctx->active.load() || e->ctx->gen.load() != e->gen) return kErrorInvalidContext;
    return e->ctx->error();
  });
}

CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned flags) {
  FAKECUDA_ENTRY();
  if ((flags & ~1u) != 0) return kErrorInvalidValue;  // CU_EVENT_WAIT_EXTERNAL only
  return onEvent(event, [&](const std::shared_ptr<Event>& e) {
    std::shared_ptr<Stream> s;
    FAKECUDA_TRY(streamOf(stream, true, &s));
    bool captured = false;
    const CUresult rc = waitInCapture(s, e, &captured);
    if (captured) return rc;
    uint64_t target = 0;
    {
      std::lock_guard<std::mutex> lk(e->mu);
      target = e->recorded;  // the event's last record before this call; none: no wait
    }
    return s->enqueue([e, target](Stream& st) {
      const bool done = deviceWait(st, [&] {
        std::lock_guard<std::mutex> lk(e->mu);
        return e->completed >= target;
      });
      return done ? kSuccess : waitGivenUp(st);
    });
  });
}

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  FAKECUDA_ENTRY();
  return onStream(stream, true, [&](Stream* s) {
    if (bytes == 0) return kSuccess;
    const Resolved to = resolve(dst, bytes, true);
    const Resolved from = resolve(src, bytes, false);
    if (to.target == Target::kIllegal || from.target == Target::kIllegal)
      return kErrorInvalidValue;  // the driver checks device ranges against allocations
    // Pageable memory: the source is read now (staged), the destination written before return.
    std::shared_ptr<std::vector<char>> staged;
    if (from.target == Target::kPageable) {
      staged = std::make_shared<std::vector<char>>(bytes);
      std::memcpy(staged->data(), from.p, bytes);
    }
    FAKECUDA_TRY(s->enqueue([dst, src, bytes, staged](Stream&) {
      // Resolved again: the memory may have gone since the call (then it is a fault).
      const Resolved d = resolve(dst, bytes, true);
      if (d.target == Target::kIllegal) return kErrorIllegalAddress;
      Resolved r;
      const char* p = staged ? staged->data() : nullptr;
      if (p == nullptr) {
        r = resolve(src, bytes, false);
        if (r.target == Target::kIllegal) return kErrorIllegalAddress;
        p = r.p;
      }
      std::memmove(d.p, p, bytes);
      count(kCopies);
      return kSuccess;
    }));
    if (to.target == Target::kPageable && s->capture.load() == kCaptureStatusNone) {
      // Blocking until the stream gets here, holding the mapping lock (waitForMappingLock).
      state().pageableCopies.fetch_add(1, std::memory_order_acq_rel);
      const CUresult rc = s->synchronize();
      state().pageableCopies.fetch_sub(1, std::memory_order_acq_rel);
      return rc;
    }
    return kSuccess;
  });
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream stream) {
  FAKECUDA_ENTRY();
  return onStream(stream, true, [&](Stream* s) {
    if (n == 0) return kSuccess;
    if (!deviceReachable(resolve(dst, n, true))) return kErrorInvalidValue;
    return s->enqueue([dst, value, n](Stream&) {
      const Resolved d = resolve(dst, n, true);
      if (!deviceReachable(d)) return kErrorIllegalAddress;
      std::memset(d.p, value, n);
      count(kMemsets);
      return kSuccess;
    });
  });
}

CUresult cuLaunchHostFunc(CUstream stream, CUhostFn fn, void* userData) {
  FAKECUDA_ENTRY();
  if (fn == nullptr) return kErrorInvalidValue;
  return onStream(stream, true, [&](Stream* s) {
    return s->enqueue([fn, userData](Stream&) {
      HostFuncScope scope;  // a host function may not call the driver
      fn(userData);
      count(kHostFuncs);
      return kSuccess;
    });
  });
}

CUresult cuStreamWaitValue64_v2(CUstream stream, CUdeviceptr addr, uint64_t value, unsigned flags) {
  FAKECUDA_ENTRY();
  if (!state().cfg.memops) return kErrorNotSupported;
  const unsigned cmp = flags & ~kWaitValueFlush;
  if (cmp > 3 || addr % 8 != 0) return kErrorInvalidValue;
  return onStream(stream, true, [&](Stream* s) {
    if (!deviceReachable(resolve(addr, 8, false))) return kErrorInvalidValue;
    return s->enqueue([addr, value, cmp](Stream& st) {
      const Resolved w = resolve(addr, 8, false);  // held: the word stays mapped while waited on
      if (!deviceReachable(w)) return kErrorIllegalAddress;
      const auto* word = reinterpret_cast<const uint64_t*>(w.p);
      const bool done = deviceWait(
          st, [&] { return waitSatisfied(cmp, __atomic_load_n(word, __ATOMIC_ACQUIRE), value); });
      if (!done) return waitGivenUp(st);
      count(kMemopWaits);
      return kSuccess;
    });
  });
}

CUresult cuStreamWriteValue64_v2(CUstream stream, CUdeviceptr addr, uint64_t value,
                                 unsigned flags) {
  FAKECUDA_ENTRY();
  if (!state().cfg.memops) return kErrorNotSupported;
  if ((flags & ~kWriteValueNoMemoryBarrier) != 0 || addr % 8 != 0) return kErrorInvalidValue;
  return onStream(stream, true, [&](Stream* s) {
    if (!deviceReachable(resolve(addr, 8, true))) return kErrorInvalidValue;
    return s->enqueue([addr, value](Stream&) {
      const Resolved w = resolve(addr, 8, true);
      if (!deviceReachable(w)) return kErrorIllegalAddress;
      __atomic_store_n(reinterpret_cast<uint64_t*>(w.p), value, __ATOMIC_RELEASE);
      count(kMemopWrites);
      return kSuccess;
    });
  });
}

}  // extern "C"
