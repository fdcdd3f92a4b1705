// A CUDA stream's handoff to a host thread and back, for calls enqueued on a user's stream (NCCL's
// semantics: the call starts when the work before it on the stream is done, and the work after it
// waits for it). Two 64-bit words of host-mapped memory (cuMemHostAlloc, DEVICEMAP):
//   ready: the stream writes a call's sequence number there when it reaches the call;
//   done:  the host thread writes it there when the call is complete; the stream waits for it.
// With stream memory operations (cuStreamWriteValue64 / cuStreamWaitValue64, where the device
// supports them) no SM is used. Without them: ready is set by a host function on the stream
// (cuLaunchHostFunc) and the stream waits in a one-thread kernel that spins on the done word
// (loomWaitFlag in Loom's module).
//
// A failed or aborted communicator still writes done, so a user's stream is never left blocked.
//
// Threads: enqueue on the thread that makes the call; isReady/release on the host thread that
// runs the calls. Sequence numbers increase by one per call, starting at 1.
#pragma once

#include <atomic>
#include <cstdint>

#include "src/core/status.h"
#include "src/device/cuda_driver.h"

namespace loom::device {

class StreamSignal {
 public:
  // Allocates the two words in the context current on this thread.
  static Result<StreamSignal*> create();
  ~StreamSignal();
  StreamSignal(const StreamSignal&) = delete;
  StreamSignal& operator=(const StreamSignal&) = delete;

  // On stream: when it gets here, ready = seq; then it waits until done >= seq.
  Status enqueue(cuda::CUstream stream, uint64_t seq);
  // Whether the stream reached call seq.
  bool isReady(uint64_t seq) const { return words_[kReady].load(std::memory_order_acquire) >= seq; }
  // Lets the stream go past call seq (and every call before it).
  void release(uint64_t seq);
  uint64_t released() const { return words_[kDone].load(std::memory_order_acquire); }
  // Whether the device has stream memory operations (else the host function and the wait kernel).
  bool memOps() const { return memOps_; }

 private:
  enum { kReady = 0, kDone = 1 };
  StreamSignal() = default;
  std::atomic<uint64_t>* words_ = nullptr;  // host-mapped: [kReady], [kDone]
  cuda::CUdeviceptr devWords_ = 0;          // their device address
  bool memOps_ = false;
};

}  // namespace loom::device
