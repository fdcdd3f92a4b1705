/*
 * Loom: collective communication for GPU and CPU clusters.
 *
 * The public C API. Shaped like NCCL's (unique id, CommInitRank, a stream argument) so that NCCL
 * users feel at home, with its own prefix. Every function returns a loomResult_t; on failure
 * loomGetLastError() returns a message naming the problem (and the peer, where one is involved).
 *
 * Buffers: host memory in this release. A NULL stream means the call has completed when it
 * returns. The stream argument is where CUDA device buffers and streams will plug in without a
 * change to this header.
 *
 * Thread safety: calls on one communicator must come from one thread at a time (as in NCCL).
 * Different communicators may be driven from different threads concurrently. loomCommAbort may be
 * called from any thread at any time and wakes every blocked call on that communicator.
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

/* A cudaStream_t when built with CUDA; NULL for synchronous host calls. */
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
} loomConfig_t;

#define LOOM_CONFIG_INITIALIZER \
  { sizeof(loomConfig_t), LOOM_CONFIG_MAGIC, LOOM_VERSION_CODE, -1, 0, NULL }

#define LOOM_SPLIT_NOCOLOR (-1)

LOOM_API loomResult_t loomGetVersion(int* version);

/* Opens the root rendezvous listener in this process and returns the id that names it. When
 * LOOM_COMM_ID=host:port is set, no listener is opened here: rank 0 opens it at that address. */
LOOM_API loomResult_t loomGetUniqueId(loomUniqueId* uniqueId);

/* Collective over all nranks: blocks until every rank has joined or the deadline passes. */
LOOM_API loomResult_t loomCommInitRank(loomComm_t* comm, int nranks, loomUniqueId commId, int rank);
LOOM_API loomResult_t loomCommInitRankConfig(loomComm_t* comm, int nranks, loomUniqueId commId,
                                             int rank, loomConfig_t* config);
/* Ranks from a launcher's environment: LOOM_COMM_ID or torchrun's MASTER_ADDR/MASTER_PORT with
 * RANK/WORLD_SIZE, Open MPI's OMPI_COMM_WORLD_*, or Slurm's SLURM_PROCID/SLURM_NTASKS. */
LOOM_API loomResult_t loomCommInitFromEnv(loomComm_t* comm, loomConfig_t* config);
/* ndev ranks as threads of this process (devlist is for CUDA builds; may be NULL). */
LOOM_API loomResult_t loomCommInitAll(loomComm_t* comms, int ndev, const int* devlist);
/* Collective over comm: ranks with the same color form a new communicator ordered by key, then
 * by old rank. LOOM_SPLIT_NOCOLOR gives *newcomm = NULL. */
LOOM_API loomResult_t loomCommSplit(loomComm_t comm, int color, int key, loomComm_t* newcomm,
                                    loomConfig_t* config);
/* Waits for outstanding operations; the communicator can then only be destroyed. */
LOOM_API loomResult_t loomCommFinalize(loomComm_t comm);
LOOM_API loomResult_t loomCommDestroy(loomComm_t comm);
/* Always returns, promptly: wakes every call blocked on comm, closes its connections, frees it. */
LOOM_API loomResult_t loomCommAbort(loomComm_t comm);
/* loomSuccess while healthy; the error that broke the communicator otherwise. */
LOOM_API loomResult_t loomCommGetAsyncError(loomComm_t comm, loomResult_t* asyncError);
LOOM_API loomResult_t loomCommCount(const loomComm_t comm, int* count);
LOOM_API loomResult_t loomCommUserRank(const loomComm_t comm, int* rank);

/* Operations between GroupStart and GroupEnd (on one or several communicators) are issued as one
 * and complete together at GroupEnd. Groups nest; the outermost GroupEnd runs them. */
LOOM_API loomResult_t loomGroupStart(void);
LOOM_API loomResult_t loomGroupEnd(void);

/* Collectives. In-place as NCCL defines it: AllReduce, Broadcast, Reduce when sendbuff == recvbuff;
 * AllGather when sendbuff == recvbuff + rank * sendcount; ReduceScatter when
 * recvbuff == sendbuff + rank * recvcount; AllToAll when sendbuff == recvbuff. */
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
 */
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
  int allowed;        /* by LOOM_ALGO */
} loomPlanCandidate_t;

typedef struct {
  char path[32];      /* "low-latency", "schedule", or "schedule/mapped": "direct" in one pass
                         over the peers' buffers when every rank's can be reached (decided per
                         call; else the planner's own choice runs) */
  char algorithm[32]; /* the schedule that runs (or would, when the path is not "schedule") */
  char source[16];    /* "model", "tuning", or "rule" (LOOM_PLANNER=0) */
  double predictedUs; /* the model's time for that algorithm; < 0: not priced */
  int nCandidates;
  loomPlanCandidate_t candidates[LOOM_PLAN_MAX_CANDIDATES];
} loomPlanInfo_t;

/* count as the collective's own call takes it (AllGather: sendcount; ReduceScatter: recvcount). */
LOOM_API loomResult_t loomCommPlanInfo(loomComm_t comm, loomCollective_t coll, size_t count,
                                       loomDataType_t datatype, int root, int inPlace,
                                       loomPlanInfo_t* info);

/* Loom extension: the algorithms comm's collectives may use, in LOOM_ALGO's grammar
 * ("allreduce:ring,tree;broadcast:^direct"), in place of LOOM_ALGO for this communicator only; NULL
 * or "" goes back to LOOM_ALGO. Takes effect from the next call. Every rank of comm must set the
 * same spec before the same call, as every rank must see the same LOOM_ALGO: ranks that disagree
 * run different schedules, which fail as mismatched calls (after LOOM_TIMEOUT at worst). Errors:
 * NULL comm, a spec LOOM_ALGO would reject (the message names the valid collectives and
 * algorithms; loomInvalidArgument), a call inside a group (loomInvalidUsage); the previous
 * setting then stays. */
LOOM_API loomResult_t loomCommSetAlgo(loomComm_t comm, const char* spec);

/* Host memory that the other processes of this host can map (as ncclMemAlloc is to NCCL): a
 * shared-memory message from a buffer allocated here is read by the receiving process straight
 * from this buffer, with one copy and no system call, instead of through the transport's slots.
 * Any buffer works with every call; these are faster inside a host. The memory is page aligned and
 * zero-filled; free it with loomMemFree (communicators need not exist). */
LOOM_API loomResult_t loomMemAlloc(void** ptr, size_t size);
LOOM_API loomResult_t loomMemFree(void* ptr);

/* Buffer registration (as ncclCommRegister / ncclCommDeregister): tells comm that
 * [buff, buff + size) (host memory) will be used by many calls. A network transport that must
 * register memory with its NIC (InfiniBand verbs, NCCL net plugins) then registers it once per
 * connection, on first use, instead of registering and deregistering every message; calls on
 * buffers inside a registered range use it whatever their offset. Registration is optional:
 * every buffer works without it. Ranges may overlap. *handle is opaque; it belongs to comm.
 * loomCommDeregister releases the registration (the NIC registrations made for it included); it
 * must come before the memory is freed. Deregistering while a call that uses the buffer is in
 * progress (for example from another thread, which breaks the one-thread rule) is the caller's
 * bug, as in NCCL. Registrations left at loomCommDestroy/loomCommAbort are released there.
 * Errors: NULL comm, buff or handle, size 0, a handle not from this comm or deregistered already
 * (loomInvalidArgument); a communicator that failed cannot register (deregistering still works). */
LOOM_API loomResult_t loomCommRegister(loomComm_t comm, void* buff, size_t size, void** handle);
LOOM_API loomResult_t loomCommDeregister(loomComm_t comm, void* handle);

LOOM_API const char* loomGetErrorString(loomResult_t result);
/* The message of the last failure of a Loom call on this thread ("" if none). */
LOOM_API const char* loomGetLastError(void);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_LOOM_H_ */
