// The process-wide state: cuInit's configuration from the environment, devices, primary contexts
// and the current context, injected faults, and the driver's error names and texts.
#include "tests/device/fake_cuda/state.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>

#include "tests/device/fake_cuda/memory.h"

namespace fakecuda {

using namespace loom::cuda;  // NOLINT(build/namespaces): the driver's constants

const char* const kCounterNames[kNumCounters] = {
    "allocations",   "device_bytes",  "host_allocations", "host_registrations",
    "streams",       "events",        "modules",          "workers",
    "ipc_mappings",  "vmm_handles",   "vmm_mappings",     "vmm_reservations",
    "context_refs",  "pending_ops",   "kernel_launches",  "kernels_run",
    "copies",        "memsets",       "memop_waits",      "memop_writes",
    "host_funcs",    "event_records", "dmabuf_exports",   "faults",
    "dropped_ops",   "abandoned_ops", "captured_ops",     "function_loads",
    "lazy_loads",    "graphs",        "graph_execs",      "user_objects",
    "graph_launches"};

namespace {

// Initial-exec: the library is dlopen'd, and its thread-locals live in the static TLS block as the
// real driver's do, not in blocks __tls_get_addr allocates. GCC 12's LeakSanitizer guesses the size
// of such a block from the bytes before it when it starts 16 bytes into a page (one block in 256),
// reads past it and crashes its exit check ("Tracer caught signal 11").
__attribute__((tls_model("initial-exec"))) thread_local Context* tCurrent = nullptr;
__attribute__((tls_model("initial-exec"))) thread_local int tInHostFunc = 0;
__attribute__((tls_model("initial-exec"))) thread_local int tCaptureMode = kCaptureModeGlobal;
__attribute__((tls_model("initial-exec"))) thread_local int tOwnCaptures = 0;  // not RELAXED

bool parseSize(const char* s, uint64_t* out) {
  char* end = nullptr;
  unsigned long long v = std::strtoull(s, &end, 10);  // NOLINT(runtime/int)
  if (end == s) return false;
  switch (*end) {
    case 'K':
    case 'k':
      v <<= 10;
      ++end;
      break;
    case 'M':
    case 'm':
      v <<= 20;
      ++end;
      break;
    case 'G':
    case 'g':
      v <<= 30;
      ++end;
      break;
    default:
      break;
  }
  if (*end != '\0') return false;
  *out = v;
  return true;
}

bool envFlag(const char* name, bool def) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return def;
  return std::strcmp(v, "0") != 0;
}

void warn(const char* what, const char* value) {
  std::fprintf(stderr, "loomtest-fakecuda: ignoring %s=%s\n", what, value);
}

// LOOMTEST_FAKECUDA_FAULT: "illegal_address:N" or "lost_device:N" (N from 1).
void parseFault(State& s) {
  const char* v = std::getenv("LOOMTEST_FAKECUDA_FAULT");
  if (v == nullptr || *v == '\0') return;
  const char* colon = std::strchr(v, ':');
  long long n = colon ? std::atoll(colon + 1) : 0;
  std::string kind(v, colon ? size_t(colon - v) : std::strlen(v));
  if (n < 1 || (kind != "illegal_address" && kind != "lost_device")) return warn("FAULT", v);
  s.faultKind = kind == "lost_device" ? FaultKind::kLostDevice : FaultKind::kIllegalAddress;
  s.faultAt = n;
}

}  // namespace

bool Device::charge(uint64_t bytes) {
  uint64_t used = bytesUsed.fetch_add(bytes);
  if (used + bytes <= capacity) return true;
  bytesUsed.fetch_sub(bytes);
  return false;
}

State& state() {
  static State* s = new State();  // never destroyed
  return *s;
}

CUresult initialize() {
  State& s = state();
  std::call_once(s.once, [&s] {
    Config& c = s.cfg;
    if (const char* v = std::getenv("LOOMTEST_FAKECUDA_DEVICES"); v && *v) {
      char* end = nullptr;
      long n = std::strtol(v, &end, 10);
      if (*end == '\0' && n >= 0 && n <= 16)
        c.devices = int(n);
      else
        warn("DEVICES", v);
    }
    if (const char* v = std::getenv("LOOMTEST_FAKECUDA_MEMORY"); v && *v) {
      if (!parseSize(v, &c.memoryPerDevice)) warn("MEMORY", v);
    }
    c.memops = envFlag("LOOMTEST_FAKECUDA_MEMOPS", true);
    c.vmm = envFlag("LOOMTEST_FAKECUDA_VMM", true);
    c.dmabuf = envFlag("LOOMTEST_FAKECUDA_DMABUF", true);
    c.p2p = envFlag("LOOMTEST_FAKECUDA_P2P", true);
    parseFault(s);
    if (c.devices == 0) {
      s.initResult = kErrorNoDevice;
      return;
    }
    if (!space().init()) {
      s.initResult = kErrorOutOfMemory;
      return;
    }
    for (int i = 0; i < c.devices; ++i) {
      auto d = std::make_unique<Device>();
      auto ctx = std::make_unique<Context>();
      d->ordinal = i;
      d->capacity = c.memoryPerDevice;
      d->primary = ctx.get();
      ctx->dev = d.get();
      s.devices.push_back(std::move(d));
      s.contexts.push_back(std::move(ctx));
    }
    s.initialized.store(true, std::memory_order_release);
  });
  return s.initResult;
}

FaultKind nextLaunchFault() {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.faultMu);
  ++s.launches;
  if (s.faultKind == FaultKind::kNone || s.launches != s.faultAt) return FaultKind::kNone;
  FaultKind k = s.faultKind;
  s.faultKind = FaultKind::kNone;
  return k;
}

CUresult entryCheck() {
  if (!state().initialized.load(std::memory_order_acquire)) return kErrorNotInitialized;
  if (tInHostFunc != 0) return kErrorNotPermitted;
  return kSuccess;
}

int exchangeCaptureMode(int mode) {
  const int old = tCaptureMode;
  tCaptureMode = mode;
  return old;
}

void captureStarted(int mode, int delta) {
  if (mode != kCaptureModeRelaxed) tOwnCaptures += delta;
  if (mode == kCaptureModeGlobal) state().globalCaptures.fetch_add(delta);
}

CUresult captureForbids() {
  if (tCaptureMode == kCaptureModeRelaxed) return kSuccess;
  if (tOwnCaptures > 0 || (tCaptureMode == kCaptureModeGlobal && state().globalCaptures.load() > 0))
    return kErrorStreamCaptureUnsupported;
  return kSuccess;
}

HostFuncScope::HostFuncScope() { ++tInHostFunc; }
HostFuncScope::~HostFuncScope() { --tInHostFunc; }

Device* deviceOf(CUdevice ordinal) {
  State& s = state();
  if (ordinal < 0 || ordinal >= int(s.devices.size())) return nullptr;
  return s.devices[size_t(ordinal)].get();
}

Context* contextOf(CUcontext handle) {
  for (auto& c : state().contexts)
    if (c->handle() == handle) return c.get();
  return nullptr;
}

Context* currentContext() { return tCurrent; }
void setCurrentContext(Context* c) { tCurrent = c; }

CUresult requireContext(Context** out) {
  Context* c = tCurrent;
  if (c == nullptr || !c->active.load(std::memory_order_acquire)) return kErrorInvalidContext;
  FAKECUDA_TRY(c->error());
  *out = c;
  return kSuccess;
}

CUresult retainPrimary(Device* d, Context** out) {
  if (d->lost.load()) return kErrorDeviceUnavailable;
  Context* c = d->primary;
  std::lock_guard<std::mutex> lk(c->mu);
  if (c->refs++ == 0) {
    c->gen.fetch_add(1);
    c->sticky.store(0);
    c->peers.store(0);
    c->active.store(true, std::memory_order_release);
  }
  count(kContextRefs);
  *out = c;
  return kSuccess;
}

CUresult releasePrimary(Device* d) {
  Context* c = d->primary;
  std::lock_guard<std::mutex> lk(c->mu);
  if (c->refs == 0) return kErrorInvalidContext;
  count(kContextRefs, -1);
  if (--c->refs > 0) return kSuccess;
  // The last release destroys the context and what it owns.
  const uint64_t gen = c->gen.load();
  c->active.store(false, std::memory_order_release);
  dropContextStreams(c, gen);
  dropContextIpc(c, gen);
  dropContextMemory(c, gen);
  return kSuccess;
}

namespace {

struct ErrorInfo {
  CUresult code;
  const char* name;
  const char* text;
};

// The driver's own names and texts for every code this library returns (and a few neighbours).
constexpr ErrorInfo kErrors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {46, "CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA-capable device(s) is/are busy or unavailable"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {205, "CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed"},
    {208, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
    {211, "CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {401, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {709, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
    {908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

const ErrorInfo* findError(CUresult rc) {
  for (const ErrorInfo& e : kErrors)
    if (e.code == rc) return &e;
  return nullptr;
}

}  // namespace

const char* errorName(CUresult rc) {
  const ErrorInfo* e = findError(rc);
  return e ? e->name : nullptr;
}

const char* errorText(CUresult rc) {
  const ErrorInfo* e = findError(rc);
  return e ? e->text : nullptr;
}

namespace {

// Waits while busy() holds; past the deadline, the hang's clear form (see waitForDeviceWaits).
CUresult waitWhile(const std::function<bool()>& busy, const std::function<void(long)>& say) {
  if (!busy()) return kSuccess;
  long waitMs = 5000;
  const char* v = std::getenv("LOOMTEST_FAKECUDA_LOAD_WAIT_MS");
  const bool asked = v && *v;  // a test of this very behaviour: fail the call, not the process
  if (asked) waitMs = std::strtol(v, nullptr, 10);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(waitMs);
  while (busy()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      say(waitMs);
      if (!asked) std::abort();  // the clear form of the hang a real GPU gives
      return kErrorNotPermitted;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return kSuccess;
}

}  // namespace

CUresult waitForIdleContext(Context* c, const char* what) {
  return waitWhile([c] { return c->pending.load(std::memory_order_acquire) > 0; },
                   [c, what](long ms) {
                     std::fprintf(stderr,
                                  "fakecuda: %s waits until the device's streams are idle, and "
                                  "%d operation(s) have not completed in %ld ms: a real driver "
                                  "hangs here (free device memory once no queued work can wait "
                                  "for this thread)\n",
                                  what, c->pending.load(), ms);
                   });
}

CUresult waitForDeviceWaits(const char* what, const char* advice) {
  auto waiting = [] {
    int n = 0;
    for (const auto& c : state().contexts) n += c->waiting.load(std::memory_order_acquire);
    return n;
  };
  return waitWhile([&] { return waiting() > 0; },
                   [&](long ms) {
                     std::fprintf(stderr,
                                  "fakecuda: %s waits until the device is idle, and %d stream(s) "
                                  "have waited in a device-side wait for %ld ms: a real driver "
                                  "hangs here (%s)\n",
                                  what, waiting(), ms, advice);
                   });
}

CUresult waitForMappingLock(const char* what) {
  return waitWhile(
      [] { return state().pageableCopies.load(std::memory_order_acquire) > 0; },
      [what](long ms) {
        std::fprintf(stderr,
                     "fakecuda: %s takes the driver's mapping lock, which %d blocking copy(ies) to "
                     "pageable memory have held for %ld ms while waiting for their stream: a real "
                     "driver hangs here (allocate and map memory on a thread that no stream waits "
                     "for)\n",
                     what, state().pageableCopies.load(), ms);
      });
}

}  // namespace fakecuda
