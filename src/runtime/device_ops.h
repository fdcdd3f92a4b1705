// The executor's local work on CUDA device memory (a schedule run with GPUDirect RDMA, whose
// buffers the network reads and writes in place): copies by the copy engine and reductions by
// Loom's kernels, enqueued on the device runner's stream. Each operation the progress loop waits
// for completes with an event it polls (all are on one stream, so they complete in order); the
// rest (a run's last copy, the division of an average) are waited for at once.
//
// Threads: the communicator's runner thread (the executor's).
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "loom/loom.h"
#include "src/core/status.h"
#include "src/device/cuda_driver.h"

namespace loom {

class DeviceOps {
 public:
  explicit DeviceOps(cuda::CUstream stream) : stream_(stream) {}
  // Waits for what is still enqueued, then destroys the events.
  ~DeviceOps();
  DeviceOps(const DeviceOps&) = delete;
  DeviceOps& operator=(const DeviceOps&) = delete;

  // dst = src (bytes), or dst = a op b (count elements; pairwise as the CPU kernels), enqueued;
  // token comes back from poll() once it is done.
  Status copy(void* dst, const void* src, size_t bytes, uint64_t token);
  Status reduce(void* dst, const void* a, const void* b, size_t count, loomDataType_t dt,
                loomRedOp_t op, uint64_t token);
  // Done on return: dst = src; buf /= n (an average's last step); bytes zeroed.
  Status copyNow(void* dst, const void* src, size_t bytes);
  Status divideNow(void* buf, size_t count, loomDataType_t dt, int n);
  Status zeroNow(void* p, size_t bytes);
  // Appends the tokens of the operations done since the last poll, in order; the error of one
  // that failed (the device's: an illegal address, a lost device).
  Status poll(std::vector<uint64_t>* done);
  bool idle() const { return pending_.empty(); }

 private:
  Status track(uint64_t token);
  Status sync(const char* what);

  struct Pending {
    cuda::CUevent event;
    uint64_t token;
  };
  cuda::CUstream stream_;
  std::deque<Pending> pending_;
  std::vector<cuda::CUevent> spare_;
};

}  // namespace loom
