// The speeds the cost model needs from this machine: memcpy and float32-sum reduction bandwidth of
// one core, and what process_vm_readv/writev cost against memcpy, measured once per process (a
// few milliseconds, at the first communicator's init).
// Ranks exchange them at init and every rank prices schedules with rank 0's, so that all derive
// the same plan even when their measurements differ.
#pragma once

namespace loom {

struct KernelSpeeds {
  double memcpyBytesPerSec = 0;  // bytes copied per second (each byte read once, written once)
  double reduceBytesPerSec = 0;  // bytes of output per second of dst = a + b (float32)
  // How many times longer process_vm_readv/writev take than memcpy to move the same tiles between
  // a large buffer and a cache-sized one (the one pass's staging, measured on this process's own
  // memory: the same kernel path as a peer's). 0: not measured (the calls are refused here).
  double cmaSlowdown = 0;
};

// Measured on first call (thread-safe); later calls return the same values.
const KernelSpeeds& localKernelSpeeds();

}  // namespace loom
