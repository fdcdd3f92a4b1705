// Streams, events, and the handle tables of streams, events, modules and functions. Each stream is
// an ordered queue of operations that one worker thread runs after the call that enqueued them
// returned. Internal to libloom-fakecuda.so.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "src/device/kernels/reduce_math.h"
#include "tests/device/fake_cuda/state.h"

namespace fakecuda {

class Stream;
struct Graph;

// An operation: runs on the stream's worker and returns success, an error that becomes the
// context's sticky error, or kAbandon (a wait given up on a destroyed stream: the rest of the
// queue is dropped).
constexpr CUresult kAbandon = -1;
using OpFn = std::function<CUresult(Stream&)>;

class Stream : public std::enable_shared_from_this<Stream> {
 public:
  Stream(Context* ctx, uint64_t gen, unsigned flags) : ctx_(ctx), gen_(gen), flags_(flags) {}
  ~Stream();

  Context* ctx() const { return ctx_; }
  uint64_t gen() const { return gen_; }
  unsigned flags() const { return flags_; }

  // Starts the worker.
  void start();
  // Appends op (not run while the stream captures). CUDA_ERROR_STREAM_CAPTURE_INVALIDATED on an
  // invalidated capture.
  CUresult enqueue(OpFn op);
  // Blocks until the work enqueued before the call is done or dropped; the context's error.
  CUresult synchronize();
  // CUDA_ERROR_NOT_READY while work is pending; else the context's error.
  CUresult query();
  // cuStreamDestroy: no more work; a wait that cannot go on is abandoned; the worker ends when
  // the queue is empty.
  void close();

  // True when a wait on the worker must give up: the stream was destroyed, or its context failed
  // or was destroyed.
  bool interrupted() const;
  bool closed() const { return closing_.load(std::memory_order_acquire); }

  // Capture status (CU_STREAM_CAPTURE_STATUS_*): cuStreamBeginCapture, or
  // loomtest_fakecuda_set_capturing (no graph: the work is counted and dropped).
  std::atomic<int> capture{0};
  // cuStreamBeginCapture's: the graph the stream's work goes to, the capture's id, its mode and
  // the thread that began it; origin: this stream began it (else it joined it by waiting on an
  // event recorded in it). Set and read under the stream's lock (captureLocked).
  struct Capture {
    std::shared_ptr<Graph> graph;
    uint64_t id = 0;
    int mode = 0;
    const void* thread = nullptr;
    bool origin = true;
  };
  // Runs f(Capture&) under the stream's lock.
  template <class F>
  auto captureLocked(F&& f) {
    std::lock_guard<std::mutex> lk(mu_);
    return f(capture_);
  }

 private:
  void run();

  Context* const ctx_;
  const uint64_t gen_;
  const unsigned flags_;
  std::mutex mu_;
  std::condition_variable workCv_;
  std::condition_variable doneCv_;
  std::deque<OpFn> q_;
  Capture capture_;
  uint64_t enqueued_ = 0;
  uint64_t completed_ = 0;
  std::atomic<bool> closing_{false};
  bool abandoned_ = false;  // worker only
  std::thread worker_;
  // Set by the worker as it ends; outlives the stream (the retired workers' list holds it).
  std::shared_ptr<std::atomic<bool>> finished_ = std::make_shared<std::atomic<bool>>(false);
};

// Waits on the worker of s until ready() holds; false when the stream is interrupted first. Polls
// with a growing pause (at most 50 us): no lock is held meanwhile.
bool deviceWait(Stream& s, const std::function<bool()>& ready);
// What a wait returns when deviceWait gave up: kAbandon on a destroyed stream, else a drop.
CUresult waitGivenUp(Stream& s);

struct Event {
  Context* ctx = nullptr;
  uint64_t gen = 0;
  unsigned flags = 0;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;   // records enqueued
  uint64_t completed = 0;  // the highest record the device has reached
  // Last recorded in a capture (else null): its graph, the stream that recorded it, and what that
  // stream depended on at the record.
  std::weak_ptr<Graph> capturedIn;
  const Stream* capturedOn = nullptr;
  std::vector<size_t> capturedDeps;  // indices in the graph's ops
};

struct Module;
struct Function {
  Module* module = nullptr;
  std::string name;
  int dtype = 0;
  int op = 0;
  std::atomic<bool> loaded{false};  // by cuFuncLoad, cuFuncGetAttribute or a first launch
};
struct Module {
  Context* ctx = nullptr;
  uint64_t gen = 0;
  std::unordered_map<std::string, std::shared_ptr<Function>> functions;
};

// A user object (cuUserObjectCreate): its destructor runs when the last reference goes.
struct UserObject {
  void* ptr = nullptr;
  void (*destroy)(void*) = nullptr;
  std::atomic<long long> refs{0};
};
// Drops n references of o; the last runs its destructor (as a host function: it may not call the
// driver) and forgets its handle.
void releaseUserObject(UserObject* o, unsigned n);

// The references to user objects that a graph or an executable graph owns; released with it.
struct UserRefs {
  std::mutex mu;
  std::vector<std::pair<UserObject*, unsigned>> refs;
  UserRefs() = default;
  UserRefs(const UserRefs&) = delete;
  UserRefs& operator=(const UserRefs&) = delete;
  ~UserRefs() {
    for (auto& r : refs) releaseUserObject(r.first, r.second);
  }
  void add(UserObject* o, unsigned n) {
    std::lock_guard<std::mutex> lk(mu);
    refs.push_back({o, n});
  }
};

// A graph made by stream capture: the captured operations, on the stream that began the capture
// (the origin) and on the streams that joined it (forks: each waited on an event recorded in the
// capture), each with the operations it depends on: the one before it on its stream, and, after a
// wait on an event, what the event's stream depended on at the record. Instantiation orders
// them as a launch runs them, one after another: any order that keeps the dependencies is one
// the device could take, and this one runs the forks' operations as early as their dependencies
// let it (runOrder), so that work a capture left without a dependency runs out of the order it
// was captured in, and shows.
struct Graph {
  struct Node {
    OpFn fn;
    const Stream* lane = nullptr;
    std::vector<size_t> deps;  // indices in ops
  };
  std::mutex mu;  // ops, pending, forks, capturing
  std::vector<Node> ops;
  const Stream* origin = nullptr;
  // The dependencies a stream's next operation takes from the events it waited on.
  std::unordered_map<const Stream*, std::vector<size_t>> pending;
  // Appends op on lane (under mu).
  void add(OpFn op, const Stream* lane);
  // What lane's next operation would depend on now: its last operation and what it waited on
  // since (under mu). An event recorded on lane stands for these.
  std::vector<size_t> tail(const Stream* lane) const;
  // The operations in the order a launch runs them (under mu).
  std::vector<OpFn> runOrder() const;
  // A fork and its last operation in ops (1 + its index; 0: none). A fork is joined when its last
  // operation is among what the origin's tail depends on, directly or through other streams (a
  // fork joined into another fork that the origin waited for after). A capture ends with every
  // fork joined (else CUDA_ERROR_STREAM_CAPTURE_UNJOINED), and its forks leave it.
  struct Fork {
    std::weak_ptr<Stream> stream;
    size_t lastOp = 0;
  };
  // Whether every fork is joined (under mu).
  bool forksJoined() const;
  std::vector<Fork> forks;
  bool capturing = true;  // until cuStreamEndCapture
  UserRefs owned;
};

// cuEventRecord on stream s while it captures: e remembers where in the capture (no node).
CUresult recordInCapture(const std::shared_ptr<Stream>& s, const std::shared_ptr<Event>& e);
// cuStreamWaitEvent on event e last recorded in a capture still under way (*handled: e was;
// else the caller waits as for any event): stream s joins that capture (a fork), or, already in
// it, waits on that point of it (the origin joining a fork back). A stream of another capture:
// CUDA_ERROR_STREAM_CAPTURE_MERGE.
CUresult waitInCapture(const std::shared_ptr<Stream>& s, const std::shared_ptr<Event>& e,
                       bool* handled);

// An executable graph: its operations and its references to the graph's user objects, held
// until the executable is destroyed and its launches have run. Launches run one after another.
struct GraphExec {
  std::vector<OpFn> ops;
  UserRefs owned;
  std::mutex mu;
  uint64_t launched = 0, completed = 0;  // under mu
};

// Every live stream, event, module, function, graph, executable graph and user object of the
// process, by handle (its address).
struct Handles {
  std::mutex mu;
  std::unordered_map<Stream*, std::shared_ptr<Stream>> streams;
  std::unordered_map<Event*, std::shared_ptr<Event>> events;
  std::unordered_map<Module*, std::unique_ptr<Module>> modules;
  std::unordered_map<Function*, std::shared_ptr<Function>> functions;
  std::unordered_map<Graph*, std::shared_ptr<Graph>> graphs;
  std::unordered_map<GraphExec*, std::shared_ptr<GraphExec>> execs;
  std::unordered_map<UserObject*, std::shared_ptr<UserObject>> userObjects;

  // Each takes mu. `table` names one of the tables above (&Handles::streams, ...).
  // Adds obj; its handle is its address.
  template <class Map>
  void add(Map Handles::*table, typename Map::mapped_type obj) {
    std::lock_guard<std::mutex> lk(mu);
    const typename Map::key_type key = obj.get();
    (this->*table)[key] = std::move(obj);
  }
  // The object of handle h, shared (null when unknown).
  template <class Map>
  typename Map::mapped_type find(Map Handles::*table, void* h) {
    std::lock_guard<std::mutex> lk(mu);
    auto it = (this->*table).find(static_cast<typename Map::key_type>(h));
    return it == (this->*table).end() ? nullptr : it->second;
  }
  // Removes the object of handle h and returns it (null when unknown).
  template <class Map>
  typename Map::mapped_type take(Map Handles::*table, void* h) {
    std::lock_guard<std::mutex> lk(mu);
    return takeEntry(this->*table, static_cast<typename Map::key_type>(h));
  }
  // A destroy entry point's work: take(), and the live count `live` goes down by one; false when
  // h is unknown. (What still holds the object, queued work, keeps it until it has run.)
  template <class Map>
  bool drop(Map Handles::*table, void* h, Counter live) {
    if (take(table, h) == nullptr) return false;
    count(live, -1);
    return true;
  }
};
Handles& handles();

// The stream a handle names: NULL (also CU_STREAM_LEGACY and CU_STREAM_PER_THREAD) is the
// current context's NULL stream. With forEnqueue, a current context is required and must be the
// stream's (else CUDA_ERROR_INVALID_CONTEXT / CUDA_ERROR_INVALID_HANDLE). Returns the stream's
// context's error if it has one.
CUresult streamOf(CUstream h, bool forEnqueue, std::shared_ptr<Stream>* out);
// The event of a handle (CUDA_ERROR_INVALID_HANDLE when unknown).
CUresult eventOf(void* h, std::shared_ptr<Event>* out);

// guarded() for an entry point that works on a stream: body(Stream*) runs with the stream of
// handle h (streamOf) while it holds it, else streamOf's code is returned.
template <class F>
CUresult onStream(CUstream h, bool forEnqueue, F&& body) noexcept {
  return guarded([&] {
    std::shared_ptr<Stream> s;
    FAKECUDA_TRY(streamOf(h, forEnqueue, &s));
    return body(s.get());
  });
}

}  // namespace fakecuda
