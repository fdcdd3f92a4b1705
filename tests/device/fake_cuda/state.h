// The emulated device's process-wide state: configuration, devices, primary contexts, the
// current context of each thread, faults to inject, counters, and the checks every entry point
// makes. Internal to libloom-fakecuda.so (fake_cuda.h says what is emulated).
//
// Locking, outermost first: Context::mu -> Handles::mu (streams.h) -> AddressSpace::mu
// (memory.h) -> Stream::mu, Event::mu (leaves). No lock is held while a worker waits on a memop
// or an event, or while it copies or reduces.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "src/device/cuda_driver.h"

// Starts an entry point: the driver's initial checks.
#define FAKECUDA_ENTRY()                                                \
  do {                                                                  \
    const ::fakecuda::CUresult fakecuda_rc_ = ::fakecuda::entryCheck(); \
    if (fakecuda_rc_ != ::loom::cuda::kSuccess) return fakecuda_rc_;    \
  } while (0)

// Returns the CUresult of an expression unless it is success.
#define FAKECUDA_TRY(expr)                                           \
  do {                                                               \
    const ::fakecuda::CUresult fakecuda_rc_ = (expr);                \
    if (fakecuda_rc_ != ::loom::cuda::kSuccess) return fakecuda_rc_; \
  } while (0)

namespace fakecuda {

using loom::cuda::CUcontext;
using loom::cuda::CUdevice;
using loom::cuda::CUdeviceptr;
using loom::cuda::CUresult;
using loom::cuda::CUstream;

// Codes beyond cuda_driver.h's, with cuda.h's values.
constexpr CUresult kErrorInvalidDevice = 101;
constexpr CUresult kErrorMapFailed = 205;
constexpr CUresult kErrorIllegalState = 401;
constexpr CUresult kErrorHostMemoryAlreadyRegistered = 712;
constexpr CUresult kErrorHostMemoryNotRegistered = 713;
constexpr CUresult kErrorNotPermitted = 800;
constexpr CUresult kErrorCaptureInvalidated = 901;
constexpr CUresult kErrorCaptureMerge = 902;
constexpr CUresult kErrorCaptureUnmatched = 903;
constexpr CUresult kErrorCaptureUnjoined = 904;
constexpr CUresult kErrorCaptureWrongThread = 908;
constexpr CUresult kErrorUnknown = 999;
// Values beyond cuda_driver.h's (checked against cuda.h where it is installed: check_values.cc).
constexpr int kCaptureStatusInvalidated = 2;        // CU_STREAM_CAPTURE_STATUS_INVALIDATED
constexpr int kPointerAttrHostPointer = 4;          // CU_POINTER_ATTRIBUTE_HOST_POINTER
constexpr int kPointerAttrIsLegacyIpcCapable = 10;  // ..._IS_LEGACY_CUDA_IPC_CAPABLE
constexpr int kPointerAttrMapped = 13;              // CU_POINTER_ATTRIBUTE_MAPPED
constexpr int kPointerAttrMappingSize = 18;         // CU_POINTER_ATTRIBUTE_MAPPING_SIZE
constexpr int kPointerAttrMappingBase = 19;         // CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR
constexpr unsigned kHostAllocFlags = 0x7;  // CU_MEMHOSTALLOC_PORTABLE | DEVICEMAP | WRITECOMBINED
constexpr unsigned kHostRegisterFlags = 0xf;  // CU_MEMHOSTREGISTER_PORTABLE | ... | READ_ONLY
constexpr unsigned kEventFlags = 0x7;  // CU_EVENT_BLOCKING_SYNC | DISABLE_TIMING | INTERPROCESS
constexpr unsigned kEventInterprocess = 0x4;        // CU_EVENT_INTERPROCESS
constexpr unsigned kWaitValueFlush = 1u << 30;      // CU_STREAM_WAIT_VALUE_FLUSH
constexpr unsigned kMemAttachGlobal = 0x1;          // CU_MEM_ATTACH_GLOBAL
constexpr unsigned kMemAttachHost = 0x2;            // CU_MEM_ATTACH_HOST
constexpr unsigned kWriteValueNoMemoryBarrier = 1;  // CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER
constexpr int kMemHandleTypeFabric = 8;             // CU_MEM_HANDLE_TYPE_FABRIC

constexpr size_t kGranularity = size_t(2) << 20;  // VMM granularity and allocation alignment
constexpr int kNumAttributes = 148;               // CU_DEVICE_ATTRIBUTE_MAX in CUDA 13

inline size_t roundUp(size_t v, size_t to) { return (v + to - 1) / to * to; }

struct Config {
  int devices = 1;
  uint64_t memoryPerDevice = uint64_t(16) << 30;
  bool memops = true;
  bool vmm = true;
  bool dmabuf = true;
  bool p2p = true;  // LOOMTEST_FAKECUDA_P2P: distinct devices may reach each other's memory
};

struct Context;

struct Device {
  int ordinal = 0;
  std::atomic<bool> lost{false};
  std::atomic<uint64_t> bytesUsed{0};
  uint64_t capacity = 0;
  Context* primary = nullptr;

  // Charges `bytes` against the capacity; false (nothing charged) when they do not fit.
  bool charge(uint64_t bytes);
  void uncharge(uint64_t bytes) { bytesUsed.fetch_sub(bytes); }
};

class Stream;

// A device's primary context. Its handle (CUcontext) is its address, the same across
// generations: each retain after the last release starts a new generation, and objects of an
// older one are gone.
struct Context {
  Device* dev = nullptr;
  std::mutex mu;  // refs, nullStream, and destruction
  int refs = 0;
  std::shared_ptr<Stream> nullStream;
  std::atomic<uint64_t> gen{0};
  std::atomic<bool> active{false};
  std::atomic<CUresult> sticky{0};
  // Streams of this context now blocked in a device-side wait (a stream memory wait, an event
  // wait, the wait kernel): what loading a function waits for (cuLaunchKernel).
  std::atomic<int> waiting{0};
  // The devices whose memory this context's kernels may reach besides its own (bit d: device d):
  // enabled by cuCtxEnablePeerAccess, or by opening an IPC handle with lazy peer access; cleared
  // with each new generation. Without it a kernel reading another device's memory faults.
  std::atomic<uint32_t> peers{0};
  // Operations enqueued on this context's streams and not yet completed (what cuMemFree waits
  // for: the driver synchronizes the device before it frees).
  std::atomic<int> pending{0};

  CUcontext handle() { return reinterpret_cast<CUcontext>(this); }
  // The error every call in this context returns now (0: none).
  CUresult error() const {
    if (dev->lost.load(std::memory_order_acquire)) return loom::cuda::kErrorDeviceUnavailable;
    return sticky.load(std::memory_order_acquire);
  }
  // True while generation g of this context is alive and has not failed.
  bool healthy(uint64_t g) const {
    return active.load(std::memory_order_acquire) && gen.load(std::memory_order_acquire) == g &&
           error() == 0;
  }
  // Makes rc the sticky error (the first one stays).
  void fail(CUresult rc) {
    CUresult none = 0;
    sticky.compare_exchange_strong(none, rc);
  }
};

enum Counter : int {
  kAllocations,
  kDeviceBytes,
  kHostAllocations,
  kHostRegistrations,
  kStreams,
  kEvents,
  kModules,
  kWorkers,
  kIpcMappings,
  kVmmHandles,
  kVmmMappings,
  kVmmReservations,
  kContextRefs,
  kPendingOps,
  kKernelLaunches,
  kKernelsRun,
  kCopies,
  kMemsets,
  kMemopWaits,
  kMemopWrites,
  kHostFuncs,
  kEventRecords,
  kDmabufExports,
  kFaults,
  kDroppedOps,
  kAbandonedOps,
  kCapturedOps,
  kFunctionLoads,
  kLazyLoads,
  kGraphs,
  kGraphExecs,
  kUserObjects,
  kGraphLaunches,
  kNumCounters
};
extern const char* const kCounterNames[kNumCounters];

enum class FaultKind { kNone, kIllegalAddress, kLostDevice };

struct State {
  std::once_flag once;
  std::atomic<bool> initialized{false};
  CUresult initResult = 0;
  Config cfg;
  std::vector<std::unique_ptr<Device>> devices;
  std::vector<std::unique_ptr<Context>> contexts;

  std::mutex faultMu;
  FaultKind faultKind = FaultKind::kNone;
  long long faultAt = 0;   // the launch number (from 1) that faults
  long long launches = 0;  // under faultMu

  std::atomic<long long> counters[kNumCounters] = {};
  // Threads in a blocking copy to pageable memory waiting for their stream (holding the driver's
  // mapping lock: waitForMappingLock).
  std::atomic<int> pageableCopies{0};
  std::atomic<int> globalCaptures{0};  // captures in GLOBAL mode now under way
};

// The process's state, created on first use and never destroyed (worker threads may outlive
// static destruction).
State& state();

// What the real driver does where an operation waits until the device is idle (a function's lazy
// load, cuMemFreeHost): waits while any stream of the process is blocked in a device-side wait
// (a stream memory wait, an event wait, the wait kernel). A wait that only the caller's progress
// would end hangs the real driver; here, after 5 s the process aborts with a line on stderr naming
// `what` and `advice` (with LOOMTEST_FAKECUDA_LOAD_WAIT_MS set, after that many ms the operation
// fails with CUDA_ERROR_NOT_PERMITTED instead: for tests of this behaviour).
CUresult waitForDeviceWaits(const char* what, const char* advice);
// Waits until context c's streams have no work left, as the driver's cuMemFree does; after 5 s
// (LOOMTEST_FAKECUDA_LOAD_WAIT_MS) still waiting, aborts saying a real driver hangs there, or
// returns kErrorNotPermitted where that variable is set.
CUresult waitForIdleContext(Context* c, const char* what);
// What the real driver does where an operation allocates or maps memory (cuMemAlloc,
// cuMemHostAlloc; cuIpcGetMemHandle, cuIpcOpenMemHandle and cuIpcCloseMemHandle treated alike, to
// be safe): it takes a lock that a thread blocked in a copy to pageable memory holds while the copy
// waits for its stream (seen on an H200: the pinned allocation of a thread that the stream waited
// for hung). Waits while another thread is in
// such a copy; past 5 s (LOOMTEST_FAKECUDA_LOAD_WAIT_MS) the hang's clear form, as
// waitForDeviceWaits.
CUresult waitForMappingLock(const char* what);

inline void count(Counter c, long long delta = 1) {
  state().counters[c].fetch_add(delta, std::memory_order_relaxed);
}

// cuInit's work, once.
CUresult initialize();

// The fault the next kernel launch carries (and counts the launch).
FaultKind nextLaunchFault();

// The entry check of every driver call but cuInit, cuDriverGetVersion and the error strings:
// CUDA_ERROR_NOT_INITIALIZED before cuInit, CUDA_ERROR_NOT_PERMITTED inside a host function.
CUresult entryCheck();
// Stream capture modes (CU_STREAM_CAPTURE_MODE_*) and what they forbid: a thread in GLOBAL mode
// (the default) may not make a potentially unsafe call (allocating or freeing memory,
// synchronizing or querying a stream or an event) while any thread captures in GLOBAL mode or it
// captures itself in a mode other than RELAXED; in THREAD_LOCAL mode only its own such captures
// forbid them; in RELAXED mode nothing does. The driver answers such a call with
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED. (The modes' values: cuda_driver.h's kCaptureMode*.)
//
// This thread's mode, replaced by mode; returns the old one (cuThreadExchangeStreamCaptureMode).
int exchangeCaptureMode(int mode);
// A capture in `mode` begun (delta 1) or ended (-1) on this thread.
void captureStarted(int mode, int delta);
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED where this thread may not make an unsafe call now.
CUresult captureForbids();
// Marks the calling thread as running a host function (cuLaunchHostFunc) while alive.
struct HostFuncScope {
  HostFuncScope();
  ~HostFuncScope();
};

Device* deviceOf(CUdevice ordinal);    // null when out of range
Context* contextOf(CUcontext handle);  // null unless a primary context's handle
Context* currentContext();             // of this thread; may be destroyed
void setCurrentContext(Context* c);

// The current context, usable: CUDA_ERROR_INVALID_CONTEXT when there is none or it was destroyed,
// else its sticky error, else success with *out set.
CUresult requireContext(Context** out);

// Retain and release of a device's primary context; the last release destroys what the context
// owns (streams.cc, memory.cc, api_ipc.cc each drop their part).
CUresult retainPrimary(Device* d, Context** out);
CUresult releasePrimary(Device* d);
void dropContextStreams(Context* c, uint64_t gen);  // streams.cc
void dropContextMemory(Context* c, uint64_t gen);   // memory.cc
void dropContextIpc(Context* c, uint64_t gen);      // api_ipc.cc

// The name and text of a CUresult (cuGetErrorName/String); null when unknown.
const char* errorName(CUresult rc);
const char* errorText(CUresult rc);

// Removes the entry of `key` from `table` (a map), returning its value (empty when there is none).
template <class Map>
typename Map::mapped_type takeEntry(Map& table, const typename Map::key_type& key) {
  auto it = table.find(key);
  if (it == table.end()) return nullptr;
  typename Map::mapped_type v = std::move(it->second);
  table.erase(it);
  return v;
}

// Moves the values of `table` (a map) for which owned(value) holds to *out, erasing them: what a
// destroyed context owned is taken under the table's lock and released outside it.
template <class Map, class Pred, class Out>
void takeIf(Map& table, Pred owned, Out* out) {
  for (auto it = table.begin(); it != table.end();) {
    if (owned(it->second)) {
      out->push_back(std::move(it->second));
      it = table.erase(it);
    } else {
      ++it;
    }
  }
}

// Runs an entry point's body, turning exceptions into codes (a C entry point never throws).
template <class F>
CUresult guarded(F&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return loom::cuda::kErrorOutOfMemory;
  } catch (...) {
    return kErrorUnknown;
  }
}

// guarded() for an entry point that needs a current context: body(Context*) runs with it when
// requireContext() gives one, else its code is returned.
template <class F>
CUresult inContext(F&& body) noexcept {
  return guarded([&] {
    Context* c = nullptr;
    FAKECUDA_TRY(requireContext(&c));
    return body(c);
  });
}

}  // namespace fakecuda
