// loom-perf's device memory (--mem device): the rank's GPU (its index among the ranks of its host,
// modulo the GPUs it sees, as nccl-tests picks cudaDev), two buffers there, a stream the calls are
// enqueued on (nccl-tests' way: the clock stops when the stream is synchronized), and copies to
// and from the host mirrors that fill and check the values. Everything through the CUDA driver
// Loom loads at run time (LOOM_CUDA_LIB: the emulated device too).
#pragma once

#include <cstddef>
#include <string>

#include "src/core/status.h"

namespace loom {
namespace perf {

// Whether a GPU is usable here ("" if so, else why not).
std::string deviceUnavailable();

class DeviceBuffers {
 public:
  DeviceBuffers() = default;
  ~DeviceBuffers();
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;

  // Two buffers of `bytes` on the GPU numbered localIndex modulo the GPUs, and a stream.
  Status init(int localIndex, size_t bytes);
  bool active() const { return send_ != 0; }
  int device() const { return device_; }
  std::string name() const { return name_; }    // "NVIDIA H200" or the emulated device's
  std::string busId() const { return busId_; }  // "0000:1b:00.0"
  void* send() const { return reinterpret_cast<void*>(send_); }
  void* recv() const { return reinterpret_cast<void*>(recv_); }
  void* stream() const { return stream_; }

  // Copies between a host mirror and the device buffer (unified addressing: either way), in order
  // with the stream's calls, and waits for it.
  Status toDevice(void* deviceDst, const void* hostSrc, size_t bytes) {
    return copy(deviceDst, hostSrc, bytes);
  }
  Status toHost(void* hostDst, const void* deviceSrc, size_t bytes) {
    return copy(hostDst, deviceSrc, bytes);
  }
  // Waits until the stream has done everything enqueued on it.
  Status sync();

 private:
  Status copy(void* dst, const void* src, size_t bytes);
  int device_ = -1;
  unsigned long long send_ = 0, recv_ = 0;  // NOLINT(runtime/int): CUdeviceptr
  void* stream_ = nullptr;
  std::string name_, busId_;
};

}  // namespace perf
}  // namespace loom
