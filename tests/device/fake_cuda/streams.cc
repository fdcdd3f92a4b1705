// Streams: the queue, its worker, synchronization, and the handle tables.
#include "tests/device/fake_cuda/streams.h"

#include <chrono>
#include <vector>

namespace fakecuda {

using namespace loom::cuda;  // NOLINT(build/namespaces): the driver's constants

namespace {

// An operation that could not finish because its context failed or was destroyed: dropped
// without a new error.
constexpr CUresult kDropped = -2;

// The workers of destroyed streams: cuStreamDestroy returns at once while the worker drains, so
// the worker is kept here and joined once it has finished, at the next destroy or when the
// library is unloaded or the process exits (at most 2 s for those still draining). A worker left
// to exit on its own could still be exiting when the process ends, which LeakSanitizer's exit
// check does not survive (it reads the exiting thread's freed thread-local blocks).
class RetiredWorkers {
 public:
  void add(std::thread t, std::shared_ptr<std::atomic<bool>> finished) {
    std::lock_guard<std::mutex> lk(mu_);
    joinFinished();
    list_.push_back({std::move(t), std::move(finished)});
    // A stream destroyed after the exit-time reap (by another library's or a test's static
    // destructor, which may run after ours) is joined here: nothing would join it later, and
    // ThreadSanitizer reports a finished thread never joined.
    if (reaped_) reapLocked();
  }

  // Joins every worker, waiting at most 2 s in all for those still draining; from now on, each
  // one as it is retired.
  void reapAll() {
    std::lock_guard<std::mutex> lk(mu_);
    reaped_ = true;
    reapLocked();
  }

 private:
  struct Worker {
    std::thread t;
    std::shared_ptr<std::atomic<bool>> finished;
  };

  void reapLocked() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    for (auto& w : list_) {
      while (!w.finished->load(std::memory_order_acquire) &&
             std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (w.finished->load(std::memory_order_acquire))
        w.t.join();
      else
        w.t.detach();  // stuck in a wait the stream's destruction did not end
    }
    list_.clear();
  }

  void joinFinished() {
    for (auto it = list_.begin(); it != list_.end();) {
      if (it->finished->load(std::memory_order_acquire)) {
        it->t.join();  // it has returned from run(): the join is short
        it = list_.erase(it);
      } else {
        ++it;
      }
    }
  }

  std::mutex mu_;
  std::vector<Worker> list_;
  bool reaped_ = false;  // the exit-time reap has run
};

RetiredWorkers& retiredWorkers() {
  static auto* r = new RetiredWorkers();  // never destroyed: a stream may close after exit's turn
  return *r;
}

// Joins the retired workers when the library is unloaded or the process exits.
struct ReapAtExit {
  ~ReapAtExit() { retiredWorkers().reapAll(); }
} reapAtExit;

}  // namespace

Stream::~Stream() {
  // The worker holds a reference while it runs, so it runs this (it cannot join itself) unless
  // close() retired it.
  if (worker_.joinable()) worker_.detach();
}

void Stream::start() {
  count(kWorkers);
  worker_ = std::thread([self = shared_from_this()] { self->run(); });
}

CUresult Stream::enqueue(OpFn op) {
  const int cap = capture.load(std::memory_order_acquire);
  if (cap == kCaptureStatusActive) {
    bool origin = true;
    std::shared_ptr<Graph> g = captureLocked([&](Capture& c) {
      origin = c.origin;
      return c.graph;
    });
    count(kCapturedOps);
    if (g != nullptr) {  // else loomtest_fakecuda_set_capturing's: dropped
      std::lock_guard<std::mutex> lk(g->mu);
      g->add(std::move(op), this);
      if (!origin)
        for (Graph::Fork& f : g->forks)
          if (f.stream.lock().get() == this) f.lastOp = g->ops.size();
    }
    return kSuccess;
  }
  if (cap != kCaptureStatusNone) return kErrorCaptureInvalidated;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closing_.load()) return kErrorInvalidHandle;
    q_.push_back(std::move(op));
    ++enqueued_;
  }
  ctx_->pending.fetch_add(1, std::memory_order_acq_rel);
  count(kPendingOps);
  workCv_.notify_one();
  return kSuccess;
}

CUresult Stream::synchronize() {
  int active = kCaptureStatusActive;
  if (capture.compare_exchange_strong(active, kCaptureStatusInvalidated) ||
      active != kCaptureStatusNone)
    return kErrorStreamCaptureUnsupported;  // and the capture is invalidated
  {
    std::unique_lock<std::mutex> lk(mu_);
    const uint64_t target = enqueued_;
    doneCv_.wait(lk, [&] { return completed_ >= target; });
  }
  if (!ctx_->active.load() || ctx_->gen.load() != gen_) return kErrorInvalidContext;
  return ctx_->error();
}

CUresult Stream::query() {
  int active = kCaptureStatusActive;
  if (capture.compare_exchange_strong(active, kCaptureStatusInvalidated) ||
      active != kCaptureStatusNone)
    return kErrorStreamCaptureUnsupported;
  if (!ctx_->active.load() || ctx_->gen.load() != gen_) return kErrorInvalidContext;
  FAKECUDA_TRY(ctx_->error());
  std::lock_guard<std::mutex> lk(mu_);
  return completed_ < enqueued_ ? kErrorNotReady : kSuccess;
}

void Stream::close() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    closing_.store(true, std::memory_order_release);
  }
  workCv_.notify_all();
  if (worker_.joinable()) retiredWorkers().add(std::move(worker_), finished_);
}

bool Stream::interrupted() const {
  return closing_.load(std::memory_order_acquire) || !ctx_->healthy(gen_);
}

void Stream::run() {
  for (;;) {
    OpFn op;
    {
      std::unique_lock<std::mutex> lk(mu_);
      workCv_.wait(lk, [&] { return !q_.empty() || closing_.load(); });
      if (q_.empty()) break;  // closed and drained
      op = std::move(q_.front());
      q_.pop_front();
    }
    if (abandoned_) {
      count(kAbandonedOps);
    } else if (!ctx_->healthy(gen_)) {
      count(kDroppedOps);
    } else {
      const CUresult rc = op(*this);
      if (rc == kAbandon) {
        abandoned_ = true;
        count(kAbandonedOps);
      } else if (rc == kDropped) {
        count(kDroppedOps);
      } else if (rc != kSuccess) {
        ctx_->fail(rc);
        count(kFaults);
      }
    }
    op = nullptr;  // what the operation holds (memory, events) goes before it counts as done
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++completed_;
    }
    ctx_->pending.fetch_sub(1, std::memory_order_acq_rel);
    count(kPendingOps, -1);
    doneCv_.notify_all();
  }
  count(kWorkers, -1);
  finished_->store(true, std::memory_order_release);
}

bool deviceWait(Stream& s, const std::function<bool()>& ready) {
  if (ready()) return true;
  struct Waiting {  // counted while blocked: a lazy load waits for it (cuLaunchKernel)
    std::atomic<int>& n;
    explicit Waiting(std::atomic<int>& w) : n(w) { n.fetch_add(1); }
    ~Waiting() { n.fetch_sub(1); }
  } waiting(s.ctx()->waiting);
  for (unsigned i = 0;; ++i) {
    if (ready()) return true;
    if (s.interrupted()) return false;
    if (i < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(i < 512 ? 5 : 50));
  }
}

CUresult waitGivenUp(Stream& s) { return s.closed() ? kAbandon : kDropped; }

Handles& handles() {
  static Handles* h = new Handles();  // never destroyed
  return *h;
}

CUresult streamOf(CUstream h, bool forEnqueue, std::shared_ptr<Stream>* out) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(h);
  if (v <= 2) {  // NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
    Context* c = nullptr;
    FAKECUDA_TRY(requireContext(&c));
    std::lock_guard<std::mutex> lk(c->mu);
    if (!c->active.load()) return kErrorInvalidContext;
    const uint64_t gen = c->gen.load();
    if (c->nullStream == nullptr || c->nullStream->gen() != gen) {
      c->nullStream = std::make_shared<Stream>(c, gen, 0);
      c->nullStream->start();
    }
    *out = c->nullStream;
    return kSuccess;
  }
  *out = handles().find(&Handles::streams, h);
  if (*out == nullptr) return kErrorInvalidHandle;
  Stream& s = **out;
  if (forEnqueue) {
    Context* cur = currentContext();
    if (cur == nullptr || !cur->active.load()) return kErrorInvalidContext;
    if (cur != s.ctx()) return kErrorInvalidHandle;
  }
  return s.ctx()->error();
}

CUresult eventOf(void* h, std::shared_ptr<Event>* out) {
  *out = handles().find(&Handles::events, h);
  return *out != nullptr ? kSuccess : kErrorInvalidHandle;
}

void dropContextStreams(Context* c, uint64_t gen) {
  std::vector<std::shared_ptr<Stream>> streams;
  std::vector<std::shared_ptr<Event>> events;
  std::vector<std::unique_ptr<Module>> modules;
  {
    auto owned = [&](const auto& o) { return o->ctx == c && o->gen == gen; };
    Handles& t = handles();
    std::lock_guard<std::mutex> lk(t.mu);
    takeIf(
        t.streams, [&](const auto& s) { return s->ctx() == c && s->gen() == gen; }, &streams);
    takeIf(t.events, owned, &events);
    takeIf(t.modules, owned, &modules);
    for (auto& m : modules)
      for (auto& f : m->functions) t.functions.erase(f.second.get());
  }
  for (auto& s : streams) s->close();
  if (c->nullStream != nullptr) {  // the caller holds c->mu
    c->nullStream->close();
    c->nullStream.reset();
  }
  count(kStreams, -static_cast<long long>(streams.size()));
  count(kEvents, -static_cast<long long>(events.size()));
  count(kModules, -static_cast<long long>(modules.size()));
}

}  // namespace fakecuda
