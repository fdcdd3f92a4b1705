// loom_torch: Loom as a torch.distributed backend (c10d::Backend over Loom's C API only).
//
// One Loom communicator per process group, made in the constructor from a unique id that rank 0
// publishes through the group's Store (so torchrun, mp.spawn and init_method="tcp://..." work
// unchanged). Every operation is queued to one worker thread that owns the communicator (Loom's
// rule: calls on a communicator must not overlap) and returns a Work at once; the worker runs the
// Loom calls, then completes the Work and its Future (the output tensors, or the error). A
// blocking call (async_op=False) with nothing queued runs on the caller's thread instead, in the
// same order. Between startCoalescing and endCoalescing the operations are held and run as one
// Loom group.
//
// Tensors: CPU or CUDA, contiguous, every dtype Loom has (bool as uint8, complex as pairs of reals
// where the operation allows it); the tensors of one operation on one device, and every CUDA
// operation of a process group on one GPU (Loom's communicator drives one device).
//
// CUDA tensors run as ProcessGroupNCCL's do, on a stream of the backend's own: an operation
// records an event on the caller's current stream when it is made; the worker makes the backend's
// stream wait for it, enqueues the Loom calls (and any copies) on that stream and records a "done"
// event, and then the Work is complete on the host. wait() makes the caller's current stream wait
// for "done" without blocking the host; is_completed() is true once the GPU is past it; the Future
// is a CUDA future on the backend's stream. The tensors are marked as used on that stream for
// PyTorch's caching allocator. A Loom call that fails on the stream afterwards (a dead peer, an
// abort) fails the communicator (loomCommGetAsyncError): the next wait() or operation raises it.
#pragma once

#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "loom/loom.h"

namespace loom_torch {

// A tensor as Loom sees it: its data, element count and datatype.
struct Buf {
  void* ptr = nullptr;
  size_t count = 0;
  loomDataType_t type = loomFloat32;
};

// The communicator as the Works see it, for the failures that come after a CUDA operation was
// enqueued (loomCommGetAsyncError). The backend clears it before destroying the communicator.
struct CommRef {
  std::mutex mu;
  loomComm_t comm = nullptr;
  // Throws DistBackendError with Loom's message if the communicator has failed.
  void throwIfFailed(const char* what);
};

// A queued operation's Work: completed by the worker, with a Future of the output tensors.
class LoomWork : public c10d::Work {
 public:
  LoomWork(int rank, c10d::OpType type, const char* title, std::vector<at::Tensor> outputs,
           c10::Device device, std::shared_ptr<CommRef> comm);

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  // Where the operation's tensors are (CPU for none).
  c10::Device device() const { return device_; }
  // CUDA: the host part is done and the GPU is past the operation's end.
  bool isCompleted() override;
  // CUDA: the caller's current stream waits for the operation (the host does not); a failure
  // recorded since is raised.
  bool wait(std::chrono::milliseconds timeout) override;
  void synchronize() override;
  // Worker, CUDA: the operation's end on the backend's stream (before complete()).
  void recordDone(const c10::Stream& stream);
  // Called once by the worker: the Future, then the Work, are done (exception: failed). A CUDA
  // operation's Future completes on the current stream (the worker holds the backend's).
  void complete(std::exception_ptr exception);

 private:
  std::vector<at::Tensor> outputs_;
  c10::Device device_;
  std::shared_ptr<CommRef> comm_;
  std::optional<c10::Event> done_;  // CUDA: set by the worker before complete()
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class LoomBackend : public c10d::Backend {
 public:
  // Collective over the group: rank 0 makes the unique id and sets it in store; every rank
  // joins. timeout is every wait's deadline (Loom's loomConfig_t.timeoutMs).
  LoomBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
              std::chrono::milliseconds timeout);
  ~LoomBackend() override;

  const std::string getBackendName() const override { return "loom"; }
  // Loom's own all_reduce (SUM, in place) of a CPU tensor on this group's communicator, called
  // here and now, around PyTorch's dispatch and this backend's queue: what the benchmark compares
  // torch.distributed.all_reduce with (loom_torch._C.direct_all_reduce). It runs after the
  // operations queued before it, as a blocking operation does.
  void directAllReduce(const at::Tensor& t);
  bool supportsCoalescing() const override { return true; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits,
                                               std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  // loomCommAbort (from any thread): the operation in flight and the queued ones fail at once; the
  // backend is dead.
  void abort() override;
  // Runs what is queued, then destroys the communicator.
  void shutdown() override;

 private:
  // One operation: `issue` makes the Loom calls (inside a group when coalescing), `finish` runs
  // after they completed (copies out of temporaries); then the Work completes. On CUDA both run
  // with the backend's stream current (Loom's calls take it as stream_), after the stream waited
  // for `ready` (the caller's stream when the operation was made); `tensors` are every tensor it
  // touches, marked as used on that stream.
  struct Op {
    std::function<void()> issue;
    std::function<void()> finish;
    c10::intrusive_ptr<LoomWork> work;  // its device() is the operation's
    std::shared_ptr<c10::Event> ready;
    std::vector<at::Tensor> tensors;
  };
  // Queues the operation, or, for a blocking call (sync: PyTorch waits on the Work at once) with
  // nothing queued or running, runs it on the calling thread: no handoff to the worker. Under
  // CUDA graph capture it runs on the calling thread after what was queued. inputs: the tensors
  // it reads (and temporaries) beside its outputs.
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const char* title,
                                         std::vector<at::Tensor> outputs,
                                         std::vector<at::Tensor> inputs, bool sync,
                                         std::function<void()> issue,
                                         std::function<void()> finish = nullptr);
  // The device of an operation's tensors (all on one; CUDA ones on this group's GPU).
  c10::Device opDevice(const std::vector<at::Tensor>& outputs,
                       const std::vector<at::Tensor>& inputs, const char* title);
  // The backend's stream on its GPU (made at the first CUDA operation).
  c10::Stream sideStream();
  // gather and scatter: the root's list of one tensor per rank, each like mine ("output" or
  // "input" tensors), checked; empty on the other ranks, which must pass none.
  std::vector<at::Tensor> rootList(const std::vector<std::vector<at::Tensor>>& lists,
                                   const at::Tensor& mine, int root, const char* op,
                                   const char* which);
  // One Loom group: toRoot (gather), the root receives every other rank's tensor of list and
  // the others send mine; else (scatter) the other way.
  void rootExchange(bool toRoot, const std::vector<at::Tensor>& list, const Buf& mine, int root,
                    const char* op);
  void run();  // the worker
  void runBatch(std::vector<Op>& ops);
  // Clears busy_ (which this thread set) and wakes whoever can go on now.
  void release();
  // Runs a batch this thread holds (busy_ set by it), then lets the next one go.
  void runHeld(std::vector<Op>& batch);
  // Waits until nothing is queued or running, then holds the backend (busy_) for this thread;
  // throws when it is shut down or aborted meanwhile.
  void holdWhenIdle(const char* title);
  // One Loom group: sends[r] to and recvs[r] from every other rank r (empty ones skipped).
  void exchange(const std::vector<Buf>& sends, const std::vector<Buf>& recvs,
                const char* op);  // on the worker: one op, or a coalesced group
  void stop(bool drain);

  loomComm_t comm_ = nullptr;
  std::shared_ptr<CommRef> ref_ = std::make_shared<CommRef>();
  loomStream_t stream_ = nullptr;    // the running batch's: the backend's CUDA stream, or none
  std::optional<c10::Device> gpu_;   // set by the first CUDA operation (under mu_)
  std::optional<c10::Stream> side_;  // the backend's stream on gpu_ (under mu_)
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::vector<Op>> queue_;  // each entry runs as one batch
  bool stopping_ = false;
  bool stopped_ = false;  // the communicator is destroyed or aborted, the worker joined
  bool busy_ = false;     // a batch runs (on the worker, or inline on a caller)
  int idleWaiters_ = 0;   // threads waiting for !busy_ (shutdown, holdWhenIdle)
  bool coalescing_ = false;
  std::vector<Op> coalesced_;
  std::thread worker_;
};

}  // namespace loom_torch
