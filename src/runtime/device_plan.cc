#include "src/runtime/device_plan.h"

#include <algorithm>
#include <cmath>

#include "src/core/dtype.h"
#include "src/core/params.h"
#include "src/device/cuda_driver.h"
#include "src/device/kernels/reduce_math.h"
#include "src/runtime/comm.h"
#include "src/runtime/device_runner.h"

namespace loom {

namespace {

double rate(double bytes, double perSec) { return perSec > 0 ? bytes / perSec : 0; }

// The host decision's price for call, whichever path it takes (the low-latency exchange's or the
// schedule's).
Result<double> hostSeconds(Comm* cm, const CallShape& call, Decision* keep) {
  LOOM_ASSIGN(Decision d, cm->decide(call, /*explain=*/true));
  const double s = d.predictedSec >= 0 ? d.predictedSec : d.scheduleSec;
  if (keep) *keep = std::move(d);
  return s;
}

// Whether devices 0..k-1 reach each other peer to peer (the driver's answer).
bool peersReachAll(int k) {
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  if (!api.cuDeviceCanAccessPeer) return false;
  for (int a = 0; a < k; ++a)
    for (int b = 0; b < k; ++b) {
      int can = 0;
      if (a != b && (api.cuDeviceCanAccessPeer(&can, a, b) != cuda::kSuccess || !can)) return false;
    }
  return true;
}

}  // namespace

double devicePeerOnePassSeconds(const CallShape& call, int n, const device::DeviceSpeeds& sp,
                                double intraAlphaSec) {
  if (sp.peerBytesPerSec <= 0) return -1;
  const double es = static_cast<double>(dataTypeSize(call.dtype));
  const double dn = static_cast<double>(n), c = static_cast<double>(call.count);
  const double slice = std::ceil(c / dn) * es;
  // The bytes the busiest rank moves to or from other GPUs, and the operations it enqueues.
  double remote = 0, ops = 1;
  switch (call.coll) {
    case CollKind::kAllReduce:  // reads n - 1 peers' slices, writes its result to n - 1 outputs
      remote = 2 * (dn - 1) * slice;
      ops = dn;
      break;
    case CollKind::kReduce:
      remote = dn * slice;
      break;
    case CollKind::kReduceScatter:
      remote = (dn - 1) * c * es;
      break;
    case CollKind::kAllGather:
    case CollKind::kAllToAll:
      remote = (dn - 1) * c * es;
      ops = dn;
      break;
    case CollKind::kBroadcast:
      remote = c * es;
      break;
    default:
      return -1;
  }
  return remote / sp.peerBytesPerSec + ops * sp.launchSec + 3 * intraAlphaSec;
}

double deviceOnePassSeconds(const CallShape& call, int n, const device::DeviceSpeeds& sp,
                            double intraAlphaSec) {
  if (sp.copyBytesPerSec <= 0) return -1;
  const double es = static_cast<double>(dataTypeSize(call.dtype));
  const double dn = static_cast<double>(n), c = static_cast<double>(call.count);
  const double b = c * es;
  // The bytes all ranks read plus write in the GPU's memory, and the operations they enqueue
  // (per rank: a reduction kernel, or copies).
  double traffic = 0, ops = 1;
  switch (call.coll) {
    case CollKind::kAllReduce:  // reduce n slices into one, then copy it to n - 1 outputs
      traffic = (dn + 1) * b + 2 * (dn - 1) * b;
      ops = dn;
      break;
    case CollKind::kReduce:
      traffic = (dn + 1) * b;
      break;
    case CollKind::kReduceScatter:
      traffic = dn * (dn + 1) * b;
      break;
    case CollKind::kAllGather:  // each rank copies its block to every output
    case CollKind::kAllToAll:
      traffic = 2 * dn * dn * b;
      ops = dn;
      break;
    case CollKind::kBroadcast:
      traffic = 2 * b;  // each rank copies the root's buffer into its own
      break;
    default:
      return -1;
  }
  return traffic / (2 * sp.copyBytesPerSec) + ops * sp.launchSec + 3 * intraAlphaSec;
}

double stagedSeconds(double in, double out, int rows, double hostSec,
                     const device::DeviceSpeeds& sp) {
  const double r = static_cast<double>(rows);
  return rate(in, sp.toHostBytesPerSec) + r * sp.launchSec + hostSec +
         rate(out, sp.toDeviceBytesPerSec) + r * sp.launchSec;
}

Result<DevicePlan> planDeviceCall(Comm* cm, const CallShape& call, const device::DeviceSpeeds& sp) {
  DevicePlan p;
  const int n = cm->nranks();
  const double es = static_cast<double>(dataTypeSize(call.dtype));
  const CollCounts counts = collCounts(call.coll, call.count, n);
  LOOM_ASSIGN(p.hostSec, hostSeconds(cm, call, &p.host));
  p.algorithm = p.host.algorithm;
  const double in = static_cast<double>(counts.input) * es;
  const double out = static_cast<double>(counts.output) * es;
  p.wholeSec = stagedSeconds(in, out, 1, p.hostSec, sp);

  // Pipelined, cut as the runner cuts it.
  QueuedOp q;
  q.args.coll = call.coll;
  q.args.count = call.count;
  q.args.dtype = call.dtype;
  q.inDevice = q.outDevice = true;
  DeviceRunner::StagePlan sp2;
  const size_t chunkBytes =
      static_cast<size_t>(std::max<int64_t>(0, params::kDeviceStageChunk.asInt()));
  if (DeviceRunner::pipelineOf(q, n, chunkBytes, &sp2)) {
    CallShape chunk = call;
    chunk.count = sp2.chunkElems;
    LOOM_ASSIGN(double h, hostSeconds(cm, chunk, nullptr));
    const double ci =
        stagedSeconds(static_cast<double>(sp2.inRows * sp2.chunkElems) * es, 0, sp2.inRows, 0, sp);
    const double co = stagedSeconds(0, static_cast<double>(sp2.outRows * sp2.chunkElems) * es,
                                    sp2.outRows, 0, sp);
    const double k = static_cast<double>(sp2.chunks);
    p.pipelinedSec = ci + h + co + (k - 1) * std::max({ci, h, co});
  }

  // The one pass, where it can run: LOOM_DEVICE_ONE_PASS, ranks of this host only, a collective
  // it takes; one GPU, or GPUs that reach each other (LOOM_DEVICE_P2P; not priced without the
  // measured speed between them).
  int gpus = 0;
  const cuda::Driver& drv = cuda::cudaDriver();
  if (drv.ok()) drv.api.cuDeviceGetCount(&gpus);
  const double alpha = cm->planner() ? cm->planner()->machine().intra.alphaSec : 0;
  const bool onePass = params::kDeviceOnePass.asBool() && n >= 2 && cm->allLocal() &&
                       n <= devk::kMaxReduceInputs &&
                       !(call.coll == CollKind::kAllToAll && call.inPlace);
  if (onePass && gpus == 1)
    p.onePassSec = deviceOnePassSeconds(call, n, sp, alpha);
  else if (onePass && params::kDeviceP2p.asBool() && peersReachAll(std::min(n, gpus)))
    p.onePassSec = devicePeerOnePassSeconds(call, n, sp, alpha);

  if (cm->deviceSchedule()) {
    // GPUDirect RDMA: the schedule itself on the device buffers; priced as the host schedule (the
    // network's bytes are the same; the kernels' reductions are not priced apart).
    p.gdrSec = p.hostSec;
  }
  if (p.gdrSec >= 0) {
    p.path = "device-gdr";
    p.seconds = p.gdrSec;
  } else if (p.onePassSec >= 0) {
    p.path = "device-one-pass";
    p.algorithm = "direct";
    p.seconds = p.onePassSec;
  } else if (p.pipelinedSec >= 0) {
    p.path = "device-pipelined";
    p.seconds = p.pipelinedSec;
  } else {
    p.path = "device-staged";
    p.seconds = p.wholeSec;
  }
  return p;
}

}  // namespace loom
