// The speeds the cost model needs from a CUDA device: its copy engines to and from pinned host
// memory, a device-to-device copy and Loom's reduction kernel (two inputs to one output), measured
// once per device and process on the context current on the calling thread (a few milliseconds on
// a GPU: 8 MiB a transfer, the third quartile of a few runs, as calibrate.h's host speeds).
//
// Threads: any (measured under a lock, once per device).
#pragma once

#include "src/core/status.h"

namespace loom::device {

struct DeviceSpeeds {
  int device = -1;                 // the device measured (-1: none)
  double toHostBytesPerSec = 0;    // device to pinned host memory
  double toDeviceBytesPerSec = 0;  // pinned host memory to device
  double copyBytesPerSec = 0;      // device to device, bytes copied (each read once, written once)
  double reduceBytesPerSec = 0;    // bytes of output of dst = a + b (float32 sum) per second
  double launchSec = 0;            // an empty copy enqueued and waited for: the per-operation cost
  // Reading another GPU's memory into this one's over peer access (NVLink or PCIe), bytes per
  // second: measured from the next device where the driver says the two reach each other; 0:
  // one GPU, or no peer access.
  double peerBytesPerSec = 0;
};

// The speeds of the device of the context current on this thread (measured on first call for that
// device, then remembered). Errors: no current context, or what the driver refused while
// measuring (an allocation that does not fit, say).
Result<DeviceSpeeds> currentDeviceSpeeds();

}  // namespace loom::device
