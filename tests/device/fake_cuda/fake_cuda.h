// libloom-fakecuda.so: an emulated CUDA device for Loom's tests. TEST ONLY: nothing outside tests/
// may load it. It exports, with the driver's C ABI (src/device/cuda_driver.h, = cuda.h), every
// driver entry point Loom's loader resolves, so Loom runs on it unmodified when LOOM_CUDA_LIB names
// it. It links no CUDA library. Tests reach the controls below with dlsym on the same library
// (dlopen of its path returns the handle the loader already holds).
//
// Environment, read once by cuInit:
//   LOOMTEST_FAKECUDA_DEVICES  number of devices (default 1; 0: cuInit fails with
//                              CUDA_ERROR_NO_DEVICE)
//   LOOMTEST_FAKECUDA_MEMORY   device memory per device, bytes with K/M/G suffixes (default 16G);
//                              more: CUDA_ERROR_OUT_OF_MEMORY
//   LOOMTEST_FAKECUDA_FAULT    "illegal_address:N" or "lost_device:N": the N-th kernel launch of
//   the
//                              process (from 1) faults when its stream runs it (see Faults)
//   LOOMTEST_FAKECUDA_MEMOPS   0: no stream memory operations (attributes 92/93/122/123 are 0,
//                              cuStreamWaitValue64/WriteValue64 give CUDA_ERROR_NOT_SUPPORTED)
//   LOOMTEST_FAKECUDA_VMM      0: no virtual memory management (attributes 102/103 are 0, cuMem*
//                              VMM calls give CUDA_ERROR_NOT_SUPPORTED)
//   LOOMTEST_FAKECUDA_DMABUF   0: no dma-buf (attribute 124 is 0, cuMemGetHandleForAddressRange
//                              gives CUDA_ERROR_NOT_SUPPORTED)
//
// What is emulated (each tested in tests/device/fake_cuda_test.cc):
// - Devices: sm_90 (compute capability 9.0, 132 SMs, unified addressing, VMM with POSIX fd
//   handles, 64-bit stream memops, dma-buf), named "Loom emulated GPU", PCI bus id
//   "0000:1<d>:00.0" (device d, hex). Unknown attributes below 148 read 0; others are
//   CUDA_ERROR_INVALID_VALUE. Driver version 12080.
// - Contexts: one primary context per device, retained and released with a count; the last
//   release destroys it as the driver does (its streams, events, modules, device and host memory,
//   IPC mappings and sticky error go; VMM objects are not per context and stay), and the next
//   retain makes a fresh one with the same handle. The current context is per thread. Calls that
//   need one fail with CUDA_ERROR_INVALID_CONTEXT without it (also when it was destroyed): every
//   allocation, creation and enqueue, cuCtxGetDevice, IPC; not destroy, free-host, unregister,
//   synchronize and query calls (the handle names the context), pointer queries, VMM and dma-buf.
//   Enqueuing on a stream of another context than the current one is CUDA_ERROR_INVALID_HANDLE.
// - Device memory cannot be read by host code: device addresses lie in a PROT_NONE arena of this
//   process (a host dereference dies with SIGSEGV). Each allocation is a memfd the device reaches
//   through a second, read-write mapping (the shadow), found by address; bounds are the exact
//   bytes allocated. Allocations are 2 MiB aligned; freed addresses are reused as late as possible.
//   Each allocation holds one fd (mind RLIMIT_NOFILE in tests with thousands of buffers).
// - Host memory: cuMemHostAlloc and cuMemHostRegister memory is host memory whose device pointer is
//   its own address (unified addressing). cuPointerGetAttribute answers for device, host-allocated
//   and registered memory, and is CUDA_ERROR_INVALID_VALUE for any other pointer;
//   cuPointerGetAttributes gives zeros there (memory type 0), as the driver does.
// - Managed memory (cuMemAllocManaged, freed by cuMemFree): host memory the host may read, that
//   pointer queries call managed device memory (MEMORY_TYPE device, IS_MANAGED 1) of the current
//   context's device. Streams do not migrate it; Loom refuses it.
// - Streams run asynchronously, each an ordered queue with its own worker thread: copies (any
//   direction; pageable host memory is read when the call is made and written before the call
//   returns, as the driver may do), memset, kernels, event records and waits, 64-bit wait/write
//   value, host functions. Calls validate their arguments as the driver does (a device range
//   outside its allocation: CUDA_ERROR_INVALID_VALUE); what goes wrong when the stream runs (memory
//   freed in between, a kernel's pointer) is a fault. A host function that calls the driver gets
//   CUDA_ERROR_NOT_PERMITTED.
// - Kernels: cuModuleLoadData accepts any image; cuModuleGetFunction knows Loom's reduction
//   kernels (src/device/kernels), whose host build runs on the stream's worker with the device
//   pointers of its ReduceArgs translated to the shadows, and the wait kernel "loomWaitFlag"
//   (WaitFlagArgs: waits, interruptibly, until *flag >= value); other names are
//   CUDA_ERROR_NOT_FOUND. Lazy loading as the driver does it by default: cuFuncLoad or
//   cuFuncGetAttribute loads a function, else its first launch does.
// - Waits for an idle device: a lazy load and cuMemFreeHost wait until no stream of the process is
//   blocked in a device-side wait (stream memory wait, event wait, the wait kernel). Where only
//   the caller could end that wait a real driver hangs for good: after 5 s the emulator aborts
//   the process with a line on stderr saying so (with LOOMTEST_FAKECUDA_LOAD_WAIT_MS=N set, after
//   N ms the call fails with CUDA_ERROR_NOT_PERMITTED instead).
//   (cuMemFree does not wait here, unlike the driver's: a test frees memory under pending work.)
// - The mapping lock: cuMemAlloc, cuMemHostAlloc, cuIpcGetMemHandle, cuIpcOpenMemHandle,
//   cuIpcCloseMemHandle and cuMemGetHandleForAddressRange wait while another thread is in a
//   blocking copy to pageable memory that waits for its stream (an H200 hung so in
//   cuMemHostAlloc: the copy holds the lock the allocation takes; the IPC calls and the dma-buf
//   export are treated alike, to be safe). Past 5 s, the same abort (or
//   CUDA_ERROR_NOT_PERMITTED with LOOMTEST_FAKECUDA_LOAD_WAIT_MS).
// - Faults: an illegal address (a kernel pointer that is not device or host-mapped memory of this
//   process, a range past an allocation's end, memory freed before the stream reached the work)
//   makes the context's error CUDA_ERROR_ILLEGAL_ADDRESS, sticky: the context's streams drop their
//   work, waits are released, and every call in the context returns it until the context is
//   destroyed (last release) and retained again. A lost device (injected) gives
//   CUDA_ERROR_DEVICE_UNAVAILABLE to every call in its contexts, to retains and to cuMemCreate on
//   it, for the rest of the process (device queries still answer).
// - VMM: cuMemCreate (POSIX fd handles; 2 MiB granularity), export (a dup of the memfd),
//   import in another process, reserve, map, set access (no access until cuMemSetAccess), unmap,
//   address free, release. Legacy IPC: the 64-byte handle carries the owner's pid, the memfd's fd
//   number and inode and the allocation's size; another process opens /proc/<pid>/fd/<fd> and
//   checks the inode (a freed allocation: CUDA_ERROR_INVALID_HANDLE). A handle of an interior
//   pointer names the whole allocation and opens at its base, as with the driver (add the offset
//   from cuMemGetAddressRange). Opening twice in a context counts; each open needs a close.
//   cuIpcOpenMemHandle in the owning process is CUDA_ERROR_INVALID_CONTEXT ("invalid device
//   context"), as the real driver gives.
// - dma-buf: cuMemGetHandleForAddressRange returns a dup of the backing memfd. As with a real
//   dma-buf, offset 0 of the fd is the start of the range; since a memfd cannot begin mid-file, the
//   range must start where the backing starts (the allocation's base, or a VMM mapping of offset
//   0 of its handle): other starts are CUDA_ERROR_NOT_SUPPORTED. Export the allocation from its
//   base (cuMemGetAddressRange) and register with offset = pointer - base, as NCCL does.
//
// Deviations from the driver (documented in the report of each):
// - The NULL stream is one more ordered queue per context: the legacy default stream's implicit
//   synchronization with other blocking streams is not emulated. CU_STREAM_LEGACY and
//   CU_STREAM_PER_THREAD name it too.
// - cuStreamDestroy returns at once as the driver does, and the stream's queued work still runs,
//   except that a wait (value or event) not satisfied when the destroyed stream reaches it is
//   abandoned with everything after it (counted: "abandoned_ops"), so that no thread waits forever.
// - cuMemFree does not synchronize; work in flight on the memory finishes on it, later work faults.
// - Stream capture (cuStreamBeginCapture_v2 ... cuStreamEndCapture) records the stream's work in
//   order into a graph, without running it (counted: "captured_ops"); synchronizing or querying
//   the capturing stream is CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture.
//   A stream that waits on an event recorded in a capture joins it (a fork; its work goes to
//   the same graph), and the capture ends only when each fork's last work is among what the
//   stream that began it depends on, directly or through other forks (an event stands for what
//   its stream depended on when it was recorded; else CUDA_ERROR_STREAM_CAPTURE_UNJOINED). A
//   stream destroyed while it captures is not taken out of its thread's count of captures under
//   way. A launch runs the graph's operations one
//   after another in an order that keeps their dependencies (a stream's order, and the events
//   waited on) and runs each fork's as early as they allow: work a capture left without a
//   dependency runs before what it was captured after, as it could on a device.
//   cuGraphInstantiateWithFlags (flags 0) copies the work; cuGraphLaunch runs it on the launch
//   stream after the executable's previous launch. User objects (cuUserObjectCreate,
//   cuGraphRetainUserObject) are owned by graphs and their executables; the last reference runs
//   the destructor, where the driver cannot be called, on the thread that dropped it (the driver
//   uses a thread of its own). Capture modes: while a capture in GLOBAL mode is under way, a
//   thread in GLOBAL mode gets CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED from cuMemAlloc, cuMemFree,
//   cuMemHostAlloc, cuMemFreeHost and the synchronizations and queries of streams and events (as
//   does the capturing thread itself in THREAD_LOCAL mode); RELAXED
//   (cuThreadExchangeStreamCaptureMode) lifts it. loomtest_fakecuda_set_capturing makes a stream
//   report ACTIVE without a graph: its work is dropped.
// - Kernel launch parameters through `extra` are CUDA_ERROR_NOT_SUPPORTED. Grid and block sizes
//   are checked against the device's limits but do not change how the host build runs.
// - Not usable in a child made by fork() without exec (neither is CUDA).
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

// Makes a kernel launch fault: the launch after `afterLaunches` more launches of this process (0:
// the next one). kind: "illegal_address" (that context's error becomes CUDA_ERROR_ILLEGAL_ADDRESS),
// "lost_device" (the launch's device is lost: CUDA_ERROR_DEVICE_UNAVAILABLE), "none" (cancels).
// One shot. Returns 0, or -1 for an unknown kind.
int loomtest_fakecuda_inject(const char* kind, int afterLaunches);

// Counters of this process: live objects "allocations" (cuMemAlloc), "device_bytes" (cuMemAlloc
// and cuMemCreate bytes held), "host_allocations", "host_registrations", "streams", "events",
// "modules", "workers" (stream threads still running, destroyed streams' included),
// "ipc_mappings", "vmm_handles", "vmm_mappings", "vmm_reservations", "context_refs",
// "pending_ops"; and totals since cuInit: "kernel_launches", "kernels_run", "copies", "memsets",
// "memop_waits", "memop_writes", "host_funcs", "event_records", "dmabuf_exports", "faults",
// "dropped_ops", "abandoned_ops", "captured_ops", "function_loads", "lazy_loads" (loaded by a
// first launch); live "graphs", "graph_execs", "user_objects"; and the total "graph_launches".
// Returns -1 for an unknown name.
long long loomtest_fakecuda_count(const char* what);

// Makes cuStreamIsCapturing report CU_STREAM_CAPTURE_STATUS_ACTIVE for `stream` (capturing != 0)
// or NONE; the NULL stream is the current context's. Returns 0, or -1 for an unknown stream.
int loomtest_fakecuda_set_capturing(void* stream, int capturing);

typedef int (*loomtest_fakecuda_inject_fn)(const char*, int);
typedef long long (*loomtest_fakecuda_count_fn)(const char*);
typedef int (*loomtest_fakecuda_set_capturing_fn)(void*, int);

#ifdef __cplusplus
}
#endif
