#include "tests/collectives/harness.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "src/core/dtype.h"
#include "src/core/params.h"

namespace loomtest {

const char* collName(Coll c) {
  switch (c) {
    case Coll::kAllReduce:
      return "AllReduce";
    case Coll::kBroadcast:
      return "Broadcast";
    case Coll::kReduce:
      return "Reduce";
    case Coll::kAllGather:
      return "AllGather";
    case Coll::kReduceScatter:
      return "ReduceScatter";
    case Coll::kAllToAll:
      return "AllToAll";
    case Coll::kSendRecv:
      return "SendRecv";
  }
  return "?";
}

bool collReduces(Coll c) {
  return c == Coll::kAllReduce || c == Coll::kReduce || c == Coll::kReduceScatter;
}

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

size_t elemSize(loomDataType_t dt) { return loom::dataTypeSize(dt); }

void setElem(void* buf, loomDataType_t dt, size_t i, double v) {
  char* p = static_cast<char*>(buf);
  switch (dt) {
    case loomInt8:
      reinterpret_cast<int8_t*>(p)[i] = static_cast<int8_t>(static_cast<int64_t>(v));
      break;
    case loomUint8:
      reinterpret_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(static_cast<int64_t>(v));
      break;
    case loomInt32:
      reinterpret_cast<int32_t*>(p)[i] = static_cast<int32_t>(static_cast<int64_t>(v));
      break;
    case loomUint32:
      reinterpret_cast<uint32_t*>(p)[i] = static_cast<uint32_t>(static_cast<int64_t>(v));
      break;
    case loomInt64:
      reinterpret_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      break;
    case loomUint64:
      reinterpret_cast<uint64_t*>(p)[i] = static_cast<uint64_t>(static_cast<int64_t>(v));
      break;
    case loomFloat16:
      reinterpret_cast<uint16_t*>(p)[i] = loom::floatToHalf(static_cast<float>(v));
      break;
    case loomBfloat16:
      reinterpret_cast<uint16_t*>(p)[i] = loom::floatToBf16(static_cast<float>(v));
      break;
    case loomFloat32:
      reinterpret_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case loomFloat64:
      reinterpret_cast<double*>(p)[i] = v;
      break;
    default:
      break;
  }
}

double getElem(const void* buf, loomDataType_t dt, size_t i) {
  const char* p = static_cast<const char*>(buf);
  switch (dt) {
    case loomInt8:
      return reinterpret_cast<const int8_t*>(p)[i];
    case loomUint8:
      return reinterpret_cast<const uint8_t*>(p)[i];
    case loomInt32:
      return reinterpret_cast<const int32_t*>(p)[i];
    case loomUint32:
      return reinterpret_cast<const uint32_t*>(p)[i];
    case loomInt64:
      return static_cast<double>(reinterpret_cast<const int64_t*>(p)[i]);
    case loomUint64:
      return static_cast<double>(reinterpret_cast<const uint64_t*>(p)[i]);
    case loomFloat16:
      return loom::halfToFloat(reinterpret_cast<const uint16_t*>(p)[i]);
    case loomBfloat16:
      return loom::bf16ToFloat(reinterpret_cast<const uint16_t*>(p)[i]);
    case loomFloat32:
      return reinterpret_cast<const float*>(p)[i];
    case loomFloat64:
      return reinterpret_cast<const double*>(p)[i];
    default:
      return 0;
  }
}

namespace {

bool isSigned(loomDataType_t dt) { return dt != loomUint8 && dt != loomUint32 && dt != loomUint64; }
bool isFloat(loomDataType_t dt) {
  return dt == loomFloat16 || dt == loomBfloat16 || dt == loomFloat32 || dt == loomFloat64;
}

// Inputs: small integers, so every sum, product, max and min is exact in every type.
double inputValue(const Case& c, int rank, size_t i) {
  if (!collReduces(c.coll)) {
    int64_t v = static_cast<int64_t>((rank * 131 + i * 7) % 97);
    return static_cast<double>(isSigned(c.dt) ? v - 48 : v);
  }
  if (c.op == loomProd) {
    static const int kSigned[4] = {1, -1, 2, 1};
    static const int kUnsigned[4] = {1, 2, 1, 1};
    size_t k = (static_cast<size_t>(rank) + i) % 4;
    return isSigned(c.dt) ? kSigned[k] : kUnsigned[k];
  }
  int64_t v = static_cast<int64_t>((rank * 5 + i * 3 + 1) % 7);
  return static_cast<double>(isSigned(c.dt) ? v - 3 : v);
}

double reduceAll(const Case& c, int nranks, size_t i) {
  double acc = inputValue(c, 0, i);
  for (int r = 1; r < nranks; ++r) {
    double v = inputValue(c, r, i);
    switch (c.op) {
      case loomSum:
      case loomAvg:
        acc += v;
        break;
      case loomProd:
        acc *= v;
        break;
      case loomMax:
        acc = std::max(acc, v);
        break;
      case loomMin:
        acc = std::min(acc, v);
        break;
      default:
        break;
    }
  }
  if (c.op == loomAvg) {
    if (isFloat(c.dt)) return acc / nranks;
    return std::trunc(acc / nranks);
  }
  return acc;
}

// The value the type stores for v (wraps integers, rounds floats).
double asStored(loomDataType_t dt, double v) {
  char tmp[8];
  setElem(tmp, dt, 0, v);
  return getElem(tmp, dt, 0);
}

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
  size_t es = elemSize(c.dt);
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
  for (size_t i = 0; i < inCount; ++i) setElem(sendbuff, c.dt, i, inputValue(c, rank, i));
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
  switch (c.coll) {
    case Coll::kAllReduce:
      res = loomAllReduce(sendbuff, recvbuff, c.count, c.dt, c.op, comm, nullptr);
      break;
    case Coll::kBroadcast:
      res = loomBroadcast(sendbuff, recvbuff, c.count, c.dt, c.root, comm, nullptr);
      break;
    case Coll::kReduce:
      res = loomReduce(sendbuff, recvbuff, c.count, c.dt, c.op, c.root, comm, nullptr);
      break;
    case Coll::kAllGather:
      res = loomAllGather(sendbuff, recvbuff, c.count, c.dt, comm, nullptr);
      break;
    case Coll::kReduceScatter:
      res = loomReduceScatter(sendbuff, recvbuff, c.count, c.dt, c.op, comm, nullptr);
      break;
    case Coll::kAllToAll:
      res = loomAllToAll(sendbuff, recvbuff, c.count, c.dt, comm, nullptr);
      break;
    case Coll::kSendRecv:
      loomGroupStart();
      loomSend(sendbuff, c.count, c.dt, next, comm, nullptr);
      loomRecv(recvbuff, c.count, c.dt, prev, comm, nullptr);
      res = loomGroupEnd();
      break;
  }
  std::string dereg = regs.release();
  if (res == loomSuccess && !dereg.empty()) return where + ": " + dereg;
  if (res != loomSuccess) return where + ": " + loomGetErrorString(res) + ": " + loomGetLastError();
  bool tolerant = c.op == loomAvg && isFloat(c.dt) && collReduces(c.coll);
  auto check = [&](size_t i, double want) -> std::string {
    double got = getElem(recvbuff, c.dt, i);
    double w = asStored(c.dt, want);
    bool ok = tolerant ? std::fabs(got - w) <= 1e-2 * std::max(1.0, std::fabs(w)) : got == w;
    if (ok) return "";
    return where + ": element " + std::to_string(i) + " is " + std::to_string(got) + ", expected " +
           std::to_string(w);
  };
  for (size_t i = 0; i < outCount; ++i) {
    double want = 0;
    switch (c.coll) {
      case Coll::kAllReduce:
        want = reduceAll(c, n, i);
        break;
      case Coll::kBroadcast:
        want = inputValue(c, c.root, i);
        break;
      case Coll::kReduce:
        if (rank != c.root) return "";
        want = reduceAll(c, n, i);
        break;
      case Coll::kAllGather:
        want = inputValue(c, static_cast<int>(i / c.count), i % c.count);
        break;
      case Coll::kReduceScatter:
        want = reduceAll(c, n, static_cast<size_t>(rank) * c.count + i);
        break;
      case Coll::kAllToAll:
        want = inputValue(c, static_cast<int>(i / c.count),
                          static_cast<size_t>(rank) * c.count + i % c.count);
        break;
      case Coll::kSendRecv:
        want = inputValue(c, prev, i);
        break;
    }
    std::string e = check(i, want);
    if (!e.empty()) return e;
  }
  return "";
}

ThreadRanks::ThreadRanks(int n) : comms_(n, nullptr) {
  loomResult_t r = loomCommInitAll(comms_.data(), n, nullptr);
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
