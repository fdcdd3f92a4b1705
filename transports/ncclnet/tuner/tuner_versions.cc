// The tuner symbols NCCL looks up: ncclTunerPlugin_v2 .. ncclTunerPlugin_v5, each a thin adaptor
// from that version's arguments to the one implementation (loom_tuner.h). Exported by
// libnccl-tuner-loom.so and by libnccl-net-loom.so (NCCL looks for a tuner in the net plugin it
// loaded); nothing else of the libraries is.
#include <strings.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "src/core/params.h"
#include "transports/ncclnet/nccl_tuner_abi.h"
#include "transports/ncclnet/tuner/loom_tuner.h"

namespace loom {
namespace tuner {
namespace {

namespace abi = ::loom::ncclabi;
using abi::ncclResult_t;

static_assert(sizeof(abi::ncclTunerConstants_v5_t) == sizeof(NcclConstants),
              "NCCL's v5 constants and the model's are the same arrays in the same order");

constexpr uint32_t kMagic = 0x4c54554e;  // "LTUN"

struct Context {
  uint32_t magic = kMagic;
  std::unique_ptr<Tuner> tuner;
  abi::ncclDebugLogger_t log = nullptr;
  bool info = false;  // NCCL_DEBUG asks for INFO: decisions are formatted and logged
};

bool ncclInfoEnabled() {
  const char* v = std::getenv("NCCL_DEBUG");
  return v != nullptr && (strcasecmp(v, "INFO") == 0 || strcasecmp(v, "TRACE") == 0);
}

void logTo(abi::ncclDebugLogger_t log, abi::ncclDebugLogLevel level, const std::string& msg) {
  if (log != nullptr)
    log(level, abi::NCCL_TUNING, __FILE__, __LINE__, "TUNER/Loom : %s", msg.c_str());
}

// Creates a context: the table (LOOM_TUNER_FILE; a bad one is one warning and NCCL's choices for
// everything), the model with NCCL's constants when it gave them.
ncclResult_t create(size_t nRanks, size_t nNodes, abi::ncclDebugLogger_t log,
                    const abi::ncclNvlDomainInfo_v5_t* nvl, abi::ncclTunerConstants_v5_t* constants,
                    void** ctx) {
  if (ctx == nullptr) {
    logTo(log, abi::NCCL_LOG_WARN, "init: null context pointer");
    return abi::ncclInvalidArgument;
  }
  try {
    auto c = std::make_unique<Context>();
    c->log = log;
    c->info = ncclInfoEnabled();
    std::vector<TableRow> table;
    bool inert = false;
    if (params::kTunerFile.isSet() && !params::kTunerFile.str().empty()) {
      Result<std::vector<TableRow>> t = loadTable(params::kTunerFile.str());
      if (t.isOk()) {
        table = std::move(t).value();
      } else {
        logTo(log, abi::NCCL_LOG_WARN,
              t.status().message() + "; the tuner leaves every choice to NCCL");
        inert = true;
      }
    }
    if (inert) {
      c->tuner = Tuner::create(0, 0, nullptr, {});
    } else {
      NcclConstants k = NcclConstants::defaults();
      if (constants != nullptr) std::memcpy(&k, constants, sizeof(k));
      c->tuner = Tuner::create(nRanks, nNodes, nullptr, std::move(table), &k);
    }
    if (c->info) {
      std::string msg = c->tuner->notes();
      if (nvl != nullptr)
        msg += " (NVLink domains " + std::to_string(nvl->nNvlDomains) + ", " +
               std::to_string(nvl->minRanksPerNvlDomain) + "-" +
               std::to_string(nvl->maxRanksPerNvlDomain) + " ranks each)";
      logTo(log, abi::NCCL_LOG_INFO, msg);
    }
    *ctx = c.release();
    return abi::ncclSuccess;
  } catch (const std::bad_alloc&) {
    logTo(log, abi::NCCL_LOG_WARN, "init: out of memory");
    return abi::ncclSystemError;
  } catch (...) {
    logTo(log, abi::NCCL_LOG_WARN, "init: unexpected failure");
    return abi::ncclInternalError;
  }
}

Context* contextOf(void* ctx) {
  auto* c = static_cast<Context*>(ctx);
  return c != nullptr && c->magic == kMagic ? c : nullptr;
}

// The decision for one call against NCCL's cost table (v3 and later): the chosen entry set to 0,
// every other entry as NCCL left it.
ncclResult_t decideTable(void* ctx, int collType, size_t nBytes, int numPipeOps,
                         float** collCostTable, int numAlgo, int numProto, int regBuff,
                         int* nChannels) {
  Context* c = contextOf(ctx);
  if (c == nullptr) return abi::ncclInvalidArgument;
  if (collCostTable == nullptr || numAlgo <= 0 || numProto <= 0) {
    logTo(c->log, abi::NCCL_LOG_WARN, "getCollInfo: no cost table");
    return abi::ncclInvalidArgument;
  }
  CollKind coll;
  if (!collOfNcclFunc(collType, &coll)) return abi::ncclSuccess;  // not ours to judge
  try {
    // NCCL passes a [numAlgo][numProto] array as float**.
    float* table = reinterpret_cast<float*>(collCostTable);
    auto offered = [&](NcclAlgo a, NcclProto p) {
      int ai = static_cast<int>(a), pi = static_cast<int>(p);
      if (ai >= numAlgo || pi >= numProto) return false;
      float v = table[ai * numProto + pi];
      return v != static_cast<float>(NCCL_ALGO_PROTO_IGNORE) && v >= 0;
    };
    Decision d = c->tuner->decide(coll, nBytes, numPipeOps, regBuff, offered);
    if (d.decided) {
      table[static_cast<int>(d.algo) * numProto + static_cast<int>(d.proto)] = 0.0f;
      if (d.channels > 0 && nChannels != nullptr) *nChannels = d.channels;
    }
    if (c->info)
      logTo(c->log, abi::NCCL_LOG_INFO,
            std::string(collName(coll)) + " " + std::to_string(nBytes) + " B x" +
                std::to_string(numPipeOps) + ": " + (d.decided ? "" : "left to NCCL: ") + d.why);
    return abi::ncclSuccess;
  } catch (...) {
    return abi::ncclInternalError;  // NCCL then tunes this call itself
  }
}

ncclResult_t destroy(void* ctx) {
  Context* c = contextOf(ctx);
  if (c == nullptr) return abi::ncclInvalidArgument;
  c->magic = 0;
  delete c;
  return abi::ncclSuccess;
}

// ---- v5 ----------------------------------------------------------------------------------------

ncclResult_t initV5(void** ctx, uint64_t /*commId*/, size_t nRanks, size_t nNodes,
                    abi::ncclDebugLogger_t log, abi::ncclNvlDomainInfo_v5_t* nvl,
                    abi::ncclTunerConstants_v5_t* constants) {
  return create(nRanks, nNodes, log, nvl, constants, ctx);
}

ncclResult_t getCollInfoV5(void* ctx, abi::ncclFunc_t collType, size_t nBytes, int numPipeOps,
                           float** table, int numAlgo, int numProto, int regBuff, int* nChannels) {
  return decideTable(ctx, collType, nBytes, numPipeOps, table, numAlgo, numProto, regBuff,
                     nChannels);
}

// ---- v4, v3 ------------------------------------------------------------------------------------

ncclResult_t initV4(size_t nRanks, size_t nNodes, abi::ncclDebugLogger_t log, void** ctx) {
  return create(nRanks, nNodes, log, nullptr, nullptr, ctx);
}

ncclResult_t getCollInfoV3(void* ctx, abi::ncclFunc_t collType, size_t nBytes, int numPipeOps,
                           float** table, int numAlgo, int numProto, int* nChannels) {
  return decideTable(ctx, collType, nBytes, numPipeOps, table, numAlgo, numProto, 0, nChannels);
}

// ---- v2: the plugin names the algorithm and protocol itself ------------------------------------

ncclResult_t getCollInfoV2(void* ctx, abi::ncclFunc_t collType, size_t nBytes, int collNetSupport,
                           int nvlsSupport, int numPipeOps, int* algorithm, int* protocol,
                           int* nChannels) {
  Context* c = contextOf(ctx);
  if (c == nullptr || algorithm == nullptr || protocol == nullptr) return abi::ncclInvalidArgument;
  CollKind coll;
  if (!collOfNcclFunc(collType, &coll)) return abi::ncclSuccess;
  try {
    auto offered = [&](NcclAlgo a, NcclProto) {
      if (a == NcclAlgo::kPat) return false;  // not in the v2 era's NCCL
      if ((a == NcclAlgo::kCollNetDirect || a == NcclAlgo::kCollNetChain) && !collNetSupport)
        return false;
      if ((a == NcclAlgo::kNvls || a == NcclAlgo::kNvlsTree) && !nvlsSupport) return false;
      return true;
    };
    Decision d = c->tuner->decide(coll, nBytes, numPipeOps, 0, offered);
    if (d.decided) {
      *algorithm = static_cast<int>(d.algo);
      *protocol = static_cast<int>(d.proto);
      if (d.channels > 0 && nChannels != nullptr) *nChannels = d.channels;
    }
    if (c->info)
      logTo(c->log, abi::NCCL_LOG_INFO,
            std::string(collName(coll)) + " " + std::to_string(nBytes) +
                " B: " + (d.decided ? "" : "left to NCCL: ") + d.why);
    return abi::ncclSuccess;
  } catch (...) {
    return abi::ncclInternalError;
  }
}

}  // namespace
}  // namespace tuner
}  // namespace loom

namespace abi = ::loom::ncclabi;
using loom::tuner::destroy;

extern "C" {
__attribute__((visibility("default"))) abi::ncclTuner_v5_t ncclTunerPlugin_v5 = {
    "Loom", loom::tuner::initV5, loom::tuner::getCollInfoV5, destroy};
__attribute__((visibility("default"))) abi::ncclTuner_v4_t ncclTunerPlugin_v4 = {
    "Loom", loom::tuner::initV4, loom::tuner::getCollInfoV5, destroy};
__attribute__((visibility("default"))) abi::ncclTuner_v3_t ncclTunerPlugin_v3 = {
    "Loom", loom::tuner::initV4, loom::tuner::getCollInfoV3, destroy};
__attribute__((visibility("default"))) abi::ncclTuner_v2_t ncclTunerPlugin_v2 = {
    "Loom", loom::tuner::initV4, loom::tuner::getCollInfoV2, destroy};
}
