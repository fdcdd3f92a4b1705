#include "tests/collectives/harness.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "src/core/dtype.h"
#include "src/core/params.h"
#include "src/device/cuda_driver.h"
#include "src/device/device_memory.h"
#include "tools/perf/expected.h"

namespace loomtest {

std::vector<Coll> allColls() {
  return {Coll::kAllReduce,     Coll::kBroadcast, Coll::kReduce,  Coll::kAllGather,
          Coll::kReduceScatter, Coll::kAllToAll,  Coll::kSendRecv};
}

std::string Case::describe() const {
  return std::string(collName(coll)) + " " + loom::dataTypeName(dt) + " " +
         (collReduces(coll) ? loom::redOpName(op) : "-") + " count " + std::to_string(count) +
         (inPlace ? " in-place" : " out-of-place") + " root " + std::to_string(root);
}

std::vector<size_t> standardCounts(int n) {
  return {0, 1, 7, static_cast<size_t>(n) * 13 + 1, 3001};
}

std::vector<Case> matrix(Coll coll, int nranks, const std::vector<size_t>& counts,
                         const std::vector<loomRedOp_t>& ops) {
  std::vector<Case> out;
  std::vector<loomRedOp_t> useOps = collReduces(coll) ? ops : std::vector<loomRedOp_t>{loomSum};
  std::vector<int> roots = {0};
  if ((coll == Coll::kBroadcast || coll == Coll::kReduce) && nranks > 1)
    roots.push_back(nranks - 1);
  for (int dt = 0; dt < loomNumTypes; ++dt)
    for (auto op : useOps)
      for (size_t count : counts)
        for (bool inPlace : {false, true}) {
          for (int root : roots)
            out.push_back({coll, static_cast<loomDataType_t>(dt), op, count, inPlace, root});
        }
  return out;
}

namespace {

// The tests' inputs: small integers, so every sum, product, max and min is exact in every type
// (avg of floating types is accepted within 1%).
class TestPattern final : public loom::InputPattern {
 public:
  TestPattern(const Case& c, int nranks)
      : InputPattern(c.dt, c.op, nranks),
        reduces_(collReduces(c.coll)),
        signed_(loom::typeIsSigned(c.dt)),
        tolerant_(c.op == loomAvg && loom::typeIsFloating(c.dt) && reduces_) {}

  double value(int rank, size_t i) const override {
    if (!reduces_) {
      int64_t v = static_cast<int64_t>((rank * 131 + i * 7) % 97);
      return static_cast<double>(signed_ ? v - 48 : v);
    }
    if (op() == loomProd) {
      static const int kSigned[4] = {1, -1, 2, 1};
      static const int kUnsigned[4] = {1, 2, 1, 1};
      size_t k = (static_cast<size_t>(rank) + i) % 4;
      return signed_ ? kSigned[k] : kUnsigned[k];
    }
    int64_t v = static_cast<int64_t>((rank * 5 + i * 3 + 1) % 7);
    return static_cast<double>(signed_ ? v - 3 : v);
  }

  bool accepts(double got, double exact) const override {
    if (!tolerant_) return InputPattern::accepts(got, exact);
    double w = stored(exact);
    return std::fabs(got - w) <= 1e-2 * std::max(1.0, std::fabs(w));
  }

 private:
  bool reduces_;
  bool signed_;
  bool tolerant_;
};

// LOOMTEST_MEM_ALLOC=1: the buffers come from loomMemAlloc (peers on the host map them).
struct Buffers {
  std::vector<char> mem;  // 64-byte aligned region inside
  char* base = nullptr;
  void* shared = nullptr;
  explicit Buffers(size_t bytes) {
    const char* e = getenv("LOOMTEST_MEM_ALLOC");
    if (e && std::strcmp(e, "1") == 0 && loomMemAlloc(&shared, bytes + 64) == loomSuccess) {
      base = static_cast<char*>(shared);
      return;
    }
    mem.assign(bytes + 128, 0);
    base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(mem.data()) + 63) & ~uintptr_t(63));
  }
  ~Buffers() {
    if (shared) loomMemFree(shared);
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
};

// LOOMTEST_DEVICE=1: the case runs on CUDA device memory (the emulated device in CI, through
// LOOM_CUDA_LIB): the host buffers above are copied to device buffers of the same layout, the
// call takes the device pointers, and the output is copied back to be checked. LOOMTEST_STREAM=1:
// on a stream of the rank's own (the call is enqueued; the test synchronizes the stream).
bool deviceMode() {
  const char* e = getenv("LOOMTEST_DEVICE");
  return e && std::strcmp(e, "1") == 0;
}
bool streamMode() {
  const char* e = getenv("LOOMTEST_STREAM");
  return e && std::strcmp(e, "1") == 0;
}

// Device memory the cases of one rank thread reuse, freed when the thread ends. cuMemFree
// synchronizes the device, as a real driver's does: ranks as threads share the device, so a rank
// freeing between its calls would wait for a peer's stream, which waits for a collective this
// rank has not yet called (a hang on a GPU; the emulated device aborts there). After a rank's last
// call, freeing is safe: its peers' calls no longer need it.
class DevicePool {
 public:
  ~DevicePool() {
    for (const Block& b : free_) loom::cuda::cudaDriver().api.cuMemFree(b.p);
  }
  loom::cuda::CUdeviceptr take(size_t bytes) {
    for (size_t i = 0; i < free_.size(); ++i)
      if (free_[i].bytes >= bytes) {
        const loom::cuda::CUdeviceptr p = free_[i].p;
        free_.erase(free_.begin() + static_cast<long>(i));
        used_.push_back({p, bytes});
        return p;
      }
    loom::cuda::CUdeviceptr p = 0;
    if (loom::cuda::cudaDriver().api.cuMemAlloc(&p, bytes) != 0) return 0;
    used_.push_back({p, bytes});
    return p;
  }
  void give(loom::cuda::CUdeviceptr p) {
    for (size_t i = 0; i < used_.size(); ++i)
      if (used_[i].p == p) {
        free_.push_back(used_[i]);
        used_.erase(used_.begin() + static_cast<long>(i));
        return;
      }
  }

 private:
  struct Block {
    loom::cuda::CUdeviceptr p;
    size_t bytes;
  };
  std::vector<Block> free_, used_;
};
thread_local DevicePool tDevicePool;

class DeviceMirror {
 public:
  // Device copies of [in, in + inBytes) and [out, out + outBytes) on device 0.
  std::string init(const char* in, size_t inBytes, const char* out, size_t outBytes) {
    const loom::cuda::Driver& d = loom::cuda::cudaDriver();
    if (!d.ok()) return "LOOMTEST_DEVICE=1 but no CUDA driver: " + d.status.message();
    api_ = &d.api;
    loom::Status st = loom::device::useDevice(0);
    if (!st.isOk()) return st.message();
    in_ = tDevicePool.take(inBytes + 64);
    out_ = tDevicePool.take(outBytes + 64);
    if (!in_ || !out_) return "cuMemAlloc failed";
    if (streamMode() && api_->cuStreamCreate(&stream_, loom::cuda::kStreamNonBlocking) != 0)
      return "cuStreamCreate failed";
    if (copy(in_, reinterpret_cast<loom::cuda::CUdeviceptr>(in), inBytes) != 0 ||
        copy(out_, reinterpret_cast<loom::cuda::CUdeviceptr>(out), outBytes) != 0)
      return "copying the inputs to the device failed";
    return "";
  }
  ~DeviceMirror() {
    if (!api_) return;
    if (stream_) api_->cuStreamDestroy(stream_);
    if (in_) tDevicePool.give(in_);
    if (out_) tDevicePool.give(out_);
  }
  // The device address of host pointer p, which lies in [hostIn, ...) or [hostOut, ...).
  void* in(const char* hostIn, const char* p) const {
    return reinterpret_cast<char*>(in_) + (p - hostIn);
  }
  void* out(const char* hostOut, const char* p) const {
    return reinterpret_cast<char*>(out_) + (p - hostOut);
  }
  void* stream() const { return stream_; }
  // Waits for the stream (stream mode) and copies the device output back to the host.
  std::string finish(char* hostOut, size_t outBytes) {
    if (stream_ && api_->cuStreamSynchronize(stream_) != 0) return "cuStreamSynchronize failed";
    if (copy(reinterpret_cast<loom::cuda::CUdeviceptr>(hostOut), out_, outBytes) != 0)
      return "copying the output from the device failed";
    return "";
  }

 private:
  int copy(loom::cuda::CUdeviceptr dst, loom::cuda::CUdeviceptr src, size_t bytes) {
    if (bytes == 0) return 0;
    if (api_->cuMemcpyAsync(dst, src, bytes, nullptr) != 0) return 1;
    return api_->cuStreamSynchronize(nullptr);
  }
  const loom::cuda::DriverApi* api_ = nullptr;
  loom::cuda::CUdeviceptr in_ = 0, out_ = 0;
  loom::cuda::CUstream stream_ = nullptr;
};

// Registrations of one case, released (and checked) before its buffers are freed.
class Registrations {
 public:
  explicit Registrations(loomComm_t comm) : comm_(comm) {}
  ~Registrations() { (void)release(); }
  Registrations(const Registrations&) = delete;
  Registrations& operator=(const Registrations&) = delete;
  // Registers [p, p + bytes) (nothing when bytes is 0); returns "" or the error.
  std::string add(void* p, size_t bytes) {
    if (bytes == 0) return "";
    void* h = nullptr;
    loomResult_t r = loomCommRegister(comm_, p, bytes, &h);
    if (r != loomSuccess)
      return std::string("loomCommRegister: ") + loomGetErrorString(r) + ": " + loomGetLastError();
    if (h == nullptr) return "loomCommRegister succeeded with a NULL handle";
    handles_.push_back(h);
    return "";
  }
  std::string release() {
    std::string err;
    for (void* h : handles_) {
      loomResult_t r = loomCommDeregister(comm_, h);
      if (r != loomSuccess && err.empty())
        err =
            std::string("loomCommDeregister: ") + loomGetErrorString(r) + ": " + loomGetLastError();
    }
    handles_.clear();
    return err;
  }

 private:
  loomComm_t comm_;
  std::vector<void*> handles_;
};

}  // namespace

std::string runCase(loomComm_t comm, int rank, int n, const Case& c) {
  size_t es = loom::dataTypeSize(c.dt);
  size_t inCount = c.count, outCount = c.count;
  if (c.coll == Coll::kAllGather) outCount = c.count * n;
  if (c.coll == Coll::kReduceScatter) inCount = c.count * n;
  if (c.coll == Coll::kAllToAll) inCount = outCount = c.count * n;
  Buffers in(inCount * es), out(std::max(inCount, outCount) * es);
  // Poison the output so that an element never written is caught.
  std::memset(out.base, 0x5a, std::max(inCount, outCount) * es);
  char* sendbuff = in.base;
  char* recvbuff = out.base;
  if (c.inPlace) {
    switch (c.coll) {
      case Coll::kAllGather:
        sendbuff = recvbuff + static_cast<size_t>(rank) * c.count * es;
        break;
      case Coll::kReduceScatter:
        sendbuff = out.base;
        recvbuff = out.base + static_cast<size_t>(rank) * c.count * es;
        break;
      default:
        sendbuff = recvbuff;
        break;
    }
  }
  const TestPattern pattern(c, n);
  loom::fillInput(pattern, rank, sendbuff, inCount);
  std::string where = c.describe() + " rank " + std::to_string(rank) + "/" + std::to_string(n);
  // LOOMTEST_REGISTER=1: both buffers are registered with loomCommRegister for the call (network
  // transports then use the registration instead of registering each message).
  Registrations regs(comm);
  const char* reg = getenv("LOOMTEST_REGISTER");
  if (reg && std::strcmp(reg, "1") == 0) {
    std::string e = regs.add(in.base, inCount * es);
    if (e.empty()) e = regs.add(out.base, std::max(inCount, outCount) * es);
    if (!e.empty()) return where + ": " + e;
  }
  loomResult_t res = loomSuccess;
  int next = (rank + 1) % n, prev = (rank - 1 + n) % n;
  // On device memory the call takes the device copies, at the same offsets.
  DeviceMirror dev;
  const void* sb = sendbuff;
  void* rb = recvbuff;
  loomStream_t stream = nullptr;
  const size_t outBytes = std::max(inCount, outCount) * es;
  if (deviceMode()) {
    std::string e = dev.init(in.base, inCount * es, out.base, outBytes);
    if (!e.empty()) return where + ": " + e;
    sb = c.inPlace ? dev.out(out.base, sendbuff) : dev.in(in.base, sendbuff);
    rb = dev.out(out.base, recvbuff);
    stream = dev.stream();
  }
  switch (c.coll) {
    case Coll::kAllReduce:
      res = loomAllReduce(sb, rb, c.count, c.dt, c.op, comm, stream);
      break;
    case Coll::kBroadcast:
      res = loomBroadcast(sb, rb, c.count, c.dt, c.root, comm, stream);
      break;
    case Coll::kReduce:
      res = loomReduce(sb, rb, c.count, c.dt, c.op, c.root, comm, stream);
      break;
    case Coll::kAllGather:
      res = loomAllGather(sb, rb, c.count, c.dt, comm, stream);
      break;
    case Coll::kReduceScatter:
      res = loomReduceScatter(sb, rb, c.count, c.dt, c.op, comm, stream);
      break;
    case Coll::kAllToAll:
      res = loomAllToAll(sb, rb, c.count, c.dt, comm, stream);
      break;
    case Coll::kSendRecv:
      loomGroupStart();
      loomSend(sb, c.count, c.dt, next, comm, stream);
      loomRecv(rb, c.count, c.dt, prev, comm, stream);
      res = loomGroupEnd();
      break;
  }
  if (res == loomSuccess && deviceMode()) {
    std::string e = dev.finish(out.base, outBytes);
    if (!e.empty()) return where + ": " + e;
    if (stream) {  // an enqueued call's failure is the communicator's
      loomResult_t async = loomSuccess;
      loomCommGetAsyncError(comm, &async);
      if (async != loomSuccess) res = async;
    }
  }
  std::string dereg = regs.release();
  if (res == loomSuccess && !dereg.empty()) return where + ": " + dereg;
  if (res != loomSuccess) return where + ": " + loomGetErrorString(res) + ": " + loomGetLastError();
  std::string firstBad;
  if (loom::countWrong(pattern, {c.coll, c.count, c.root, rank}, recvbuff, &firstBad) > 0)
    return where + ": " + firstBad;
  return "";
}

ThreadRanks::ThreadRanks(int n, const std::vector<int>& devices) : comms_(n, nullptr) {
  loomResult_t r = loomCommInitAll(comms_.data(), n, devices.empty() ? nullptr : devices.data());
  ok_ = r == loomSuccess;
  if (!ok_) error_ = std::string(loomGetErrorString(r)) + ": " + loomGetLastError();
}

ThreadRanks::~ThreadRanks() {
  for (auto c : comms_)
    if (c) loomCommDestroy(c);
}

std::string ThreadRanks::run(const std::function<std::string(int, loomComm_t)>& fn) {
  std::vector<std::string> results(comms_.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms_.size(); ++r)
    threads.emplace_back([&, r] { results[r] = fn(static_cast<int>(r), comms_[r]); });
  for (auto& t : threads) t.join();
  std::string all;
  for (auto& s : results)
    if (!s.empty()) all += s + "\n";
  return all;
}

void setParam(const char* name, const char* value) {
  if (value)
    setenv(name, value, 1);
  else
    unsetenv(name);
  loom::reloadParams();
}

}  // namespace loomtest
