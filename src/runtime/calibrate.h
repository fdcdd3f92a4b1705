// The speeds the cost model needs from this machine: memcpy and float32-sum reduction bandwidth of
// one core, measured once per process (a few milliseconds, at the first communicator's init).
// Ranks exchange them at init and every rank prices schedules with rank 0's, so that all derive
// the same plan even when their measurements differ.
#pragma once

namespace loom {

struct KernelSpeeds {
  double memcpyBytesPerSec = 0;  // bytes copied per second (each byte read once, written once)
  double reduceBytesPerSec = 0;  // bytes of output per second of dst = a + b (float32)
};

// Measured on first call (thread-safe); later calls return the same values.
const KernelSpeeds& localKernelSpeeds();

}  // namespace loom
