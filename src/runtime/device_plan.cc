#include "src/runtime/device_plan.h"

#include <algorithm>
#include <cmath>

#include "src/core/dtype.h"
#include "src/core/params.h"
#include "src/core/text.h"
#include "src/device/cuda_driver.h"
#include "src/device/kernels/reduce_math.h"
#include "src/runtime/comm.h"
#include "src/runtime/device_runner.h"
#include "topology/paths.h"

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

// The PCI bus ids of devices 0..k-1; none where the driver does not name one of them.
std::vector<std::string> busIdsOf(int k) {
  const cuda::DriverApi& api = cuda::cudaDriver().api;
  std::vector<std::string> ids;
  for (int d = 0; d < k; ++d) {
    char bus[64] = {};
    if (!api.cuDeviceGetPCIBusId || api.cuDeviceGetPCIBusId(bus, sizeof(bus), d) != cuda::kSuccess)
      return {};
    ids.push_back(bus);
  }
  return ids;
}

}  // namespace

const char* onePassCopiesName(OnePassCopies how) {
  return how == OnePassCopies::kKernels ? "kernels" : "engines";
}

double devicePeerOnePassSeconds(const CallShape& call, int n, const device::DeviceSpeeds& sp,
                                double intraAlphaSec, OnePassCopies how) {
  if (sp.peerBytesPerSec <= 0) return -1;
  const double es = static_cast<double>(dataTypeSize(call.dtype));
  const double dn = static_cast<double>(n), c = static_cast<double>(call.count);
  const double slice = std::ceil(c / dn) * es;
  const bool kernels = how == OnePassCopies::kKernels;
  // The bytes the busiest rank moves to or from other GPUs (the same either way), and the
  // operations it enqueues.
  double remote = 0, ops = 1;
  switch (call.coll) {
    case CollKind::kAllReduce:  // reads n - 1 peers' slices, writes its result to n - 1 outputs
      remote = 2 * (dn - 1) * slice;
      ops = kernels ? 1 : dn;
      break;
    case CollKind::kReduce:
      remote = dn * slice;
      break;
    case CollKind::kReduceScatter:
      remote = (dn - 1) * c * es;
      break;
    case CollKind::kAllGather:
      remote = (dn - 1) * c * es;
      ops = kernels ? 1 : dn;
      break;
    case CollKind::kAllToAll:  // a different block per output: an operation each, either way
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
                            double intraAlphaSec, OnePassCopies how) {
  // Traffic rates (bytes read plus written per second): a copy moves 2 bytes per byte copied, the
  // two-input reduction 3 per byte of output; a kernel with other input counts is taken to move
  // bytes at the same rate.
  const double copyRate = 2 * sp.copyBytesPerSec, kernelRate = 3 * sp.reduceBytesPerSec;
  if (copyRate <= 0 || kernelRate <= 0) return -1;
  const double es = static_cast<double>(dataTypeSize(call.dtype));
  const double dn = static_cast<double>(n), c = static_cast<double>(call.count);
  const double b = c * es;
  const bool kernels = how == OnePassCopies::kKernels;
  // The bytes all ranks read plus write in the GPU's memory by kernels and by copies, and the
  // operations each enqueues.
  double byKernel = 0, byCopy = 0, ops = 1;
  switch (call.coll) {
    case CollKind::kAllReduce:
      if (kernels) {  // each reads its slice of n inputs and stores it into n outputs
        byKernel = 2 * dn * b;
      } else {  // reduce n slices into its own output, then copy that to n - 1 outputs
        byKernel = (dn + 1) * b;
        byCopy = 2 * (dn - 1) * b;
        ops = dn;
      }
      break;
    case CollKind::kReduce:
      byKernel = (dn + 1) * b;
      break;
    case CollKind::kReduceScatter:
      byKernel = dn * (dn + 1) * b;
      break;
    case CollKind::kAllGather:
      if (kernels) {  // each reads its block once and stores it into n outputs
        byKernel = dn * (dn + 1) * b;
      } else {  // each copies its block to every output
        byCopy = 2 * dn * dn * b;
        ops = dn;
      }
      break;
    case CollKind::kAllToAll:  // a different block per output
      (kernels ? byKernel : byCopy) = 2 * dn * dn * b;
      ops = dn;
      break;
    case CollKind::kBroadcast:  // each rank copies the root's buffer into its own
      (kernels ? byKernel : byCopy) = 2 * dn * b;
      break;
    default:
      return -1;
  }
  return byKernel / kernelRate + byCopy / copyRate + ops * sp.launchSec + 3 * intraAlphaSec;
}

double topologyPeerBytesPerSec(const topo::Graph& graph, const std::vector<std::string>& busIds) {
  std::vector<int> nodes;
  for (const std::string& bus : busIds) {
    const int node = graph.findByBusId(asciiLower(bus));
    if (node < 0) return 0;
    nodes.push_back(node);
  }
  if (nodes.size() < 2) return 0;
  const topo::Paths paths = topo::Paths::compute(graph);
  double narrowest = -1;
  for (size_t a = 0; a < nodes.size(); ++a)
    for (size_t b = 0; b < nodes.size(); ++b) {
      if (a == b) continue;
      const topo::Path& p = paths.get(nodes[a], nodes[b]);
      if (p.type == topo::PathType::kDis || p.bw <= 0) return 0;
      const double bw = static_cast<double>(p.bw) * 1e9;
      if (narrowest < 0 || bw < narrowest) narrowest = bw;
    }
  return narrowest > 0 ? narrowest : 0;
}

OnePassCopies chooseOnePassCopies(double kernelsSec, double enginesSec) {
  // str() spells a valid choice as the choices do, whatever case the environment used.
  const std::string forced = params::kDeviceOnePassCopies.str();
  if (forced == "kernels") return OnePassCopies::kKernels;
  if (forced == "engines") return OnePassCopies::kEngines;
  if (kernelsSec >= 0 && (enginesSec < 0 || kernelsSec < enginesSec))
    return OnePassCopies::kKernels;
  return OnePassCopies::kEngines;
}

double stagedSeconds(double in, double out, int rows, double hostSec,
                     const device::DeviceSpeeds& sp) {
  const double r = static_cast<double>(rows);
  return rate(in, sp.toHostBytesPerSec) + r * sp.launchSec + hostSec +
         rate(out, sp.toDeviceBytesPerSec) + r * sp.launchSec;
}

int onePassGpus(Comm* cm, const CallShape& call) {
  // Where it can run: LOOM_DEVICE_ONE_PASS, ranks of this host only, a collective it takes; one
  // GPU, or GPUs that reach each other (LOOM_DEVICE_P2P).
  const int n = cm->nranks();
  int gpus = 0;
  const cuda::Driver& drv = cuda::cudaDriver();
  if (drv.ok()) drv.api.cuDeviceGetCount(&gpus);
  const bool onePass = params::kDeviceOnePass.asInt() != 0 && n >= 2 && cm->allLocal() &&
                       n <= devk::kMaxReduceInputs &&
                       !(call.coll == CollKind::kAllToAll && call.inPlace);
  if (!onePass || gpus < 1) return 0;
  if (gpus == 1 || (params::kDeviceP2p.asBool() && peersReachAll(std::min(n, gpus)))) return gpus;
  return 0;
}

Result<DevicePlan> planDeviceCall(Comm* cm, const CallShape& call, const device::DeviceSpeeds& sp,
                                  int gpus) {
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

  if (gpus < 0) gpus = onePassGpus(cm, call);
  const double alpha = cm->planner() ? cm->planner()->machine().intra.alphaSec : 0;
  auto price = gpus == 1 ? deviceOnePassSeconds : devicePeerOnePassSeconds;
  if (gpus > 0) {
    device::DeviceSpeeds at = sp;
    if (gpus > 1) {  // the links between the ranks' GPUs (one a rank: devices 0..n-1)
      const double topo = topologyPeerBytesPerSec(localTopology(), busIdsOf(std::min(n, gpus)));
      if (topo > 0)
        at.peerBytesPerSec = sp.peerBytesPerSec > 0 ? std::min(sp.peerBytesPerSec, topo) : topo;
    }
    p.onePassKernelsSec = price(call, n, at, alpha, OnePassCopies::kKernels);
    p.onePassEnginesSec = price(call, n, at, alpha, OnePassCopies::kEngines);
    p.copies = chooseOnePassCopies(p.onePassKernelsSec, p.onePassEnginesSec);
    p.onePassSec = p.copies == OnePassCopies::kKernels ? p.onePassKernelsSec : p.onePassEnginesSec;
  }

  if (cm->deviceSchedule()) {
    // GPUDirect RDMA: the schedule itself on the device buffers; priced as the host schedule (the
    // network's bytes are the same; the kernels' reductions are not priced apart).
    p.gdrSec = p.hostSec;
  }
  if (p.gdrSec >= 0) {
    p.path = "device-gdr";
    p.seconds = p.gdrSec;
    return p;
  }
  // Staged as the runner stages (in chunks wherever the call has several: LOOM_DEVICE_STAGE_CHUNK
  // decides that, not the price), unless the one pass costs no more.
  p.path = p.pipelinedSec >= 0 ? "device-pipelined" : "device-staged";
  p.seconds = p.pipelinedSec >= 0 ? p.pipelinedSec : p.wholeSec;
  const bool always = params::kDeviceOnePass.asInt() == 2;
  if (p.onePassSec >= 0 && (always || !(p.seconds >= 0 && p.seconds < p.onePassSec))) {
    p.path = "device-one-pass";
    p.algorithm = "direct";
    p.seconds = p.onePassSec;
  }
  return p;
}

}  // namespace loom
