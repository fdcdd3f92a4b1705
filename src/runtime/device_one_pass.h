// The one pass over the peers' CUDA device buffers, for calls of a communicator whose ranks all
// share a host, on one GPU or on GPUs that reach each other peer to peer (NVLink or PCIe: the
// driver's cuDeviceCanAccessPeer, and the topology's NCCL rule of a path of PXB or better where it
// knows the GPUs; LOOM_DEVICE_P2P=0 stages them): no host staging, no messages. Each rank reaches
// every rank's buffers (threads of one process by address, with peer access turned on towards
// other GPUs; other processes through CUDA IPC handles, opened once (on the thread that posts
// calls) and cached, with lazy peer access) and does its share with Loom's reduction kernels and
// the copy engines on the runner's stream: an AllReduce rank reduces its slice of every input in
// rank order and writes the result into every output; ReduceScatter and Reduce reduce a slice;
// AllGather, AllToAll push their blocks; Broadcast pulls the root's buffer. The bytes cross the
// GPU's memory once.
//
// Rounds of the host's low-latency exchange frame it, as the host one pass
// (src/runtime/one_pass.h): the first publishes each rank's buffers and whether it can take this
// path (every buffer it uses is device memory of the shared GPU that its peers can reach), and
// every rank decides from the same records, so all run it or all fall back to staging; between
// processes the second publishes the IPC handles and a third says whether each rank has every
// peer's handle open already (the runner thread opens nothing: a call that finds one unopened is
// staged on every rank, and the next call's post opens it on the calling thread: prepare()); the
// last says every rank is done, so no rank returns (and lets its stream go on to reuse its
// buffers) while a peer still reads or writes them.
//
// With GPUs that differ, the second round (always held then) also says whether each rank reaches
// every other GPU; if one does not, all stage. A rank's result (AllReduce) or block (AllGather)
// goes to the outputs either by Loom's kernels, one launch storing it into every output, or by the
// copy engines, one copy per output after the reduction into its own: whichever the cost model
// prices lower with the device's measured speeds (src/runtime/device_plan.h), or the one
// LOOM_DEVICE_ONE_PASS_COPIES names. Each rank chooses for its own share: either way gives the same
// bytes, so ranks need not agree.
//
// Not yet: groups of calls and Send/Recv: those are staged (src/runtime/device_runner.h).
// LOOM_DEVICE_ONE_PASS=0 turns it off.
//
// Threads: the communicator's runner thread, but prepare() (the thread that posts calls, and the
// runner's opener thread).
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "src/core/status.h"
#include "src/device/cuda_driver.h"
#include "src/device/device_speeds.h"
#include "src/runtime/device_plan.h"
#include "src/runtime/executor.h"
#include "topology/paths.h"

namespace loom {

class Comm;

class DeviceOnePass {
 public:
  // For comm's calls on CUDA device `device` (its primary context current on the calling thread),
  // enqueued on stream.
  DeviceOnePass(Comm* comm, int device, cuda::CUstream stream);
  // Closes the IPC mappings it opened.
  ~DeviceOnePass();
  DeviceOnePass(const DeviceOnePass&) = delete;
  DeviceOnePass& operator=(const DeviceOnePass&) = delete;

  // Whether the call tries the one pass: a call on device memory of a shape the one pass takes,
  // on a communicator where it may run. The same answer on every rank when every rank passes
  // device memory (loom.h requires one kind per call).
  bool tries(const QueuedOp& call) const;
  // Whether it may run at all here (one host, shared memory between the ranks, the parameter).
  bool usable() const { return usable_; }
  // What a call's own device buffers are to the other processes: the IPC handles of their
  // allocations and the offsets into them; ok false for a buffer that is not IPC-capable memory
  // (a VMM mapping, say: the call is staged). Found when the call is posted, on the calling
  // thread (exportBuffers), so that the runner asks the driver for no handle either.
  struct Exported {
    bool inOk = false, outOk = false;
    cuda::CUipcMemHandle in{}, out{};
    uint64_t inOff = 0, outOff = 0;
  };
  Exported exportBuffers(const QueuedOp& call) const;
  // Runs call in one pass when every rank can; *ran false when some rank cannot (nothing happened
  // on any rank: the caller stages). mine: exportBuffers(call), made when it was posted. On
  // failure the communicator is marked failed. Runner thread only.
  Status run(const QueuedOp& call, const Exported& mine, bool* ran);

  // On the thread that posts calls (DeviceRunner::post), never on the runner: opens the peers' IPC
  // handles that calls found unopened, and closes the mappings beyond the cache's size. The
  // runner thread maps nothing: a user's stream may wait for the call it runs, and the real
  // driver's mapping calls take a lock that a thread blocked in a copy to pageable memory holds
  // while its stream waits (NCCL opens peers' buffers at enqueue or connection time too, and
  // closes legacy IPC mappings only once its streams are synchronized). Also on the runner's
  // opener thread, for calls kept for CUDA graphs (whose replays make no post): one prepare at a
  // time; one called while another runs returns at once (that one opens what is wanted).
  void prepare();
  // Whether a call found peers' handles unopened that prepare() has not yet taken.
  bool wanting() {
    std::lock_guard<std::mutex> lk(mapsMu_);
    return !wanted_.empty();
  }

 private:
  // A peer's allocation opened in this process: its base here, by (pid, handle); busy while a
  // call of the runner uses it (prepare closes only idle ones).
  struct Mapping {
    uint32_t pid;
    cuda::CUipcMemHandle handle;
    cuda::CUdeviceptr base;
    int busy;
  };
  struct Wanted {
    uint32_t pid;
    cuda::CUipcMemHandle handle;
  };
  // The base of (pid, handle)'s mapping, marked busy (and appended to *held), or 0 where it is not
  // open yet: then it is wanted, and the next prepare() opens it. Runner thread.
  cuda::CUdeviceptr lookup(uint32_t pid, const cuda::CUipcMemHandle& handle,
                           std::vector<cuda::CUdeviceptr>* held);
  // Marks the mappings lookup() returned idle again.
  void release(const std::vector<cuda::CUdeviceptr>& held);
  // Whether device `peer` (bus id peerBus) may be reached from this one peer to peer:
  // LOOM_DEVICE_P2P, the driver's answer (cuDeviceCanAccessPeer) and the topology's where it knows
  // both GPUs (a path of PXB or better).
  bool peerAllowed(cuda::CUdevice peer, const std::string& peerBus);
  // Turns peer access on from this device's context to every device peerAllowed (peersOn_).
  void enablePeers();
  // Whether this rank's GPU reaches the GPUs of the other n records (Record) peer to peer: those
  // of this process's ranks through peersOn_, those of other processes peerAllowed.
  bool reachPeers(const void* records, int n, uint32_t myPid);
  // How this rank writes the outputs of op (sameGpu: every rank on this GPU).
  OnePassCopies copiesFor(const OpArgs& op, bool sameGpu);
  // The device's measured speeds (a few milliseconds of copies and kernels on the device, on a
  // stream of their own, once per device and process, when the runner starts); null where they
  // could not be measured.
  const device::DeviceSpeeds* speeds();
  // Whether this rank's plan (planDeviceCall, as --plan shows it) prices the one pass of op no
  // higher than staging it as the runner would; yes where it cannot price. LOOM_DEVICE_ONE_PASS=2:
  // yes. Every rank publishes its answer in the
  // first round, and all stage unless every one says yes.
  bool plannedHere(const OpArgs& op);

  Comm* comm_;
  int device_;
  cuda::CUstream stream_;
  uint64_t gpuKey_ = 0;    // a hash of this GPU's PCI bus id (0: unknown)
  std::string bus_;        // that bus id
  std::set<int> peersOn_;  // devices this context has peer access to (cuCtxEnablePeerAccess)
  std::unique_ptr<topo::Paths> paths_;  // of this host's topology, made on first need
  bool usable_ = false;          // a shared host area whose exchange buffers hold the handles
  bool kernels_ = false;         // Loom's kernels load on this GPU
  device::DeviceSpeeds speeds_;  // speeds(), once measured
  bool speedsTried_ = false, speedsOk_ = false;
  std::mutex prepareMu_;        // held by the one prepare() running
  std::mutex mapsMu_;           // maps_, wanted_, opening_, unopenable_: no driver call under it
  std::list<Mapping> maps_;     // most recent first; at most kMaxMappings idle ones after prepare()
  std::vector<Wanted> wanted_;  // for prepare() to open
  std::vector<Wanted> opening_;    // what prepare() is opening now (not wanted again meanwhile)
  std::deque<Wanted> unopenable_;  // opens that failed (the last kMaxMappings): not asked again
};

}  // namespace loom
