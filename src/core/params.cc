#include "src/core/params.h"

#include <fmt/format.h>
#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "src/core/log.h"

namespace loom {
namespace params {

constexpr int64_t kYearSeconds = 365LL * 24 * 3600;
constexpr int64_t kHugeBytes = 1LL << 50;

const Param kDebug{"LOOM_DEBUG", "WARN", "Log level: NONE, WARN, INFO or TRACE",
                   ParamChoices{"NONE|WARN|INFO|TRACE|0"}};
const Param kDebugSubsys{"LOOM_DEBUG_SUBSYS", "ALL",
                         "Subsystems logged at INFO/TRACE: comma list of INIT,NET,COLL,BOOTSTRAP,"
                         "SHM,PLAN,TOPO,ENV,P2P or ALL; a leading ^ excludes",
                         ParamChoices{"INIT|NET|COLL|BOOTSTRAP|SHM|PLAN|TOPO|ENV|P2P|ALL", true}};
const Param kDebugFile{"LOOM_DEBUG_FILE", ParamType::kString, "",
                       "Write the log to this file instead of stderr (%h host, %p pid)"};
const Param kTimeout{"LOOM_TIMEOUT",
                     ParamType::kInt,
                     "300",
                     "Deadline in seconds of every wait (rendezvous, connection, collective); "
                     "0 waits forever",
                     0,
                     kYearSeconds};
const Param kCommId{"LOOM_COMM_ID", ParamType::kString, "",
                    "host:port of the root rendezvous for launched jobs (as NCCL_COMM_ID); rank 0 "
                    "listens there"};
const Param kHostId{"LOOM_HOSTID", ParamType::kString, "",
                    "Overrides this process's host identity (ranks with equal ids share a host)"};
const Param kCommSecret{"LOOM_COMM_SECRET", ParamType::kString, "",
                        "Secret shared by the ranks of an environment-launched job; default is "
                        "derived from the job's address, size and job id"};
const Param kBootstrapPortOffset{"LOOM_BOOTSTRAP_PORT_OFFSET",
                                 ParamType::kInt,
                                 "1",
                                 "With torchrun's MASTER_ADDR/MASTER_PORT, Loom's root listens on "
                                 "MASTER_PORT plus this offset",
                                 -65535,
                                 65535};
const Param kSocketIfname{"LOOM_SOCKET_IFNAME", ParamType::kString, "",
                          "Interfaces for sockets, NCCL_SOCKET_IFNAME grammar: prefix list, ^ "
                          "excludes, = exact (default: any but lo and docker, else lo)"};
const Param kSocketFamily{"LOOM_SOCKET_FAMILY", "",
                          "AF_INET or AF_INET6 to restrict the socket address family",
                          ParamChoices{"AF_INET|AF_INET6|4|6"}};
const Param kSocketNsocks{"LOOM_SOCKET_NSOCKS",
                          ParamType::kInt,
                          "2",
                          "TCP sockets per connection; large messages are split across them",
                          1,
                          16};
const Param kSocketNthreads{"LOOM_SOCKET_NTHREADS",
                            ParamType::kInt,
                            "0",
                            "Helper threads per connection that move the data sockets' bytes "
                            "(0: the caller's progress loop moves them)",
                            0,
                            16};
const Param kSocketMinSplit{"LOOM_SOCKET_MIN_SPLIT",
                            ParamType::kSize,
                            "64K",
                            "Messages at least this large are split across the sockets of a "
                            "connection",
                            0,
                            kHugeBytes};
const Param kChunkSize{"LOOM_CHUNK_SIZE",
                       ParamType::kSize,
                       "512K",
                       "Bytes per pipelined piece of a schedule step",
                       1024,
                       1LL << 30};
const Param kAllReduceRdMax{"LOOM_ALLREDUCE_RD_MAX",
                            ParamType::kSize,
                            "256K",
                            "AllReduce messages up to this size use recursive doubling (fewest "
                            "steps), larger ones the ring (least traffic); 0: always the ring",
                            0,
                            kHugeBytes};
const Param kRingChannels{"LOOM_RING_CHANNELS",
                          ParamType::kInt,
                          "1",
                          "Channels of the ring algorithms (read at communicator init): the data "
                          "is split into this many parts, each moved by its own ring, odd ones "
                          "in the opposite direction; 1 to 64",
                          1,
                          64};
const Param kMaxInflight{"LOOM_MAX_INFLIGHT",
                         ParamType::kInt,
                         "32",
                         "Outstanding network requests per connection and direction",
                         1,
                         65536};
const Param kSpinUs{"LOOM_SPIN_US",
                    ParamType::kInt,
                    "100",
                    "Microseconds a rank polls without progress (yielding the core between "
                    "polls) before it sleeps in poll()",
                    0,
                    10000000};
const Param kShmDisable{"LOOM_SHM_DISABLE", ParamType::kBool, "0",
                        "1: ranks on one host talk over sockets instead of shared memory"};
const Param kShmSingleCopy{"LOOM_SHM_SINGLE_COPY",
                           ParamType::kInt,
                           "1",
                           "Large shared-memory messages read straight from the sender's buffer: "
                           "0 never (copy through the slots), 1 between threads of one process "
                           "(memcpy) and from loomMemAlloc buffers of other processes (mapped), 2 "
                           "also any buffer of other processes (process_vm_readv, where allowed)",
                           0,
                           2};
const Param kShmSlotSize{"LOOM_SHM_SLOT_SIZE",
                         ParamType::kSize,
                         "64K",
                         "Payload bytes of one slot of a shared-memory ring",
                         64,
                         64LL << 20};
const Param kShmSlots{"LOOM_SHM_SLOTS",
                      ParamType::kInt,
                      "8",
                      "Slots per shared-memory ring (one ring per ordered pair of local ranks)",
                      2,
                      1024};
const Param kShmRtsMin{"LOOM_SHM_SINGLE_COPY_MIN",
                       ParamType::kSize,
                       "32K",
                       "Shared-memory messages at least this large use single copy when it is "
                       "available",
                       1,
                       kHugeBytes};
const Param kShmLlMax{"LOOM_SHM_LL_MAX",
                      ParamType::kSize,
                      "64K",
                      "Collectives whose ranks all share a host use the low-latency exchange (one "
                      "flag-synchronised copy, no rendezvous) when each rank contributes at most "
                      "this many bytes; 0 disables it",
                      0,
                      64LL << 20};
const Param kShmDirectMax{"LOOM_SHM_DIRECT_MAX",
                          ParamType::kSize,
                          "1G",
                          "Collectives whose ranks all share a host use the direct algorithms "
                          "(each rank reduces its slice straight from its peers) up to this "
                          "size, the ring above it; 0: always the ring",
                          0,
                          kHugeBytes};
const Param kNtMin{"LOOM_NT_MIN",
                   ParamType::kSize,
                   "0",
                   "Calls whose buffers on a host (every local rank's input and output together) "
                   "exceed this many bytes write their results with non-temporal stores, around "
                   "the caches (no read of each destination line before it is written); 0: a "
                   "model of the caches decides (outputs no recent call wrote, or buffers above "
                   "a quarter of the last-level cache, stream)",
                   0,
                   kHugeBytes};
const Param kShmMapped{"LOOM_SHM_MAPPED", ParamType::kBool, "1",
                       "Collectives whose ranks all share a host and whose buffers every rank can "
                       "reach (threads of one process, loomMemAlloc memory, or plain memory with "
                       "LOOM_SHM_MAPPED_CMA) run in one pass where the planner chose the direct "
                       "algorithm or prices one pass cheaper: each rank reduces its slice from its "
                       "peers' buffers and writes the result into every peer's output; 0: through "
                       "the transport"};
const Param kShmThp{"LOOM_SHM_THP", ParamType::kBool, "1",
                    "Before the one pass reaches a rank's plain buffers from other processes "
                    "(process_vm_readv/writev), the rank collapses them into transparent huge "
                    "pages, once per buffer (madvise MADV_COLLAPSE; the kernel then pins one page "
                    "per 2 MiB instead of one per 4 KiB); 0: buffers stay as they are"};
const Param kShmResultTiles{
    "LOOM_SHM_RESULT_TILES",
    ParamType::kInt,
    "1",
    "In that one pass, an out-of-place AllReduce or Broadcast whose outputs every peer reaches "
    "only through process_vm_writev, and are cold, passes its results through tiles in the "
    "shared segment instead: each rank stores its slice's result into its own output and a shared "
    "tile, and each peer copies the tile into its output (no write into another process's cold "
    "memory). 1: where the host's ranks do not outnumber its cores (the ranks wait for each other "
    "tile by tile), and then by measurement: each rank times both ways on its calls and takes the "
    "faster (each way's best of its last 5 calls), trying the other again after 16 calls (the "
    "tiles) or 64 (process_vm_writev), since the tiles are fast only where the ranks' cores share "
    "a cache; 2: always, also where the ranks outnumber the cores; 0: process_vm_writev. The ranks "
    "agree: any rank's 0 (or 1 with too few cores, or measuring process_vm_writev faster) makes "
    "them all use process_vm_writev",
    0,
    2};
const Param kShmMappedCma{"LOOM_SHM_MAPPED_CMA", ParamType::kBool, "1",
                          "The one-pass collectives (LOOM_SHM_MAPPED) also reach plain buffers of "
                          "other processes on the host, through process_vm_readv/writev where "
                          "ptrace rules allow it (not with LOOM_SHM_SINGLE_COPY=0); 0: only mapped "
                          "(loomMemAlloc) buffers"};
const Param kPlanner{
    "LOOM_PLANNER", ParamType::kBool, "1",
    "Choose each collective's algorithm with the cost model (and LOOM_TUNING_FILE); "
    "0: the fixed size rules (direct on one host, rd for small AllReduce, else the "
    "first registered)"};
const Param kTuningFile{
    "LOOM_TUNING_FILE", ParamType::kString, "",
    "Measured algorithm choices (written by loom-perf --tune) that override the "
    "cost model where they cover a call; a file for another rank layout is "
    "ignored with a warning"};
const Param kTunerMachine{
    "LOOM_TUNER_MACHINE", ParamType::kString, "",
    "The NCCL tuner plugin's machine: a loom-sim built-in (dgx-h100, ...) or an NCCL topology "
    "file; unset: NCCL_TOPO_FILE, else the machine discovered where NCCL runs"};
const Param kTunerFile{"LOOM_TUNER_FILE", ParamType::kString, "",
                       "Measured choices for the NCCL tuner plugin (NCCL's example tuner CSV: "
                       "collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks"
                       "[,numPipeOps,regBuff]) that override its model where they match"};
const Param kModelNetMbps{"LOOM_MODEL_NET_MBPS",
                          ParamType::kInt,
                          "0",
                          "Network bandwidth per host (Mbit/s) the cost model assumes; 0: the "
                          "ports' speed from the topology (10 Gbit/s when unknown)",
                          0,
                          100000000};
const Param kModelNetLatUs{"LOOM_MODEL_NET_LAT_US",
                           ParamType::kInt,
                           "30",
                           "Per-message latency (us) of the network in the cost model",
                           0,
                           1000000};
const Param kModelShmLatUs{"LOOM_MODEL_SHM_LAT_US",
                           ParamType::kInt,
                           "2",
                           "Per-message latency (us) of shared memory in the cost model",
                           0,
                           1000000};
const Param kAlgo{"LOOM_ALGO", ParamType::kString, "",
                  "Algorithms allowed, NCCL_ALGO grammar: 'ring,rd', '^direct', or per collective "
                  "'allreduce:ring,rd;allgather:ring'"};
const Param kTopoFile{"LOOM_TOPO_FILE", ParamType::kString, "",
                      "NCCL-format topology XML that replaces discovery (NCCL_TOPO_FILE is used "
                      "when this is unset)"};
const Param kTopoDumpFile{"LOOM_TOPO_DUMP_FILE", ParamType::kString, "",
                          "Write the discovered topology to this file, in NCCL's XML format "
                          "(NCCL_TOPO_DUMP_FILE is used when this is unset)"};

const Param kNet{"LOOM_NET", ParamType::kString, "",
                 "Network transport between hosts: ib, socket, or the name of the network of the "
                 "plugin LOOM_NET_PLUGIN loads (empty: the plugin if one is named, else ib when a "
                 "device has an active port, else socket)"};
const Param kNetPlugin{
    "LOOM_NET_PLUGIN", ParamType::kString, "",
    "External NCCL net plugin to use as the network transport: a path, or a name "
    "loaded as libnccl-net-<name>.so (empty: none)"};
const Param kIbverbsLib{"LOOM_IBVERBS_LIB", ParamType::kString, "libibverbs.so.1",
                        "The verbs library the InfiniBand transport loads at run time"};
const Param kIbHca{"LOOM_IB_HCA", ParamType::kString, "",
                   "InfiniBand devices and ports to use, NCCL_IB_HCA grammar: mlx5_0:1,mlx5_1 "
                   "(prefixes), ^ excludes, = exact names (empty: every device)"};
const Param kIbQpsPerConnection{"LOOM_IB_QPS_PER_CONNECTION",
                                ParamType::kInt,
                                "1",
                                "Queue pairs per InfiniBand connection; large messages are split "
                                "across them (1-16)",
                                1,
                                16};
const Param kIbGidIndex{"LOOM_IB_GID_INDEX",
                        ParamType::kInt,
                        "-1",
                        "RoCE GID index (-1: choose a RoCE v2 IPv4 GID, else v2, else any)",
                        -1,
                        255};
const Param kIbRoceVersion{"LOOM_IB_ROCE_VERSION_NUM",
                           ParamType::kInt,
                           "2",
                           "RoCE version preferred by the automatic GID choice (1 or 2)",
                           1,
                           2};
const Param kIbTc{"LOOM_IB_TC", ParamType::kInt, "0", "InfiniBand/RoCE traffic class", 0, 255};
const Param kIbSl{"LOOM_IB_SL", ParamType::kInt, "0", "InfiniBand service level", 0, 15};
const Param kIbTimeout{"LOOM_IB_TIMEOUT",
                       ParamType::kInt,
                       "20",
                       "InfiniBand local ack timeout exponent: 4.096 us x 2^value (1-31)",
                       1,
                       31};
const Param kIbRetryCnt{
    "LOOM_IB_RETRY_CNT", ParamType::kInt, "7", "InfiniBand transport retry count (0-7)", 0, 7};
const Param kIbPkey{"LOOM_IB_PKEY", ParamType::kInt, "0", "InfiniBand partition key index", 0,
                    65535};
const Param kNetGdrLevel{"LOOM_NET_GDR_LEVEL", "PXB",
                         "Farthest GPU-NIC path at which GPUDirect RDMA is used: LOC, PIX, PXB, "
                         "PHB or SYS (NCCL_NET_GDR_LEVEL's names)",
                         ParamChoices{"LOC|PIX|PXB|PHB|SYS|0|1|2|3|4"}};
const Param kDmabufEnable{"LOOM_DMABUF_ENABLE", ParamType::kBool, "1",
                          "Register GPU memory through dma-buf when the driver and NIC support it"};
const Param kIbGdrFlushDisable{"LOOM_IB_GDR_FLUSH_DISABLE", ParamType::kBool, "0",
                               "Skip the RDMA-read flush after GPUDirect receives"};

const Param kCudaLib{"LOOM_CUDA_LIB", ParamType::kString, "",
                     "The CUDA driver library loaded at run time (empty: libcuda.so.1); the "
                     "tests name the emulated device, libloom-fakecuda.so"};
const Param kDeviceOnePass{
    "LOOM_DEVICE_ONE_PASS",
    ParamType::kInt,
    "1",
    "Collectives on CUDA device memory whose ranks all share a host, on one GPU or on GPUs that "
    "reach each other peer to peer (LOOM_DEVICE_P2P), run in one pass over the peers' device "
    "buffers (CUDA IPC between processes), without host staging: 1 where the cost model prices it "
    "no higher than staging on every rank, 2 wherever it can run; 0: staged",
    0,
    2};
const Param kDeviceOnePassCopies{
    "LOOM_DEVICE_ONE_PASS_COPIES", "auto",
    "How the device one pass writes its peers' outputs: kernels (one launch stores a rank's result "
    "or block into every output), engines (the copy engines, a copy per output after the "
    "reduction into its own), or auto: whichever the cost model prices lower with the device's "
    "measured speeds",
    ParamChoices{"auto|kernels|engines"}};
const Param kDeviceP2p{
    "LOOM_DEVICE_P2P", ParamType::kBool, "1",
    "Ranks of one host on different GPUs that reach each other peer to peer (NVLink, PCIe) take "
    "the one pass over each other's device buffers; 0: their calls are staged through the host"};
const Param kDeviceGdr{
    "LOOM_DEVICE_GDR", ParamType::kBool, "1",
    "Calls on CUDA device memory run on the schedule with the network reading and writing the "
    "device buffers (GPUDirect RDMA) where every rank's network can and no two ranks of a host "
    "use shared memory; 0: staged through pinned host memory. Read at init; every rank must agree"};
const Param kDeviceStageChunk{
    "LOOM_DEVICE_STAGE_CHUNK",
    ParamType::kSize,
    "4M",
    "Staged calls on CUDA device memory larger than this are pipelined in chunks of about this "
    "many bytes (device to host copy, the host collective and the copy back overlap); 0: each "
    "call is staged whole. Every rank must use the same value (read when the device runner "
    "starts)",
    0,
    kHugeBytes};

const Param* const kAll[] = {&kDebug,
                             &kDebugSubsys,
                             &kDebugFile,
                             &kTimeout,
                             &kCommId,
                             &kHostId,
                             &kCommSecret,
                             &kBootstrapPortOffset,
                             &kSocketIfname,
                             &kSocketFamily,
                             &kTopoFile,
                             &kTopoDumpFile,
                             &kSocketNsocks,
                             &kSocketNthreads,
                             &kSocketMinSplit,
                             &kChunkSize,
                             &kAllReduceRdMax,
                             &kMaxInflight,
                             &kSpinUs,
                             &kShmDisable,
                             &kShmSingleCopy,
                             &kShmSlotSize,
                             &kShmSlots,
                             &kShmRtsMin,
                             &kShmLlMax,
                             &kShmDirectMax,
                             &kNtMin,
                             &kShmMapped,
                             &kShmMappedCma,
                             &kShmThp,
                             &kShmResultTiles,
                             &kAlgo,
                             &kRingChannels,
                             &kPlanner,
                             &kTuningFile,
                             &kTunerMachine,
                             &kTunerFile,
                             &kModelNetMbps,
                             &kModelNetLatUs,
                             &kModelShmLatUs,
                             &kNet,
                             &kNetPlugin,
                             &kIbverbsLib,
                             &kIbHca,
                             &kIbQpsPerConnection,
                             &kIbGidIndex,
                             &kIbRoceVersion,
                             &kIbTc,
                             &kIbSl,
                             &kIbTimeout,
                             &kIbRetryCnt,
                             &kIbPkey,
                             &kNetGdrLevel,
                             &kDmabufEnable,
                             &kIbGdrFlushDisable,
                             &kCudaLib,
                             &kDeviceOnePass,
                             &kDeviceStageChunk,
                             &kDeviceOnePassCopies,
                             &kDeviceP2p,
                             &kDeviceGdr};
}  // namespace params

namespace {

// A parameter as read: the text in force (the environment's when valid, else the default), its
// value for the typed ones, and why the environment's text was rejected.
struct Resolved {
  std::string text;
  int64_t value = 0;
  std::string rejected;
};

struct Cache {
  std::mutex mu;
  std::unordered_map<const Param*, std::pair<bool, std::string>> env;  // set?, text
  std::unordered_map<const Param*, Resolved> resolved;
};

Cache& cache() {
  // Never destroyed: params may be read during static teardown. Fork-safe: the lock is held
  // across fork() so that a child never inherits it locked by a thread that does not exist there
  // (frameworks fork workers from processes that use Loom; tests fork ranks).
  static Cache* c = [] {
    auto* fresh = new Cache();
    pthread_atfork([] { cache().mu.lock(); }, [] { cache().mu.unlock(); },
                   [] { cache().mu.unlock(); });
    return fresh;
  }();
  return *c;
}

// Made while the library loads, on the loading thread, rather than by whichever of Loom's threads
// asks first: ThreadSanitizer, with PyTorch's uninstrumented modules ignored
// (tools/sanitize_torch.sh), missed the first asker's initialization and reported its later
// readers.
[[maybe_unused]] const Cache& kCacheAtLoad = cache();

const std::pair<bool, std::string>& envOf(Cache& c, const Param* p) {
  auto it = c.env.find(p);
  if (it != c.env.end()) return it->second;
  const char* v = std::getenv(p->name());
  return c.env.emplace(p, std::make_pair(v != nullptr, v ? std::string(v) : std::string()))
      .first->second;
}

bool parseBool(const std::string& s, int64_t* out) {
  for (const char* t : {"1", "true", "yes", "on"})
    if (strcasecmp(s.c_str(), t) == 0) return *out = 1, true;
  for (const char* f : {"0", "false", "no", "off"})
    if (strcasecmp(s.c_str(), f) == 0) return *out = 0, true;
  return false;
}

bool parseTyped(ParamType type, const std::string& s, int64_t* out) {
  switch (type) {
    case ParamType::kSize:
      return parseSize(s, out);
    case ParamType::kBool:
      return parseBool(s, out);
    case ParamType::kInt: {
      if (s.empty()) return false;
      char* end = nullptr;
      errno = 0;
      long long v = std::strtoll(s.c_str(), &end, 0);
      if (errno != 0 || *end != '\0') return false;
      *out = v;
      return true;
    }
    case ParamType::kString:
      return false;
  }
  return false;
}

const char* typeName(ParamType t) {
  switch (t) {
    case ParamType::kInt:
      return "int";
    case ParamType::kSize:
      return "size";
    case ParamType::kBool:
      return "bool";
    case ParamType::kString:
      return "string";
  }
  return "?";
}

// A size as a person writes it: 4K, 64M, 1G, else bytes.
std::string sizeText(int64_t v) {
  for (auto [shift, suffix] :
       {std::make_pair(30, "G"), std::make_pair(20, "M"), std::make_pair(10, "K")})
    if (v != 0 && v % (int64_t{1} << shift) == 0) return fmt::format("{}{}", v >> shift, suffix);
  return std::to_string(v);
}

std::vector<std::string> choiceNames(const ParamChoices& c) {
  std::vector<std::string> out;
  std::string cur;
  for (const char* p = c.names; *p; ++p) {
    if (*p == '|') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += *p;
    }
  }
  out.push_back(cur);
  return out;
}

// The choice text matches (any case), as the choices spell it; empty when none does.
std::string matchChoice(const std::vector<std::string>& names, const std::string& text) {
  for (const auto& n : names)
    if (strcasecmp(n.c_str(), text.c_str()) == 0) return n;
  return std::string();
}

Resolved resolve(const Param& p, const std::pair<bool, std::string>& env) {
  Resolved r;
  r.text = p.defaultValue();
  if (p.type() != ParamType::kString) parseTyped(p.type(), r.text, &r.value);
  if (!env.first) return r;
  int64_t value = 0;
  r.rejected = p.check(env.second, &value);
  if (!r.rejected.empty()) return r;
  r.text = p.spelled(env.second);
  r.value = value;
  return r;
}

std::atomic<bool> gWarn{true};

// Resolves p (once per reloadParams()); the warning for a rejected value is logged outside the
// lock (the log reads LOOM_DEBUG through here).
Resolved resolved(const Param& p) {
  Cache& c = cache();
  Resolved r;
  {
    std::lock_guard<std::mutex> lk(c.mu);
    auto it = c.resolved.find(&p);
    if (it != c.resolved.end()) return it->second;
    r = resolve(p, envOf(c, &p));
    c.resolved.emplace(&p, r);
  }
  if (!r.rejected.empty() && gWarn.load(std::memory_order_relaxed))
    LOOM_WARN("{}={} {}; using the default {}", p.name(), envOf(cache(), &p).second, r.rejected,
              r.text.empty() ? std::string("(unset)") : r.text);
  return r;
}

}  // namespace

bool parseSize(const std::string& text, int64_t* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str() || v < 0) return false;
  int64_t mult = 1;
  std::string suffix(end);
  if (suffix == "" || suffix == "B")
    mult = 1;
  else if (suffix == "K" || suffix == "k" || suffix == "KB" || suffix == "KiB")
    mult = 1LL << 10;
  else if (suffix == "M" || suffix == "m" || suffix == "MB" || suffix == "MiB")
    mult = 1LL << 20;
  else if (suffix == "G" || suffix == "g" || suffix == "GB" || suffix == "GiB")
    mult = 1LL << 30;
  else
    return false;
  if (v > (INT64_MAX / mult)) return false;
  *out = v * mult;
  return true;
}

std::string Param::allowed() const {
  if (type_ == ParamType::kString) {
    if (!choices_.names) return std::string();
    std::vector<std::string> names = choiceNames(choices_);
    std::string out;
    for (size_t i = 0; i < names.size(); ++i)
      out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
    return choices_.list ? "a comma list of " + out + " (a leading ^ excludes)" : out;
  }
  if (type_ == ParamType::kBool) return "0/1, true/false, yes/no or on/off";
  if (lo_ == INT64_MIN && hi_ == INT64_MAX) return std::string();
  auto show = [&](int64_t v) {
    return type_ == ParamType::kSize ? sizeText(v) : std::to_string(v);
  };
  return show(lo_) + " to " + show(hi_);
}

std::string Param::check(const std::string& text, int64_t* value) const {
  if (type_ == ParamType::kString) {
    if (!choices_.names || text.empty()) return std::string();
    std::vector<std::string> names = choiceNames(choices_);
    if (!choices_.list) {
      if (!matchChoice(names, text).empty()) return std::string();
      return "is not " + allowed();
    }
    std::string items = text[0] == '^' ? text.substr(1) : text;
    size_t from = 0;
    for (;;) {
      size_t comma = items.find(',', from);
      std::string item = items.substr(from, comma == std::string::npos ? comma : comma - from);
      if (matchChoice(names, item).empty())
        return fmt::format("names '{}', which is not one of {}", item, allowed());
      if (comma == std::string::npos) break;
      from = comma + 1;
    }
    return std::string();
  }
  int64_t v = 0;
  if (!parseTyped(type_, text, &v)) {
    if (type_ == ParamType::kBool) return "is not a valid bool (" + allowed() + ")";
    return fmt::format("is not a valid {}", typeName(type_));
  }
  if (v < lo_ || v > hi_) return "is out of range (" + allowed() + ")";
  *value = v;
  return std::string();
}

std::string Param::spelled(const std::string& text) const {
  if (type_ != ParamType::kString || !choices_.names || choices_.list) return text;
  std::string canon = matchChoice(choiceNames(choices_), text);
  return canon.empty() ? text : canon;
}

bool Param::isSet() const {
  Cache& c = cache();
  std::lock_guard<std::mutex> lk(c.mu);
  return envOf(c, this).first;
}

std::string Param::str() const { return resolved(*this).text; }

int64_t Param::asInt() const { return resolved(*this).value; }

std::string Param::rejected() const { return resolved(*this).rejected; }

std::vector<ParamValue> allParams() {
  std::vector<ParamValue> out;
  for (const Param* p : params::kAll) {
    ParamValue v;
    v.name = p->name();
    v.type = typeName(p->type());
    v.value = p->str();
    v.rejected = p->rejected();
    v.source = !p->isSet() ? "default" : v.rejected.empty() ? "env" : "invalid";
    if (p->isSet()) {
      Cache& c = cache();
      std::lock_guard<std::mutex> lk(c.mu);
      v.envText = envOf(c, p).second;
    }
    v.defaultValue = p->defaultValue();
    v.description = p->description();
    v.allowed = p->allowed();
    out.push_back(std::move(v));
  }
  return out;
}

std::string formatParams() {
  std::string out = fmt::format("# {:<28} {:<8} {:<16} {:<8} {:<10} {}\n", "Parameter", "Type",
                                "Value", "Source", "Default", "Description");
  std::string rejected;
  for (const auto& v : allParams()) {
    out += fmt::format("  {:<28} {:<8} {:<16} {:<8} {:<10} {}{}\n", v.name, v.type,
                       v.value.empty() ? "\"\"" : v.value, v.source,
                       v.defaultValue.empty() ? "\"\"" : v.defaultValue, v.description,
                       v.allowed.empty() || v.type == "bool" ? "" : " [" + v.allowed + "]");
    if (!v.rejected.empty())
      rejected +=
          fmt::format("#   {}={} {}: the default is in force\n", v.name, v.envText, v.rejected);
  }
  if (!rejected.empty()) out += "# Rejected values:\n" + rejected;
  return out;
}

void setParamWarnings(bool on) { gWarn.store(on, std::memory_order_relaxed); }

std::atomic<uint64_t> gParamsGeneration{1};

void reloadParams() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lk(c.mu);
  c.env.clear();
  c.resolved.clear();
  gParamsGeneration.fetch_add(1, std::memory_order_acq_rel);
  logReconfigure();
}

}  // namespace loom
