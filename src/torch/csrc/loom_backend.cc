// loom_torch's backend: see loom_backend.h.
#include "loom_backend.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <dlfcn.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <utility>

// The stream handle type of Loom's driver table (src/device/cuda_driver.h, which this extension
// cannot include), so that the call below has its callee's exact type where that callee is
// checked (the emulated driver under UndefinedBehaviorSanitizer: tools/sanitize_torch.sh).
namespace loom::cuda {
struct CUstream_st;
}  // namespace loom::cuda

namespace loom_torch {
namespace {

// Whether CUDA stream s is being captured into a graph: the driver's cuStreamIsCapturing, from the
// driver Loom uses (LOOM_CUDA_LIB, else the libcuda.so.1 that PyTorch's CUDA build has loaded;
// false where none is loaded: no CUDA graphs).
bool streamCapturing(void* s) {
  using IsCapturing = int (*)(loom::cuda::CUstream_st*, int*);
  static const IsCapturing isCapturing = []() -> IsCapturing {
    const char* named = std::getenv("LOOM_CUDA_LIB");
    void* lib = ::dlopen(named && *named ? named : "libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return lib ? reinterpret_cast<IsCapturing>(::dlsym(lib, "cuStreamIsCapturing")) : nullptr;
  }();
  int status = 0;
  return isCapturing != nullptr &&
         isCapturing(static_cast<loom::cuda::CUstream_st*>(s), &status) == 0 && status != 0;
}

// A Loom call's failure as torch.distributed.DistBackendError, with Loom's message (which rank,
// what happened).
void check(loomResult_t r, const char* what) {
  if (r == loomSuccess) return;
  C10_THROW_ERROR(DistBackendError, c10::str("loom: ", what, " failed: ", loomGetErrorString(r),
                                             ": ", loomGetLastError()));
}

// Loom calls issued as one group on this thread. A call refused at once keeps its error; the
// group always ends (also when something threw, so that this thread's group state is closed),
// and the first error is thrown at end().
class Group {
 public:
  explicit Group(const char* what) : what_(what) { check(loomGroupStart(), "loomGroupStart"); }
  ~Group() {
    if (!ended_) loomGroupEnd();
  }
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  void add(loomResult_t r) {
    if (r != loomSuccess && first_ == loomSuccess) {
      first_ = r;
      message_ = loomGetLastError();
    }
  }
  void end() {
    ended_ = true;
    const loomResult_t r = loomGroupEnd();
    if (first_ != loomSuccess)
      C10_THROW_ERROR(
          DistBackendError,
          c10::str("loom: ", what_, " failed: ", loomGetErrorString(first_), ": ", message_));
    check(r, what_);
  }

 private:
  const char* what_;
  bool ended_ = false;
  loomResult_t first_ = loomSuccess;
  std::string message_;
};

// What an operation does with its tensors' values: complex numbers travel as pairs of reals only
// where that gives the same result (no reduction, or a sum or average).
enum class Use { kMove, kSumOrAvg, kOtherReduction };

Buf buf(const at::Tensor& t, const char* op, Use use = Use::kMove) {
  TORCH_CHECK(t.defined(), "loom: ", op, ": an undefined tensor");
  TORCH_CHECK(t.device().is_cpu() || t.is_cuda(), "loom: ", op,
              ": tensors must be on the CPU or a CUDA GPU, not ", t.device());
  TORCH_CHECK(!t.is_sparse(), "loom: ", op, ": sparse tensors are not supported");
  TORCH_CHECK(t.is_contiguous(), "loom: ", op,
              ": tensors must be contiguous (call .contiguous() first); got sizes ", t.sizes(),
              " and strides ", t.strides());
  Buf b;
  b.ptr = t.data_ptr();
  b.count = static_cast<size_t>(t.numel());
  switch (t.scalar_type()) {
    case at::kFloat:
      b.type = loomFloat32;
      break;
    case at::kDouble:
      b.type = loomFloat64;
      break;
    case at::kHalf:
      b.type = loomFloat16;
      break;
    case at::kBFloat16:
      b.type = loomBfloat16;
      break;
    case at::kChar:
      b.type = loomInt8;
      break;
    case at::kByte:
      b.type = loomUint8;
      break;
    case at::kBool:
      b.type = loomUint8;
      break;
    case at::kInt:
      b.type = loomInt32;
      break;
    case at::kLong:
      b.type = loomInt64;
      break;
    case at::kUInt32:
      b.type = loomUint32;
      break;
    case at::kUInt64:
      b.type = loomUint64;
      break;
    case at::kComplexFloat:
    case at::kComplexDouble:
    case at::kComplexHalf:
      TORCH_CHECK(use != Use::kOtherReduction, "loom: ", op, ": ", t.scalar_type(),
                  " supports only SUM and AVG reductions (complex numbers have no order, and a "
                  "product is not elementwise on their parts)");
      b.type = t.scalar_type() == at::kComplexFloat    ? loomFloat32
               : t.scalar_type() == at::kComplexDouble ? loomFloat64
                                                       : loomFloat16;
      b.count *= 2;
      break;
    default:
      TORCH_CHECK(false, "loom: ", op, ": dtype ", t.scalar_type(),
                  " is not supported (float32, float64, float16, bfloat16, int8, uint8, bool, "
                  "int32, int64, uint32, uint64 and complex are)");
  }
  return b;
}

// A reduction: Loom's operation, and whether the input is first multiplied (PREMUL_SUM).
struct Reduction {
  loomRedOp_t op = loomSum;
  bool premul = false;
  double factor = 1.0;
  at::Tensor tensorFactor;
  Use use = Use::kSumOrAvg;

  void prepare(const at::Tensor& t) const {
    if (!premul) return;
    if (tensorFactor.defined())
      t.mul_(tensorFactor.to(t.device()));
    else
      t.mul_(factor);
  }
};

Reduction reduction(const c10d::ReduceOp& rop, const at::Tensor& t, const char* op) {
  Reduction r;
  const bool isBool = t.scalar_type() == at::kBool;
  switch (rop.op_) {
    case c10d::ReduceOp::SUM:
      r.op = isBool ? loomMax : loomSum;
      break;  // logical or
    case c10d::ReduceOp::AVG:
      TORCH_CHECK(!isBool, "loom: ", op, ": AVG of bool tensors is not defined");
      r.op = loomAvg;
      break;
    case c10d::ReduceOp::PRODUCT:
      r.op = isBool ? loomMin : loomProd;  // logical and
      r.use = Use::kOtherReduction;
      break;
    case c10d::ReduceOp::MIN:
      r.op = loomMin;
      r.use = Use::kOtherReduction;
      break;
    case c10d::ReduceOp::MAX:
      r.op = loomMax;
      r.use = Use::kOtherReduction;
      break;
    case c10d::ReduceOp::PREMUL_SUM: {
      TORCH_CHECK(!isBool, "loom: ", op, ": PREMUL_SUM of bool tensors is not defined");
      auto* s = dynamic_cast<c10d::PreMulSumSupplement*>(rop.supplement_.get());
      TORCH_CHECK(s != nullptr, "loom: ", op, ": PREMUL_SUM without its factor");
      r.op = loomSum;
      r.premul = true;
      r.factor = s->double_factor;
      r.tensorFactor = s->tensor_factor;
      break;
    }
    default:
      TORCH_CHECK(false, "loom: ", op, ": ReduceOp ", static_cast<int>(rop.op_),
                  " (BAND, BOR or BXOR) is not supported: Loom reduces with SUM, AVG, PRODUCT, "
                  "MIN, MAX and PREMUL_SUM");
  }
  return r;
}

void checkRank(int64_t r, int size, const char* op, const char* what) {
  TORCH_CHECK(r >= 0 && r < size, "loom: ", op, ": ", what, " ", r,
              " is not a rank of this group (", size, " ranks)");
}

const at::Tensor& single(const std::vector<at::Tensor>& ts, const char* op) {
  TORCH_CHECK(ts.size() == 1, "loom: ", op, ": one tensor per process expected, got ", ts.size());
  return ts[0];
}

void sameShape(const at::Tensor& a, const at::Tensor& b, const char* op, const char* what) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type() && a.numel() == b.numel(), "loom: ", op, ": ",
              what, " must match the input (", b.scalar_type(), ", ", b.numel(), " elements); got ",
              a.scalar_type(), ", ", a.numel(), " elements");
}

// The coalesced all_gather_into_tensor and reduce_scatter_tensor: pairs of one tensor per rank
// (small) and one of all ranks' (large: n times as many elements, the same dtype).
void checkPairs(const std::vector<at::Tensor>& small, const std::vector<at::Tensor>& large, int n,
                const char* op) {
  TORCH_CHECK(small.size() == large.size() && !small.empty(), "loom: ", op, ": ", small.size(),
              " and ", large.size(), " tensors");
  for (size_t i = 0; i < small.size(); ++i)
    TORCH_CHECK(large[i].scalar_type() == small[i].scalar_type() &&
                    large[i].numel() == n * small[i].numel(),
                "loom: ", op, ": the larger tensor must hold ", n, " x ", small[i].numel(),
                " elements of ", small[i].scalar_type(), "; it has ", large[i].numel(), " of ",
                large[i].scalar_type());
}

// Offsets and lengths (in elements) of each rank's slice along dim 0, from PyTorch's split sizes
// (empty: equal slices).
std::vector<std::pair<size_t, size_t>> slices(const at::Tensor& t,
                                              const std::vector<int64_t>& split, int size,
                                              const char* op, const char* which) {
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  const size_t row = rows == 0 ? 0 : static_cast<size_t>(t.numel() / rows);
  std::vector<std::pair<size_t, size_t>> s(size);
  if (split.empty()) {
    TORCH_CHECK(rows % size == 0, "loom: ", op, ": the ", which, " tensor's first dimension (",
                rows, ") is not divisible by the group's ", size, " ranks");
    for (int r = 0; r < size; ++r) s[r] = {r * (rows / size) * row, (rows / size) * row};
    return s;
  }
  TORCH_CHECK(static_cast<int>(split.size()) == size, "loom: ", op, ": ", which,
              " split sizes has ", split.size(), " entries for ", size, " ranks");
  int64_t off = 0;
  for (int r = 0; r < size; ++r) {
    TORCH_CHECK(split[r] >= 0, "loom: ", op, ": a negative ", which, " split size");
    s[r] = {static_cast<size_t>(off) * row, static_cast<size_t>(split[r]) * row};
    off += split[r];
  }
  TORCH_CHECK(off == rows, "loom: ", op, ": ", which, " split sizes add up to ", off,
              ", the tensor's first dimension is ", rows);
  return s;
}

}  // namespace

// ---- LoomWork -------------------------------------------------------------------------------

void CommRef::throwIfFailed(const char* what) {
  std::lock_guard<std::mutex> lk(mu);
  if (comm == nullptr) return;
  loomResult_t async = loomSuccess;
  if (loomCommGetAsyncError(comm, &async) != loomSuccess || async == loomSuccess) return;
  const std::string detail = async == loomAborted ? "" : loomGetLastError();
  C10_THROW_ERROR(DistBackendError,
                  c10::str("loom: ", what, ": the communicator failed: ", loomGetErrorString(async),
                           detail.empty() ? "" : ": ", detail));
}

LoomWork::LoomWork(int rank, c10d::OpType type, const char* title, std::vector<at::Tensor> outputs,
                   c10::Device device, std::shared_ptr<CommRef> comm)
    // The title opens a profiler range only while a profiler listens: without one, c10d::Work's
    // range is an allocation per call that records nothing.
    : c10d::Work(rank, type, at::hasCallbacks() ? title : nullptr),
      outputs_(std::move(outputs)),
      device_(device),
      comm_(std::move(comm)),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::ofTensors(),
          device.is_cuda() ? std::vector<c10::Device>{device} : std::vector<c10::Device>{})) {}

bool LoomWork::isCompleted() {
  if (!c10d::Work::isCompleted()) return false;
  return !done_ || done_->query();
}

void LoomWork::synchronize() {
  if (!done_) return;
  done_->block(c10::impl::VirtualGuardImpl(device_.type()).getStream(device_));
}

bool LoomWork::wait(std::chrono::milliseconds timeout) {
  const bool done = c10d::Work::wait(timeout);  // the host part (throws its failure)
  synchronize();
  if (device_.is_cuda()) comm_->throwIfFailed("wait");
  return done;
}

void LoomWork::recordDone(const c10::Stream& stream) {
  done_.emplace(stream.device_type());
  done_->record(stream);
}

void LoomWork::complete(std::exception_ptr exception) {
  // The Future first, as gloo's Works do: a caller that wait()ed may read get_future().value()
  // at once. (The other way round, 40% of 3000 waits here returned while the Future was not yet
  // done.)
  if (exception)
    future_->setError(exception);
  else
    future_->markCompleted(c10::IValue(outputs_));
  finish(exception);
}

// ---- LoomBackend: life ------------------------------------------------------------------------

LoomBackend::LoomBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                         std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size) {
  TORCH_CHECK(store, "loom: no Store to exchange the unique id through");
  const std::string key = "loom_unique_id";
  loomUniqueId id;
  if (rank == 0) {
    check(loomGetUniqueId(&id), "loomGetUniqueId");
    store->set(key, std::vector<uint8_t>(reinterpret_cast<uint8_t*>(id.internal),
                                         reinterpret_cast<uint8_t*>(id.internal) + sizeof(id)));
  } else {
    std::vector<uint8_t> v = store->get(key);  // waits for rank 0, within the Store's timeout
    TORCH_CHECK(v.size() == sizeof(id), "loom: the unique id in the Store has ", v.size(),
                " bytes, expected ", sizeof(id));
    std::memcpy(id.internal, v.data(), sizeof(id));
  }
  loomConfig_t config = LOOM_CONFIG_INITIALIZER;
  const int64_t ms = timeout.count();
  config.timeoutMs = ms <= 0 ? -1 : static_cast<int>(std::min<int64_t>(ms, INT_MAX));
  config.commName = "torch.distributed";
  check(loomCommInitRankConfig(&comm_, size, id, rank, &config), "loomCommInitRank");
  ref_->comm = comm_;
  worker_ = std::thread([this] { run(); });
}

LoomBackend::~LoomBackend() { stop(true); }

void LoomBackend::stop(bool drain) {
  std::vector<Op> dropped;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopped_ || (stopping_ && drain)) return;  // done, or another thread is stopping
    stopping_ = true;
    if (!drain) {
      for (auto& batch : queue_)
        for (Op& op : batch) dropped.push_back(std::move(op));
      queue_.clear();
      for (Op& op : coalesced_) dropped.push_back(std::move(op));
      coalesced_.clear();
    }
  }
  cv_.notify_all();
  // Queued operations fail without running (outside the lock: a Future's callbacks run here).
  for (Op& op : dropped)
    op.work->complete(std::make_exception_ptr(
        c10::DistBackendError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                              "loom: the process group was aborted before this operation ran")));
  // The abort wakes the call in flight (it fails), and a call the worker starts after it returns
  // loomAborted at once: Loom keeps an aborted handle valid for exactly this.
  if (!drain && comm_ != nullptr) loomCommAbort(comm_);
  if (worker_.joinable()) worker_.join();
  {
    std::unique_lock<std::mutex> lk(mu_);  // a blocking call running on its caller's thread
    ++idleWaiters_;
    cv_.wait(lk, [&] { return !busy_; });
    --idleWaiters_;
  }
  // A shutdown lets the operations on the backend's stream finish first (as ncclCommDestroy
  // finalizes): destroying the communicator would fail the calls still pending there. Bounded by
  // Loom's deadline where a peer never comes.
  std::optional<c10::Stream> side;
  {
    std::lock_guard<std::mutex> lk(mu_);
    side = side_;
  }
  if (drain && side && comm_ != nullptr) {
    try {
      c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).synchronizeStream(*side);
    } catch (const std::exception& e) {
      TORCH_WARN("loom: shutdown: waiting for the process group's CUDA stream: ", e.what());
    }
  }
  if (drain) {  // Works outliving the backend ask no more (an aborted handle stays valid)
    std::lock_guard<std::mutex> lk(ref_->mu);
    ref_->comm = nullptr;
  }
  if (drain && comm_ != nullptr) loomCommDestroy(comm_);
  comm_ = nullptr;
  std::lock_guard<std::mutex> lk(mu_);
  stopped_ = true;
}

void LoomBackend::abort() { stop(false); }

void LoomBackend::shutdown() { stop(true); }

// ---- the queue and the worker -------------------------------------------------------------------

c10::Device LoomBackend::opDevice(const std::vector<at::Tensor>& outputs,
                                  const std::vector<at::Tensor>& inputs, const char* title) {
  std::optional<c10::Device> dev;
  for (const auto* list : {&outputs, &inputs})
    for (const at::Tensor& t : *list) {
      if (!t.defined()) continue;
      const c10::Device d = t.is_cuda() ? t.device() : c10::Device(c10::kCPU);
      TORCH_CHECK(!dev || *dev == d, "loom: ", title, ": tensors on ", *dev, " and ", d,
                  " in one operation");
      dev = d;
    }
  if (!dev || !dev->is_cuda()) return c10::Device(c10::kCPU);
  std::lock_guard<std::mutex> lk(mu_);
  if (!gpu_) gpu_ = *dev;
  TORCH_CHECK(*gpu_ == *dev, "loom: ", title, ": tensors on ", *dev,
              ", but this process group runs on ", *gpu_,
              " (Loom's communicator drives one GPU, its first CUDA operation's: make one "
              "process group per GPU)");
  return *dev;
}

c10::Stream LoomBackend::sideStream() {
  std::lock_guard<std::mutex> lk(mu_);
  if (!side_)
    side_ = c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).getStreamFromGlobalPool(*gpu_);
  return *side_;
}

c10::intrusive_ptr<c10d::Work> LoomBackend::enqueue(c10d::OpType type, const char* title,
                                                    std::vector<at::Tensor> outputs,
                                                    std::vector<at::Tensor> inputs, bool sync,
                                                    std::function<void()> issue,
                                                    std::function<void()> finish) {
  const c10::Device dev = opDevice(outputs, inputs, title);
  auto work = c10::make_intrusive<LoomWork>(getRank(), type, title, outputs, dev, ref_);
  Op op{std::move(issue), std::move(finish), work, nullptr, std::move(inputs)};
  bool capturing = false;
  if (dev.is_cuda()) {
    ref_->throwIfFailed(title);  // a failure on the stream since the last operation
    const c10::Stream caller = c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).getStream(dev);
    capturing = streamCapturing(caller.native_handle());
    // What the caller's stream holds now comes before the operation. Under capture
    // (torch.cuda.graph) the backend's stream joins the capture by waiting on this event, and
    // Loom keeps its calls for the graph (include/loom/loom.h, "CUDA graphs").
    op.ready = std::make_shared<c10::Event>(c10::DeviceType::CUDA);
    op.ready->record(caller);
    for (at::Tensor& t : outputs) op.tensors.push_back(std::move(t));
  }
  std::vector<Op> batch;
  batch.push_back(std::move(op));
  {
    std::unique_lock<std::mutex> lk(mu_);
    TORCH_CHECK(!stopping_, "loom: ", title, ": the process group was shut down or aborted");
    if (coalescing_) {
      TORCH_CHECK(coalesced_.empty() || coalesced_.front().work->device() == dev, "loom: ", title,
                  ": one coalesced region on ", coalesced_.front().work->device(), " and ", dev);
      coalesced_.push_back(std::move(batch[0]));
      return work;
    }
    if (!capturing && (!sync || busy_ || !queue_.empty())) {
      queue_.push_back(std::move(batch));
      lk.unlock();
      cv_.notify_all();
      return work;
    }
    if (!capturing) busy_ = true;  // run here, now: the worker waits
  }
  // Under capture always here, after what was queued before: the capture's calls are made on the
  // capturing thread, so that every CUDA call joining the capture comes from it (in GLOBAL mode
  // another thread's unsafe calls would break it), and in this process group's order.
  if (capturing) holdWhenIdle(title);
  runHeld(batch);
  return work;
}

void LoomBackend::holdWhenIdle(const char* title) {
  std::unique_lock<std::mutex> lk(mu_);
  ++idleWaiters_;
  cv_.wait(lk, [&] { return stopping_ || (!busy_ && queue_.empty()); });
  --idleWaiters_;
  TORCH_CHECK(!stopping_, "loom: ", title, ": the process group was shut down or aborted");
  busy_ = true;
}

void LoomBackend::run() {
  for (;;) {
    std::vector<Op> batch;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return (!queue_.empty() && !busy_) || (stopping_ && queue_.empty()); });
      if (queue_.empty()) return;  // stopping, and drained
      batch = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    runHeld(batch);
  }
}

void LoomBackend::runHeld(std::vector<Op>& batch) {
  runBatch(batch);
  release();
}

void LoomBackend::release() {
  bool wake;
  {
    std::lock_guard<std::mutex> lk(mu_);
    busy_ = false;
    // Only someone who can go on now: the worker when operations wait (or it should stop), a
    // thread waiting for the backend to be idle. Waking the worker after every blocking call for
    // nothing took a core from the peers on a busy host.
    wake = !queue_.empty() || stopping_ || idleWaiters_ > 0;
  }
  if (wake) cv_.notify_all();
}

void LoomBackend::runBatch(std::vector<Op>& ops) {
  std::exception_ptr error;
  // CUDA: the backend's stream is current here (its copies and the Future's events go there)
  // and every Loom call is enqueued on it.
  std::optional<c10::StreamGuard> onStream;
  std::optional<c10::Stream> side;
  try {
    if (!ops.empty() && ops.front().work->device().is_cuda()) {
      side = sideStream();
      onStream.emplace(*side);
      const c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
      for (const Op& op : ops) {
        if (op.ready) op.ready->block(*side);
        for (const at::Tensor& t : op.tensors)
          if (t.defined() && t.has_storage())
            impl.recordDataPtrOnStream(t.storage().data_ptr(), *side);
      }
      stream_ = side->native_handle();
    }
    size_t calls = 0;
    for (const Op& op : ops) calls += op.issue ? 1 : 0;
    if (calls == 1) {
      for (const Op& op : ops)
        if (op.issue) op.issue();
    } else if (calls > 1) {
      Group g("the coalesced operations");
      for (const Op& op : ops)
        if (op.issue) op.issue();
      g.end();
    }
    for (const Op& op : ops)
      if (op.finish) op.finish();
    if (side)
      for (const Op& op : ops) op.work->recordDone(*side);
  } catch (...) {
    error = std::current_exception();
  }
  stream_ = nullptr;
  for (Op& op : ops) op.work->complete(error);
}

void LoomBackend::startCoalescing() {
  std::lock_guard<std::mutex> lk(mu_);
  TORCH_CHECK(!coalescing_, "loom: startCoalescing while already coalescing");
  coalescing_ = true;
}

c10::intrusive_ptr<c10d::Work> LoomBackend::endCoalescing() {
  std::vector<Op> batch;
  {
    std::lock_guard<std::mutex> lk(mu_);
    TORCH_CHECK(coalescing_, "loom: endCoalescing without startCoalescing");
    coalescing_ = false;
    batch = std::move(coalesced_);
    coalesced_.clear();
  }
  std::vector<at::Tensor> outputs;
  for (const Op& op : batch)
    for (const at::Tensor& t : op.work->result()) outputs.push_back(t);
  const c10::Device dev = batch.empty() ? c10::Device(c10::kCPU) : batch.front().work->device();
  auto work = c10::make_intrusive<LoomWork>(getRank(), c10d::OpType::COALESCED, "loom:coalesced",
                                            outputs, dev, ref_);
  batch.push_back(Op{nullptr, nullptr, work, nullptr, {}});  // completes with the batch
  // Under capture on this thread, as enqueue runs a single operation.
  const bool capturing =
      dev.is_cuda() &&
      streamCapturing(
          c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).getStream(dev).native_handle());
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!stopping_ && !capturing) {
      queue_.push_back(std::move(batch));
      cv_.notify_one();
      return work;
    }
  }
  if (capturing) {
    try {
      holdWhenIdle("coalesced operations");
    } catch (...) {  // shut down or aborted meanwhile: the held operations fail
      for (Op& op : batch) op.work->complete(std::current_exception());
      throw;
    }
    runHeld(batch);
    return work;
  }
  // Shut down or aborted meanwhile (PyTorch aborts every group inside a coalescing region): an
  // empty region is done; held operations fail.
  std::exception_ptr error;
  if (batch.size() > 1)
    error = std::make_exception_ptr(c10::DistBackendError(
        {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
        "loom: the process group was shut down or aborted before the coalesced operations ran"));
  for (Op& op : batch) op.work->complete(error);
  return work;
}

// ---- the operations
// -------------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> LoomBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                      const c10d::BroadcastOptions& opts) {
  const at::Tensor t = single(tensors, "broadcast");
  const Buf b = buf(t, "broadcast");
  checkRank(opts.rootRank, getSize(), "broadcast", "root");
  const int root = static_cast<int>(opts.rootRank);
  return enqueue(
      c10d::OpType::BROADCAST, "loom:broadcast", {t}, {}, !opts.asyncOp, [this, b, root] {
        check(loomBroadcast(b.ptr, b.ptr, b.count, b.type, root, comm_, stream_), "broadcast");
      });
}

c10::intrusive_ptr<c10d::Work> LoomBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                      const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(!opts.sparseIndices.has_value(),
              "loom: all_reduce of sparse tensors is not supported");
  const at::Tensor t = single(tensors, "all_reduce");
  const Reduction red = reduction(opts.reduceOp, t, "all_reduce");
  const Buf b = buf(t, "all_reduce", red.use);
  return enqueue(
      c10d::OpType::ALLREDUCE, "loom:all_reduce", {t}, {}, !opts.asyncOp, [this, b, red, t] {
        red.prepare(t);
        check(loomAllReduce(b.ptr, b.ptr, b.count, b.type, red.op, comm_, stream_), "all_reduce");
      });
}

void LoomBackend::directAllReduce(const at::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu(), "loom: direct_all_reduce takes CPU tensors, not ", t.device());
  const Buf b = buf(t, "direct_all_reduce", Use::kSumOrAvg);
  holdWhenIdle("direct_all_reduce");  // after the operations queued before
  const loomResult_t r = loomAllReduce(b.ptr, b.ptr, b.count, b.type, loomSum, comm_, nullptr);
  release();
  check(r, "direct_all_reduce");
}

c10::intrusive_ptr<c10d::Work> LoomBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "loom: allreduce_coalesced: no tensors");
  std::vector<std::pair<Buf, Reduction>> calls;
  for (const at::Tensor& t : tensors) {
    Reduction red = reduction(opts.reduceOp, t, "allreduce_coalesced");
    calls.emplace_back(buf(t, "allreduce_coalesced", red.use), red);
  }
  return enqueue(c10d::OpType::ALLREDUCE_COALESCED, "loom:allreduce_coalesced", tensors, {},
                 !opts.asyncOp, [this, calls, tensors] {
                   for (size_t i = 0; i < calls.size(); ++i) calls[i].second.prepare(tensors[i]);
                   Group g("allreduce_coalesced");
                   for (const auto& [b, red] : calls)
                     g.add(loomAllReduce(b.ptr, b.ptr, b.count, b.type, red.op, comm_, stream_));
                   g.end();
                 });
}

c10::intrusive_ptr<c10d::Work> LoomBackend::reduce(std::vector<at::Tensor>& tensors,
                                                   const c10d::ReduceOptions& opts) {
  const at::Tensor t = single(tensors, "reduce");
  const Reduction red = reduction(opts.reduceOp, t, "reduce");
  const Buf b = buf(t, "reduce", red.use);
  checkRank(opts.rootRank, getSize(), "reduce", "root");
  const int root = static_cast<int>(opts.rootRank);
  return enqueue(
      c10d::OpType::REDUCE, "loom:reduce", {t}, {}, !opts.asyncOp, [this, b, red, t, root] {
        red.prepare(t);
        check(loomReduce(b.ptr, b.ptr, b.count, b.type, red.op, root, comm_, stream_), "reduce");
      });
}

c10::intrusive_ptr<c10d::Work> LoomBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1,
              "loom: all_gather: one input tensor and one output list per process expected");
  return allgather_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> LoomBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputLists.size() == inputs.size() && !inputs.empty(),
              "loom: all_gather: ", inputs.size(), " inputs and ", outputLists.size(),
              " output lists");
  struct Call {
    Buf in;
    at::Tensor flat;
    std::vector<at::Tensor> outs;
  };
  std::vector<Call> calls;
  std::vector<at::Tensor> all;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& in = inputs[i];
    TORCH_CHECK(static_cast<int>(outputLists[i].size()) == getSize(),
                "loom: all_gather: ", outputLists[i].size(), " output tensors for ", getSize(),
                " ranks");
    for (const at::Tensor& o : outputLists[i]) {
      sameShape(o, in, "all_gather", "every output tensor");
      TORCH_CHECK(o.device() == in.device(), "loom: all_gather: an output on ", o.device(),
                  ", the input on ", in.device());
      all.push_back(o);
    }
    Call c;
    c.in = buf(in, "all_gather");
    c.flat = at::empty({getSize() * in.numel()}, in.options());
    c.outs = outputLists[i];
    calls.push_back(std::move(c));
  }
  auto issue = [this, calls] {
    Group g("all_gather");
    for (const Call& c : calls) {
      const Buf f = buf(c.flat, "all_gather");
      g.add(loomAllGather(c.in.ptr, f.ptr, c.in.count, c.in.type, comm_, stream_));
    }
    g.end();
  };
  auto finish = [calls, n = getSize()] {
    for (const Call& c : calls) {
      const int64_t each = c.flat.numel() / n;
      for (int r = 0; r < n; ++r)
        c.outs[r].copy_(c.flat.narrow(0, r * each, each).view_as(c.outs[r]));
    }
  };
  std::vector<at::Tensor> used = inputs;
  for (const Call& c : calls) used.push_back(c.flat);
  return enqueue(c10d::OpType::ALLGATHER, "loom:all_gather", all, std::move(used), !opts.asyncOp,
                 issue, finish);
}

c10::intrusive_ptr<c10d::Work> LoomBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                            const c10d::AllgatherOptions& opts) {
  std::vector<at::Tensor> outs = {output}, ins = {input};
  return allgather_into_tensor_coalesced(outs, ins, opts);
}

c10::intrusive_ptr<c10d::Work> LoomBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  checkPairs(inputs, outputs, getSize(), "all_gather_into_tensor");
  std::vector<std::pair<Buf, Buf>> calls;
  for (size_t i = 0; i < inputs.size(); ++i) {
    calls.emplace_back(buf(inputs[i], "all_gather_into_tensor"),
                       buf(outputs[i], "all_gather_into_tensor"));
  }
  return enqueue(c10d::OpType::_ALLGATHER_BASE, "loom:all_gather_into_tensor", outputs, inputs,
                 !opts.asyncOp, [this, calls] {
                   Group g("all_gather_into_tensor");
                   for (const auto& [in, out] : calls)
                     g.add(loomAllGather(in.ptr, out.ptr, in.count, in.type, comm_, stream_));
                   g.end();
                 });
}

std::vector<at::Tensor> LoomBackend::rootList(const std::vector<std::vector<at::Tensor>>& lists,
                                              const at::Tensor& mine, int root, const char* op,
                                              const char* which) {
  if (getRank() != root) {
    TORCH_CHECK(lists.empty() || (lists.size() == 1 && lists[0].empty()), "loom: ", op,
                ": only the root passes ", which, " tensors");
    return {};
  }
  TORCH_CHECK(lists.size() == 1 && static_cast<int>(lists[0].size()) == getSize(), "loom: ", op,
              ": the root needs one list of ", getSize(), " ", which, " tensors");
  for (const at::Tensor& t : lists[0]) {
    sameShape(t, mine, op, c10::str("every ", which, " tensor").c_str());
    buf(t, op);
  }
  return lists[0];
}

void LoomBackend::rootExchange(bool toRoot, const std::vector<at::Tensor>& list, const Buf& mine,
                               int root, const char* op) {
  auto move = [&](const Buf& b, int peer) {
    return toRoot == (getRank() == root) ? loomRecv(b.ptr, b.count, b.type, peer, comm_, stream_)
                                         : loomSend(b.ptr, b.count, b.type, peer, comm_, stream_);
  };
  Group g(op);
  if (getRank() == root) {
    for (int r = 0; r < getSize(); ++r)
      if (r != root) g.add(move(buf(list[r], op), r));
  } else {
    g.add(move(mine, root));
  }
  g.end();
}

c10::intrusive_ptr<c10d::Work> LoomBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                   std::vector<at::Tensor>& inputs,
                                                   const c10d::GatherOptions& opts) {
  const at::Tensor in = single(inputs, "gather");
  const Buf b = buf(in, "gather");
  checkRank(opts.rootRank, getSize(), "gather", "root");
  const int root = static_cast<int>(opts.rootRank);
  const std::vector<at::Tensor> outs = rootList(outputs, in, root, "gather", "output");
  auto issue = [this, b, outs, root] { rootExchange(true, outs, b, root, "gather"); };
  auto finish = [outs, in, root] {
    if (!outs.empty()) outs[root].copy_(in.view_as(outs[root]));
  };
  return enqueue(c10d::OpType::GATHER, "loom:gather", outs, {in}, !opts.asyncOp, issue, finish);
}

c10::intrusive_ptr<c10d::Work> LoomBackend::scatter(std::vector<at::Tensor>& outputs,
                                                    std::vector<std::vector<at::Tensor>>& inputs,
                                                    const c10d::ScatterOptions& opts) {
  const at::Tensor out = single(outputs, "scatter");
  const Buf o = buf(out, "scatter");
  checkRank(opts.rootRank, getSize(), "scatter", "root");
  const int root = static_cast<int>(opts.rootRank);
  const std::vector<at::Tensor> ins = rootList(inputs, out, root, "scatter", "input");
  auto issue = [this, o, out, ins, root] {
    if (!ins.empty()) out.copy_(ins[root].view_as(out));
    rootExchange(false, ins, o, root, "scatter");
  };
  return enqueue(c10d::OpType::SCATTER, "loom:scatter", {out}, ins, !opts.asyncOp, issue);
}

c10::intrusive_ptr<c10d::Work> LoomBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const at::Tensor out = single(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
              "loom: reduce_scatter: one list of ", getSize(), " input tensors expected");
  const Reduction red = reduction(opts.reduceOp, out, "reduce_scatter");
  const Buf o = buf(out, "reduce_scatter", red.use);
  std::vector<at::Tensor> ins = inputs[0];
  for (const at::Tensor& i : ins) {
    sameShape(i, out, "reduce_scatter", "every input tensor");
    buf(i, "reduce_scatter", red.use);
  }
  return enqueue(c10d::OpType::REDUCE_SCATTER, "loom:reduce_scatter", {out}, ins, !opts.asyncOp,
                 [this, o, red, ins] {
                   std::vector<at::Tensor> flat;
                   for (const at::Tensor& i : ins) flat.push_back(i.reshape(-1));
                   at::Tensor all = at::cat(flat);
                   red.prepare(all);
                   const Buf a = buf(all, "reduce_scatter", red.use);
                   check(loomReduceScatter(a.ptr, o.ptr, o.count, o.type, red.op, comm_, stream_),
                         "reduce_scatter");
                 });
}

c10::intrusive_ptr<c10d::Work> LoomBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  std::vector<at::Tensor> outs = {output}, ins = {input};
  return reduce_scatter_tensor_coalesced(outs, ins, opts);
}

c10::intrusive_ptr<c10d::Work> LoomBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  checkPairs(outputs, inputs, getSize(), "reduce_scatter_tensor");
  struct Call {
    Buf in, out;
    Reduction red;
    at::Tensor input;
  };
  std::vector<Call> calls;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Reduction red = reduction(opts.reduceOp, inputs[i], "reduce_scatter_tensor");
    calls.push_back({buf(inputs[i], "reduce_scatter_tensor", red.use),
                     buf(outputs[i], "reduce_scatter_tensor", red.use), red, inputs[i]});
  }
  return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, "loom:reduce_scatter_tensor", outputs, inputs,
                 !opts.asyncOp, [this, calls] {
                   // PREMUL_SUM: a scaled copy of the input (the caller's input is not written).
                   std::vector<at::Tensor> scaled;
                   Group g("reduce_scatter_tensor");
                   for (const Call& c : calls) {
                     Buf in = c.in;
                     if (c.red.premul) {
                       scaled.push_back(c.input.clone());
                       c.red.prepare(scaled.back());
                       in = buf(scaled.back(), "reduce_scatter_tensor", c.red.use);
                     }
                     g.add(loomReduceScatter(in.ptr, c.out.ptr, c.out.count, c.out.type, c.red.op,
                                             comm_, stream_));
                   }
                   g.end();
                 });
}

void LoomBackend::exchange(const std::vector<Buf>& sends, const std::vector<Buf>& recvs,
                           const char* op) {
  Group g(op);
  for (int r = 0; r < getSize(); ++r) {
    if (r == getRank()) continue;
    if (sends[r].count > 0)
      g.add(loomSend(sends[r].ptr, sends[r].count, sends[r].type, r, comm_, stream_));
    if (recvs[r].count > 0)
      g.add(loomRecv(recvs[r].ptr, recvs[r].count, recvs[r].type, r, comm_, stream_));
  }
  g.end();
}

c10::intrusive_ptr<c10d::Work> LoomBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                          std::vector<int64_t>& outputSplits,
                                                          std::vector<int64_t>& inputSplits,
                                                          const c10d::AllToAllOptions& opts) {
  const int n = getSize(), me = getRank();
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "loom: all_to_all_single: output ",
              output.scalar_type(), " and input ", input.scalar_type(), " differ");
  const Buf in = buf(input, "all_to_all_single"), out = buf(output, "all_to_all_single");
  const auto sendAt = slices(input, inputSplits, n, "all_to_all_single", "input");
  const auto recvAt = slices(output, outputSplits, n, "all_to_all_single", "output");
  const size_t elem = input.element_size();
  const bool equal = inputSplits.empty() && outputSplits.empty();
  if (equal)
    TORCH_CHECK(input.numel() == output.numel(), "loom: all_to_all_single: input has ",
                input.numel(), " elements and output ", output.numel());
  TORCH_CHECK(sendAt[me].second == recvAt[me].second, "loom: all_to_all_single: this rank sends ",
              sendAt[me].second, " elements to itself but expects ", recvAt[me].second);
  // Loom's elements per tensor element (2 for complex).
  const size_t per = in.count / std::max<size_t>(1, static_cast<size_t>(input.numel()));
  auto slice = [per, elem](const Buf& b, const std::pair<size_t, size_t>& at) {
    return Buf{static_cast<char*>(b.ptr) + at.first * elem, at.second * per, b.type};
  };
  std::vector<Buf> sends, recvs;
  for (int r = 0; r < n; ++r) {
    sends.push_back(slice(in, sendAt[r]));
    recvs.push_back(slice(out, recvAt[r]));
  }
  // This rank's own slice, copied as tensors (on the GPU for CUDA ones).
  const at::Tensor selfIn = input.reshape(-1).narrow(0, static_cast<int64_t>(sendAt[me].first),
                                                     static_cast<int64_t>(sendAt[me].second));
  const at::Tensor selfOut = output.view(-1).narrow(0, static_cast<int64_t>(recvAt[me].first),
                                                    static_cast<int64_t>(recvAt[me].second));
  auto issue = [this, in, out, sends, recvs, selfIn, selfOut, equal, n] {
    if (equal) {
      check(loomAllToAll(in.ptr, out.ptr, in.count / n, in.type, comm_, stream_),
            "all_to_all_single");
      return;
    }
    // Unequal slices: this rank's own by a copy, the others as sends and receives in one group.
    selfOut.copy_(selfIn);
    exchange(sends, recvs, "all_to_all_single");
  };
  return enqueue(c10d::OpType::ALLTOALL_BASE, "loom:all_to_all_single", {output}, {input},
                 !opts.asyncOp, issue);
}

c10::intrusive_ptr<c10d::Work> LoomBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllToAllOptions& opts) {
  const int n = getSize(), me = getRank();
  TORCH_CHECK(static_cast<int>(outputs.size()) == n && static_cast<int>(inputs.size()) == n,
              "loom: all_to_all: ", n, " input and ", n, " output tensors expected; got ",
              inputs.size(), " and ", outputs.size());
  std::vector<Buf> ins, outs;
  for (int r = 0; r < n; ++r) {
    ins.push_back(buf(inputs[r], "all_to_all"));
    outs.push_back(buf(outputs[r], "all_to_all"));
  }
  sameShape(outputs[me], inputs[me], "all_to_all", "this rank's own output");
  auto issue = [this, ins, outs, inputs, outputs, me] {
    outputs[me].copy_(inputs[me]);
    exchange(ins, outs, "all_to_all");
  };
  return enqueue(c10d::OpType::ALLTOALL, "loom:all_to_all", outputs, inputs, !opts.asyncOp, issue);
}

c10::intrusive_ptr<c10d::Work> LoomBackend::send(std::vector<at::Tensor>& tensors, int dstRank,
                                                 int) {
  const at::Tensor t = single(tensors, "send");
  const Buf b = buf(t, "send");
  checkRank(dstRank, getSize(), "send", "destination");
  return enqueue(c10d::OpType::SEND, "loom:send", {t}, {}, false, [this, b, dstRank] {
    check(loomSend(b.ptr, b.count, b.type, dstRank, comm_, stream_), "send");
  });
}

c10::intrusive_ptr<c10d::Work> LoomBackend::recv(std::vector<at::Tensor>& tensors, int srcRank,
                                                 int) {
  const at::Tensor t = single(tensors, "recv");
  const Buf b = buf(t, "recv");
  checkRank(srcRank, getSize(), "recv", "source");
  return enqueue(c10d::OpType::RECV, "loom:recv", {t}, {}, false, [this, b, srcRank] {
    check(loomRecv(b.ptr, b.count, b.type, srcRank, comm_, stream_), "recv");
  });
}

c10::intrusive_ptr<c10d::Work> LoomBackend::recvAnysource(std::vector<at::Tensor>&, int) {
  TORCH_CHECK(false,
              "loom: recv from any source is not supported: Loom, like NCCL, receives from a "
              "named rank (pass src)");
}

c10::intrusive_ptr<c10d::Work> LoomBackend::barrier(const c10d::BarrierOptions& opts) {
  at::Tensor token = at::zeros({1}, at::kByte);
  const Buf b = buf(token, "barrier");
  return enqueue(c10d::OpType::BARRIER, "loom:barrier", {}, {}, !opts.asyncOp, [this, b, token] {
    check(loomAllReduce(b.ptr, b.ptr, 1, loomUint8, loomSum, comm_, stream_), "barrier");
  });
}

}  // namespace loom_torch
