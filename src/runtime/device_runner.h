// Calls on CUDA device memory, and calls enqueued on a CUDA stream, for one communicator.
//
// Semantics (NCCL's, include/loom/loom.h): a call (or a group) with a stream is enqueued and
// returns at once; it starts when the work before it on that stream is done, and the work after
// it waits for it. A call on device memory with a NULL stream is done when it returns. A failed or
// aborted communicator, or one destroyed with calls pending, still releases every stream waiting
// on it (src/device/stream_signal.h); the failure is the communicator's error
// (loomCommGetAsyncError).
//
// How: the communicator's runner thread takes the calls in issue order. For a call on a stream it
// waits until the stream reaches it (no deadline: the work before it may be long; an abort ends
// the wait), then runs it, then releases the stream. The device buffers of a call are staged
// through pinned host memory: the inputs are copied to the host by the device's copy engines on
// Loom's own stream, the call runs on the host path (dispatch, the executor, the transports), and
// the outputs are copied back. Every transport and path works this way. A call larger than
// LOOM_DEVICE_STAGE_CHUNK is pipelined: it runs as a sequence of host calls on chunks of its rows
// (every rank chunks it alike, from what every rank knows of the call), through a ring of pinned
// slots, so the copy of chunk j+1 to the host, chunk j's host collective and the copy of chunk j-1
// back proceed at once (two streams: the copy engines of both directions). Where every rank
// shares the host, on one GPU or GPUs that reach each other peer to peer, one call at a time skips
// the staging: the one pass over the peers' device buffers (src/runtime/device_one_pass.h).
// Between hosts with GPUDirect RDMA (Comm::deviceSchedule) calls run on the schedule itself, the
// network reading and writing the device buffers (runOnSchedule). The rest is staged (groups
// whole).
//
// Calls made on a stream that is being captured into a CUDA graph are kept for the graph's
// replays, as NCCL's are (its persistent plans): the capture records a host function and a wait on
// the stream (src/device/stream_signal.h's memory operations or wait kernel, on a word of the
// kept call's own). Each time the graph reaches the call, the host function admits it to the
// runner; the runner runs it ahead of every call still waiting for its stream to reach it (on
// one stream those are behind it) and writes the word, and the graph goes on. What the call
// needs (its staging reservation, its buffers' registrations and IPC handles) is made at capture,
// on the capturing thread; the kept call lives as long as the graph does (a CUDA user object the
// graph owns). A graph replayed after its communicator is gone does nothing and is not blocked
// (a warning says so). Between processes a replay that finds the peers' buffers unopened is
// staged, and the runner's opener thread opens them for the next one. One stream per captured
// call or group; two launches of one graph at once (two executable graphs of it on different
// streams) fail the communicator, as their calls would have no order.
//
// Threads: once a communicator has a runner, every call on it runs on the runner thread (the
// calling thread waits for a call without a stream), so one thread drives the communicator as the
// executor requires. submit() follows the API's one-thread-per-communicator rule.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "src/core/status.h"
#include "src/device/cuda_driver.h"
#include "src/device/stream_signal.h"
#include "src/runtime/device_one_pass.h"
#include "src/runtime/executor.h"

namespace loom {

class Comm;

class DeviceRunner {
 public:
  // The runner of comm on CUDA device `device` (its primary context), with its thread started.
  static Result<std::unique_ptr<DeviceRunner>> create(Comm* comm, int device);
  // Stops the thread: calls still pending fail with the communicator's error (or "destroyed with
  // calls pending") and their streams are released. A stream that has not yet reached its last
  // call (the user's own work before it is still running) reads the signal's words later: they
  // are kept, and freed by a later runner's creation or destruction once the stream is past them.
  ~DeviceRunner();
  DeviceRunner(const DeviceRunner&) = delete;
  DeviceRunner& operator=(const DeviceRunner&) = delete;

  int device() const { return device_; }
  // Loom's own stream on the device (the staging copies, the one pass, the executor's device
  // work on the schedule path).
  cuda::CUstream workStream() const { return stream_; }
  // Device memory for the executor's scratch and staging on the schedule path (runner thread):
  // post() reserves what a job's calls should need (reserveStaging); a schedule that needs more
  // grows it here, on the runner (the hazard reserveStaging describes). What it outgrows is kept
  // until the runner goes (cuMemFree waits for the whole device, which may be waiting for this
  // very call).
  Result<char*> deviceScratch(size_t bytes);

  // Reserves now, on the calling thread, the pinned staging memory that any single call of this
  // communicator needs (LOOM_DEVICE_STAGE_CHUNK bounds it: about 6 chunks; nothing where calls
  // are staged whole or run on the schedule), so that none of its calls allocates: for a
  // communicator bound to its device at init (loomConfig_t.cudaDev) with other ranks in this
  // process. The driver's allocations wait while another thread is blocked in a copy to pageable
  // memory, which may wait for a call of this rank. A group that needs more grows it when posted.
  Status reserveAhead();

  struct Job;
  // A call (or group) captured into a CUDA graph, kept for its replays (device_runner.cc).
  struct Kept;
  // The runner as the kept calls' host functions and destructors reach it: outlives it.
  struct Port;
  // Queues calls (one call, or a group's calls on this communicator) in issue order, with the
  // distinct user streams of the calls (none: the caller waits with wait()). With streams, the
  // calls are enqueued on them when this returns.
  Result<std::shared_ptr<Job>> post(std::vector<QueuedOp> calls,
                                    std::vector<cuda::CUstream> streams);
  // Waits until a posted job without streams is complete; its status.
  Status wait(const std::shared_ptr<Job>& job);
  // Waits until every call posted so far is complete (for calls that read or change what the
  // runner thread uses: loomCommSetAlgo, loomCommPlanInfo, loomCommSplit).
  Status drain() { return submit({}, {}); }
  // post, then wait when there are no streams.
  Status submit(std::vector<QueuedOp> calls, std::vector<cuda::CUstream> streams) {
    LOOM_ASSIGN(std::shared_ptr<Job> job, post(std::move(calls), std::move(streams)));
    return wait(job);
  }

  // Where a call's device buffers go in the pinned staging memory: in place, the whole buffer the
  // input lives in (it holds both); out of place, the input (read) and the output (written in
  // full). Pipelined (chunks >= 2): chunk j of every row (the input has inRows rows, the output
  // outRows, each the call's count elements long: 1 row for AllReduce, Broadcast and Reduce, nranks
  // rows for the AllGather output, the ReduceScatter input and both AllToAll buffers) goes through
  // slot j % kSlots, which holds the rows' chunks back to back (inSlot bytes, then outSlot bytes).
  struct StagePlan {
    size_t inOff = 0, inBytes = 0, outOff = 0, outBytes = 0;
    bool stageIn = false, stageOut = false, whole = false;
    size_t chunks = 0, chunkElems = 0, inSlot = 0, outSlot = 0;
    int inRows = 1, outRows = 1;
  };
  static constexpr size_t kSlots = 3;  // chunk j+1 in, chunk j on the host, chunk j-1 out
  // Whether call (alone in its job) is pipelined in chunks of about chunkBytes among n ranks, and
  // its plan if so: from the call's collective, count, datatype and n only, so every rank cuts it
  // alike.
  static bool pipelineOf(const QueuedOp& call, int n, size_t chunkBytes, StagePlan* plan);

  struct Job {
    std::vector<QueuedOp> calls;
    std::vector<cuda::CUstream> streams;
    uint64_t seq = 0;              // on streams: the signal's sequence number; 0: a caller waits
    std::vector<StagePlan> plans;  // one per call, made with the reservation (post)
    DeviceOnePass::Exported exported;  // a single call's buffers' IPC handles (post)
    // The transport's registrations of the call's device buffers on the schedule path, made by
    // post and released by the posting thread once the job is finished (holdRegistrations).
    std::vector<void*> holds;
    char* staging = nullptr;  // pinned memory reserved for the staging copies
    size_t stagingBytes = 0;
    Kept* kept = nullptr;  // a graph's replay of a kept call: released through its word
    Status refused;        // why the runner fails the communicator instead of running it
    bool finished = false;
    Status status;
  };

 private:
  DeviceRunner(Comm* comm, int device) : comm_(comm), device_(device) {}
  void loop();
  Status run(Job& job);
  // The calls of a job on device memory straight on the schedule path (GPUDirect RDMA: the
  // network reads and writes the device buffers; Comm::deviceSchedule).
  Status runOnSchedule(const Job& job);
  // q's algorithm as dispatch decides it with its buffers' kinds (device memory: the schedule).
  Status decideOnSchedule(QueuedOp* q, bool grouped);
  // A call whose plan is pipelined (plan.chunks >= 2), through the slots at host.
  Status runPipelined(const QueuedOp& call, const StagePlan& plan, char* host);
  // Pinned host memory for a job's staging (job->staging), grown as needed and reused, on the
  // calling thread: never on the runner thread, where a user's stream may wait for the running
  // job. The real driver's allocations take a lock that a blocking call of another thread may
  // hold while it waits for that stream (a copy to pageable memory), and cuMemFreeHost waits for
  // the whole device: either deadlocks there (seen on an H200). Nothing is freed before the runner
  // goes. On the schedule path (GPUDirect RDMA) it reserves the device scratch instead.
  Status reserveStaging(Job* job);
  // Makes the staging buffer at least need bytes (growing it geometrically); the calling thread.
  Status growStaging(size_t need);
  // Makes the device scratch at least bytes (geometrically); post's thread or the runner's.
  Status growScratch(size_t bytes);
  void finish(Job* job, Status st);
  // Runs a job the runner has taken (st: why it may not run), then finishes it.
  void execute(Job* job, Status st);
  // post's path for a job on a stream being captured: keeps it for the graph's replays.
  Status capture(Job* job);
  // A graph reached kept call k: queues a replay of it (a host function, under the port's lock).
  void admit(Kept* k);
  // Queues a job that fails the communicator with why, on the runner thread (a host function's:
  // it may not block on the network, nor touch the connections the runner uses).
  void admitFailure(Status why);
  // Releases what kept calls whose graphs are gone held (the posting thread).
  void reapKept();
  // The host function a graph runs where a kept call was captured (a Kept*).
  static void onReplay(void* kept);
  // The destructor of a kept call's user object: its graph and executable graphs are gone.
  static void onGraphGone(void* kept);
  // The user's streams wait for the job (post).
  Status handOff(Job* job);
  // On the schedule path (GPUDirect RDMA), on the calling thread: registers with the network
  // transport the job's device buffers and the device scratch (net::Transport::holdMemory), so that
  // the runner's requests find them registered. Registering GPU memory exports it (the driver's
  // cuMemGetHandleForAddressRange), a call the runner must not make while a user's stream may
  // wait for it (reserveStaging says why); the registrations then stay cached for later calls.
  Status holdRegistrations(Job* job);
  void releaseHolds(Job* job);
  // Releases the holds of the jobs posted with some that have finished (the calling thread).
  void releaseFinishedHolds();

  Comm* comm_;
  int device_;
  std::unique_ptr<device::StreamSignal> signal_;
  // Recorded on the lead stream after each job's handoff: once it completes, no stream reads the
  // signal's words any more (they outlive the runner until then: see ~DeviceRunner).
  cuda::CUevent passed_ = nullptr;
  cuda::CUstream stream_ = nullptr;      // Loom's own stream: the staging copies, the one pass
  cuda::CUstream backStream_ = nullptr;  // pipelined calls' copies back to the device
  // Per slot of a pipelined call: its chunk is on the host (in), its chunk is back (out).
  cuda::CUevent inDone_[kSlots] = {}, outDone_[kSlots] = {};
  size_t stageChunk_ = 0;  // LOOM_DEVICE_STAGE_CHUNK (0: calls are staged whole)
  std::unique_ptr<DeviceOnePass> onePass_;
  char* pinned_ = nullptr;  // the staging buffer new jobs get (reserveStaging)
  size_t pinnedBytes_ = 0;
  std::vector<char*> outgrown_;    // earlier staging buffers, freed with the runner
  std::mutex scratchMu_;           // the three below: grown by post's thread and the runner
  cuda::CUdeviceptr scratch_ = 0;  // deviceScratch's
  size_t scratchBytes_ = 0;
  std::vector<cuda::CUdeviceptr> outgrownScratch_;
  cuda::CUdeviceptr scratchHeldAt_ = 0;  // the scratch scratchHold_ registers (posting thread)
  void* scratchHold_ = nullptr;
  std::deque<std::shared_ptr<Job>> holding_;  // posted jobs with holds, in order (posting thread)
  uint64_t nextSeq_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> jobs_;
  std::deque<std::shared_ptr<Job>> replays_;  // admitted by graphs: run before jobs_
  bool stop_ = false;
  std::shared_ptr<Port> port_;
  // The opener: a thread that opens the peers' IPC handles that kept calls' replays found
  // unopened (DeviceOnePass::prepare), since replays make no post to open them; started by the
  // first capture on a communicator that may take the one pass.
  void openerLoop();
  std::thread opener_;
  std::atomic<bool> openerStarted_{false};
  std::mutex openMu_;
  std::condition_variable openCv_;
  bool openWanted_ = false, openStop_ = false;  // under openMu_
  std::thread thread_;
};

}  // namespace loom
