/*
 * Loom: collective communication for GPU and CPU clusters.
 *
 * The public C API. Shaped like NCCL's (unique id, CommInitRank, a stream argument) so that NCCL
 * users feel at home, with its own prefix. Every function but the two that return strings returns
 * a loomResult_t; on failure loomGetLastError() returns a message naming the problem (and the
 * peer, where one is involved). Each function's comment says how it blocks and points to these
 * rules, which hold for all of them:
 *
 * Blocking. With a NULL stream, calls on host memory run on the calling thread (nothing progresses
 * between calls) and, outside a group, return when this rank's part is complete: its send buffer
 * was read, its receive buffer holds the result, and no peer touches either any more (peers may
 * still be finishing their part). Every wait has the communicator's deadline
 * (loomConfig_t.timeoutMs, else LOOM_TIMEOUT: then loomTimeout) and ends early when a peer fails
 * or on loomCommAbort.
 *
 * CUDA. Where the CUDA driver is present (loaded at run time; LOOM_CUDA_LIB), buffers may be CUDA
 * device memory (cudaMalloc, cuMemCreate mappings; not managed memory), both buffers of a call on
 * one device, and one device per communicator. With a NULL stream such a call comes after the
 * work already on the default (legacy) stream, and is done when it returns. With a stream (a
 * cudaStream_t of that device's primary context) it is checked, enqueued and returns at once, as
 * with NCCL: it starts when the stream's work before it is done, and the stream's work after it
 * waits for it; its failure is then the communicator's (loomCommGetAsyncError). A failed, aborted
 * or destroyed communicator still lets every waiting stream go. Every rank of a call passes device
 * memory, or every rank host memory (as NCCL and PyTorch require); a call that mixes them fails on
 * every rank. One thread of the communicator runs its device calls: in one pass over the peers'
 * device buffers where every rank shares the host and the GPU (CUDA IPC between processes), else
 * staged through pinned host memory. The communicator sets that up (the thread, streams, the
 * device's measured speeds) at its first device call, or at init where a device is named
 * (loomConfig_t.cudaDev, loomCommInitAll's devlist; loomCommSplit keeps the parent's), as NCCL
 * binds a communicator to its device; a device this process does not see is loomInvalidArgument.
 * Name it for ranks that are threads of one process (their pinned staging is then reserved at init
 * too): the CUDA driver's allocations wait while any thread is blocked in a copy to pageable
 * memory, so one rank's device call could wait for another rank's thread reading a result that
 * waits for that very call.
 *
 * CUDA graphs. A call (or a group) on a stream being captured (cudaStreamBeginCapture, any mode)
 * runs nothing then: it is kept for the graph, and runs each time a launch of the graph reaches
 * it, on the buffers named at capture (which must stay allocated while the graph may run), taking
 * its place in the communicator's order there, as a call enqueued at that moment would (calls
 * still waiting for that stream come after it). The kept call lives as long as the graph and its
 * executable graphs. A group under capture has its calls on streams of that one capture (others
 * fork into it by waiting on an event recorded in it); the graph joins them at the group as an
 * eager group's streams are joined. One executable graph of a capture runs at a time (two
 * launched at once fail the communicator: their calls would have no order between ranks); a graph
 * launched after its communicator was destroyed skips its calls and goes on. Loom makes the driver
 * calls that a capture in progress forbids (allocations) in RELAXED mode.
 *
 * Groups. Between loomGroupStart and loomGroupEnd a call is checked (argument errors come back at
 * once), queued, and returns at once; the work happens in the outermost loomGroupEnd.
 *
 * Buffers. The caller owns every buffer. One passed to a call must stay allocated, a send buffer
 * unmodified and a receive buffer untouched, until the call returns, or, for a call made inside a
 * group, until the outermost loomGroupEnd returns; on a stream, until the stream's work up to the
 * call is complete. Structs and strings passed in (loomConfig_t and its commName, a spec) are read
 * during the call only.
 *
 * Handles. A loomComm_t is the caller's from the call that returns it until loomCommDestroy or
 * loomCommAbort. After loomCommDestroy it must not be used again, by any thread. After
 * loomCommAbort (from any thread, at any moment) the handle itself stays valid: a call that
 * another thread starts on it, during or after the abort, returns loomAborted (as does a group
 * holding its calls), loomCommGetAsyncError reports loomAborted, and loomCommDestroy or a second
 * loomCommAbort of it is a no-op; only the handle's few bytes are kept.
 *
 * Threads. Calls on one communicator must not overlap (as in NCCL): one thread at a time, and the
 * calls a thread has queued in an open group hold the communicator until its loomGroupEnd. The
 * exceptions: loomCommAbort, and loomCommGetAsyncError, may be called from another thread while a
 * call runs on it (see their comments). Different communicators may be driven from different
 * threads concurrently. Group state and loomGetLastError are per thread. See docs/threads.md.
 */
#ifndef LOOM_LOOM_H_
#define LOOM_LOOM_H_

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define LOOM_API __attribute__((visibility("default")))
#else
#define LOOM_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_MAJOR 0
#define LOOM_MINOR 1
#define LOOM_PATCH 0
#define LOOM_VERSION_CODE (LOOM_MAJOR * 10000 + LOOM_MINOR * 100 + LOOM_PATCH)

/* Result codes. Values 0-7 have the meaning of NCCL's ncclResult_t. */
typedef enum {
  loomSuccess = 0,
  loomUnhandledCudaError = 1,
  loomSystemError = 2,     /* a system call failed, or a peer's connection was lost */
  loomInternalError = 3,   /* a bug in Loom */
  loomInvalidArgument = 4, /* a bad argument to this call (null pointer, unknown datatype, ...) */
  loomInvalidUsage = 5,    /* a call that does not fit the communicator's state or other ranks */
  loomRemoteError = 6,     /* a peer failed or sent something that does not match this call */
  loomInProgress = 7,      /* a nonblocking communicator is still initialising */
  loomTimeout = 8,         /* a wait passed its deadline (LOOM_TIMEOUT) */
  loomAborted = 9,         /* the communicator was aborted */
  loomNumResults = 10
} loomResult_t;

/* Datatypes: numbered as NCCL numbers them. */
typedef enum {
  loomInt8 = 0,
  loomChar = 0,
  loomUint8 = 1,
  loomInt32 = 2,
  loomInt = 2,
  loomUint32 = 3,
  loomInt64 = 4,
  loomUint64 = 5,
  loomFloat16 = 6,
  loomHalf = 6,
  loomFloat32 = 7,
  loomFloat = 7,
  loomFloat64 = 8,
  loomDouble = 8,
  loomBfloat16 = 9,
  loomNumTypes = 10
} loomDataType_t;

/* Reduction operations. loomAvg divides the sum by the number of ranks (integers truncate). */
typedef enum {
  loomSum = 0,
  loomProd = 1,
  loomMax = 2,
  loomMin = 3,
  loomAvg = 4,
  loomNumOps = 5
} loomRedOp_t;

/* Opaque communicator. */
typedef struct loomComm* loomComm_t;

/* A cudaStream_t (CUstream), or NULL: done on return (see 'CUDA' above). */
typedef void* loomStream_t;

#define LOOM_UNIQUE_ID_BYTES 128
/* Made by loomGetUniqueId on one process and handed to every rank out of band. */
typedef struct {
  char internal[LOOM_UNIQUE_ID_BYTES];
} loomUniqueId;

/* Communicator configuration. Initialise with LOOM_CONFIG_INITIALIZER so that fields added later
 * keep their defaults: `size` tells Loom which fields the caller knows about. */
#define LOOM_CONFIG_MAGIC 0x4c4f4f4du /* "LOOM" */
typedef struct {
  size_t size;          /* sizeof(loomConfig_t) as the caller compiled it */
  unsigned int magic;   /* LOOM_CONFIG_MAGIC */
  unsigned int version; /* LOOM_VERSION_CODE as the caller compiled it */
  int timeoutMs;        /* deadline of every wait; -1: LOOM_TIMEOUT */
  int hostId;           /* reserved; 0 */
  const char* commName; /* shown in logs; may be NULL */
  int cudaDev;          /* -1: the device of the first device call; >= 0: this CUDA device, its
                           device resources set up during init (see 'CUDA' above) */
} loomConfig_t;

#define LOOM_CONFIG_INITIALIZER \
  { sizeof(loomConfig_t), LOOM_CONFIG_MAGIC, LOOM_VERSION_CODE, -1, 0, NULL, -1 }

#define LOOM_SPLIT_NOCOLOR (-1)

/* LOOM_VERSION_CODE of the library. Returns at once; any thread. */
LOOM_API loomResult_t loomGetVersion(int* version);

/* Returns at once with an id naming a rendezvous listener it starts on a thread of this process.
 * The listener serves the one communicator made from the id and ends once every rank has joined,
 * or LOOM_TIMEOUT after this call (as set now, 0: never; not loomConfig_t.timeoutMs), used or
 * not. With LOOM_COMM_ID=host:port set, nothing starts here: the id names that address and rank
 * 0's loomCommInitRank starts the listener in its own process. The id is a value: copyable bytes
 * (address and secret) to hand to every rank out of band. */
LOOM_API loomResult_t loomGetUniqueId(loomUniqueId* uniqueId);

/* Collective over all nranks: blocks until every rank has joined and shared memory inside each
 * host is set up, or a wait passes the deadline (config's timeoutMs, else LOOM_TIMEOUT; the
 * listener's own LOOM_TIMEOUT also bounds the rendezvous). Groups do not apply: it blocks inside
 * one too. *comm is the caller's until loomCommDestroy/loomCommAbort; NULL on failure. */
LOOM_API loomResult_t loomCommInitRank(loomComm_t* comm, int nranks, loomUniqueId commId, int rank);
/* As loomCommInitRank; config may be NULL and is read during the call only. */
LOOM_API loomResult_t loomCommInitRankConfig(loomComm_t* comm, int nranks, loomUniqueId commId,
                                             int rank, loomConfig_t* config);
/* Ranks from a launcher's environment: LOOM_COMM_ID or torchrun's MASTER_ADDR/MASTER_PORT with
 * RANK/WORLD_SIZE, Open MPI's OMPI_COMM_WORLD_*, or Slurm's SLURM_PROCID/SLURM_NTASKS. Rank 0
 * starts the rendezvous listener in its process; then it blocks as loomCommInitRank does. */
LOOM_API loomResult_t loomCommInitFromEnv(loomComm_t* comm, loomConfig_t* config);
/* ndev ranks as threads of this process: starts a listener as loomGetUniqueId does and blocks
 * until every rank is ready. devlist (may be NULL) names rank i's CUDA device devlist[i], as
 * loomConfig_t.cudaDev does. comms holds ndev handles, each to destroy; on failure none is kept
 * (every comms[i] is NULL). */
LOOM_API loomResult_t loomCommInitAll(loomComm_t* comms, int ndev, const int* devlist);
/* Collective over comm: ranks with the same color form a new communicator ordered by key, then
 * by old rank. LOOM_SPLIT_NOCOLOR gives *newcomm = NULL. Blocks until every rank of comm has
 * called it and the new communicator is set up (comm's deadline, then config's);
 * loomInvalidUsage inside a group. *newcomm is independent of comm: destroy each on its own. */
LOOM_API loomResult_t loomCommSplit(loomComm_t comm, int color, int key, loomComm_t* newcomm,
                                    loomConfig_t* config);
/* Returns at once: host calls complete before they return, so nothing is outstanding. As in
 * NCCL only loomCommDestroy should follow, but nothing is marked: comm stays usable. */
LOOM_API loomResult_t loomCommFinalize(loomComm_t comm);
/* Frees comm: drops the calls this thread queued on it in an open group, releases its
 * registrations, closes its connections and marks this rank closed in shared memory, so peers
 * still waiting on it fail ("destroyed its communicator"). It does not synchronize with other
 * ranks (it waits, a few seconds at most, only for a peer of this host already reading this
 * rank's memory, and ~200 ms for a goodbye to its bootstrap neighbours). NULL: no-op. */
LOOM_API loomResult_t loomCommDestroy(loomComm_t comm);
/* From any thread: raises comm's abort flag (calls blocked on it return loomAborted within
 * milliseconds, calls starting on it from now on return loomAborted at once), drops this thread's
 * queued calls on it, waits up to about 10 s for running calls to leave, then frees comm's
 * resources as loomCommDestroy does, without the goodbye. If a call is still running after 10 s,
 * it returns and leaves them allocated (leaked) rather than free them under the call. Either way
 * comm is dead; the handle stays valid (see 'Handles' above). */
LOOM_API loomResult_t loomCommAbort(loomComm_t comm);
/* loomSuccess while healthy; loomAborted once aborted; else the error that broke the
 * communicator (a call enqueued on a stream reports its failure here), and then
 * loomGetLastError() says what happened. Returns at once; may run on another thread while a call
 * runs on comm (it reads the failure state under a lock), and during or after loomCommAbort, but
 * not once loomCommDestroy has begun. */
LOOM_API loomResult_t loomCommGetAsyncError(loomComm_t comm, loomResult_t* asyncError);
/* The number of ranks of comm / this rank in it. Both return at once. */
LOOM_API loomResult_t loomCommCount(const loomComm_t comm, int* count);
LOOM_API loomResult_t loomCommUserRank(const loomComm_t comm, int* rank);

/* Operations between GroupStart and GroupEnd (on one or several communicators) are issued as one
 * and complete together at GroupEnd. Groups nest and are per thread. GroupStart returns at once;
 * so does a nested GroupEnd. The outermost GroupEnd runs the queued calls and blocks until all
 * are complete (see 'Blocking' above), returning the first error; their buffers are then free. */
LOOM_API loomResult_t loomGroupStart(void);
LOOM_API loomResult_t loomGroupEnd(void);

/* Collectives. In-place as NCCL defines it: AllReduce, Broadcast, Reduce when sendbuff == recvbuff;
 * AllGather when sendbuff == recvbuff + rank * sendcount; ReduceScatter when
 * recvbuff == sendbuff + rank * recvcount; AllToAll when sendbuff == recvbuff. A buffer a rank
 * does not use (a non-root's Broadcast sendbuff or Reduce recvbuff) is ignored. Each blocks, or
 * queues in a group, as 'Blocking' and 'Groups' above say; buffers as 'Buffers' above says. */
LOOM_API loomResult_t loomAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                    loomDataType_t datatype, loomRedOp_t op, loomComm_t comm,
                                    loomStream_t stream);
LOOM_API loomResult_t loomBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                    loomDataType_t datatype, int root, loomComm_t comm,
                                    loomStream_t stream);
LOOM_API loomResult_t loomReduce(const void* sendbuff, void* recvbuff, size_t count,
                                 loomDataType_t datatype, loomRedOp_t op, int root, loomComm_t comm,
                                 loomStream_t stream);
LOOM_API loomResult_t loomAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                    loomDataType_t datatype, loomComm_t comm, loomStream_t stream);
LOOM_API loomResult_t loomReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                        loomDataType_t datatype, loomRedOp_t op, loomComm_t comm,
                                        loomStream_t stream);
/* count elements go to each peer: sendbuff and recvbuff hold nranks * count elements. */
LOOM_API loomResult_t loomAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                                   loomDataType_t datatype, loomComm_t comm, loomStream_t stream);
/* Point to point: sends to a peer match that peer's receives in posting order; counts must match.
 * Blocking, groups and buffers as for collectives. Outside a group a call may wait for the peer's
 * matching one: put the sends and receives of an exchange in one group. */
LOOM_API loomResult_t loomSend(const void* sendbuff, size_t count, loomDataType_t datatype,
                               int peer, loomComm_t comm, loomStream_t stream);
LOOM_API loomResult_t loomRecv(void* recvbuff, size_t count, loomDataType_t datatype, int peer,
                               loomComm_t comm, loomStream_t stream);

/* Loom extension: what a collective would run on comm, without running it (loom-perf --plan uses
 * it). Collective-wide: every rank gets the same answer. */
typedef enum {
  loomCollAllReduce = 0,
  loomCollBroadcast = 1,
  loomCollReduce = 2,
  loomCollAllGather = 3,
  loomCollReduceScatter = 4,
  loomCollAllToAll = 5
} loomCollective_t;

#define LOOM_PLAN_MAX_CANDIDATES 16
typedef struct {
  char name[32];      /* a registered algorithm */
  double predictedUs; /* the cost model's time; < 0: not priced */
  int allowed;        /* by LOOM_ALGO or loomCommSetAlgo */
} loomPlanCandidate_t;

typedef struct {
  char path[32];      /* for plain host buffers: "low-latency", "one-pass" (over the peers'
                         buffers, without messages; where a rank's buffers cannot be reached,
                         the call falls back to the schedule) or "schedule". loomMemAlloc buffers
                         may take the one pass where "schedule" is reported */
  char algorithm[32]; /* "direct" on the one pass; else the schedule's algorithm (on
                         "low-latency": the one that would run without it) */
  char source[16];    /* "model", "tuning" (LOOM_TUNING_FILE), "filter" (LOOM_ALGO or
                         loomCommSetAlgo left only it), "rule" (LOOM_PLANNER=0, no model, 1 rank) */
  double predictedUs; /* the model's time for that algorithm; < 0: not priced */
  int nCandidates;
  loomPlanCandidate_t candidates[LOOM_PLAN_MAX_CANDIDATES];
} loomPlanInfo_t;

/* count as the collective's own call takes it (AllGather: sendcount; ReduceScatter: recvcount);
 * root must be a rank even for collectives without one. Local: returns at once, sends nothing. */
LOOM_API loomResult_t loomCommPlanInfo(loomComm_t comm, loomCollective_t coll, size_t count,
                                       loomDataType_t datatype, int root, int inPlace,
                                       loomPlanInfo_t* info);

/* Loom extension: as loomCommPlanInfo, for a call whose buffers are CUDA device memory. path:
 * "device-gdr" (the schedule on the device buffers, the network reading and writing them:
 * GPUDirect RDMA), "device-one-pass" (ranks of one host on one GPU, or on GPUs that reach each
 * other peer to peer, read their peers' device buffers),
 * "device-pipelined" (staged through pinned host memory in LOOM_DEVICE_STAGE_CHUNK chunks, the
 * copies and the host schedule overlapping) or "device-staged" (staged whole); algorithm: "direct"
 * on the one pass, else the host schedule's; predictedUs: the path's price with this device's
 * copy and kernel speeds (measured on first use, a few milliseconds). candidates: "gdr-schedule",
 * "one-pass",
 * "staged-whole", "staged-pipelined" (priced where they can run; allowed: 0 where not), then the
 * host schedule's candidates for the whole call. The device is the one comm runs its device calls
 * on, else the calling thread's current CUDA context's. Priced with this rank's speeds: ranks may
 * differ in predictedUs, not in path. Errors: as loomCommPlanInfo; no CUDA driver, or no device
 * (loomInvalidUsage: make one current, cudaSetDevice). */
LOOM_API loomResult_t loomCommPlanInfoDevice(loomComm_t comm, loomCollective_t coll, size_t count,
                                             loomDataType_t datatype, int root, int inPlace,
                                             loomPlanInfo_t* info);

/* Loom extension: the algorithms comm's collectives may use, in LOOM_ALGO's grammar
 * ("allreduce:ring,tree;broadcast:^direct"), in place of LOOM_ALGO for this communicator only; NULL
 * or "" goes back to LOOM_ALGO. Takes effect from the next call. Every rank of comm must set the
 * same spec before the same call, as every rank must see the same LOOM_ALGO: ranks that disagree
 * run different schedules, which fail as mismatched calls (after LOOM_TIMEOUT at worst). Local:
 * returns at once; spec is parsed here and need not outlive the call. Errors:
 * NULL comm, a spec LOOM_ALGO would reject (the message names the valid collectives and
 * algorithms; loomInvalidArgument), a call inside a group (loomInvalidUsage); the previous
 * setting then stays. */
LOOM_API loomResult_t loomCommSetAlgo(loomComm_t comm, const char* spec);

/* Host memory that the other processes of this host can map (as ncclMemAlloc is to NCCL): a
 * shared-memory message from a buffer allocated here is read by the receiving process straight
 * from this buffer, with one copy and no system call, instead of through the transport's slots.
 * Any buffer works with every call; these are faster inside a host. The memory is page aligned and
 * zero-filled and the caller's until loomMemFree, whatever happens to communicators (none need
 * exist). Both return at once and may be called from any thread; loomMemFree(NULL) does nothing. */
LOOM_API loomResult_t loomMemAlloc(void** ptr, size_t size);
LOOM_API loomResult_t loomMemFree(void* ptr);

/* Buffer registration (as ncclCommRegister / ncclCommDeregister): tells comm that
 * [buff, buff + size) (host memory) will be used by many calls. A network transport that must
 * register memory with its NIC (InfiniBand verbs, NCCL net plugins) then registers it once per
 * connection, on first use, instead of registering and deregistering every message; calls on
 * buffers inside a registered range use it whatever their offset. Registration is optional:
 * every buffer works without it. Ranges may overlap. Both return at once (the NIC registration
 * happens in a later call). *handle is opaque; it belongs to comm and lives until
 * loomCommDeregister, loomCommDestroy or loomCommAbort, which release it (the NIC registrations
 * made for it included); the memory must stay allocated until then. Deregistering while a call
 * that uses the buffer is in progress (from another thread: that breaks 'Threads' above) is the
 * caller's bug, as in NCCL.
 * Errors: NULL comm, buff or handle, size 0, a handle not from this comm or deregistered already
 * (loomInvalidArgument); a communicator that failed cannot register (deregistering still works). */
LOOM_API loomResult_t loomCommRegister(loomComm_t comm, void* buff, size_t size, void** handle);
LOOM_API loomResult_t loomCommDeregister(loomComm_t comm, void* handle);

/* A static string, never to free. Returns at once; any thread. */
LOOM_API const char* loomGetErrorString(loomResult_t result);
/* The message of the last failure of a Loom call on this thread ("" if none); successes leave it.
 * Owned by Loom; valid until this thread's next failing Loom call. */
LOOM_API const char* loomGetLastError(void);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_LOOM_H_ */
