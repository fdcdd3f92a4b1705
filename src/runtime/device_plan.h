// What a call on CUDA device memory would run and what it would cost (loomCommPlanInfoDevice,
// loom-perf --plan --mem device): the cost model priced with the device's measured speeds
// (src/device/device_speeds.h) beside the host schedule's price.
//
// The device paths (src/runtime/device_runner.h):
//   - one-pass: every rank of one host on one GPU: each reduces or copies its slice straight from
//     its peers' device buffers. Two ways, priced apart, the cheaper taken (or the one
//     LOOM_DEVICE_ONE_PASS_COPIES names): kernels (one launch of Loom's kernel reads the slice of
//     every input and stores the result into every output; AllGather's block goes to every output
//     by one launch) or engines (the reduction into its own output, then a copy engine copy per
//     other output). Its price: the bytes all ranks move through the GPU's memory (they share it),
//     kernels at the measured kernel speed and copies at the measured copy speed, an operation's
//     cost per launch and copy, and the host exchange's three flag rounds.
//   - staged whole: the input copied to pinned host memory, the host schedule, the output copied
//     back, one after the other.
//   - staged pipelined (LOOM_DEVICE_STAGE_CHUNK): the same in chunks, the three overlapping: the
//     first chunk's copy in, then the slowest of the three per chunk for the others, then the last
//     chunk's host call and copy back.
// The one pass is priced where it can run: all ranks on this host, LOOM_DEVICE_ONE_PASS on, a
// collective it takes, and every rank on one GPU (a host with one GPU), or, with several, one GPU
// per rank (NCCL's habit) where they all reach each other peer to peer (LOOM_DEVICE_P2P): then by
// the bytes each rank moves between GPUs at the measured peer speed.
//
// Threads: the communicator's calling thread (as loomCommPlanInfo).
#pragma once

#include <string>
#include <vector>

#include "src/core/status.h"
#include "src/device/device_speeds.h"
#include "src/runtime/dispatch.h"
#include "topology/graph.h"

namespace loom {

class Comm;

// How the device one pass writes the outputs it fills.
enum class OnePassCopies { kKernels, kEngines };
const char* onePassCopiesName(OnePassCopies how);

struct DevicePlan {
  std::string path;        // "device-gdr", "device-one-pass", "device-pipelined" or "device-staged"
  std::string algorithm;   // "direct" on the one pass; else the host schedule's (the whole call's)
  double seconds = -1;     // the chosen path's price
  double onePassSec = -1;  // < 0: the one pass cannot run, or is not priced
  double onePassKernelsSec = -1, onePassEnginesSec = -1;  // each way of it
  OnePassCopies copies = OnePassCopies::kKernels;         // the way onePassSec is
  double wholeSec = -1;                                   // staged whole
  double pipelinedSec = -1;  // staged in chunks (< 0: the call is one chunk, or chunking is off)
  double gdrSec = -1;        // on the schedule with GPUDirect RDMA (Comm::deviceSchedule)
  double hostSec = -1;       // the host schedule of the whole call alone
  Decision host;             // the host decision for the whole call
};

// The GPUs the plan prices the one pass of call among (1: one GPU; n: rank i on device i, which
// reach each other peer to peer), or 0 where it does not: LOOM_DEVICE_ONE_PASS off, ranks of
// several hosts, a collective it does not take, GPUs without peer to peer (LOOM_DEVICE_P2P).
int onePassGpus(Comm* cm, const CallShape& call);

// The plan of call (device buffers on every rank) on cm, priced with speeds: GPUDirect RDMA where
// the communicator runs device schedules; else the one pass where it costs no more than staging
// as the runner stages (or LOOM_DEVICE_ONE_PASS=2), else staged. gpus: onePassGpus(cm, call)
// where the caller has it (-1: asked here; it queries the driver).
Result<DevicePlan> planDeviceCall(Comm* cm, const CallShape& call,
                                  const device::DeviceSpeeds& speeds, int gpus = -1);

// The price of the one pass of call among n ranks sharing one GPU with speeds, its outputs
// written `how`; intraAlphaSec is a flag round's cost. < 0 for a collective it does not take, or
// without the speeds it needs. Pure.
double deviceOnePassSeconds(const CallShape& call, int n, const device::DeviceSpeeds& speeds,
                            double intraAlphaSec, OnePassCopies how);

// The same among n ranks on n GPUs that reach each other peer to peer: the busiest rank's bytes to
// and from other GPUs at speeds.peerBytesPerSec (either way), and its operations. < 0 without that
// speed. Pure. (planDeviceCall's peer speed: the measured one, bounded by the topology's
// narrowest path between the ranks' GPUs where the host's topology knows them, or that path alone
// where nothing was measured.)
double devicePeerOnePassSeconds(const CallShape& call, int n, const device::DeviceSpeeds& speeds,
                                double intraAlphaSec, OnePassCopies how);

// The narrowest path between any two of the GPUs with these PCI bus ids in graph (NVLink or PCIe,
// as NCCL rates them), in bytes per second; 0 where the graph does not know every one. Pure.
double topologyPeerBytesPerSec(const topo::Graph& graph, const std::vector<std::string>& busIds);

// The way the one pass takes: LOOM_DEVICE_ONE_PASS_COPIES where it names one, else the lower of
// the two prices (the engines on a tie, or where neither is priced: they leave the GPU's cores to
// the user's kernels).
OnePassCopies chooseOnePassCopies(double kernelsSec, double enginesSec);

// Staged: the copy of `in` bytes to the host and of `out` bytes back (rows copies each way), around
// a host call of hostSec. Pure.
double stagedSeconds(double in, double out, int rows, double hostSec,
                     const device::DeviceSpeeds& speeds);

}  // namespace loom
