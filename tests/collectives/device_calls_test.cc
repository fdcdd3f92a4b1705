// Calls on CUDA device memory and CUDA streams, beyond the collective matrix (which runs on device
// buffers in the collectives_device* variants): bad input refused with its reason, a stream's
// order (the call starts when the stream reaches it and the work after it waits for it), groups on
// several streams, and what happens to a waiting stream when the communicator is destroyed,
// aborted, loses a rank or its device faults: the stream is always released.
//
// They need a CUDA driver: ctest runs them as collectives_device_calls (and _nomemops, without
// stream memory operations) with LOOM_CUDA_LIB naming the emulated device (tests/device/fake_cuda)
// and two devices. On a real GPU they run as they are (tools/gpu_check.sh), except the cases that
// need the emulator's controls, which skip saying so.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "loom/loom.h"
#include "src/device/cuda_driver.h"
#include "src/device/device_memory.h"
#include "src/device/kernels.h"
#include "tests/collectives/harness.h"
#include "tests/collectives/workers.h"
#include "tests/device/dev_buf.h"

namespace loomtest {
namespace {

namespace cuda = loom::cuda;
using cuda::CUdeviceptr;
using cuda::CUstream;

const cuda::DriverApi& api() { return cuda::cudaDriver().api; }

#define SKIP_WITHOUT_CUDA()                                                                    \
  if (!loom::device::cudaUsable())                                                             \
  GTEST_SKIP() << "needs a CUDA driver (" << cuda::cudaDriver().status.message()               \
               << "): ctest runs these as collectives_device_calls with LOOM_CUDA_LIB naming " \
                  "the emulated device"

using loomtest::DevBuf;
using loomtest::driverSymbol;

// A non-blocking stream of `device`, destroyed with this.
struct Stream {
  CUstream s = nullptr;
  explicit Stream(int device = 0) {
    if (loom::device::useDevice(device).isOk()) api().cuStreamCreate(&s, cuda::kStreamNonBlocking);
    (void)loom::device::useDevice(0);
  }
  ~Stream() {
    if (s) api().cuStreamDestroy(s);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

// Holds a stream at a point until opened (a host function that waits; at most 60 s, so that a
// broken test cannot hang the stream for good). reached: the stream got there.
struct Gate {
  std::atomic<bool> reached{false}, open{false};
  static void hold(void* p) {
    auto* g = static_cast<Gate*>(p);
    g->reached = true;
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!g->open && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  bool close(CUstream s) { return api().cuLaunchHostFunc(s, &Gate::hold, this) == 0; }
};

// The call's result and loomGetLastError, as one line.
std::string outcome(loomResult_t r) {
  return std::string(loomGetErrorString(r)) + ": " + (r == loomSuccess ? "" : loomGetLastError());
}

TEST(DeviceCalls, BadDeviceInputIsRefusedWithItsReason) {
  SKIP_WITHOUT_CUDA();
  ThreadRanks tr(1);
  ASSERT_TRUE(tr.ok()) << tr.error();
  loomComm_t comm = tr.comm(0);
  ASSERT_TRUE(loom::device::useDevice(0).isOk());
  const size_t n = 1024;
  DevBuf a(n * 4), b(n * 4);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<float> host(n, 1.0f);
  auto refused = [&](loomResult_t r, loomResult_t code, const char* words) {
    const std::string msg = r == loomSuccess ? "" : loomGetLastError();
    EXPECT_EQ(r, code) << msg;
    EXPECT_NE(msg.find(words), std::string::npos) << msg;
  };

  // Host memory where device memory is required, and the reverse.
  refused(loomAllReduce(host.data(), b.ptr(), n, loomFloat32, loomSum, comm, nullptr),
          loomInvalidArgument, "both must be CUDA device memory or both host memory");
  refused(loomAllReduce(a.ptr(), host.data(), n, loomFloat32, loomSum, comm, nullptr),
          loomInvalidArgument, "both must be CUDA device memory or both host memory");

  // A freed device buffer: CUDA forgets it, and the host cannot read it.
  {
    CUdeviceptr freed = 0;
    ASSERT_EQ(api().cuMemAlloc(&freed, n * 4), 0);
    ASSERT_EQ(api().cuMemFree(freed), 0);
    refused(loomAllReduce(reinterpret_cast<void*>(freed), reinterpret_cast<void*>(freed), n,
                          loomFloat32, loomSum, comm, nullptr),
            loomInvalidArgument, "a freed device buffer?");
  }

  // Managed memory.
  using AllocManaged = cuda::CUresult (*)(CUdeviceptr*, size_t, unsigned);
  if (auto allocManaged = reinterpret_cast<AllocManaged>(driverSymbol("cuMemAllocManaged"))) {
    CUdeviceptr m = 0;
    ASSERT_EQ(allocManaged(&m, n * 4, 1 /* CU_MEM_ATTACH_GLOBAL */), 0);
    refused(
        loomAllReduce(reinterpret_cast<void*>(m), b.ptr(), n, loomFloat32, loomSum, comm, nullptr),
        loomInvalidArgument, "managed memory");
    api().cuMemFree(m);
  } else {
    ADD_FAILURE() << "the driver library has no cuMemAllocManaged";
  }

  Stream s;
  ASSERT_NE(s.s, nullptr);

  // A stream that is no stream any more (the emulator only: the real driver may crash on it).
  if (driverSymbol("loomtest_fakecuda_count")) {
    CUstream gone = nullptr;
    ASSERT_EQ(api().cuStreamCreate(&gone, cuda::kStreamNonBlocking), 0);
    ASSERT_EQ(api().cuStreamDestroy(gone), 0);
    refused(loomAllReduce(a.ptr(), b.ptr(), n, loomFloat32, loomSum, comm, gone),
            loomInvalidArgument, "is not a CUDA stream of a live context");
  }

  // Two devices: buffers of both in one call, a stream of the other device, and a call on the
  // other device once the communicator runs its device calls on device 0.
  if (cuda::cudaDriver().devices >= 2) {
    DevBuf other(n * 4, 1);
    Stream otherStream(1);
    ASSERT_TRUE(other.ok() && otherStream.s);
    refused(loomAllReduce(a.ptr(), other.ptr(), n, loomFloat32, loomSum, comm, nullptr),
            loomInvalidArgument, "one device per call");
    refused(loomAllReduce(a.ptr(), b.ptr(), n, loomFloat32, loomSum, comm, otherStream.s),
            loomInvalidArgument, "the stream belongs to CUDA device 1 and the buffers to device 0");
    ASSERT_TRUE(a.put(host));
    ASSERT_EQ(loomAllReduce(a.ptr(), b.ptr(), n, loomFloat32, loomSum, comm, nullptr), loomSuccess)
        << loomGetLastError();
    DevBuf other2(n * 4, 1);
    refused(loomAllReduce(other.ptr(), other2.ptr(), n, loomFloat32, loomSum, comm, nullptr),
            loomInvalidArgument, "one device per communicator");
  } else {
    std::printf("(the cases of two devices need two; this driver has %d)\n",
                cuda::cudaDriver().devices);
  }

  // None of it broke the communicator: a good call still gives the right answer.
  ASSERT_TRUE(a.put(host));
  ASSERT_EQ(loomAllReduce(a.ptr(), b.ptr(), n, loomFloat32, loomSum, comm, s.s), loomSuccess)
      << loomGetLastError();
  EXPECT_EQ(b.get(n, s.s), host);
  loomResult_t async = loomInternalError;
  EXPECT_EQ(loomCommGetAsyncError(comm, &async), loomSuccess);
  EXPECT_EQ(async, loomSuccess);
}

// One rank of StreamCallStartsWhenTheStreamReachesIt...: see there.
std::string heldStreamCall(int rank, loomComm_t comm, int nranks, size_t n, Gate* gate,
                           std::atomic<bool>* enqueued, const std::atomic<bool>* checkedBefore) {
  struct Mark {  // however this ends, the others may go on and the stream is let go
    std::atomic<bool>* flag;
    Gate* gate;
    ~Mark() {
      *flag = true;
      gate->open = true;
    }
  } mark{enqueued, gate};
  if (!loom::device::useDevice(0).isOk()) return "useDevice failed";
  DevBuf in(n * 4), out(n * 4);
  Stream s, probe;
  void* pinned = nullptr;
  if (!in.ok() || !out.ok() || !s.s || !probe.s ||
      api().cuMemHostAlloc(&pinned, n * 4, cuda::kMemHostAllocPortable) != 0)
    return "setup failed";
  std::unique_ptr<void, void (*)(void*)> freePinned(pinned,
                                                    [](void* p) { api().cuMemFreeHost(p); });
  std::vector<float> mine(n, static_cast<float>(rank + 1)), poison(n, -7.0f);
  if (!in.put(mine) || !out.put(poison)) return "upload failed";
  auto* after = static_cast<float*>(pinned);
  std::fill(after, after + n, -9.0f);
  std::string e;
  if (!gate->close(s.s)) e = "cuLaunchHostFunc failed";
  loomResult_t r = loomAllReduce(in.ptr(), out.ptr(), n, loomFloat32, loomSum, comm, s.s);
  if (e.empty() && r != loomSuccess) e = "enqueue: " + outcome(r);
  if (e.empty() &&
      api().cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(after), out.p, n * 4, s.s) != 0)
    e = "the copy after the call failed to enqueue";
  *enqueued = true;
  // While the gate holds the stream: the call has not run and the copy after it has not either.
  while (!*checkedBefore) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (e.empty() && out.get(n, probe.s) != poison)
    e = "the output changed while the stream was held before the call";
  if (e.empty() && after[0] != -9.0f) e = "the copy after the call ran before it";
  gate->open = true;
  if (api().cuStreamSynchronize(s.s) != 0 && e.empty()) e = "cuStreamSynchronize failed";
  const float want = static_cast<float>(nranks * (nranks + 1) / 2);
  if (e.empty() && !std::all_of(after, after + n, [&](float x) { return x == want; }))
    e = "the copy after the call saw " + std::to_string(after[0]) + ", expected " +
        std::to_string(want);
  loomResult_t async = loomSuccess;
  loomCommGetAsyncError(comm, &async);
  if (e.empty() && async != loomSuccess) e = "async error: " + outcome(async);
  return e;
}

// Each rank holds its stream with a gate, enqueues an AllReduce and a copy of its output after
// it: the call returns at once, nothing runs until the gate opens, then the copy after the call
// sees the sums.
TEST(DeviceCalls, StreamCallStartsWhenTheStreamReachesItAndTheWorkAfterWaits) {
  SKIP_WITHOUT_CUDA();
  const int nranks = 2;
  ThreadRanks tr(nranks);
  ASSERT_TRUE(tr.ok()) << tr.error();
  const size_t n = 4096;
  std::vector<Gate> gates(nranks);
  std::vector<std::atomic<bool>> enqueued(nranks);
  std::atomic<bool> checkedBefore{false};
  // Once every rank has enqueued (so every call returned while its stream was held), the ranks
  // look, after giving the runners time to (wrongly) run.
  std::thread coordinator([&] {
    for (int r = 0; r < nranks; ++r)
      while (!enqueued[r]) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    checkedBefore = true;
  });
  std::string err = tr.run([&](int rank, loomComm_t comm) -> std::string {
    std::string e =
        heldStreamCall(rank, comm, nranks, n, &gates[rank], &enqueued[rank], &checkedBefore);
    return e.empty() ? "" : "rank " + std::to_string(rank) + ": " + e;
  });
  coordinator.join();
  EXPECT_EQ(err, "");
}

// One rank as a thread, four device buffers of n floats on device 0 (current after), two streams.
struct OneRankOnDevice {
  explicit OneRankOnDevice(size_t count) : n(count) {}
  bool ok() const { return tr.ok() && a.ok() && b.ok() && c.ok() && d.ok() && s1.s && s2.s; }
  ThreadRanks tr{1};
  const size_t n;
  DevBuf a{n * 4}, b{n * 4}, c{n * 4}, d{n * 4};
  Stream s1, s2;
};

// A call without a stream comes after the work already on the default stream (as NCCL's calls on
// stream 0): inputs copied there asynchronously, behind a held gate, are what the call reduces.
TEST(DeviceCalls, NullStreamCallComesAfterTheDefaultStreamsWork) {
  SKIP_WITHOUT_CUDA();
  ThreadRanks tr(1);
  ASSERT_TRUE(tr.ok()) << tr.error();
  ASSERT_TRUE(loom::device::useDevice(0).isOk());
  const size_t n = 4096;
  DevBuf a(n * 4), b(n * 4);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<float> poison(n, -1.0f), fresh(n, 5.0f);
  ASSERT_TRUE(a.put(poison) && b.put(poison));
  Gate gate;
  ASSERT_TRUE(gate.close(nullptr));
  ASSERT_EQ(api().cuMemcpyAsync(a.p, reinterpret_cast<CUdeviceptr>(fresh.data()), n * 4, nullptr),
            0);
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gate.open = true;
  });
  loomResult_t r = loomAllReduce(a.ptr(), b.ptr(), n, loomFloat32, loomSum, tr.comm(0), nullptr);
  opener.join();
  ASSERT_EQ(r, loomSuccess) << loomGetLastError();
  EXPECT_EQ(b.get(n), fresh) << "the call read its input before the default stream wrote it";
}

// A group of two calls on two streams of one communicator: both streams reach the group before
// it runs, and the work after it on either stream waits for both calls.
TEST(DeviceCalls, GroupOnTwoStreamsHoldsBothAndReleasesBoth) {
  SKIP_WITHOUT_CUDA();
  OneRankOnDevice t(2048);
  ASSERT_TRUE(t.ok()) << t.tr.error();
  loomComm_t comm = t.tr.comm(0);
  const size_t n = t.n;
  DevBuf &a = t.a, &b = t.b, &c = t.c, &d = t.d;
  Stream &s1 = t.s1, &s2 = t.s2;
  std::vector<float> va(n, 3.0f), vc(n, 5.0f), poison(n, -1.0f);
  ASSERT_TRUE(a.put(va) && c.put(vc) && b.put(poison) && d.put(poison));
  Gate gate;
  std::atomic<bool> afterOn2{false};
  ASSERT_TRUE(gate.close(s1.s));  // only s1 is held
  ASSERT_EQ(loomGroupStart(), loomSuccess);
  ASSERT_EQ(loomAllReduce(a.ptr(), b.ptr(), n, loomFloat32, loomSum, comm, s1.s), loomSuccess);
  ASSERT_EQ(loomBroadcast(c.ptr(), d.ptr(), n, loomFloat32, 0, comm, s2.s), loomSuccess);
  ASSERT_EQ(loomGroupEnd(), loomSuccess) << loomGetLastError();
  ASSERT_EQ(api().cuLaunchHostFunc(
                s2.s, [](void* p) { static_cast<std::atomic<bool>*>(p)->store(true); }, &afterOn2),
            0);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(afterOn2) << "work after the group on s2 ran while s1 had not reached the group";
  Stream probe;
  EXPECT_EQ(d.get(n, probe.s), poison) << "the group ran before s1 reached it";
  gate.open = true;
  ASSERT_EQ(api().cuStreamSynchronize(s2.s), 0);
  ASSERT_EQ(api().cuStreamSynchronize(s1.s), 0);
  EXPECT_TRUE(afterOn2);
  EXPECT_EQ(b.get(n), va);
  EXPECT_EQ(d.get(n), vc);
  // A group that mixes a stream and no stream on one communicator is refused.
  ASSERT_EQ(loomGroupStart(), loomSuccess);
  ASSERT_EQ(loomAllReduce(a.ptr(), b.ptr(), n, loomFloat32, loomSum, comm, s1.s), loomSuccess);
  ASSERT_EQ(loomAllReduce(c.ptr(), d.ptr(), n, loomFloat32, loomSum, comm, nullptr), loomSuccess);
  loomResult_t r = loomGroupEnd();
  EXPECT_EQ(r, loomInvalidUsage);
  EXPECT_NE(std::string(loomGetLastError()).find("mixes calls with and without a stream"),
            std::string::npos)
      << loomGetLastError();
}

// A communicator destroyed while its call waits for the stream to reach it: the destroy returns,
// and the stream, let go later, passes the call (its handoff words outlive the communicator until
// then) without a fault.
TEST(DeviceCalls, DestroyWithACallPendingOnAStreamLetsTheStreamGo) {
  SKIP_WITHOUT_CUDA();
  ThreadRanks tr(1);
  ASSERT_TRUE(tr.ok()) << tr.error();
  ASSERT_TRUE(loom::device::useDevice(0).isOk());
  const size_t n = 1024;
  DevBuf a(n * 4), b(n * 4);
  Stream s;
  ASSERT_TRUE(a.ok() && b.ok() && s.s);
  const long long faultsBefore = loomtest::fakeCudaCount("faults");
  Gate gate;
  ASSERT_TRUE(gate.close(s.s));
  ASSERT_EQ(loomAllReduce(a.ptr(), b.ptr(), n, loomFloat32, loomSum, tr.comm(0), s.s), loomSuccess);
  std::atomic<bool> after{false};
  ASSERT_EQ(api().cuLaunchHostFunc(
                s.s, [](void* p) { static_cast<std::atomic<bool>*>(p)->store(true); }, &after),
            0);
  EXPECT_EQ(loomCommDestroy(tr.comm(0)), loomSuccess) << loomGetLastError();
  tr.release(0);
  gate.open = true;
  EXPECT_EQ(api().cuStreamSynchronize(s.s), 0);
  EXPECT_TRUE(after) << "the work after the call did not run";
  EXPECT_EQ(loomtest::fakeCudaCount("faults"), faultsBefore)
      << "the stream faulted on freed handoff words";
  // A communicator made afterwards frees the words the stream has passed, and works.
  ThreadRanks again(1);
  ASSERT_TRUE(again.ok()) << again.error();
  std::vector<float> v(n, 2.0f);
  ASSERT_TRUE(a.put(v));
  ASSERT_EQ(loomAllReduce(a.ptr(), b.ptr(), n, loomFloat32, loomSum, again.comm(0), s.s),
            loomSuccess);
  EXPECT_EQ(b.get(n, s.s), v);
}

// loomCommAbort while a rank's call on a stream waits for a peer that never calls: the abort
// returns and the stream is released.
TEST(DeviceCalls, AbortReleasesAStreamWaitingForAPeer) {
  SKIP_WITHOUT_CUDA();
  ThreadRanks tr(2);
  ASSERT_TRUE(tr.ok()) << tr.error();
  ASSERT_TRUE(loom::device::useDevice(0).isOk());
  const size_t n = 1024;
  DevBuf a(n * 4), b(n * 4);
  Stream s;
  ASSERT_TRUE(a.ok() && b.ok() && s.s);
  ASSERT_EQ(loomAllReduce(a.ptr(), b.ptr(), n, loomFloat32, loomSum, tr.comm(0), s.s),
            loomSuccess);  // rank 1 never calls
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(api().cuStreamQuery(s.s), cuda::kErrorNotReady) << "the stream did not wait";
  EXPECT_EQ(loomCommAbort(tr.comm(0)), loomSuccess) << loomGetLastError();
  tr.release(0);
  EXPECT_EQ(api().cuStreamSynchronize(s.s), 0);
}

// The driver's stream capture and graph entry points (not in Loom's table: Loom keeps calls for
// graphs; the application captures, instantiates and launches them). Null where the driver lacks
// them.
struct GraphApi {
  bool ok() const {
    const cuda::DriverApi& a = api();
    return a.cuStreamBeginCapture && a.cuStreamEndCapture && a.cuGraphInstantiate &&
           a.cuGraphLaunch && a.cuGraphExecDestroy && a.cuGraphDestroy && a.cuUserObjectCreate &&
           a.cuGraphRetainUserObject;
  }
  cuda::CUresult begin(CUstream s, int mode) const { return api().cuStreamBeginCapture(s, mode); }
  cuda::CUresult end(CUstream s, void** graph) const {
    cuda::CUgraph g = nullptr;
    const cuda::CUresult rc = api().cuStreamEndCapture(s, &g);
    *graph = g;
    return rc;
  }
  cuda::CUresult instantiate(void** exec, void* graph, int flags) const {
    cuda::CUgraphExec e = nullptr;
    const cuda::CUresult rc = api().cuGraphInstantiate(&e, static_cast<cuda::CUgraph>(graph),
                                                       static_cast<unsigned>(flags));
    *exec = e;
    return rc;
  }
  cuda::CUresult launch(void* exec, CUstream s) const {
    return api().cuGraphLaunch(static_cast<cuda::CUgraphExec>(exec), s);
  }
  cuda::CUresult execDestroy(void* exec) const {
    return api().cuGraphExecDestroy(static_cast<cuda::CUgraphExec>(exec));
  }
  cuda::CUresult graphDestroy(void* graph) const {
    return api().cuGraphDestroy(static_cast<cuda::CUgraph>(graph));
  }
  static constexpr int kGlobal = 0, kThreadLocal = 1;  // CU_STREAM_CAPTURE_MODE_*

  // Captures on s what record() enqueues, into an executable graph (*exec); the error, or "".
  std::string capture(CUstream s, int mode, const std::function<std::string()>& record,
                      void** exec) const {
    *exec = nullptr;
    if (begin(s, mode) != 0) return "cuStreamBeginCapture failed";
    std::string e = record();
    void* graph = nullptr;
    const cuda::CUresult rc = end(s, &graph);  // ended even when record failed
    if (e.empty() && rc != 0) e = "cuStreamEndCapture: " + std::to_string(rc);
    if (e.empty() && instantiate(exec, graph, 0) != 0) e = "cuGraphInstantiate failed";
    if (graph) graphDestroy(graph);  // the executable graph keeps what it needs
    return e;
  }
};

// The checks of a graph test: a CUDA driver, and one that captures (g: its graph calls).
#define SKIP_WITHOUT_GRAPHS(g)                                     \
  SKIP_WITHOUT_CUDA();                                             \
  GraphApi g;                                                      \
  if (!(g).ok())                                                   \
  GTEST_SKIP() << "the CUDA driver " << cuda::cudaDriver().library \
               << " lacks stream capture or graph user objects (CUDA 11.3 and later)"

// Ranks (threads) meeting at a point: each arrives, then waits for all (at most 60 s).
struct Meeting {
  explicit Meeting(int n) : n_(n) {}
  bool arrive() {
    ++arrived_;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (arrived_ < n_) {
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }

 private:
  const int n_;
  std::atomic<int> arrived_{0};
};

// Two ranks as threads for the graph tests, and two points where they meet: after allocating and
// after capturing (a capture in GLOBAL mode forbids allocating and synchronizing on every thread).
struct GraphRanks {
  static constexpr int kRanks = 2;
  ThreadRanks tr{kRanks};
  Meeting allocated{kRanks}, captured{kRanks};
  // Once every rank has allocated, captures on s what record() enqueues (GraphApi::capture),
  // then waits for every rank's capture to end: "" or the error.
  std::string capture(const GraphApi& g, CUstream s, int mode,
                      const std::function<std::string()>& record, void** exec) {
    if (!allocated.arrive()) return "the ranks did not meet";
    std::string e = g.capture(s, mode, record, exec);
    if (!captured.arrive() && e.empty()) e = "the ranks did not meet";
    return e;
  }
  // fn(rank, comm) on each rank's thread, with device 0 current; the errors, joined.
  std::string run(const std::function<std::string(int, loomComm_t)>& fn) {
    if (!tr.ok()) return "the communicators: " + tr.error();
    return tr.run([&](int rank, loomComm_t comm) {
      (void)loom::device::useDevice(0);
      return fn(rank, comm);
    });
  }
};

// Whether every value of v is want; else a line naming the first that is not.
std::string allEqual(const std::vector<float>& v, float want, const char* what) {
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != want)
      return std::string(what) + "[" + std::to_string(i) + "] = " + std::to_string(v[i]) +
             ", expected " + std::to_string(want);
  return "";
}

// Launch `launch` of exec on s: upload() its inputs first, then check() the results; "" or the
// error, naming the launch.
std::string launchChecked(const GraphApi& g, void* exec, CUstream s, int launch,
                          const std::function<bool()>& upload,
                          const std::function<std::string()>& check) {
  const std::string at = "launch " + std::to_string(launch);
  if (!upload()) return at + ": upload failed";
  if (g.launch(exec, s) != 0 || api().cuStreamSynchronize(s) != 0) return at + " failed";
  const std::string e = check();
  return e.empty() ? e : at + ": " + e;
}

// An AllReduce captured into a CUDA graph (in GLOBAL mode, the default of cudaStreamBeginCapture
// and torch.cuda.graph), with a copy of its output after it: nothing runs at capture; each launch
// reduces the inputs as they are then, and the copy after the call sees the sums. The kept calls
// go with their graphs (the emulator's count of user objects).
TEST(DeviceCalls, GraphReplaysACapturedCallWithEachLaunchsValues) {
  SKIP_WITHOUT_GRAPHS(g);
  const int nranks = GraphRanks::kRanks;
  GraphRanks gr;
  const size_t n = 4096;
  const long long objectsBefore = loomtest::fakeCudaCount("user_objects");
  std::string err = gr.run([&](int rank, loomComm_t comm) -> std::string {
    // Everything allocated before any capture: a capture in GLOBAL mode forbids allocating and
    // synchronizing on every thread.
    DevBuf in(n * 4), out(n * 4), copy(n * 4);
    Stream s, probe;
    const std::vector<float> poison(n, -1.0f);
    if (!in.ok() || !out.ok() || !copy.ok() || !s.s || !probe.s || !out.put(poison) ||
        !copy.put(poison))
      return "setup failed";
    void* exec = nullptr;
    std::string e = gr.capture(
        g, s.s, GraphApi::kGlobal,
        [&]() -> std::string {
          loomResult_t r = loomAllReduce(in.ptr(), out.ptr(), n, loomFloat32, loomSum, comm, s.s);
          if (r != loomSuccess) return "the captured call: " + outcome(r);
          if (api().cuMemcpyAsync(copy.p, out.p, n * 4, s.s) != 0)
            return "the copy after it failed";
          return "";
        },
        &exec);
    if (e.empty() && out.get(n, probe.s) != poison) e = "the call ran when it was captured";
    for (int launch = 1; launch <= 3 && e.empty(); ++launch) {
      e = launchChecked(
          g, exec, s.s, launch,
          [&] { return in.put(std::vector<float>(n, static_cast<float>((rank + 1) * launch))); },
          [&] {
            const float want = static_cast<float>(launch * nranks * (nranks + 1) / 2);
            std::string x = allEqual(out.get(n, probe.s), want, "output");
            return x.empty() ? allEqual(copy.get(n, probe.s), want, "the copy after the call") : x;
          });
    }
    if (exec) g.execDestroy(exec);
    loomResult_t async = loomSuccess;
    loomCommGetAsyncError(comm, &async);
    if (e.empty() && async != loomSuccess) e = "async error: " + outcome(async);
    return e.empty() ? "" : "rank " + std::to_string(rank) + ": " + e;
  });
  EXPECT_EQ(err, "");
  if (objectsBefore >= 0) {
    EXPECT_EQ(loomtest::fakeCudaCount("user_objects"), objectsBefore)
        << "a kept call outlived its graph";
  }
}

// A graph's call and eager calls on one stream run in the stream's order, whichever was made
// first: an eager call made after the graph's launch (while the stream is held before it) waits
// for the graph's call, and one made before the launch runs first. Every sum is right.
TEST(DeviceCalls, GraphAndEagerCallsOnOneStreamRunInTheStreamsOrder) {
  SKIP_WITHOUT_GRAPHS(g);
  const int nranks = GraphRanks::kRanks;
  GraphRanks gr;
  const size_t n = 2048;
  std::vector<Gate> gates(2 * nranks);
  std::string err = gr.run([&](int rank, loomComm_t comm) -> std::string {
    DevBuf a(n * 4), ra(n * 4), b(n * 4), rb(n * 4);
    Stream s, probe;
    if (!a.ok() || !ra.ok() || !b.ok() || !rb.ok() || !s.s || !probe.s) return "setup failed";
    void* exec = nullptr;
    std::string e = gr.capture(
        g, s.s, GraphApi::kThreadLocal,
        [&]() -> std::string {
          loomResult_t r = loomAllReduce(a.ptr(), ra.ptr(), n, loomFloat32, loomSum, comm, s.s);
          return r == loomSuccess ? "" : "the captured call: " + outcome(r);
        },
        &exec);
    const float sum = static_cast<float>(nranks * (nranks + 1) / 2);
    for (int round = 0; round < 2 && e.empty(); ++round) {
      const bool graphFirst = round == 0;
      const float scale = static_cast<float>(round + 1);
      if (!a.put(std::vector<float>(n, scale * static_cast<float>(rank + 1))) ||
          !b.put(std::vector<float>(n, 10.0f * scale * static_cast<float>(rank + 1)))) {
        e = "upload failed";
        break;
      }
      Gate& gate = gates[2 * rank + round];
      if (!gate.close(s.s)) e = "cuLaunchHostFunc failed";
      auto eager = [&] {
        loomResult_t r = loomAllReduce(b.ptr(), rb.ptr(), n, loomFloat32, loomSum, comm, s.s);
        if (r != loomSuccess && e.empty()) e = "the eager call: " + outcome(r);
      };
      if (!graphFirst) eager();
      if (e.empty() && g.launch(exec, s.s) != 0) e = "cuGraphLaunch failed";
      if (graphFirst) eager();
      gate.open = true;
      if (api().cuStreamSynchronize(s.s) != 0 && e.empty()) e = "cuStreamSynchronize failed";
      if (e.empty()) e = allEqual(ra.get(n, probe.s), scale * sum, "the graph's output");
      if (e.empty()) e = allEqual(rb.get(n, probe.s), 10.0f * scale * sum, "the eager output");
      if (!e.empty()) e = (graphFirst ? "graph first: " : "eager first: ") + e;
    }
    if (exec) g.execDestroy(exec);
    return e.empty() ? "" : "rank " + std::to_string(rank) + ": " + e;
  });
  EXPECT_EQ(err, "");
}

// Two executable graphs of one capture launched at once on two streams (rank 0; rank 1 launches
// its graph once, later): the second launch reaches the kept call while the first runs it. Both
// streams are released, the first launch's sums are right, and the communicator fails naming the
// cause (their calls would have no order between ranks).
TEST(DeviceCalls, GraphLaunchedTwiceAtOnceFailsTheCommunicatorAndReleasesBoth) {
  SKIP_WITHOUT_GRAPHS(g);
  GraphRanks gr;
  const size_t n = 1024;
  std::string err = gr.run([&](int rank, loomComm_t comm) -> std::string {
    DevBuf a(n * 4), b(n * 4);
    Stream s1, s2, probe;
    if (!a.ok() || !b.ok() || !s1.s || !s2.s || !probe.s ||
        !a.put(std::vector<float>(n, static_cast<float>(rank + 1))))
      return "setup failed";
    if (!gr.allocated.arrive()) return "the ranks did not meet";
    void* graph = nullptr;
    std::string e;
    if (g.begin(s1.s, GraphApi::kThreadLocal) != 0) e = "cuStreamBeginCapture failed";
    loomResult_t r = loomAllReduce(a.ptr(), b.ptr(), n, loomFloat32, loomSum, comm, s1.s);
    if (e.empty() && r != loomSuccess) e = "the captured call: " + outcome(r);
    if (g.end(s1.s, &graph) != 0 && e.empty()) e = "cuStreamEndCapture failed";
    const long long hostFuncs = loomtest::fakeCudaCount("host_funcs");
    if (!gr.captured.arrive() && e.empty()) e = "the ranks did not meet";
    void* execs[2] = {nullptr, nullptr};
    for (void*& x : execs)
      if (e.empty() && g.instantiate(&x, graph, 0) != 0) e = "cuGraphInstantiate failed";
    if (graph) g.graphDestroy(graph);
    if (!e.empty()) return "rank " + std::to_string(rank) + ": " + e;
    if (rank == 0) {
      if (g.launch(execs[0], s1.s) != 0 || g.launch(execs[1], s2.s) != 0) e = "launch failed";
      if (api().cuStreamSynchronize(s1.s) != 0 || api().cuStreamSynchronize(s2.s) != 0)
        e = "a stream failed";
      if (e.empty()) e = allEqual(b.get(n, probe.s), 3.0f, "the first launch's output");
      loomResult_t async = loomSuccess;
      for (int i = 0; i < 5000 && async == loomSuccess; ++i) {  // the runner's verdict, within 5 s
        loomCommGetAsyncError(comm, &async);
        if (async == loomSuccess) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      const std::string msg = async == loomSuccess ? "" : loomGetLastError();
      if (e.empty() && async == loomSuccess) e = "the communicator did not fail";
      if (e.empty() && msg.find("two executable graphs") == std::string::npos)
        e = "the failure does not name the cause: " + msg;
    } else {
      // After rank 0's two launches have reached the call (the emulator counts host functions;
      // a real driver: 200 ms), its first replay in flight, waiting for this one.
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (hostFuncs >= 0 && loomtest::fakeCudaCount("host_funcs") < hostFuncs + 2 &&
             std::chrono::steady_clock::now() < end)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::this_thread::sleep_for(std::chrono::milliseconds(hostFuncs >= 0 ? 20 : 200));
      if (g.launch(execs[0], s1.s) != 0 || api().cuStreamSynchronize(s1.s) != 0)
        e = "launch failed";
    }
    for (void* x : execs) g.execDestroy(x);
    return e.empty() ? "" : "rank " + std::to_string(rank) + ": " + e;
  });
  EXPECT_EQ(err, "");
}

// A graph launched after its communicator was destroyed: the kept call does nothing, the graph
// goes on (the work after the call runs), and nothing faults.
TEST(DeviceCalls, GraphOfADestroyedCommunicatorGoesOnWithoutTheCall) {
  SKIP_WITHOUT_GRAPHS(g);
  OneRankOnDevice t(1024);
  ASSERT_TRUE(t.ok()) << t.tr.error();
  const std::vector<float> poison(t.n, -1.0f);
  ASSERT_TRUE(t.a.put(std::vector<float>(t.n, 4.0f)) && t.b.put(poison));
  std::atomic<bool> after{false};
  void* exec = nullptr;
  auto record = [&]() -> std::string {
    loomResult_t r =
        loomAllReduce(t.a.ptr(), t.b.ptr(), t.n, loomFloat32, loomSum, t.tr.comm(0), t.s1.s);
    if (r != loomSuccess) return outcome(r);
    auto mark = [](void* p) { static_cast<std::atomic<bool>*>(p)->store(true); };
    return api().cuLaunchHostFunc(t.s1.s, mark, &after) == 0 ? "" : "cuLaunchHostFunc failed";
  };
  ASSERT_EQ(g.capture(t.s1.s, GraphApi::kGlobal, record, &exec), "");
  const long long faultsBefore = loomtest::fakeCudaCount("faults");
  EXPECT_EQ(loomCommDestroy(t.tr.comm(0)), loomSuccess) << loomGetLastError();
  t.tr.release(0);
  ASSERT_EQ(g.launch(exec, t.s1.s), 0);
  EXPECT_EQ(api().cuStreamSynchronize(t.s1.s), 0);
  EXPECT_TRUE(after) << "the work after the kept call did not run";
  EXPECT_EQ(t.b.get(t.n), poison) << "a destroyed communicator's kept call ran";
  EXPECT_EQ(loomtest::fakeCudaCount("faults"), faultsBefore);
  g.execDestroy(exec);
}

// A group on two streams of one capture (the second forked into it by an event, and joined back
// before the capture ends, as PyTorch's process groups and NCCL users do): kept as one call; each
// launch runs both calls on that launch's inputs, and work on either stream after the group sees
// the results.
TEST(DeviceCalls, GraphKeepsAGroupOnTwoStreamsOfOneCapture) {
  SKIP_WITHOUT_GRAPHS(g);
  const int nranks = GraphRanks::kRanks;
  GraphRanks gr;
  const size_t n = 2048;
  std::string err = gr.run([&](int rank, loomComm_t comm) -> std::string {
    DevBuf a(n * 4), b(n * 4), c(n * 4), d(n * 4), copyB(n * 4), copyD(n * 4);
    Stream s1, s2, probe;
    cuda::CUevent fork = nullptr, back = nullptr;
    if (!a.ok() || !b.ok() || !c.ok() || !d.ok() || !copyB.ok() || !copyD.ok() || !s1.s || !s2.s ||
        !probe.s || api().cuEventCreate(&fork, cuda::kEventDisableTiming) != 0 ||
        api().cuEventCreate(&back, cuda::kEventDisableTiming) != 0)
      return "setup failed";
    void* exec = nullptr;
    std::string e = gr.capture(
        g, s1.s, GraphApi::kGlobal,
        [&]() -> std::string {
          if (api().cuEventRecord(fork, s1.s) != 0 || api().cuStreamWaitEvent(s2.s, fork, 0) != 0)
            return "forking s2 into the capture failed";
          loomResult_t r = loomGroupStart();
          if (r == loomSuccess)
            r = loomAllReduce(a.ptr(), b.ptr(), n, loomFloat32, loomSum, comm, s1.s);
          if (r == loomSuccess)
            r = loomAllReduce(c.ptr(), d.ptr(), n, loomFloat32, loomMax, comm, s2.s);
          const loomResult_t end = loomGroupEnd();
          if (r != loomSuccess || end != loomSuccess)
            return "the captured group: " + outcome(r != loomSuccess ? r : end) + ": " +
                   loomGetLastError();
          if (api().cuMemcpyAsync(copyB.p, b.p, n * 4, s1.s) != 0 ||
              api().cuMemcpyAsync(copyD.p, d.p, n * 4, s2.s) != 0)
            return "the copies after it failed";
          if (api().cuEventRecord(back, s2.s) != 0 || api().cuStreamWaitEvent(s1.s, back, 0) != 0)
            return "joining s2 back failed";
          return "";
        },
        &exec);
    for (int launch = 1; launch <= 3 && e.empty(); ++launch) {
      const float sum = static_cast<float>(launch * nranks * (nranks + 1) / 2);
      const float max = static_cast<float>((nranks - 1) * 10 + launch);
      e = launchChecked(
          g, exec, s1.s, launch,
          [&] {
            return a.put(std::vector<float>(n, static_cast<float>((rank + 1) * launch))) &&
                   c.put(std::vector<float>(n, static_cast<float>(rank * 10 + launch)));
          },
          [&] {
            std::string x = allEqual(b.get(n, probe.s), sum, "the first call's output");
            if (x.empty()) x = allEqual(copyB.get(n, probe.s), sum, "the copy after it on s1");
            if (x.empty()) x = allEqual(d.get(n, probe.s), max, "the second call's output");
            if (x.empty()) x = allEqual(copyD.get(n, probe.s), max, "the copy after it on s2");
            return x;
          });
    }
    if (exec) g.execDestroy(exec);
    api().cuEventDestroy(fork);
    api().cuEventDestroy(back);
    return e.empty() ? "" : "rank " + std::to_string(rank) + ": " + e;
  });
  EXPECT_EQ(err, "");
}

// What Loom cannot keep for a graph is refused with the reason: a group whose calls are on two
// streams of which only one is being captured, or which are in two captures, and a capture that
// was invalidated.
TEST(DeviceCalls, GraphCapturesLoomCannotKeepAreRefusedWithTheirReason) {
  SKIP_WITHOUT_GRAPHS(g);
  OneRankOnDevice t(1024);
  ASSERT_TRUE(t.ok()) << t.tr.error();
  loomComm_t comm = t.tr.comm(0);
  // t.a -> t.b on s1 and t.c -> t.d on s2: an AllReduce of n floats.
  auto allReduce = [&](const DevBuf& in, const DevBuf& out, const Stream& s) {
    return loomAllReduce(in.ptr(), out.ptr(), t.n, loomFloat32, loomSum, comm, s.s);
  };
  auto refused = [&](loomResult_t r, const char* words) {
    EXPECT_EQ(r, loomInvalidUsage);
    EXPECT_NE(std::string(loomGetLastError()).find(words), std::string::npos) << loomGetLastError();
  };
  ASSERT_EQ(g.begin(t.s1.s, GraphApi::kThreadLocal), 0);
  ASSERT_EQ(loomGroupStart(), loomSuccess);
  ASSERT_EQ(allReduce(t.a, t.b, t.s1), loomSuccess);
  ASSERT_EQ(allReduce(t.c, t.d, t.s2), loomSuccess);
  refused(loomGroupEnd(), "being captured into a CUDA graph");
  // Both streams captured, but into two captures: no one graph could join them.
  ASSERT_EQ(g.begin(t.s2.s, GraphApi::kThreadLocal), 0);
  ASSERT_EQ(loomGroupStart(), loomSuccess);
  ASSERT_EQ(allReduce(t.a, t.b, t.s1), loomSuccess);
  ASSERT_EQ(allReduce(t.c, t.d, t.s2), loomSuccess);
  refused(loomGroupEnd(), "(2 different captures)");
  void* other = nullptr;
  ASSERT_EQ(g.end(t.s2.s, &other), 0);
  if (other) g.graphDestroy(other);
  // Synchronizing a capturing stream invalidates its capture.
  EXPECT_NE(api().cuStreamSynchronize(t.s1.s), 0);
  refused(allReduce(t.a, t.b, t.s1), "invalidated");
  void* graph = nullptr;
  EXPECT_NE(g.end(t.s1.s, &graph), 0);
  EXPECT_EQ(graph, nullptr);
  // The communicator still works.
  ASSERT_TRUE(t.a.put(std::vector<float>(t.n, 3.0f)));
  ASSERT_EQ(allReduce(t.a, t.b, t.s1), loomSuccess) << loomGetLastError();
  EXPECT_EQ(t.b.get(t.n, t.s1.s), std::vector<float>(t.n, 3.0f));
}

// Ranks as processes, each capturing an AllReduce into a graph of its own (GLOBAL mode) and
// launching it, with an eager call among the launches: every result right; once the runner's
// opener has opened the peers' buffers the replays take the one pass (worker mode "devgraph").
TEST(DeviceCalls, GraphOfRanksAsProcessesReplaysStagedThenInOnePass) {
  SKIP_WITHOUT_GRAPHS(g);
  if (!driverSymbol("loomtest_fakecuda_count"))
    GTEST_SKIP() << "needs the emulated device's counters; the driver is "
                 << cuda::cudaDriver().library;
  WorkerResult res = runWorkers(3, "devgraph", {{"LOOM_DEVICE_ONE_PASS", "2"}});
  for (int r = 0; r < 3; ++r)
    EXPECT_TRUE(res.exitedWith(r, 0)) << "rank " << r << ": " << res.describe(r);
}

// Ranks as processes on device buffers with streams: rank 1 is killed; the survivors' streams are
// released and loomCommGetAsyncError names the rank (worker mode "devkill:1").
TEST(DeviceCalls, KilledPeerReleasesTheWaitingStreamAndIsNamed) {
  SKIP_WITHOUT_CUDA();
  WorkerResult res = runWorkers(3, "devkill:1", {{"LOOM_TIMEOUT", "30"}});
  EXPECT_TRUE(res.killedBySignal(1)) << res.describe(1);
  for (int r : {0, 2}) EXPECT_TRUE(res.exitedWith(r, 0)) << "rank " << r << ": " << res.describe(r);
}

// Ranks as processes, rank 0's call enqueued on a stream that its own work holds: a kernel of its
// faults meanwhile (illegal address, injected), so its context's streams drop their work and the
// stream never reaches the call. Rank 0's call fails naming the cause, its stream is let go, and
// the other rank's call fails instead of hanging (worker mode "devfault"). (A buffer freed under
// a queued call cannot happen: cuMemFree waits for the device, on a GPU and on the emulated one; a
// buffer freed before the call is refused when the call is made: BadDeviceInput...)
TEST(DeviceCalls, DeviceFaultFailsTheCallOnEveryRankAndReleasesTheStream) {
  SKIP_WITHOUT_CUDA();
  if (!driverSymbol("loomtest_fakecuda_inject"))
    GTEST_SKIP() << "needs the emulated device (a fault on purpose); the driver is "
                 << cuda::cudaDriver().library;
  WorkerResult res = runWorkers(2, "devfault", {{"LOOM_TIMEOUT", "20"}});
  for (int r : {0, 1}) EXPECT_TRUE(res.exitedWith(r, 0)) << "rank " << r << ": " << res.describe(r);
}

// The one pass over the peers' device buffers (src/runtime/device_one_pass.h): ranks as processes
// open each other's buffers through CUDA IPC and reduce with Loom's kernels; with
// LOOM_DEVICE_ONE_PASS=0 the same calls are staged (no IPC mapping, no kernel). The emulator's
// counters tell them apart; every result is checked (worker mode "devonepass").
TEST(DeviceCalls, OnePassOverThePeersDeviceBuffersAndStagedWhenOff) {
  SKIP_WITHOUT_CUDA();
  if (!driverSymbol("loomtest_fakecuda_count"))
    GTEST_SKIP() << "needs the emulated device's counters; the driver is "
                 << cuda::cudaDriver().library;
  for (const char* on : {"2", "0"}) {  // 2: wherever it can run, whatever the prices
    WorkerResult res = runWorkers(3, "devonepass", {{"LOOM_DEVICE_ONE_PASS", on}});
    for (int r = 0; r < 3; ++r)
      EXPECT_TRUE(res.exitedWith(r, 0))
          << "LOOM_DEVICE_ONE_PASS=" << on << " rank " << r << ": " << res.describe(r);
  }
}

// One rank's AllReduce of n floats on device `dev` (its buffers and stream there), out of place
// then in place, every element checked; "" or what went wrong. A rank in a process of its own
// reads each result back at once, by a copy to pageable memory that waits for the call while
// holding the driver's mapping lock (so the runner must allocate and map nothing); ranks as
// threads (threads) read it once the stream is done, since they allocate their buffers here, and
// an allocation would wait for another rank's copy, which waits for this rank's call.
std::string allReduceOnDevice(int rank, int nranks, loomComm_t comm, int dev, size_t n,
                              bool threads) {
  DevBuf a(n * 4, dev), b(n * 4, dev);
  Stream s(dev);
  if (!loom::device::useDevice(dev).isOk()) return "useDevice failed";
  std::vector<float> mine(n);
  for (size_t i = 0; i < n; ++i) mine[i] = static_cast<float>(rank + 1 + i % 5);
  if (!a.ok() || !b.ok() || !s.s || !a.put(mine)) return "setup failed";
  for (bool inPlace : {false, true}) {
    void* out = inPlace ? a.ptr() : b.ptr();
    loomResult_t r = loomAllReduce(a.ptr(), out, n, loomFloat32, loomSum, comm, s.s);
    if (r != loomSuccess) return "allreduce: " + outcome(r);
    if (threads && loom::cuda::cudaDriver().api.cuStreamSynchronize(s.s) != 0)
      return "cuStreamSynchronize";
    std::vector<float> got = (inPlace ? a : b).get(n, s.s);
    for (size_t i = 0; i < n; ++i) {
      const float want = static_cast<float>(nranks * (nranks + 1) / 2 + nranks * (i % 5));
      if (got[i] != want)
        return "rank " + std::to_string(rank) + (inPlace ? " in place" : " out of place") +
               ": element " + std::to_string(i) + " is " + std::to_string(got[i]) + ", expected " +
               std::to_string(want);
    }
  }
  return "";
}

// Ranks of one host on different GPUs that reach each other peer to peer take the one pass too:
// as threads (peer access turned on, buffers by address) and as processes (IPC handles opened with
// lazy peer access); with LOOM_DEVICE_P2P=0 they stage. The emulator's counters tell the paths
// apart (its kernels fault on another device's memory without peer access); every value is
// checked, in place and out of place.
TEST(DeviceCalls, OnePassAcrossGpusWithPeerAccessAndStagedWhenOff) {
  SKIP_WITHOUT_CUDA();
  int gpus = 0;
  api().cuDeviceGetCount(&gpus);
  if (gpus < 2)
    GTEST_SKIP() << "needs two GPUs (ctest runs it with LOOMTEST_FAKECUDA_DEVICES=2); there are "
                 << gpus;
  struct Restore {
    ~Restore() {
      setParam("LOOM_DEVICE_P2P", nullptr);
      setParam("LOOM_DEVICE_ONE_PASS", nullptr);
    }
  } restore;
  setParam("LOOM_DEVICE_ONE_PASS", "2");  // wherever it can run, whatever the emulator's prices
  const size_t n = 10007;
  for (const char* p2p : {"1", "0"}) {
    setParam("LOOM_DEVICE_P2P", p2p);
    const bool on = p2p[0] == '1';
    // Bound at init: each thread reads its result back at once by a copy to pageable memory,
    // during which the other's first device call could allocate nothing (the mapping lock).
    ThreadRanks tr(2, {0, 1 % gpus});
    ASSERT_TRUE(tr.ok()) << tr.error();
    const long long launches = loomtest::fakeCudaCount("kernel_launches");
    std::string err = tr.run([&](int rank, loomComm_t comm) {
      return allReduceOnDevice(rank, 2, comm, rank % gpus, n, true);
    });
    EXPECT_EQ(err, "") << "LOOM_DEVICE_P2P=" << p2p;
    if (launches >= 0) {
      if (on) {
        EXPECT_GE(loomtest::fakeCudaCount("kernel_launches") - launches, 4)
            << "the calls were staged";
      } else {
        EXPECT_EQ(loomtest::fakeCudaCount("kernel_launches") - launches, 0)
            << "LOOM_DEVICE_P2P=0 ran kernels";
      }
    }
    // The same between processes, through IPC handles of another device.
    WorkerResult res = runWorkers(
        2, "devonepass",
        {{"LOOMTEST_RANK_DEVICES", "1"}, {"LOOM_DEVICE_P2P", p2p}, {"LOOM_DEVICE_ONE_PASS", "2"}});
    for (int r = 0; r < 2; ++r)
      EXPECT_TRUE(res.exitedWith(r, 0))
          << "LOOM_DEVICE_P2P=" << p2p << " rank " << r << ": " << res.describe(r);
  }
}

// Ranks of different hosts (no shared memory) over the emulated InfiniBand device with GPUDirect
// RDMA (dma-buf): calls on device memory run on the schedule, the network reading and writing the
// device buffers and Loom's kernels reducing what arrives (the emulator counts them); with
// LOOM_DEVICE_GDR=0 the same calls are staged through the host (no kernel). Every value checked.
TEST(DeviceCalls, GpuDirectScheduleOverInfiniBandAndStagedWhenOff) {
  SKIP_WITHOUT_CUDA();
#ifndef LOOMTEST_FAKEVERBS_LIB
  GTEST_SKIP() << "needs the emulated verbs device (built with the tests)";
#else
  if (!driverSymbol("loomtest_fakecuda_count"))
    GTEST_SKIP() << "needs the emulated device's counters; the driver is "
                 << cuda::cudaDriver().library;
  // In worker processes: the network a process selects stays its own (the tests before this one
  // chose sockets in this process).
  // The NIC's writes into device memory land late unless flushed, as on real hardware: an
  // unflushed receive gives wrong values. Each rank's log says which path its device calls take,
  // and why not GPUDirect RDMA when they do not.
  for (const char* gdr : {"1", "0"}) {
    WorkerResult res = runWorkers(3, "devgdr",
                                  {{"LOOM_NET", "ib"},
                                   {"LOOM_IBVERBS_LIB", LOOMTEST_FAKEVERBS_LIB},
                                   {"LOOM_SHM_DISABLE", "1"},
                                   {"LOOM_NET_GDR_LEVEL", "SYS"},
                                   {"LOOMTEST_FAKEVERBS_GPU_WRITE_DELAY_MS", "200"},
                                   {"LOOM_DEBUG", "INFO"},
                                   {"LOOM_DEBUG_SUBSYS", "INIT"},
                                   {"LOOM_DEVICE_GDR", gdr}});
    const std::string says =
        gdr[0] == '1' ? "on the schedule, the network reading and writing the device buffers"
                      : "not GPUDirect RDMA: ranks 0-2 cannot (this one: LOOM_DEVICE_GDR=0)";
    for (int r = 0; r < 3; ++r) {
      EXPECT_TRUE(res.exitedWith(r, 0))
          << "LOOM_DEVICE_GDR=" << gdr << " rank " << r << ": " << res.describe(r);
      EXPECT_NE(res.output[r].find(says), std::string::npos)
          << "LOOM_DEVICE_GDR=" << gdr << " rank " << r << ": " << res.output[r];
      // The device scratch was reserved when each call was posted, from its schedule.
      EXPECT_EQ(res.output[r].find("more than its post reserved"), std::string::npos)
          << "LOOM_DEVICE_GDR=" << gdr << " rank " << r << ": " << res.output[r];
    }
  }
#endif
}

// The same schedule through an imported NCCL net plugin (Loom's own libnccl-net-loom.so, over its
// IB transport on the emulated verbs device): the adaptor registers each device allocation once
// per comm, and exports nothing on the runner's thread, where the reads back by a copy to pageable
// memory (which holds the driver's mapping lock while the stream waits for the call) would hang
// it: the posting thread exported the allocations (holdMemory).
TEST(DeviceCalls, GpuDirectScheduleThroughAnImportedNcclPlugin) {
  SKIP_WITHOUT_CUDA();
#if !defined(LOOMTEST_FAKEVERBS_LIB) || !defined(LOOMTEST_NCCL_NET_PLUGIN)
  GTEST_SKIP() << "needs the emulated verbs device and libnccl-net-loom.so (built with the tests)";
#else
  if (!driverSymbol("loomtest_fakecuda_count"))
    GTEST_SKIP() << "needs the emulated device's counters; the driver is "
                 << cuda::cudaDriver().library;
  WorkerResult res = runWorkers(3, "devgdr",
                                {{"LOOM_NET_PLUGIN", LOOMTEST_NCCL_NET_PLUGIN},
                                 {"LOOM_IBVERBS_LIB", LOOMTEST_FAKEVERBS_LIB},
                                 {"LOOM_SHM_DISABLE", "1"},
                                 {"LOOM_NET_GDR_LEVEL", "SYS"},
                                 {"LOOMTEST_FAKEVERBS_GPU_WRITE_DELAY_MS", "200"},
                                 {"LOOM_DEBUG", "INFO"},
                                 {"LOOM_DEBUG_SUBSYS", "INIT,NET"},
                                 {"LOOM_DEVICE_GDR", "1"}});
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(res.exitedWith(r, 0)) << "rank " << r << ": " << res.describe(r);
    EXPECT_NE(res.output[r].find("on the schedule, the network reading and writing the device "
                                 "buffers"),
              std::string::npos)
        << "rank " << r << ": " << res.output[r];
    EXPECT_NE(res.output[r].find("network 'Loom'"), std::string::npos)
        << "rank " << r << " did not use the plugin: " << res.output[r];
    EXPECT_EQ(res.output[r].find("more than its post reserved"), std::string::npos)
        << "rank " << r << ": " << res.output[r];
  }
#endif
}

// Ranks as threads: the one pass reaches the other threads' device buffers by address (no IPC),
// in place and out of place.
TEST(DeviceCalls, OnePassAmongThreadsInPlaceAndOutOfPlace) {
  SKIP_WITHOUT_CUDA();
  setParam("LOOM_DEVICE_ONE_PASS", "2");  // wherever it can run, whatever the emulator's prices
  struct Restore {
    ~Restore() { setParam("LOOM_DEVICE_ONE_PASS", nullptr); }
  } restore;
  const int nranks = 3;
  ThreadRanks tr(nranks, {0, 0, 0});  // bound at init (see OnePassAcrossGpus...)
  ASSERT_TRUE(tr.ok()) << tr.error();
  const long long launches = loomtest::fakeCudaCount("kernel_launches");
  const long long lazyLoads = loomtest::fakeCudaCount("lazy_loads");
  const size_t n = 10007;  // slices of unequal length
  std::string err = tr.run(
      [&](int rank, loomComm_t comm) { return allReduceOnDevice(rank, nranks, comm, 0, n, true); });
  EXPECT_EQ(err, "");
  if (launches >= 0) {
    EXPECT_GE(loomtest::fakeCudaCount("kernel_launches") - launches, 2 * nranks)
        << "the one pass launched no reduction kernels: the calls were staged";
    // Loaded when the runner started, not by a first launch while the users' streams waited for
    // the call (which hangs a real driver with lazy loading).
    EXPECT_EQ(loomtest::fakeCudaCount("lazy_loads") - lazyLoads, 0);
  }
}

// Ranks as threads bound to their device at init (loomCommInitAll's devlist): every call after
// that, staged whole or pipelined (LOOM_DEVICE_ONE_PASS=0), allocates nothing, host or device:
// the staging was reserved at init, so no rank's call waits on the driver's mapping lock while
// another rank's thread reads its result back by a copy to pageable memory (each does, at once).
// A bad devlist or config.cudaDev is refused with the reason.
TEST(DeviceCalls, RanksBoundAtInitAllocateNothingLater) {
  SKIP_WITHOUT_CUDA();
  setParam("LOOM_DEVICE_ONE_PASS", "0");
  struct Restore {
    ~Restore() { setParam("LOOM_DEVICE_ONE_PASS", nullptr); }
  } restore;
  {
    ThreadRanks tr(2, {0, 0});
    ASSERT_TRUE(tr.ok()) << tr.error();
    const size_t big = size_t(3) << 20;  // 12 MiB: pipelined in 4 MiB chunks
    // Buffers and streams made here, not on the rank threads (allReduceOnDevice says why).
    std::vector<std::unique_ptr<DevBuf>> bufs;
    std::vector<std::unique_ptr<Stream>> streams;
    for (int r = 0; r < 2; ++r) {
      bufs.push_back(std::make_unique<DevBuf>(big * 4, 0));
      streams.push_back(std::make_unique<Stream>(0));
      ASSERT_TRUE(bufs.back()->ok() && streams.back()->s);
    }
    const long long pinned = loomtest::fakeCudaCount("host_allocations"),
                    dev = loomtest::fakeCudaCount("allocations");
    for (size_t n : {size_t(1000), big}) {
      for (int r = 0; r < 2; ++r)
        ASSERT_TRUE(bufs[r]->put(std::vector<float>(n, static_cast<float>(r + 1))));
      std::string err = tr.run([&](int rank, loomComm_t comm) -> std::string {
        if (!loom::device::useDevice(0).isOk()) return "useDevice failed";
        void* p = bufs[rank]->ptr();
        CUstream s = streams[rank]->s;
        if (loomAllReduce(p, p, n, loomFloat32, loomSum, comm, s) != loomSuccess)
          return std::string("allreduce: ") + loomGetLastError();
        std::vector<float> got = bufs[rank]->get(n, s);  // at once: pageable, while it runs
        for (size_t i = 0; i < n; ++i)
          if (got[i] != 3.0f)
            return "rank " + std::to_string(rank) + ": element " + std::to_string(i) + " is " +
                   std::to_string(got[i]);
        return "";
      });
      EXPECT_EQ(err, "") << n << " floats";
      if (pinned >= 0) {  // live counts
        EXPECT_EQ(loomtest::fakeCudaCount("host_allocations"), pinned)
            << n << " floats: staging allocated";
        EXPECT_EQ(loomtest::fakeCudaCount("allocations"), dev)
            << n << " floats: device memory allocated";
      }
    }
  }
  loomComm_t comms[2] = {nullptr, nullptr};
  const int bad[2] = {0, 99};
  EXPECT_EQ(loomCommInitAll(comms, 2, bad), loomInvalidArgument);
  EXPECT_NE(std::string(loomGetLastError()).find("devlist[1] names CUDA device 99"),
            std::string::npos)
      << loomGetLastError();
  EXPECT_EQ(comms[0], nullptr);
  loomUniqueId id;
  ASSERT_EQ(loomGetUniqueId(&id), loomSuccess);
  loomConfig_t cfg = LOOM_CONFIG_INITIALIZER;
  cfg.cudaDev = -3;
  loomComm_t c = nullptr;
  EXPECT_EQ(loomCommInitRankConfig(&c, 1, id, 0, &cfg), loomInvalidArgument);
  EXPECT_NE(std::string(loomGetLastError()).find("config.cudaDev is -3"), std::string::npos)
      << loomGetLastError();
  EXPECT_EQ(c, nullptr);
}

// Every collective but Send/Recv, in place and out of place, float32 sum of f32Count and bfloat16
// max of bf16Count, on tr's n ranks as the harness runs them (LOOMTEST_DEVICE, LOOMTEST_STREAM):
// "" or what went wrong first.
std::string everyCollective(ThreadRanks& tr, int n, size_t f32Count, size_t bf16Count) {
  std::vector<Case> cases;
  for (Coll c : allColls())
    if (c != Coll::kSendRecv)
      for (bool inPlace : {false, true}) {
        cases.push_back({c, loomFloat32, loomSum, f32Count, inPlace, n - 1});
        cases.push_back({c, loomBfloat16, loomMax, bf16Count, inPlace, 0});
      }
  return tr.run([&](int rank, loomComm_t comm) -> std::string {
    for (const Case& c : cases) {
      std::string e = runCase(comm, rank, n, c);
      if (!e.empty()) return e;
    }
    return "";
  });
}

// Staged calls larger than LOOM_DEVICE_STAGE_CHUNK are pipelined (src/runtime/device_runner.h):
// every collective, in place and out of place, with a count that leaves a short last chunk, on
// each rank's stream and with a NULL stream, between ranks the one pass does not join (no shared
// memory: the sockets), every element checked; the emulator's copy count shows the chunks.
TEST(DeviceCalls, LargeStagedCallsArePipelinedInChunksAndEveryValueIsRight) {
  SKIP_WITHOUT_CUDA();
  setParam("LOOM_DEVICE_STAGE_CHUNK", "64K");  // read when each communicator's runner starts
  setParam("LOOM_SHM_DISABLE", "1");
  setParam("LOOMTEST_DEVICE", "1");
  struct Restore {
    ~Restore() {
      for (const char* p :
           {"LOOM_DEVICE_STAGE_CHUNK", "LOOM_SHM_DISABLE", "LOOMTEST_DEVICE", "LOOMTEST_STREAM"})
        setParam(p, nullptr);
    }
  } restore;
  for (int n : {2, 3}) {
    ThreadRanks tr(n);
    ASSERT_TRUE(tr.ok()) << tr.error();
    for (const char* stream : {"1", "0"}) {
      setParam("LOOMTEST_STREAM", stream);
      const size_t count = (size_t(1) << 18) + 77;  // 16 chunks of 64 KiB and a short one (fp32)
      EXPECT_EQ(everyCollective(tr, n, count, count / 3), "")
          << n << " ranks, LOOMTEST_STREAM=" << stream;
    }
    // One AllReduce alone: staged whole it is 2 copies a rank; in 64 KiB chunks, 2 a chunk.
    const long long copies = loomtest::fakeCudaCount("copies");
    std::string err = tr.run([&](int rank, loomComm_t comm) -> std::string {
      const size_t count = size_t(1) << 18;
      DevBuf a(count * 4);
      if (!a.ok()) return "cuMemAlloc failed";
      loomResult_t r = loomAllReduce(a.ptr(), a.ptr(), count, loomFloat32, loomSum, comm, nullptr);
      return r == loomSuccess ? "" : "rank " + std::to_string(rank) + ": " + outcome(r);
    });
    EXPECT_EQ(err, "");
    if (copies >= 0) {
      EXPECT_GE(loomtest::fakeCudaCount("copies") - copies, 2 * 16 * n)
          << "the call was not pipelined";
    }
  }
}

// The device one pass writes its peers' outputs by Loom's kernels (one launch a rank stores its
// result or block into every output) or by the copy engines (a copy per output): each way gives
// every value (every collective, in place and out of place, 2 and 3 ranks as threads on the one
// GPU), and the emulator's counters show which ran; auto prices the two with the measured speeds.
TEST(DeviceCalls, OnePassWritesOutputsByKernelsOrCopyEngines) {
  SKIP_WITHOUT_CUDA();
  setParam("LOOMTEST_DEVICE", "1");
  setParam("LOOMTEST_STREAM", "1");
  // Wherever it can run: forced to the engines, the emulator's one pass may price above staging.
  setParam("LOOM_DEVICE_ONE_PASS", "2");
  struct Restore {
    ~Restore() {
      for (const char* p : {"LOOM_DEVICE_ONE_PASS_COPIES", "LOOMTEST_DEVICE", "LOOMTEST_STREAM",
                            "LOOM_DEVICE_ONE_PASS"})
        setParam(p, nullptr);
    }
  } restore;
  for (const char* way : {"kernels", "engines", "auto"}) {
    setParam("LOOM_DEVICE_ONE_PASS_COPIES", way);
    for (int n : {2, 3}) {
      ThreadRanks tr(n);
      ASSERT_TRUE(tr.ok()) << tr.error();
      EXPECT_EQ(everyCollective(tr, n, 10007, 999), "")  // unequal slices
          << n << " ranks, LOOM_DEVICE_ONE_PASS_COPIES=" << way;
      // One AllGather out of place, counted: a launch a rank, or a copy per rank and output.
      const long long copies = loomtest::fakeCudaCount("copies"),
                      launches = loomtest::fakeCudaCount("kernel_launches");
      if (copies < 0 || std::string(way) == "auto") continue;
      std::string err = tr.run([&](int rank, loomComm_t comm) -> std::string {
        const size_t count = 4096;
        DevBuf in(count * 4), out(count * 4 * static_cast<size_t>(n));
        if (!in.ok() || !out.ok()) return "cuMemAlloc failed";
        loomResult_t r = loomAllGather(in.ptr(), out.ptr(), count, loomFloat32, comm, nullptr);
        return r == loomSuccess ? "" : "rank " + std::to_string(rank) + ": " + outcome(r);
      });
      EXPECT_EQ(err, "");
      const bool kernels = std::string(way) == "kernels";
      EXPECT_EQ(loomtest::fakeCudaCount("copies") - copies, kernels ? 0 : n * n)
          << way << ", " << n << " ranks";
      EXPECT_EQ(loomtest::fakeCudaCount("kernel_launches") - launches, kernels ? n : 0)
          << way << ", " << n << " ranks";
    }
  }
}

// loomCommPlanInfoDevice: the device paths priced with the device's measured speeds. Ranks of one
// host on its one GPU take the one pass; with it off, a call is staged whole, or pipelined when it
// is larger than LOOM_DEVICE_STAGE_CHUNK; staging costs more than the host schedule it wraps.
// Without a device to plan for, a clear error.
TEST(DeviceCalls, PlanInfoDevicePricesTheDevicePaths) {
  SKIP_WITHOUT_CUDA();
  int gpus = 0;
  api().cuDeviceGetCount(&gpus);
  struct Restore {
    ~Restore() {
      setParam("LOOM_DEVICE_ONE_PASS", nullptr);
      setParam("LOOM_DEVICE_P2P", nullptr);
    }
  } restore;
  setParam("LOOM_DEVICE_ONE_PASS", "2");  // where it can run (its price against staging: below)
  ThreadRanks tr(2);
  ASSERT_TRUE(tr.ok()) << tr.error();
  loomComm_t comm = tr.comm(0);
  loomPlanInfo_t info;
  std::string err;
  std::thread([&] {  // a thread with no CUDA context, and a communicator without device calls
    loomResult_t r =
        loomCommPlanInfoDevice(comm, loomCollAllReduce, 1024, loomFloat32, 0, 0, &info);
    err = r == loomInvalidUsage ? loomGetLastError() : "result " + outcome(r);
  })
      .join();
  EXPECT_NE(err.find("no CUDA context is current"), std::string::npos) << err;
  ASSERT_TRUE(loom::device::useDevice(0).isOk());
  auto candidate = [&](const char* name) -> const loomPlanCandidate_t* {
    for (int i = 0; i < info.nCandidates; ++i)
      if (std::string(info.candidates[i].name) == name) return &info.candidates[i];
    return nullptr;
  };
  ASSERT_EQ(loomCommPlanInfoDevice(comm, loomCollAllReduce, 1 << 20, loomFloat32, 0, 0, &info),
            loomSuccess)
      << loomGetLastError();
  // One GPU, or GPUs that reach each other peer to peer (the emulated ones do): the one pass.
  EXPECT_EQ(std::string(info.path), "device-one-pass");
  ASSERT_NE(candidate("one-pass"), nullptr);
  EXPECT_EQ(candidate("one-pass")->allowed, 1);
  if (gpus >= 2) {
    setParam("LOOM_DEVICE_P2P", "0");
    ASSERT_EQ(loomCommPlanInfoDevice(comm, loomCollAllReduce, 1 << 20, loomFloat32, 0, 0, &info),
              loomSuccess);
    EXPECT_EQ(std::string(info.path), "device-staged") << "GPUs without peer to peer";
    setParam("LOOM_DEVICE_P2P", nullptr);
  }
  ASSERT_NE(candidate("staged-whole"), nullptr);
  ASSERT_NE(candidate("ring"), nullptr);
  // Staged whole: the copies to and from the host around the host's own choice for the call
  // (which may be the one pass, cheaper than the ring).
  loomPlanInfo_t hostInfo;
  ASSERT_EQ(loomCommPlanInfo(comm, loomCollAllReduce, 1 << 20, loomFloat32, 0, 0, &hostInfo),
            loomSuccess);
  EXPECT_GT(candidate("staged-whole")->predictedUs, hostInfo.predictedUs)
      << "copies to and from the host cost nothing";
  EXPECT_GT(info.predictedUs, 0);

  setParam("LOOM_DEVICE_ONE_PASS", "0");
  ASSERT_EQ(loomCommPlanInfoDevice(comm, loomCollAllGather, 1000, loomFloat32, 0, 0, &info),
            loomSuccess);
  EXPECT_EQ(std::string(info.path), "device-staged");
  EXPECT_EQ(candidate("one-pass")->allowed, 0);
  EXPECT_EQ(candidate("staged-pipelined")->allowed, 0) << "a 4 KB call in chunks";
  ASSERT_EQ(loomCommPlanInfoDevice(comm, loomCollAllGather, 4 << 20, loomFloat32, 0, 0, &info),
            loomSuccess);
  EXPECT_EQ(std::string(info.path), "device-pipelined");
  EXPECT_EQ(candidate("staged-pipelined")->allowed, 1);
  EXPECT_DOUBLE_EQ(info.predictedUs, candidate("staged-pipelined")->predictedUs);
}

// A call with device memory on some ranks and host memory on others is refused on every rank
// (as NCCL and PyTorch require one kind), with a message that says so; nothing hangs.
TEST(DeviceCalls, HostMemoryOnSomeRanksAndDeviceMemoryOnOthersFails) {
  SKIP_WITHOUT_CUDA();
  ThreadRanks tr(2);
  ASSERT_TRUE(tr.ok()) << tr.error();
  const size_t n = 256;
  std::vector<std::string> msgs(2);
  std::vector<loomResult_t> res(2, loomSuccess);
  tr.run([&](int rank, loomComm_t comm) -> std::string {
    if (!loom::device::useDevice(0).isOk()) return "useDevice failed";
    DevBuf a(n * 4), b(n * 4);
    std::vector<float> ha(n, 1.0f), hb(n);
    if (rank == 0)
      res[0] = loomAllReduce(a.ptr(), b.ptr(), n, loomFloat32, loomSum, comm, nullptr);
    else
      res[1] = loomAllReduce(ha.data(), hb.data(), n, loomFloat32, loomSum, comm, nullptr);
    msgs[rank] = loomGetLastError();
    return "";
  });
  EXPECT_NE(res[0], loomSuccess);
  EXPECT_NE(res[1], loomSuccess);
  EXPECT_NE(msgs[0].find("some ranks passed host memory and others CUDA device memory"),
            std::string::npos)
      << msgs[0];
}

}  // namespace

// Worker modes of the tests above (workers.cc sends modes that start with "dev" here).
int deviceWorker(const std::string& mode, loomComm_t comm, int rank, int n) {
  if (!loom::device::useDevice(0).isOk()) {
    fprintf(stderr, "rank %d: no CUDA device: %s\n", rank,
            cuda::cudaDriver().status.message().c_str());
    return 20;
  }
  const size_t count = size_t(1) << 16;
  DevBuf in(count * 4), out(count * 4);
  Stream s;
  if (!in.ok() || !out.ok() || !s.s) return 21;
  std::vector<float> ones(count, 1.0f);
  if (!in.put(ones)) return 22;
  auto failedNaming = [&](const char* what, const std::string& words) {
    std::string msg = loomGetLastError();
    fprintf(stderr, "rank %d: %s: %s\n", rank, what, msg.c_str());
    return msg.find(words) != std::string::npos ? 0 : 3;
  };
  if (mode.rfind("devkill:", 0) == 0) {
    const int victim = atoi(mode.c_str() + 8);
    const std::string named = "rank " + std::to_string(victim);
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (int it = 0; std::chrono::steady_clock::now() < end; ++it) {
      if (rank == victim && it == 1) raise(SIGKILL);
      if (loomAllReduce(in.ptr(), out.ptr(), count, loomFloat32, loomSum, comm, s.s) != loomSuccess)
        return failedNaming("enqueue", named);
      if (api().cuStreamSynchronize(s.s) != 0) {
        fprintf(stderr, "rank %d: cuStreamSynchronize failed\n", rank);
        return 4;
      }
      loomResult_t async = loomSuccess;
      loomCommGetAsyncError(comm, &async);
      if (async != loomSuccess) return failedNaming("async error", named);
    }
    fprintf(stderr, "rank %d: every allreduce succeeded although rank %d was killed\n", rank,
            victim);
    return 2;
  }
  if (mode == "devfault") {
    if (rank != 0) {
      loomResult_t r =
          loomAllReduce(in.ptr(), out.ptr(), count, loomFloat32, loomSum, comm, nullptr);
      if (r == loomSuccess) {
        fprintf(stderr, "rank %d: the allreduce succeeded although rank 0's failed\n", rank);
        return 2;
      }
      fprintf(stderr, "rank %d: failed as it should: %s\n", rank, loomGetLastError());
      return 0;
    }
    Gate gate;
    CUdeviceptr doomed = 0;
    if (api().cuMemAlloc(&doomed, count * 4) != 0 || !gate.close(s.s)) return 23;
    if (loomAllReduce(reinterpret_cast<void*>(doomed), out.ptr(), count, loomFloat32, loomSum, comm,
                      s.s) != loomSuccess)
      return failedNaming("enqueue", "");
    {
      // A kernel of this rank's on another stream faults while the call waits for its stream.
      auto inject =
          reinterpret_cast<int (*)(const char*, int)>(driverSymbol("loomtest_fakecuda_inject"));
      Stream other;
      const void* src[] = {in.ptr()};
      if (!inject || inject("illegal_address", 0) != 0 ||
          !loom::device::launchReduce(other.s, out.ptr(), src, 1, count, loomFloat32, loomSum, 0)
               .isOk())
        return 24;
      api().cuStreamSynchronize(other.s);
    }
    gate.open = true;
    const cuda::CUresult sync = api().cuStreamSynchronize(s.s);  // returns: the stream is let go
    loomResult_t async = loomSuccess;
    for (int i = 0; i < 2000 && async == loomSuccess; ++i) {  // the runner's verdict, within 2 s
      loomCommGetAsyncError(comm, &async);
      if (async == loomSuccess) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    fprintf(stderr, "rank 0: cuStreamSynchronize %d, async %s\n", sync, loomGetErrorString(async));
    if (async == loomSuccess) return 5;
    return failedNaming("async error", "ILLEGAL_ADDRESS");
  }
  if (mode == "devgdr") {
    // GpuDirectScheduleOverInfiniBandAndStagedWhenOff: kernels reduce what the network wrote into
    // device memory (GPUDirect), or none run (staged).
    const bool gdr = getenv("LOOM_DEVICE_GDR") && atoi(getenv("LOOM_DEVICE_GDR")) != 0;
    const long long launches0 = loomtest::fakeCudaCount("kernel_launches");
    const std::string err = allReduceOnDevice(rank, n, comm, 0, 100003, false);
    if (!err.empty()) {
      fprintf(stderr, "rank %d: %s\n", rank, err.c_str());
      return 1;
    }
    const long long launches = loomtest::fakeCudaCount("kernel_launches") - launches0;
    fprintf(stderr, "rank %d: LOOM_DEVICE_GDR=%d, kernel_launches +%lld\n", rank, gdr, launches);
    if (gdr ? launches == 0 : launches != 0) return 6;
    if (gdr) {
      // Buffers that run past their allocation: the call is refused when it is made (its post
      // registers them with the network, which names the allocation), on every rank alike.
      if (loomAllReduce(in.ptr(), out.ptr(), count * 2, loomFloat32, loomSum, comm, s.s) ==
          loomSuccess)
        return 7;
      if (failedNaming("buffers past their allocation", "runs past the end of its allocation"))
        return 8;
    }
    return 0;
  }
  if (mode == "devonepass") {
    // 1 Mi floats per rank, out of place then in place; every element checked. With
    // LOOMTEST_RANK_DEVICES=1 rank r is on device r % (devices): peer to peer between them
    // (LOOM_DEVICE_P2P, default on).
    auto flag = [](const char* name, bool def) {
      const char* v = getenv(name);
      return v && *v ? atoi(v) != 0 : def;
    };
    int gpus = 1;
    api().cuDeviceGetCount(&gpus);
    const int dev = flag("LOOMTEST_RANK_DEVICES", false) ? rank % gpus : 0;
    const bool on =
        flag("LOOM_DEVICE_ONE_PASS", true) &&
        (gpus < 2 || !flag("LOOMTEST_RANK_DEVICES", false) || flag("LOOM_DEVICE_P2P", true));
    const size_t big = size_t(1) << 20;
    DevBuf a(big * 4, dev), b(big * 4, dev);
    Stream rs(dev);
    if (!loom::device::useDevice(dev).isOk()) return 20;
    std::vector<float> mine(big);
    for (size_t i = 0; i < big; ++i) mine[i] = static_cast<float>(rank + 1 + i % 7);
    if (!a.ok() || !b.ok() || !rs.s || !a.put(mine)) return 21;
    {
      // A first call on other buffers starts the runner (which measures the device's speeds with
      // kernels of its own) before the counts.
      DevBuf w(4, dev);
      if (!w.ok() ||
          loomAllReduce(w.ptr(), w.ptr(), 1, loomFloat32, loomSum, comm, rs.s) != loomSuccess ||
          cuda::cudaDriver().api.cuStreamSynchronize(rs.s) != 0)
        return failedNaming("first allreduce", "");
    }
    const long long maps0 = loomtest::fakeCudaCount("ipc_mappings"),
                    launches0 = loomtest::fakeCudaCount("kernel_launches");
    // Twice: the first call on new buffers between processes is staged (the runner opens no IPC
    // handle) and the next call's post opens them. Each result is read back at once by a copy to
    // pageable memory on the stream, which holds the driver's mapping lock while the stream waits
    // for the call: a runner that mapped memory would hang there.
    for (bool inPlace : {false, true, false, true}) {
      if (!inPlace && !a.put(mine)) return 21;  // the in-place call before overwrote it
      DevBuf& outBuf = inPlace ? a : b;
      if (loomAllReduce(a.ptr(), outBuf.ptr(), big, loomFloat32, loomSum, comm, rs.s) !=
          loomSuccess)
        return failedNaming("allreduce", "");
      std::vector<float> got = outBuf.get(big, rs.s);
      for (size_t i = 0; i < big; ++i) {
        const float want = static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i % 7));
        if (got[i] != want) {
          fprintf(stderr, "rank %d: element %zu is %g, expected %g\n", rank, i, got[i], want);
          return 1;
        }
      }
    }
    const long long maps = loomtest::fakeCudaCount("ipc_mappings") - maps0;
    const long long launches = loomtest::fakeCudaCount("kernel_launches") - launches0;
    fprintf(stderr, "rank %d (device %d): one pass %s: ipc_mappings +%lld, kernel_launches +%lld\n",
            rank, dev, on ? "on" : "off", maps, launches);
    if (on ? (maps < 2 || launches < 2) : (maps != 0 || launches != 0)) return 6;
    return 0;
  }
  if (mode == "devgraph") {
    // GraphOfRanksAsProcesses...: an AllReduce captured in GLOBAL mode and launched four times,
    // an eager call on the same buffers, a fifth launch; every element checked after each.
    // Between processes a replay that finds the peers' buffers unopened is staged (the runner
    // opens nothing) and the runner's opener thread opens them: the third and fourth replays take
    // the one pass (kernels of Loom's).
    GraphApi g;
    if (!g.ok()) return 30;
    const size_t big = size_t(1) << 18;
    DevBuf a(big * 4), b(big * 4);
    Stream gs;
    if (!a.ok() || !b.ok() || !gs.s) return 21;
    void* exec = nullptr;
    const std::string captured = g.capture(
        gs.s, GraphApi::kGlobal,
        [&]() -> std::string {
          loomResult_t r = loomAllReduce(a.ptr(), b.ptr(), big, loomFloat32, loomSum, comm, gs.s);
          return r == loomSuccess ? "" : outcome(r);
        },
        &exec);
    if (!captured.empty()) {
      fprintf(stderr, "rank %d: capture: %s\n", rank, captured.c_str());
      return 31;
    }
    const long long maps0 = loomtest::fakeCudaCount("ipc_mappings");
    long long launches0 = 0, launches = 0;
    for (int round = 1; round <= 6; ++round) {
      const bool eager = round == 5;
      if (round == 3) {
        // The opener's work is asynchronous: wait (at most 10 s) until it has opened a peer's.
        const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (loomtest::fakeCudaCount("ipc_mappings") == maps0 &&
               std::chrono::steady_clock::now() < end)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        launches0 = loomtest::fakeCudaCount("kernel_launches");
      }
      if (round == 5) launches = loomtest::fakeCudaCount("kernel_launches") - launches0;
      std::vector<float> mine(big);
      for (size_t i = 0; i < big; ++i) mine[i] = static_cast<float>(round * (rank + 1) + i % 3);
      if (!a.put(mine)) return 21;
      if (eager ? loomAllReduce(a.ptr(), b.ptr(), big, loomFloat32, loomSum, comm, gs.s) !=
                      loomSuccess
                : g.launch(exec, gs.s) != 0)
        return failedNaming(eager ? "eager allreduce" : "cuGraphLaunch", "");
      std::vector<float> got = b.get(big, gs.s);
      for (size_t i = 0; i < big; ++i) {
        const float want =
            static_cast<float>(round * n * (n + 1) / 2 + n * static_cast<int>(i % 3));
        if (got[i] != want) {
          fprintf(stderr, "rank %d: round %d (%s): element %zu is %g, expected %g\n", rank, round,
                  eager ? "eager" : "graph", i, got[i], want);
          return 1;
        }
      }
    }
    g.execDestroy(exec);
    loomResult_t async = loomSuccess;
    loomCommGetAsyncError(comm, &async);
    fprintf(stderr,
            "rank %d: 5 replays and 1 eager call right; ipc_mappings +%lld; kernel_launches +%lld "
            "in replays 3 and 4; async %s\n",
            rank, loomtest::fakeCudaCount("ipc_mappings") - maps0, launches,
            loomGetErrorString(async));
    if (async != loomSuccess) return 5;
    return launches >= 2 ? 0 : 6;  // the one pass's kernels
  }
  fprintf(stderr, "unknown device worker mode %s\n", mode.c_str());
  return 12;
}

}  // namespace loomtest
