/* The NCCL tuner-plugin ABI, versions 2 to 5, declared by Loom from the published facts (see
 * ../shared/reference/nccl-tuner-abi.md and docs/nccl_plugin.md). Loom exports it from
 * libnccl-net-loom.so (NCCL looks for a tuner inside the net plugin it loaded) and from
 * libnccl-tuner-loom.so (NCCL_TUNER_PLUGIN=loom): symbols ncclTunerPlugin_v2 .. ncclTunerPlugin_v5.
 *
 * Layout contract as for the net ABI (nccl_net_abi.h, whose result codes and logger it shares):
 * the static_asserts at the end pin sizes and offsets for LP64.
 *
 * Differences between versions:
 * - v2: init(nRanks, nNodes, logger, &ctx); getCollInfo returns the algorithm and protocol itself
 *   (given whether CollNet and NVLS are supported); destroy(ctx).
 * - v3: getCollInfo fills a cost table [algorithm][protocol] instead (NCCL's entries, -1 for the
 *   combinations it will not run; the lowest entry wins).
 * - v4: getCollInfo also says whether the user buffer can be registered (regBuff).
 * - v5: init(&ctx, commId, nRanks, nNodes, logger, nvlDomainInfo, constants): the NVLink domains
 *   and NCCL's tuning constants (in/out); destroy becomes finalize.
 */
#ifndef LOOM_TRANSPORTS_NCCLNET_NCCL_TUNER_ABI_H_
#define LOOM_TRANSPORTS_NCCLNET_NCCL_TUNER_ABI_H_

#include "transports/ncclnet/nccl_net_abi.h"

#ifdef __cplusplus
namespace loom {
namespace ncclabi {
#endif

/* The collectives NCCL tunes (NCCL's first values; later NCCL versions append more). */
typedef enum {
  ncclFuncBroadcast = 0,
  ncclFuncReduce = 1,
  ncclFuncAllGather = 2,
  ncclFuncReduceScatter = 3,
  ncclFuncAllReduce = 4,
  ncclFuncSendRecv = 5,
  ncclFuncSend = 6,
  ncclFuncRecv = 7
} ncclFunc_t;

enum {
  NCCL_TUNER_NUM_ALGORITHMS = 7, /* TREE RING COLLNET_DIRECT COLLNET_CHAIN NVLS NVLS_TREE PAT */
  NCCL_TUNER_NUM_PROTOCOLS = 3,  /* LL LL128 SIMPLE */
  NCCL_TUNER_NUM_HW_LINKS = 3,   /* NVLINK PCI NET */
  NCCL_TUNER_NUM_COMPCAPS = 4,   /* Volta Ampere Hopper Blackwell */
  NCCL_TUNER_NUM_SCALES = 3      /* 1 node, 2 nodes, more */
};
/* A cost-table entry NCCL will not run. */
#define NCCL_ALGO_PROTO_IGNORE -1.0

typedef struct {
  int nNvlDomains;          /* NVLink domains of the communicator */
  int minRanksPerNvlDomain; /* fewest ranks in one */
  int maxRanksPerNvlDomain; /* most ranks in one */
} ncclNvlDomainInfo_v5_t;

typedef struct {
  double baseLatencies[NCCL_TUNER_NUM_ALGORITHMS][NCCL_TUNER_NUM_PROTOCOLS];
  double hwLatencies[NCCL_TUNER_NUM_HW_LINKS][NCCL_TUNER_NUM_ALGORITHMS][NCCL_TUNER_NUM_PROTOCOLS];
  double llMaxBws[NCCL_TUNER_NUM_COMPCAPS][NCCL_TUNER_NUM_SCALES];
  double perChMaxRingLL128Bws[NCCL_TUNER_NUM_COMPCAPS][NCCL_TUNER_NUM_SCALES];
  double perChMaxTreeLL128Bws[NCCL_TUNER_NUM_COMPCAPS][NCCL_TUNER_NUM_SCALES];
  double perChMaxTreeBws[NCCL_TUNER_NUM_COMPCAPS][NCCL_TUNER_NUM_SCALES];
  double perChMaxNVLSTreeBws[NCCL_TUNER_NUM_COMPCAPS][NCCL_TUNER_NUM_SCALES];
} ncclTunerConstants_v5_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes,
                       ncclDebugLogger_t logFunction, ncclNvlDomainInfo_v5_t* nvlDomainInfo,
                       ncclTunerConstants_v5_t* constants);
  ncclResult_t (*getCollInfo)(void* ctx, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff,
                              int* nChannels);
  ncclResult_t (*finalize)(void* ctx);
} ncclTuner_v5_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** ctx);
  ncclResult_t (*getCollInfo)(void* ctx, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff,
                              int* nChannels);
  ncclResult_t (*destroy)(void* ctx);
} ncclTuner_v4_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** ctx);
  ncclResult_t (*getCollInfo)(void* ctx, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int* nChannels);
  ncclResult_t (*destroy)(void* ctx);
} ncclTuner_v3_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** ctx);
  ncclResult_t (*getCollInfo)(void* ctx, ncclFunc_t collType, size_t nBytes, int collNetSupport,
                              int nvlsSupport, int numPipeOps, int* algorithm, int* protocol,
                              int* nChannels);
  ncclResult_t (*destroy)(void* ctx);
} ncclTuner_v2_t;

#ifdef __cplusplus
static_assert(sizeof(ncclFunc_t) == 4, "NCCL enums are int-sized");
static_assert(sizeof(ncclNvlDomainInfo_v5_t) == 12, "ncclNvlDomainInfo_v5 layout");
static_assert(offsetof(ncclTunerConstants_v5_t, hwLatencies) == 21 * 8, "v5 constants layout");
static_assert(offsetof(ncclTunerConstants_v5_t, llMaxBws) == (21 + 63) * 8, "v5 constants layout");
static_assert(offsetof(ncclTunerConstants_v5_t, perChMaxNVLSTreeBws) == (21 + 63 + 48) * 8,
              "v5 constants layout");
static_assert(sizeof(ncclTunerConstants_v5_t) == (21 + 63 + 60) * 8, "v5 constants layout");
static_assert(sizeof(ncclTuner_v5_t) == 4 * sizeof(void*), "v5 table: name + 3 functions");
static_assert(sizeof(ncclTuner_v4_t) == 4 * sizeof(void*), "v4 table: name + 3 functions");
static_assert(sizeof(ncclTuner_v3_t) == 4 * sizeof(void*), "v3 table: name + 3 functions");
static_assert(sizeof(ncclTuner_v2_t) == 4 * sizeof(void*), "v2 table: name + 3 functions");
}  // namespace ncclabi
}  // namespace loom
#endif /* __cplusplus */

#endif /* LOOM_TRANSPORTS_NCCLNET_NCCL_TUNER_ABI_H_ */
