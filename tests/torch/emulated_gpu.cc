// loom_emulated_gpu: PyTorch's CUDA device type over Loom's emulated GPU (libloom-fakecuda.so), so
// that loom_torch's CUDA path runs on a machine without a GPU. TEST ONLY (tests/torch).
//
// install(lib) replaces PyTorch's device guard for CUDA (streams, events, the current device) with
// one over the emulated driver's streams and events, which Loom loads too (LOOM_CUDA_LIB names the
// same library: one emulated device per process). Tensors on it are made here (from_blob over the
// emulated device memory, read and written through the driver); PyTorch's own CUDA kernels and
// allocator are not there, so the backend's operations that run a torch operation on the GPU
// (all_gather into a list, PREMUL_SUM, reduce_scatter of a list) fail with PyTorch's error, and
// the tests use the others. A stream's id is its CUstream; the default stream of each device is
// one the guard creates (process wide), the current one is per thread.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <dlfcn.h>
#include <torch/extension.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

// The emulated driver's own handle types (src/device/cuda_driver.h, which this extension cannot
// include), so that every call through the pointers below has its callee's exact type
// (UndefinedBehaviorSanitizer checks it: tools/sanitize_torch.sh).
namespace loom::cuda {
struct CUctx_st;
struct CUstream_st;
struct CUevent_st;
struct CUgraph_st;
struct CUgraphExec_st;
}  // namespace loom::cuda

namespace {

using CUresult = int;
using CUdevice = int;
using CUcontext = loom::cuda::CUctx_st*;
using CUstream = loom::cuda::CUstream_st*;
using CUevent = loom::cuda::CUevent_st*;
using CUgraph = loom::cuda::CUgraph_st*;
using CUgraphExec = loom::cuda::CUgraphExec_st*;
using CUdeviceptr = unsigned long long;  // NOLINT(runtime/int): the driver's type
constexpr CUresult kSuccess = 0;
constexpr CUresult kNotReady = 600;
constexpr unsigned kEventDisableTiming = 2;

struct Driver {
  void* lib = nullptr;
  CUresult (*init)(unsigned) = nullptr;
  CUresult (*deviceCount)(int*) = nullptr;
  CUresult (*deviceGet)(CUdevice*, int) = nullptr;
  CUresult (*retain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*setCurrent)(CUcontext) = nullptr;
  CUresult (*streamCreate)(CUstream*, unsigned) = nullptr;
  CUresult (*streamSync)(CUstream) = nullptr;
  CUresult (*streamQuery)(CUstream) = nullptr;
  CUresult (*eventCreate)(CUevent*, unsigned) = nullptr;
  CUresult (*eventDestroy)(CUevent) = nullptr;
  CUresult (*eventRecord)(CUevent, CUstream) = nullptr;
  CUresult (*eventQuery)(CUevent) = nullptr;
  CUresult (*eventSync)(CUevent) = nullptr;
  CUresult (*streamWaitEvent)(CUstream, CUevent, unsigned) = nullptr;
  CUresult (*memAlloc)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*memFree)(CUdeviceptr) = nullptr;
  CUresult (*memcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*hostAlloc)(void**, size_t, unsigned) = nullptr;
  CUresult (*streamWaitValue64)(CUstream, CUdeviceptr, uint64_t, unsigned) = nullptr;
  CUresult (*beginCapture)(CUstream, int) = nullptr;
  CUresult (*endCapture)(CUstream, CUgraph*) = nullptr;
  CUresult (*instantiate)(CUgraphExec*, CUgraph, unsigned long long) = nullptr;  // NOLINT
  CUresult (*graphLaunch)(CUgraphExec, CUstream) = nullptr;
  CUresult (*graphDestroy)(CUgraph) = nullptr;
  CUresult (*execDestroy)(CUgraphExec) = nullptr;
  std::array<CUcontext, 8> ctx{};
  int count = 0;
};

Driver& drv() {
  static Driver d;
  return d;
}

void ok(CUresult r, const char* what) {
  TORCH_CHECK(r == kSuccess, "loom_emulated_gpu: ", what, " failed: CUresult ", r);
}

template <typename F>
void sym(F& f, const char* name) {
  f = reinterpret_cast<F>(dlsym(drv().lib, name));
  TORCH_CHECK(f != nullptr, "loom_emulated_gpu: the driver has no ", name);
}

// The device's primary context, current on this thread (the emulated driver's current context is
// per thread, and every enqueue needs it).
void enter(c10::DeviceIndex d) {
  TORCH_CHECK(d >= 0 && d < drv().count, "loom_emulated_gpu: no device ", static_cast<int>(d));
  ok(drv().setCurrent(drv().ctx[d]), "cuCtxSetCurrent");
}

CUstream handle(const c10::Stream& s) { return reinterpret_cast<CUstream>(s.id()); }

c10::Stream wrap(CUstream s, c10::DeviceIndex d) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::kCUDA, d),
                     static_cast<c10::StreamId>(reinterpret_cast<intptr_t>(s)));
}

thread_local c10::DeviceIndex tDevice = 0;
thread_local std::unordered_map<int, CUstream> tCurrent;  // device -> this thread's stream
std::mutex gMu;
std::array<CUstream, 8> gDefault{};  // per device, made at install

class EmulatedGuard final : public c10::impl::DeviceGuardImplInterface {
 public:
  c10::DeviceType type() const override { return c10::kCUDA; }
  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::Device old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(c10::kCUDA, tDevice); }
  void setDevice(c10::Device d) const override {
    enter(d.index());
    tDevice = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < drv().count) {
      drv().setCurrent(drv().ctx[d.index()]);
      tDevice = d.index();
    }
  }
  // A device without an index ("cuda", as PyTorch's flight recorder asks) is the current one,
  // as PyTorch's own CUDA guard reads it.
  static c10::DeviceIndex indexOf(c10::Device d) {
    const c10::DeviceIndex i = d.has_index() ? d.index() : tDevice;
    TORCH_CHECK(i >= 0 && i < drv().count, "loom_emulated_gpu: no device ", static_cast<int>(i));
    return i;
  }
  c10::Stream getStream(c10::Device d) const override {
    const c10::DeviceIndex i = indexOf(d);
    const auto it = tCurrent.find(i);
    return wrap(it == tCurrent.end() ? gDefault[i] : it->second, i);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    const c10::DeviceIndex i = indexOf(d);
    return wrap(gDefault[i], i);
  }
  c10::Stream getNewStream(c10::Device d, int) const override {
    const c10::DeviceIndex i = indexOf(d);
    enter(i);
    CUstream s = nullptr;
    ok(drv().streamCreate(&s, 1), "cuStreamCreate");  // non-blocking, as PyTorch's pool streams
    return wrap(s, i);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override {
    return getNewStream(d, 0);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    const c10::Stream old = getStream(s.device());
    tCurrent[s.device_index()] = handle(s);
    return old;
  }
  void* getStreamNativeHandle(const c10::Stream s) const override { return handle(s); }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    if (event) drv().eventDestroy(static_cast<CUevent>(event));
  }
  void record(void** event, const c10::Stream& s, const c10::DeviceIndex,
              const c10::EventFlag) const override {
    enter(s.device_index());
    if (*event == nullptr) {
      CUevent e = nullptr;
      ok(drv().eventCreate(&e, kEventDisableTiming), "cuEventCreate");
      *event = e;
    }
    ok(drv().eventRecord(static_cast<CUevent>(*event), handle(s)), "cuEventRecord");
  }
  void block(void* event, const c10::Stream& s) const override {
    if (!event) return;
    enter(s.device_index());
    ok(drv().streamWaitEvent(handle(s), static_cast<CUevent>(event), 0), "cuStreamWaitEvent");
  }
  bool queryEvent(void* event) const override {
    if (!event) return true;
    const CUresult r = drv().eventQuery(static_cast<CUevent>(event));
    TORCH_CHECK(r == kSuccess || r == kNotReady, "loom_emulated_gpu: cuEventQuery: ", r);
    return r == kSuccess;
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(drv().count);
  }
  bool queryStream(const c10::Stream& s) const override {
    return drv().streamQuery(handle(s)) == kSuccess;
  }
  void synchronizeStream(const c10::Stream& s) const override {
    ok(drv().streamSync(handle(s)), "cuStreamSynchronize");
  }
  void synchronizeEvent(void* event) const override {
    if (event) ok(drv().eventSync(static_cast<CUevent>(event)), "cuEventSynchronize");
  }
};

EmulatedGuard* gGuard = nullptr;

void install(const std::string& path) {
  std::lock_guard<std::mutex> lk(gMu);
  if (gGuard) return;
  Driver& d = drv();
  d.lib = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  TORCH_CHECK(d.lib != nullptr, "loom_emulated_gpu: cannot load ", path, ": ", dlerror());
  sym(d.init, "cuInit");
  sym(d.deviceCount, "cuDeviceGetCount");
  sym(d.deviceGet, "cuDeviceGet");
  sym(d.retain, "cuDevicePrimaryCtxRetain");
  sym(d.setCurrent, "cuCtxSetCurrent");
  sym(d.streamCreate, "cuStreamCreate");
  sym(d.streamSync, "cuStreamSynchronize");
  sym(d.streamQuery, "cuStreamQuery");
  sym(d.eventCreate, "cuEventCreate");
  sym(d.eventDestroy, "cuEventDestroy_v2");
  sym(d.eventRecord, "cuEventRecord");
  sym(d.eventQuery, "cuEventQuery");
  sym(d.eventSync, "cuEventSynchronize");
  sym(d.streamWaitEvent, "cuStreamWaitEvent");
  sym(d.memAlloc, "cuMemAlloc_v2");
  sym(d.memFree, "cuMemFree_v2");
  sym(d.memcpyAsync, "cuMemcpyAsync");
  sym(d.hostAlloc, "cuMemHostAlloc");
  sym(d.streamWaitValue64, "cuStreamWaitValue64_v2");
  sym(d.beginCapture, "cuStreamBeginCapture_v2");
  sym(d.endCapture, "cuStreamEndCapture");
  sym(d.instantiate, "cuGraphInstantiateWithFlags");
  sym(d.graphLaunch, "cuGraphLaunch");
  sym(d.graphDestroy, "cuGraphDestroy");
  sym(d.execDestroy, "cuGraphExecDestroy");
  ok(d.init(0), "cuInit");
  ok(d.deviceCount(&d.count), "cuDeviceGetCount");
  TORCH_CHECK(d.count > 0 && d.count <= 8, "loom_emulated_gpu: ", d.count, " devices");
  for (int i = 0; i < d.count; ++i) {
    CUdevice dev = 0;
    ok(d.deviceGet(&dev, i), "cuDeviceGet");
    ok(d.retain(&d.ctx[i], dev), "cuDevicePrimaryCtxRetain");
    enter(static_cast<c10::DeviceIndex>(i));
    ok(d.streamCreate(&gDefault[i], 0), "cuStreamCreate");
  }
  gGuard = new EmulatedGuard();  // kept for the process's life, as PyTorch's own guards are
  c10::impl::device_guard_impl_registry[static_cast<size_t>(c10::kCUDA)].store(gGuard);
}

CUstream current(c10::DeviceIndex d) {
  return handle(gGuard->getStream(c10::Device(c10::kCUDA, d)));
}

// A CUDA tensor on device d holding a copy of the CPU tensor src (written on d's current stream).
at::Tensor toDevice(const at::Tensor& src, int64_t d) {
  TORCH_CHECK(gGuard, "loom_emulated_gpu: install() first");
  const auto dev = static_cast<c10::DeviceIndex>(d);
  enter(dev);
  const at::Tensor host = src.contiguous();
  const size_t bytes = host.nbytes();
  CUdeviceptr p = 0;
  ok(drv().memAlloc(&p, bytes == 0 ? 1 : bytes), "cuMemAlloc");
  at::Tensor t = at::for_blob(reinterpret_cast<void*>(p), host.sizes())
                     .options(host.options().device(c10::Device(c10::kCUDA, dev)))
                     .target_device(c10::Device(c10::kCUDA, dev))
                     .deleter([](void* q) { drv().memFree(reinterpret_cast<CUdeviceptr>(q)); })
                     .make_tensor();
  if (bytes > 0)  // pageable source: read when the call is made
    ok(drv().memcpyAsync(p, reinterpret_cast<CUdeviceptr>(host.data_ptr()), bytes, current(dev)),
       "cuMemcpyAsync");
  return t;
}

// Writes the CPU tensor src into the CUDA tensor dst, on dst's device's current stream.
void writeTensor(const at::Tensor& dst, const at::Tensor& src) {
  const at::Tensor host = src.contiguous();
  TORCH_CHECK(dst.is_cuda() && host.nbytes() == dst.nbytes(), "loom_emulated_gpu: write sizes");
  enter(dst.device().index());
  ok(drv().memcpyAsync(reinterpret_cast<CUdeviceptr>(dst.data_ptr()),
                       reinterpret_cast<CUdeviceptr>(host.data_ptr()), host.nbytes(),
                       current(dst.device().index())),
     "cuMemcpyAsync");
}

// A CPU copy of a CUDA tensor, read on its device's current stream (the call returns when the
// stream has reached the copy: a pageable destination).
at::Tensor toCpu(const at::Tensor& t) {
  TORCH_CHECK(t.is_cuda(), "loom_emulated_gpu: to_cpu of a ", t.device(), " tensor");
  at::Tensor host = at::empty(t.sizes(), t.options().device(c10::kCPU));
  enter(t.device().index());
  if (t.nbytes() > 0)
    ok(drv().memcpyAsync(reinterpret_cast<CUdeviceptr>(host.data_ptr()),
                         reinterpret_cast<CUdeviceptr>(t.data_ptr()), t.nbytes(),
                         current(t.device().index())),
       "cuMemcpyAsync");
  return host;
}

// A gate on device d's current stream: the stream's later work waits until open() is called.
struct Gate {
  uint64_t* word = nullptr;
  void open() { __atomic_store_n(word, 1, __ATOMIC_RELEASE); }
};

Gate gate(int64_t d) {
  const auto dev = static_cast<c10::DeviceIndex>(d);
  enter(dev);
  void* p = nullptr;
  ok(drv().hostAlloc(&p, 8, 0), "cuMemHostAlloc");
  Gate g;
  g.word = static_cast<uint64_t*>(p);
  *g.word = 0;
  ok(drv().streamWaitValue64(current(dev), reinterpret_cast<CUdeviceptr>(p), 1, 0),
     "cuStreamWaitValue64");
  return g;
}

// Makes a new stream of device d current on this thread (None: the default stream again).
void useNewStream(int64_t d, bool fresh) {
  const auto dev = static_cast<c10::DeviceIndex>(d);
  if (fresh)
    gGuard->exchangeStream(gGuard->getNewStream(c10::Device(c10::kCUDA, dev), 0));
  else
    tCurrent.erase(dev);
}

void synchronize(int64_t d) {
  const auto dev = static_cast<c10::DeviceIndex>(d);
  enter(dev);
  ok(drv().streamSync(current(dev)), "cuStreamSynchronize");
}

// CUDA graphs as torch.cuda.graph makes them, on the emulated driver: capture on device d's
// current stream (mode: CU_STREAM_CAPTURE_MODE_*; GLOBAL, torch.cuda.graph's default), then the
// executable graph (its handle as an integer), launched on the current stream.
void beginCapture(int64_t d, int64_t mode) {
  enter(static_cast<c10::DeviceIndex>(d));
  ok(drv().beginCapture(current(static_cast<c10::DeviceIndex>(d)), static_cast<int>(mode)),
     "cuStreamBeginCapture");
}
int64_t endCapture(int64_t d) {
  enter(static_cast<c10::DeviceIndex>(d));
  CUgraph g = nullptr;
  ok(drv().endCapture(current(static_cast<c10::DeviceIndex>(d)), &g), "cuStreamEndCapture");
  CUgraphExec e = nullptr;
  const CUresult r = drv().instantiate(&e, g, 0);
  drv().graphDestroy(g);  // the executable keeps what it needs
  ok(r, "cuGraphInstantiateWithFlags");
  return static_cast<int64_t>(reinterpret_cast<intptr_t>(e));
}
void launchGraph(int64_t exec, int64_t d) {
  enter(static_cast<c10::DeviceIndex>(d));
  ok(drv().graphLaunch(reinterpret_cast<CUgraphExec>(static_cast<intptr_t>(exec)),
                       current(static_cast<c10::DeviceIndex>(d))),
     "cuGraphLaunch");
}
void destroyGraph(int64_t exec) {
  ok(drv().execDestroy(reinterpret_cast<CUgraphExec>(static_cast<intptr_t>(exec))),
     "cuGraphExecDestroy");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "PyTorch's CUDA device over Loom's emulated GPU (tests only)";
  m.def("install", &install, "Replaces PyTorch's CUDA device guard with the emulated GPU's");
  m.def("to_device", &toDevice, pybind11::arg("src"), pybind11::arg("device") = 0);
  m.def("write", &writeTensor);
  m.def("to_cpu", &toCpu);
  pybind11::class_<Gate>(m, "Gate").def("open", &Gate::open);
  m.def("gate", &gate, pybind11::arg("device") = 0);
  m.def(
      "use_new_stream", [](int64_t d) { useNewStream(d, true); }, pybind11::arg("device") = 0);
  m.def(
      "use_default_stream", [](int64_t d) { useNewStream(d, false); }, pybind11::arg("device") = 0);
  m.def("synchronize", &synchronize, pybind11::arg("device") = 0);
  m.def("begin_capture", &beginCapture, pybind11::arg("device") = 0, pybind11::arg("mode") = 0);
  m.def("end_capture", &endCapture, pybind11::arg("device") = 0);
  m.def("launch_graph", &launchGraph, pybind11::arg("exec"), pybind11::arg("device") = 0);
  m.def("destroy_graph", &destroyGraph);
}
