// Entry points: stream capture into graphs, executable graphs, user objects, and the thread's
// capture mode. A capture records its streams' operations with their dependencies: the stream
// that began it, and the streams that joined it by waiting on an event recorded in it (forks,
// which the origin must wait for again before the capture ends); a launch runs them in an order
// that keeps the dependencies (Graph::runOrder), on the launch stream, after the executable's
// previous launch.
#include "tests/device/fake_cuda/streams.h"

using namespace fakecuda;    // NOLINT(build/namespaces)
using namespace loom::cuda;  // NOLINT(build/namespaces): the driver's types and constants

namespace fakecuda {

void Graph::add(OpFn op, const Stream* lane) {
  Node n{std::move(op), lane, {}};
  for (size_t i = ops.size(); i-- > 0;)
    if (ops[i].lane == lane) {
      n.deps.push_back(i);
      break;
    }
  auto it = pending.find(lane);
  if (it != pending.end()) {
    n.deps.insert(n.deps.end(), it->second.begin(), it->second.end());
    pending.erase(it);
  }
  ops.push_back(std::move(n));
}

std::vector<size_t> Graph::tail(const Stream* lane) const {
  std::vector<size_t> t;
  for (size_t i = ops.size(); i-- > 0;)
    if (ops[i].lane == lane) {
      t.push_back(i);
      break;
    }
  auto it = pending.find(lane);
  if (it != pending.end()) t.insert(t.end(), it->second.begin(), it->second.end());
  return t;
}

bool Graph::forksJoined() const {
  std::vector<bool> reached(ops.size(), false);
  std::vector<size_t> todo = tail(origin);
  while (!todo.empty()) {
    const size_t i = todo.back();
    todo.pop_back();
    if (reached[i]) continue;
    reached[i] = true;
    todo.insert(todo.end(), ops[i].deps.begin(), ops[i].deps.end());
  }
  for (const Fork& f : forks)
    if (f.lastOp > 0 && !reached[f.lastOp - 1]) return false;
  return true;
}

std::vector<OpFn> Graph::runOrder() const {
  std::vector<OpFn> order;
  std::vector<bool> ran(ops.size(), false);
  while (order.size() < ops.size()) {
    // The first operation whose dependencies have run, a fork's before the origin's.
    size_t pick = ops.size();
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ran[i]) continue;
      bool ready = true;
      for (size_t d : ops[i].deps) ready = ready && ran[d];
      if (!ready) continue;
      if (pick == ops.size()) pick = i;
      if (ops[i].lane != origin) {
        pick = i;
        break;
      }
    }
    ran[pick] = true;  // one is always ready: dependencies point back
    order.push_back(ops[pick].fn);
  }
  return order;
}

CUresult recordInCapture(const std::shared_ptr<Stream>& s, const std::shared_ptr<Event>& e) {
  // No node, as the driver makes none: the event stands for the stream's work so far.
  if (s->capture.load() != kCaptureStatusActive) return kErrorCaptureInvalidated;
  std::shared_ptr<Graph> g = s->captureLocked([](Stream::Capture& c) { return c.graph; });
  if (g == nullptr) return kSuccess;  // loomtest_fakecuda_set_capturing's: nothing kept
  std::vector<size_t> deps;
  {
    std::lock_guard<std::mutex> lk(g->mu);
    deps = g->tail(s.get());
  }
  std::lock_guard<std::mutex> lk(e->mu);
  e->capturedIn = g;
  e->capturedOn = s.get();
  e->capturedDeps = std::move(deps);
  return kSuccess;
}

CUresult waitInCapture(const std::shared_ptr<Stream>& s, const std::shared_ptr<Event>& e,
                       bool* handled) {
  *handled = false;
  std::shared_ptr<Graph> g;
  const Stream* on = nullptr;
  std::vector<size_t> deps;
  {
    std::lock_guard<std::mutex> lk(e->mu);
    g = e->capturedIn.lock();
    on = e->capturedOn;
    deps = e->capturedDeps;
  }
  if (g == nullptr) return kSuccess;
  {
    std::lock_guard<std::mutex> lk(g->mu);
    if (!g->capturing) return kSuccess;  // that capture has ended: an ordinary wait
  }
  *handled = true;
  if (s->capture.load() == kCaptureStatusInvalidated) return kErrorCaptureInvalidated;
  // The capture's id, mode and thread, from the stream that recorded the event (alive: it
  // captures until the capture ends).
  Stream::Capture joined;
  {
    std::shared_ptr<Stream> from;
    streamOf(reinterpret_cast<CUstream>(const_cast<Stream*>(on)), false, &from);
    if (from == nullptr) return kErrorInvalidHandle;
    joined = from->captureLocked([](Stream::Capture& c) { return c; });
  }
  // s's next operation depends on what the event's stream depended on at the record: its last
  // operation then, and what it had waited on since.
  auto depend = [&] {
    std::vector<size_t>& p = g->pending[s.get()];
    p.insert(p.end(), deps.begin(), deps.end());
  };
  const CUresult rc = s->captureLocked([&](Stream::Capture& c) {
    if (c.graph == nullptr) {  // not capturing: it joins as a fork
      c = joined;
      c.origin = false;
      std::lock_guard<std::mutex> lk(g->mu);
      g->forks.push_back({s, 0});
      depend();
      s->capture.store(kCaptureStatusActive, std::memory_order_release);
      return kSuccess;
    }
    if (c.graph != g) return kErrorCaptureMerge;
    std::lock_guard<std::mutex> lk(g->mu);
    depend();
    return kSuccess;
  });
  return rc;  // no node: the operations after it are captured after the event's
}

void releaseUserObject(UserObject* o, unsigned n) {
  if (o->refs.fetch_sub(n, std::memory_order_acq_rel) != static_cast<long long>(n)) return;
  {
    HostFuncScope scope;  // the destructor may not call the driver
    o->destroy(o->ptr);
  }
  handles().drop(&Handles::userObjects, o, kUserObjects);
}

}  // namespace fakecuda

namespace {

// This thread's identity, by the address of a thread-local of its own (initial-exec: state.cc
// says why).
__attribute__((tls_model("initial-exec"))) thread_local char tThreadTag = 0;
const void* threadTag() { return &tThreadTag; }

// The stream of a capture entry point: a created stream (the NULL stream is not capturable).
CUresult capturable(CUstream h, std::shared_ptr<Stream>* out) {
  if (reinterpret_cast<uintptr_t>(h) <= 2) return kErrorStreamCaptureUnsupported;
  return streamOf(h, false, out);
}

// An entry point on n references of the user object of handle obj: body(object), else
// CUDA_ERROR_INVALID_VALUE (n 0, an unknown handle).
template <class F>
CUresult onUserObject(void* obj, unsigned n, F&& body) {
  FAKECUDA_ENTRY();
  if (n == 0) return kErrorInvalidValue;
  return guarded([&] {
    std::shared_ptr<UserObject> o = handles().find(&Handles::userObjects, obj);
    return o == nullptr ? kErrorInvalidValue : body(o.get());
  });
}

}  // namespace

extern "C" {

CUresult cuThreadExchangeStreamCaptureMode(int* mode) {
  FAKECUDA_ENTRY();
  if (mode == nullptr || *mode < kCaptureModeGlobal || *mode > kCaptureModeRelaxed)
    return kErrorInvalidValue;
  *mode = exchangeCaptureMode(*mode);
  return kSuccess;
}

CUresult cuStreamBeginCapture_v2(CUstream stream, int mode) {
  FAKECUDA_ENTRY();
  if (mode < kCaptureModeGlobal || mode > kCaptureModeRelaxed) return kErrorInvalidValue;
  return guarded([&] {
    std::shared_ptr<Stream> s;
    FAKECUDA_TRY(capturable(stream, &s));
    static std::atomic<uint64_t> ids{0};
    auto g = std::make_shared<Graph>();
    g->origin = s.get();
    const CUresult rc = s->captureLocked([&](Stream::Capture& c) {
      if (s->capture.load() != kCaptureStatusNone) return kErrorIllegalState;
      c.graph = g;
      c.id = ++ids;
      c.mode = mode;
      c.thread = threadTag();
      s->capture.store(kCaptureStatusActive, std::memory_order_release);
      return kSuccess;
    });
    FAKECUDA_TRY(rc);
    handles().add(&Handles::graphs, g);
    count(kGraphs);
    captureStarted(mode, 1);
    return kSuccess;
  });
}

CUresult cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  FAKECUDA_ENTRY();
  if (graph == nullptr) return kErrorInvalidValue;
  return guarded([&] {
    std::shared_ptr<Stream> s;
    FAKECUDA_TRY(capturable(stream, &s));
    Stream::Capture ended;
    const CUresult rc = s->captureLocked([&](Stream::Capture& c) {
      if (c.graph == nullptr) return kErrorIllegalState;
      if (!c.origin) return kErrorCaptureUnmatched;  // a fork: the origin ends the capture
      if (c.mode != kCaptureModeRelaxed && c.thread != threadTag()) return kErrorCaptureWrongThread;
      ended = std::move(c);
      c = Stream::Capture{};
      return kSuccess;
    });
    FAKECUDA_TRY(rc);
    captureStarted(ended.mode, -1);
    int status = s->capture.exchange(kCaptureStatusNone);
    // The forks leave the capture; one not joined back (or invalidated) fails it.
    std::vector<Graph::Fork> forks;
    bool joined = true;
    {
      std::lock_guard<std::mutex> lk(ended.graph->mu);
      ended.graph->capturing = false;
      joined = ended.graph->forksJoined();
      forks.swap(ended.graph->forks);
    }
    CUresult failed = kErrorCaptureInvalidated;
    for (const Graph::Fork& f : forks) {
      std::shared_ptr<Stream> fork = f.stream.lock();
      if (fork == nullptr) continue;
      fork->captureLocked([](Stream::Capture& c) { return c = Stream::Capture{}, 0; });
      if (fork->capture.exchange(kCaptureStatusNone) != kCaptureStatusActive)
        status = kCaptureStatusInvalidated;
    }
    if (!joined && status == kCaptureStatusActive) {
      status = kCaptureStatusInvalidated;
      failed = kErrorCaptureUnjoined;
    }
    *graph = nullptr;
    if (status == kCaptureStatusActive) {
      *graph = reinterpret_cast<CUgraph>(ended.graph.get());
      return kSuccess;
    }
    handles().drop(&Handles::graphs, ended.graph.get(), kGraphs);
    return failed;
  });
}

// cuStreamGetCaptureInfo_v2: the status, and while active the capture's id and graph. No node
// handles: *deps is NULL and *numDeps 0.
CUresult cuStreamGetCaptureInfo_v2(CUstream stream, int* status, uint64_t* id, CUgraph* graph,
                                   const void** deps, size_t* numDeps) {
  FAKECUDA_ENTRY();
  if (status == nullptr) return kErrorInvalidValue;
  return guarded([&] {
    std::shared_ptr<Stream> s;
    const CUresult rc = streamOf(stream, false, &s);
    if (s == nullptr) return rc;
    s->captureLocked([&](Stream::Capture& c) {
      *status = s->capture.load();
      const bool active = *status == kCaptureStatusActive;
      if (id) *id = active ? c.id : 0;
      if (graph) *graph = active ? reinterpret_cast<CUgraph>(c.graph.get()) : nullptr;
      return 0;
    });
    if (deps) *deps = nullptr;
    if (numDeps) *numDeps = 0;
    return kSuccess;
  });
}

// cuStreamGetCaptureInfo_v3: _v2's answers, and no edge data (*edges NULL).
CUresult cuStreamGetCaptureInfo_v3(CUstream stream, int* status, uint64_t* id, CUgraph* graph,
                                   const void** deps, const void** edges, size_t* numDeps) {
  if (edges) *edges = nullptr;
  return cuStreamGetCaptureInfo_v2(stream, status, id, graph, deps, numDeps);
}

CUresult cuGraphDestroy(CUgraph graph) {
  FAKECUDA_ENTRY();
  return guarded([&] {
    // A capture still under way keeps its graph until it ends.
    return handles().drop(&Handles::graphs, graph, kGraphs) ? kSuccess : kErrorInvalidValue;
  });
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph,
                                     unsigned long long flags) {  // NOLINT
  FAKECUDA_ENTRY();
  if (exec == nullptr || flags != 0) return kErrorInvalidValue;
  return guarded([&] {
    std::shared_ptr<Graph> g = handles().find(&Handles::graphs, graph);
    if (g == nullptr) return kErrorInvalidValue;
    auto e = std::make_shared<GraphExec>();
    {
      std::lock_guard<std::mutex> lk(g->mu);
      e->ops = g->runOrder();
    }
    {
      // The executable holds references of its own to the graph's user objects.
      std::lock_guard<std::mutex> lk(g->owned.mu);
      for (auto& r : g->owned.refs) {
        r.first->refs.fetch_add(r.second, std::memory_order_acq_rel);
        e->owned.add(r.first, r.second);
      }
    }
    handles().add(&Handles::execs, e);
    count(kGraphExecs);
    *exec = reinterpret_cast<CUgraphExec>(e.get());
    return kSuccess;
  });
}

CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
  FAKECUDA_ENTRY();
  return guarded([&] {
    std::shared_ptr<GraphExec> e = handles().find(&Handles::execs, exec);
    if (e == nullptr) return kErrorInvalidValue;
    std::shared_ptr<Stream> s;
    FAKECUDA_TRY(streamOf(stream, true, &s));
    uint64_t mine = 0;
    {
      std::lock_guard<std::mutex> lk(e->mu);
      mine = ++e->launched;
    }
    // After the executable's previous launch (on whichever stream), then its operations in
    // order, then this launch counts as done. Each holds the executable (and so its user
    // objects) until it has run.
    FAKECUDA_TRY(s->enqueue([e, mine](Stream& st) {
      const bool done = deviceWait(st, [&] {
        std::lock_guard<std::mutex> lk(e->mu);
        return e->completed + 1 >= mine;
      });
      return done ? kSuccess : waitGivenUp(st);
    }));
    for (size_t i = 0; i < e->ops.size(); ++i)
      FAKECUDA_TRY(s->enqueue([e, i](Stream& st) { return e->ops[i](st); }));
    FAKECUDA_TRY(s->enqueue([e, mine](Stream&) {
      std::lock_guard<std::mutex> lk(e->mu);
      e->completed = mine;
      return kSuccess;
    }));
    count(kGraphLaunches);
    return kSuccess;
  });
}

CUresult cuGraphExecDestroy(CUgraphExec exec) {
  FAKECUDA_ENTRY();
  return guarded([&] {
    // Launches still queued hold it until they have run.
    return handles().drop(&Handles::execs, exec, kGraphExecs) ? kSuccess : kErrorInvalidValue;
  });
}

CUresult cuUserObjectCreate(CUuserObject* obj, void* ptr, CUhostFn destroy,
                            unsigned initialRefcount, unsigned flags) {
  FAKECUDA_ENTRY();
  if (obj == nullptr || destroy == nullptr || initialRefcount == 0 ||
      flags != kUserObjectNoDestructorSync)
    return kErrorInvalidValue;
  return guarded([&] {
    auto o = std::make_shared<UserObject>();
    o->ptr = ptr;
    o->destroy = destroy;
    o->refs.store(initialRefcount);
    handles().add(&Handles::userObjects, o);
    count(kUserObjects);
    *obj = reinterpret_cast<CUuserObject>(o.get());
    return kSuccess;
  });
}

CUresult cuUserObjectRetain(CUuserObject obj, unsigned n) {
  return onUserObject(obj, n, [&](UserObject* o) {
    o->refs.fetch_add(n, std::memory_order_acq_rel);
    return kSuccess;
  });
}

CUresult cuUserObjectRelease(CUuserObject obj, unsigned n) {
  return onUserObject(obj, n, [&](UserObject* o) {
    if (o->refs.load() < n) return kErrorInvalidValue;
    releaseUserObject(o, n);
    return kSuccess;
  });
}

CUresult cuGraphRetainUserObject(CUgraph graph, CUuserObject obj, unsigned n, unsigned flags) {
  FAKECUDA_ENTRY();
  if (n == 0 || (flags & ~kGraphUserObjectMove) != 0) return kErrorInvalidValue;
  return guarded([&] {
    std::shared_ptr<Graph> g = handles().find(&Handles::graphs, graph);
    std::shared_ptr<UserObject> o = handles().find(&Handles::userObjects, obj);
    if (g == nullptr || o == nullptr) return kErrorInvalidValue;
    // MOVE: the caller's references become the graph's; else the graph takes new ones.
    if (flags != kGraphUserObjectMove) o->refs.fetch_add(n, std::memory_order_acq_rel);
    g->owned.add(o.get(), n);
    return kSuccess;
  });
}

}  // extern "C"
