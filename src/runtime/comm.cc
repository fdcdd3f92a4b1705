#include "src/runtime/comm.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <thread>

#include "algorithms/algo_filter.h"
#include "algorithms/schedule.h"
#include "algorithms/tuning.h"
#include "src/bootstrap/wire.h"
#include "src/core/clock.h"
#include "src/core/dtype.h"
#include "src/core/log.h"
#include "src/core/params.h"
#include "src/core/process.h"
#include "src/runtime/calibrate.h"
#include "src/runtime/device_runner.h"
#include "src/runtime/executor.h"
#include "transports/ib/gdr.h"
#include "transports/select/select.h"
#include "transports/shm/host_group.h"

namespace loom {

namespace {

// Little writer/reader for PeerInfo blobs.
void putU32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
void putStr(std::string& s, const std::string& v) {
  putU32(s, static_cast<uint32_t>(v.size()));
  s += v;
}

struct Reader {
  const std::string& s;
  size_t pos = 0;
  bool ok = true;
  uint32_t u32() {
    if (pos + 4 > s.size()) return ok = false, 0;
    uint32_t v;
    std::memcpy(&v, s.data() + pos, 4);
    pos += 4;
    return v;
  }
  std::string str() {
    uint32_t n = u32();
    if (!ok || pos + n > s.size()) return ok = false, std::string();
    std::string v = s.substr(pos, n);
    pos += n;
    return v;
  }
};

uint64_t mixSecret(uint64_t secret, uint64_t a, uint64_t b) {
  uint64_t h = secret ^ 0x9e3779b97f4a7c15ull;
  for (uint64_t v : {a, b}) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
  }
  return h;
}

int64_t configTimeoutMs(const loomConfig_t* config) {
  if (config && config->size >= offsetof(loomConfig_t, timeoutMs) + sizeof(int) &&
      config->timeoutMs >= 0)
    return config->timeoutMs;
  return defaultTimeoutMs();
}

std::string configName(const loomConfig_t* config) {
  if (config && config->size >= offsetof(loomConfig_t, commName) + sizeof(const char*) &&
      config->commName)
    return config->commName;
  return std::string();
}

}  // namespace

std::string PeerInfo::serialize() const {
  std::string s;
  putU32(s, 0x4c504931);  // "LPI1"
  putStr(s, hostId);
  putStr(s, hostName);
  putU32(s, static_cast<uint32_t>(pid));
  s.append(reinterpret_cast<const char*>(netHandle.bytes), net::kHandleSize);
  putStr(s, topo);
  putU32(s, memcpyMBps);
  putU32(s, reduceMBps);
  putU32(s, cmaSlowdownMilli);
  putU32(s, cores);
  putU32(s, flags);
  return s;
}

Result<PeerInfo> PeerInfo::deserialize(const std::string& blob) {
  Reader r{blob};
  PeerInfo p;
  if (r.u32() != 0x4c504931) return LOOM_ERROR(kInternal, "peer info: bad magic");
  p.hostId = r.str();
  p.hostName = r.str();
  p.pid = static_cast<int>(r.u32());
  if (!r.ok || r.pos + net::kHandleSize > blob.size())
    return LOOM_ERROR(kInternal, "peer info: malformed ({} bytes)", blob.size());
  std::memcpy(p.netHandle.bytes, blob.data() + r.pos, net::kHandleSize);
  r.pos += net::kHandleSize;
  p.topo = r.str();
  p.memcpyMBps = r.u32();
  p.reduceMBps = r.u32();
  p.cmaSlowdownMilli = r.u32();
  p.cores = r.u32();
  p.flags = r.u32();
  if (!r.ok || r.pos != blob.size())
    return LOOM_ERROR(kInternal, "peer info: malformed ({} bytes)", blob.size());
  return p;
}

std::string localHostId() {
  if (params::kHostId.isSet() && !params::kHostId.str().empty()) return params::kHostId.str();
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::string id = host;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string bootId;
  if (boot && std::getline(boot, bootId)) id += ":" + bootId;
  return id;
}

const topo::Graph& localTopology(Status* error) {
  // Leaked on purpose (used until static teardown); computed once, whatever the thread.
  struct Local {
    topo::Graph graph;
    Status error;
  };
  static const Local* local = [] {
    auto* out = new Local();
    std::string source;
    auto g = topo::loadLocalTopology(nullptr, &source);
    if (!g.isOk()) {
      if (topo::topologyFilesNamed())
        out->error = g.status();
      else
        LOOM_WARN("no topology: {}; continuing without device information", g.status().message());
      return out;
    }
    LOOM_INFO(kSubTopo, "topology from {}: {} nodes ({} GPUs, {} NICs)", source, g.value().size(),
              g.value().count(topo::NodeType::kGpu), g.value().count(topo::NodeType::kNic));
    out->graph = std::move(g).value();
    return out;
  }();
  if (error) *error = local->error;
  return local->graph;
}

Status Comm::buildSystem() {
  std::vector<topo::RankTopo> all;
  all.reserve(nranks_);
  for (int r = 0; r < nranks_; ++r) {
    auto t = topo::RankTopo::deserialize(peers_[r].topo);
    if (!t.isOk())
      return Status(t.status().code(),
                    fmt::format("topology of {}: {}", describe(r), t.status().message()));
    all.push_back(std::move(t).value());
  }
  LOOM_ASSIGN(system_, topo::SystemTopo::build(std::move(all)));
  for (const auto& w : system_.warnings) LOOM_WARN("topology: {}", w);
  const int64_t channels = params::kRingChannels.asInt();
  if (channels < 1 || channels > kMaxLayoutChannels) {
    return LOOM_ERROR(kInvalidArgument, "LOOM_RING_CHANNELS={} is out of range (1 to {})", channels,
                      kMaxLayoutChannels);
  }
  LOOM_ASSIGN(rankLayout_, RankLayout::create(system_.hostOf, {}, static_cast<int>(channels)));
  if (rank_ == 0) {
    std::string perHost;
    for (const auto& h : system_.hosts)
      perHost += fmt::format("{}{}", perHost.empty() ? "" : ",", h.ranks.size());
    LOOM_INFO(kSubTopo, "{} ranks on {} host(s) (ranks per host: {}), {} rail(s){}", nranks_,
              system_.hosts.size(), perHost, system_.rails.size(),
              system_.railsUniform ? "" : " (hosts differ)");
  }
  return Status();
}

Comm::~Comm() {
  // First: the runner's thread drives the communicator while it has calls; pending ones are
  // released (their streams too) before anything below goes.
  runner_.reset();
  if (shm_) shm_->setState(shm::PeerState::kClosed);
  // The transport's memory handles are made per connection and must go before it closes.
  registrations_.releaseHandles();
  connections_.close(/*withListener=*/true);
}

Status Comm::initNet(const loomConfig_t* config) {
  // A bad LOOM_ALGO fails here, at init, rather than at the first collective.
  {
    LOOM_ASSIGN(AlgoFilter algo, AlgoFilter::parse(params::kAlgo.str()));
    algo.warnOnce();
  }
  LOOM_ASSIGN(net_, networkTransport(/*allowPlugin=*/true));
  if (net_->devices() < 1)
    return LOOM_ERROR(kSystem, "network transport {} has no device", net_->name());
  registrations_.setTransport(net_);
  net::Handle h{};
  LOOM_TRY(connections_.listen(net_, &h));
  peers_.assign(nranks_, PeerInfo());
  peers_[rank_].netHandle = h;
  schedules_ = std::make_unique<ScheduleCache>();
  timeoutMs_ = configTimeoutMs(config);
  return Status();
}

Result<std::unique_ptr<Comm>> Comm::create(const UniqueIdInfo& id, int nranks, int rank,
                                           const loomConfig_t* config) {
  std::unique_ptr<Comm> c(new Comm());
  c->rank_ = rank;
  c->nranks_ = nranks;
  c->name_ = configName(config);
  c->secret_ = id.secret;
  LOOM_TRY(c->initNet(config));
  PeerInfo& me = c->peers_[rank];
  me.hostId = localHostId();
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  me.hostName = host;
  me.pid = getpid();
  Status topoError;
  const topo::Graph& graph = localTopology(&topoError);
  LOOM_TRY(topoError);
  me.topo = topo::localRankTopo(graph, me.hostId).serialize();
  // Only rank 0's speeds price schedules (buildPlanner); the other ranks do not measure, so that
  // their measurements do not take the cores rank 0 measures on (4 ranks on 2 cores gave 10.5-14
  // GB/s from one start to the next).
  if (rank == 0) {
    const KernelSpeeds& speeds = localKernelSpeeds();
    me.memcpyMBps = static_cast<uint32_t>(std::min(4e9, speeds.memcpyBytesPerSec / 1e6));
    me.reduceMBps = static_cast<uint32_t>(std::min(4e9, speeds.reduceBytesPerSec / 1e6));
    me.cmaSlowdownMilli = static_cast<uint32_t>(std::min(1e6, speeds.cmaSlowdown * 1000));
  }
  net::Properties netProps;
  // GPUDirect RDMA for this rank's device calls: its network takes device memory, and every GPU
  // of this host is near enough its NIC (LOOM_NET_GDR_LEVEL, as each registration checks): the
  // rank's GPU is not known before its first device call.
  const bool haveProps = c->net_->getProperties(0, &netProps).isOk();
  if (!params::kDeviceGdr.asBool())
    c->gdrWhyNot_ = "LOOM_DEVICE_GDR=0";
  else if (!haveProps || !(netProps.ptrSupport & net::kPtrCuda))
    c->gdrWhyNot_ = fmt::format("its network ({}) takes no device memory", c->net_->name());
  else if (!ib::gdrReachesEveryGpu(netProps.pciPath))
    c->gdrWhyNot_ = fmt::format(
        "a GPU of this host is farther from NIC {} than LOOM_NET_GDR_LEVEL allows, or the CUDA "
        "driver lists none",
        netProps.name);
  else
    me.flags |= PeerInfo::kPeerNetCuda;
  if (!params::kShmDisable.asBool()) me.flags |= PeerInfo::kPeerShm;
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  me.cores = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  Deadline deadline(c->timeoutMs_);
  LOOM_ASSIGN(c->bootstrap_, Bootstrap::connect(id, rank, nranks, me.serialize(), deadline,
                                                c->failure_.abortFlagMutable()));
  c->failure_.setBootstrap(c->bootstrap_.get());
  for (int r = 0; r < nranks; ++r) {
    LOOM_ASSIGN(c->peers_[r], PeerInfo::deserialize(c->bootstrap_->blob(r)));
  }
  c->computeLocality();
  LOOM_TRY(c->buildSystem());
  LOOM_TRY(c->initShm());
  c->buildTransportTable();
  LOOM_TRY(c->buildPlanner());
  int local = c->localRanks_;
  net::Properties props;
  (void)c->net_->getProperties(0, &props);
  LOOM_INFO(kSubInit, "comm {}rank {} of {} ready: {} ranks on this host ({}), network {} via {}",
            c->name_.empty() ? "" : c->name_ + " ", rank, nranks, local,
            c->shm_ ? "shared memory" : "no shared memory", c->net_->name(), props.name);
  return c;
}

Result<std::unique_ptr<Comm>> Comm::split(int color, int key, const loomConfig_t* config) {
  // Every member learns (color, key, rank, new bootstrap listener, new transport handle) of every
  // rank through this comm's bootstrap, then the members of each color join a new ring.
  struct Record {
    int32_t color, key, oldRank, addrLen;
    sockaddr_storage addr;
    uint32_t blobLen;
    char blob[1024];
  };
  uint64_t seq = static_cast<uint64_t>(splitCount_++);
  uint64_t newSecret = mixSecret(secret_, seq, static_cast<uint64_t>(static_cast<int64_t>(color)));
  std::unique_ptr<Comm> nc;
  std::unique_ptr<Bootstrap> nb;
  Record mine{};
  mine.color = color;
  mine.key = key;
  mine.oldRank = rank_;
  if (color != LOOM_SPLIT_NOCOLOR) {
    nc.reset(new Comm());
    nc->name_ = configName(config);
    nc->secret_ = newSecret;
    nc->rank_ = 0;
    nc->nranks_ = 1;
    LOOM_TRY(nc->initNet(config));
    LOOM_ASSIGN(nb, Bootstrap::prepare(newSecret, &bootstrap_->listenAddress()));
    PeerInfo me = peers_[rank_];
    me.netHandle = nc->peers_[0].netHandle;
    me.topo.clear();  // every member has it already (peers_), and the record has a fixed size
    std::string blob = me.serialize();
    if (blob.size() > sizeof(mine.blob)) return LOOM_ERROR(kInternal, "split: peer info too large");
    mine.addrLen = static_cast<int32_t>(nb->listenAddress().len);
    mine.addr = nb->listenAddress().ss;
    mine.blobLen = static_cast<uint32_t>(blob.size());
    std::memcpy(mine.blob, blob.data(), blob.size());
  }
  std::vector<Record> all(nranks_);
  Deadline deadline(timeoutMs_);
  LOOM_TRY(bootstrap_->allGather(&mine, sizeof(Record), all.data(), deadline)
               .withContext("loomCommSplit exchanging colors"));
  if (color == LOOM_SPLIT_NOCOLOR) return std::unique_ptr<Comm>();
  std::vector<const Record*> members;
  for (const auto& r : all)
    if (r.color == color) members.push_back(&r);
  std::stable_sort(members.begin(), members.end(), [](const Record* a, const Record* b) {
    return a->key != b->key ? a->key < b->key : a->oldRank < b->oldRank;
  });
  int newRank = -1;
  std::vector<Bootstrap::Member> ms;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i]->oldRank == rank_) newRank = static_cast<int>(i);
    Bootstrap::Member m;
    m.listener.ss = members[i]->addr;
    m.listener.len = static_cast<socklen_t>(members[i]->addrLen);
    m.blob.assign(members[i]->blob, members[i]->blobLen);
    ms.push_back(std::move(m));
  }
  nc->rank_ = newRank;
  nc->nranks_ = static_cast<int>(members.size());
  nc->peers_.assign(nc->nranks_, PeerInfo());
  for (int r = 0; r < nc->nranks_; ++r) {
    LOOM_ASSIGN(nc->peers_[r], PeerInfo::deserialize(ms[r].blob));
    nc->peers_[r].topo = peers_[members[r]->oldRank].topo;
  }
  LOOM_TRY(nb->joinRing(newRank, std::move(ms), Deadline(nc->timeoutMs_),
                        nc->failure_.abortFlagMutable())
               .withContext("loomCommSplit joining the new communicator"));
  nc->bootstrap_ = std::move(nb);
  nc->failure_.setBootstrap(nc->bootstrap_.get());
  nc->computeLocality();
  LOOM_TRY(nc->buildSystem());
  LOOM_TRY(nc->initShm());
  nc->buildTransportTable();
  LOOM_TRY(nc->buildPlanner());
  LOOM_INFO(kSubInit, "split color {} key {}: rank {} of {} (was rank {} of {})", color, key,
            newRank, nc->nranks_, rank_, nranks_);
  return nc;
}

void Comm::computeLocality() {
  localRanks_ = 0;
  for (const auto& p : peers_) localRanks_ += p.hostId == peers_[rank_].hostId;
  yieldWhenIdle_ = localRanks_ > usableCpus();
  spinNs_ =
      params::kSpinUs.isSet() ? std::max<int64_t>(0, params::kSpinUs.asInt()) * 1000 : 100 * 1000;
  deviceSchedule_ = findDeviceSchedule(&deviceScheduleWhyNot_);
}

bool Comm::sharesProcess() const {
  const PeerInfo& me = peers_[rank_];
  for (int r = 0; r < nranks_; ++r)
    if (r != rank_ && peers_[r].pid == me.pid && peers_[r].hostId == me.hostId) return true;
  return false;
}

std::string Comm::describe(int r) const {
  if (r < 0 || r >= static_cast<int>(peers_.size())) return fmt::format("rank {}", r);
  const PeerInfo& p = peers_[r];
  return fmt::format("rank {} (host {}, pid {})", r, p.hostName, p.pid);
}

std::string Comm::deadPeers() const {
  std::string dead;
  int count = 0;
  const std::string& myHost = peers_[rank_].hostId;
  for (int r = 0; r < nranks_; ++r) {
    const PeerInfo& p = peers_[r];
    if (r == rank_ || p.hostId != myHost || p.pid <= 0 || p.pid == getpid()) continue;
    if (processGone(p.pid)) dead += (count++ ? ", " : "") + describe(r);
  }
  // Counted, not guessed from commas: each description has one ("rank 1 (host h, pid 9)").
  return count == 0 ? dead : dead + (count == 1 ? " has died" : " have died");
}

// The machine the planner prices schedules on. Every input is the same on every rank: hosts and
// ports from the exchanged topology, kernel speeds and CPU counts as rank 0 and each host's first
// rank measured them, and parameters (which every rank must set alike, as with NCCL).
Status Comm::buildPlanner() {
  HostCluster hc;
  hc.hostOf = system_.hostOf;
  hc.memcpyBytesPerSec = peers_[0].memcpyMBps ? peers_[0].memcpyMBps * 1e6 : 5e9;
  hc.reduceBytesPerSec = peers_[0].reduceMBps ? peers_[0].reduceMBps * 1e6 : 4e9;
  hc.cmaSlowdown = peers_[0].cmaSlowdownMilli / 1000.0;
  for (const auto& h : system_.hosts) hc.coresPerHost.push_back(peers_[h.ranks.front()].cores);
  double netBps = 0;
  if (params::kModelNetMbps.asInt() > 0) {
    netBps = static_cast<double>(params::kModelNetMbps.asInt()) * 1e6 / 8;
  } else {
    // The narrowest path between two hosts with ports: rankPath takes the narrower of two ranks'
    // ports, so the slowest port of any rank counts once another host has a port (linear, not
    // a loop over every pair of ranks).
    std::vector<double> slowest(system_.hosts.size(), 0);  // per host; 0: no port
    for (int r = 0; r < nranks_; ++r) {
      double bw = system_.netBandwidth(r) * 1e9;
      double& s = slowest[static_cast<size_t>(system_.hostOf[r])];
      if (bw > 0) s = s == 0 ? bw : std::min(s, bw);
    }
    size_t withPorts = 0;
    for (double s : slowest) withPorts += s > 0;
    if (withPorts >= 2)
      for (double s : slowest)
        if (s > 0 && (netBps == 0 || s < netBps)) netBps = s;
    if (netBps == 0) netBps = 10e9 / 8;  // NCCL's default for a port of unknown speed
  }
  hc.netBytesPerSec = netBps;
  const double netAlpha = static_cast<double>(params::kModelNetLatUs.asInt()) * 1e-6;
  hc.netAlphaSec = netAlpha;
  hc.shmAlphaSec = static_cast<double>(params::kModelShmLatUs.asInt()) * 1e-6;
  // Whether ranks of a host share memory must be decided alike on every rank (a rank alone on its
  // host has no shared memory of its own, yet prices the other hosts' links): the parameter, not
  // this rank's transport. A host whose shared memory failed to set up runs over sockets while
  // priced as shared memory.
  hc.shm = !params::kShmDisable.asBool();
  CostMachine m = hostCostMachine(hc);
  size_t piece = static_cast<size_t>(std::max<int64_t>(params::kChunkSize.asInt(), 1));
  planner_ = std::make_unique<Planner>(std::move(m), rankLayout_, piece);
  if (params::kTuningFile.isSet() && !params::kTuningFile.str().empty()) {
    Result<TuningFile> t = loadTuning(params::kTuningFile.str());
    std::vector<int> perHost;
    for (const auto& h : system_.hosts) perHost.push_back(static_cast<int>(h.ranks.size()));
    if (!t.isOk()) {
      LOOM_WARN("{}: ignored", t.status().message());
    } else if (t.value().nranks != nranks_ || t.value().ranksPerHost != perHost) {
      LOOM_WARN("tuning file {} was measured on {}, not on this communicator's {}: ignored",
                params::kTuningFile.str(), describeLayout(t.value().nranks, t.value().ranksPerHost),
                describeLayout(nranks_, perHost));
    } else {
      planner_->setTuning(t.value().entries);
      if (rank_ == 0)
        LOOM_INFO(kSubPlan, "tuning file {}: {} entries for {}", params::kTuningFile.str(),
                  t.value().entries.size(), describeLayout(nranks_, perHost));
    }
  }
  if (rank_ == 0) {
    std::string shared;
    for (size_t h = 0; h < planner_->machine().hostMemBytesPerSec.size(); ++h)
      if (planner_->machine().hostMemBytesPerSec[h] > 0)
        shared +=
            fmt::format("{}host {} {:.1f} GB/s, {:.1f} GB/s per rank", shared.empty() ? "" : ", ",
                        h, planner_->machine().hostMemBytesPerSec[h] / 1e9,
                        planner_->machine().hostRankMemBytesPerSec[h] / 1e9);
    LOOM_INFO(kSubPlan,
              "cost model: shared memory {:.1f} GB/s, {:.0f} us; network {:.2f} GB/s, {:.0f} us; "
              "reduce {:.1f} GB/s; cores shared by more ranks: {}",
              planner_->machine().intra.bytesPerSec / 1e9, planner_->machine().intra.alphaSec * 1e6,
              netBps / 1e9, netAlpha * 1e6, planner_->machine().reduceBytesPerSec / 1e9,
              shared.empty() ? "none" : shared);
  }
  return Status();
}

Result<std::shared_ptr<const Plan>> Comm::planFor(const CollArgs& args, size_t elemSize,
                                                  const AlgoFilter& filter) {
  CacheKey key;
  key.words = {static_cast<uint64_t>(args.coll),
               args.count,
               elemSize,
               static_cast<uint64_t>(static_cast<int64_t>(args.root)),
               uint64_t{args.inPlace},
               0};
  key.name = filter.spec();
  {
    std::lock_guard<std::mutex> lk(planMu_);
    auto it = planChoices_.find(key);
    if (it != planChoices_.end()) return it->second;
  }
  LOOM_ASSIGN(Plan plan, planner_->choose(args, elemSize, filter));
  auto shared = std::make_shared<const Plan>(std::move(plan));
  std::lock_guard<std::mutex> lk(planMu_);
  if (planChoices_.size() > 4096) planChoices_.clear();
  planChoices_.emplace(key, shared);
  return shared;
}

Result<std::shared_ptr<const AlgoFilter>> Comm::algoFilter() const {
  if (algoOverride_) return algoOverride_;
  static std::mutex mu;
  static std::string lastSpec;
  static std::shared_ptr<const AlgoFilter> filter = std::make_shared<const AlgoFilter>();
  std::string spec = params::kAlgo.str();
  std::lock_guard<std::mutex> lk(mu);
  if (spec != lastSpec) {
    LOOM_ASSIGN(AlgoFilter parsed, AlgoFilter::parse(spec));
    parsed.warnOnce();
    filter = std::make_shared<const AlgoFilter>(std::move(parsed));
    lastSpec = spec;
  }
  return filter;
}

bool Comm::allLocal() const { return shm_ && shm_->area().nlocal() == nranks_; }

bool Comm::findDeviceSchedule(std::string* whyNot) const {
  if (nranks_ < 2) {
    *whyNot = "one rank";
    return false;
  }
  std::map<std::string, int> perHost;
  std::vector<int> without;
  bool shm = false;
  for (int r = 0; r < nranks_; ++r) {
    const PeerInfo& p = peers_[r];
    if (!(p.flags & PeerInfo::kPeerNetCuda)) without.push_back(r);
    ++perHost[p.hostId];
    shm = shm || (p.flags & PeerInfo::kPeerShm);
  }
  if (!without.empty()) {
    *whyNot =
        fmt::format("rank{} {} cannot ({})", without.size() > 1 ? "s" : "",
                    wire::formatRanks(without.data(), without.size(), 8),
                    gdrWhyNot_.empty() ? "each rank's log says why" : "this one: " + gdrWhyNot_);
    return false;
  }
  if (shm)
    for (const auto& [host, n] : perHost)
      if (n > 1) {  // those ranks talk through shared memory: host memory only
        *whyNot = fmt::format(
            "{} ranks share host {} and its shared memory, which carries host memory only "
            "(LOOM_SHM_DISABLE=1 puts them on the network too)",
            n, host);
        return false;
      }
  return true;
}

Result<const DispatchFacts*> Comm::rebuildDispatchFacts() {
  std::lock_guard<std::mutex> lk(factsMu_);
  const uint64_t gen = paramsGeneration();
  if (const DispatchFacts* in = facts_.load(); in != nullptr && gen == factsGeneration_.load())
    return in;  // another thread rebuilt them meanwhile
  auto built = std::make_unique<BuiltFacts>();
  LOOM_ASSIGN(built->filter, algoFilter());
  DispatchFacts& f = built->facts;
  f.nranks = nranks_;
  f.allLocal = allLocal();
  f.llMaxBytes = llMax_;
  // The one pass publishes a 64-byte record in the low-latency buffers (one_pass.cc).
  f.onePassOn = shm_ && params::kShmMapped.asBool() && shm_->area().options().llBytes >= 64;
  f.onePassReach = onePassReach_;
  f.oneProcess = oneProcess_;
  f.singleCopy = params::kShmSingleCopy.asInt() >= 1;
  f.directMaxBytes = static_cast<size_t>(std::max<int64_t>(0, params::kShmDirectMax.asInt()));
  f.rdMaxBytes = static_cast<size_t>(std::max<int64_t>(0, params::kAllReduceRdMax.asInt()));
  f.filter = built->filter.get();
  // What the transports take, within what the executor copies and reduces: host memory with the
  // CPU, device memory with the device where every rank can (deviceSchedule).
  f.scheduleKinds =
      connections_.acceptedKinds() &
      (kHostKinds | (deviceSchedule() ? memKindBit(MemKind::kCudaDevice) : MemKindSet{0}));
  if (planner_) f.machine = &planner_->machine();
  if (planner_ && params::kPlanner.asBool())
    f.plan = [this](const CollArgs& args, size_t elemSize, const AlgoFilter& fil) {
      return planFor(args, elemSize, fil);
    };
  factsBuilt_.push_back(std::move(built));
  if (factsBuilt_.size() > kKeptFacts) factsBuilt_.pop_front();
  facts_.store(&factsBuilt_.back()->facts);
  factsGeneration_.store(gen);
  return facts_.load();
}

Result<Decision> Comm::decide(const CallShape& call, bool explain) {
  LOOM_ASSIGN(const DispatchFacts* facts, dispatchFacts());
  const bool log = rank_ == 0 && logEnabled(LogLevel::kInfo, kSubPlan);
  if (!explain && !log) return dispatch(call, *facts);
  DispatchFacts f = *facts;
  f.explain = explain;
  f.detail = true;
  LOOM_ASSIGN(Decision d, dispatch(call, f));
  if (log && !explain) {
    // Once per call shape (and filter): the line the planner's choices are read from.
    std::string key = fmt::format("{}/{}/{}/{}/{}/{}/{}", static_cast<int>(call.coll), call.count,
                                  dataTypeSize(call.dtype), call.root, call.inPlace, call.grouped,
                                  f.filter->spec());
    std::lock_guard<std::mutex> lk(planMu_);
    if (planLogged_.size() > 4096) planLogged_.clear();
    if (planLogged_.insert(key).second)
      LOOM_INFO(kSubPlan, "{} count {} x {} B{}{}: {}", collName(call.coll), call.count,
                dataTypeSize(call.dtype), call.inPlace ? " in place" : "",
                call.grouped ? " in a group" : "", describeDecision(d));
  }
  return d;
}

Result<DeviceRunner*> Comm::deviceRunner(int device) {
  if (runner_) return runner_.get();
  if (device < 0) return LOOM_ERROR(kInternal, "a device runner without a device");
  LOOM_ASSIGN(runner_, DeviceRunner::create(this, device));
  return runner_.get();
}

Status Comm::quiesce() { return runner_ ? runner_->drain() : Status(); }

bool Comm::onePassAttemptDue() {
  if (onePassSkip_ == 0) return true;
  --onePassSkip_;
  return false;
}

void Comm::noteOnePassAttempt(bool ran) {
  onePassBackoff_ = ran ? 0 : std::min(256, std::max(1, onePassBackoff_ * 2));
  onePassSkip_ = onePassBackoff_;
}

Status Comm::initShm() {
  if (nranks_ < 2) return Status();
  // The ranks of this host, in rank order; the first creates the segment.
  std::vector<int> local;
  for (int r = 0; r < nranks_; ++r)
    if (peers_[r].hostId == peers_[rank_].hostId) local.push_back(r);
  int me = static_cast<int>(std::find(local.begin(), local.end(), rank_) - local.begin());
  int n = static_cast<int>(local.size());
  bool leader = me == 0;
  bool want = n > 1 && !params::kShmDisable.asBool();
  shm::Options opts = shm::optionsFromParams();
  opts.yieldWhenIdle = yieldWhenIdle_;
  opts = shm::fitOptions(n, opts);
  size_t bytes = shm::segmentBytes(n, opts);

  // Round 1: each host's leader creates and formats the segment under a fresh name and tells
  // its peers the name's nonce. Every rank takes part in every round (whatever its host), so the
  // rounds match across hosts.
  struct Round1 {
    uint8_t want, created;
    uint8_t pad[6];
    uint64_t nonce;
  };
  Round1 mine{};
  mine.want = want;
  auto segName = [&](uint64_t nonce) {
    return fmt::format("/loom-{}-{:016x}", peers_[local[0]].pid, nonce);
  };
  std::vector<shm::LocalPeer> lp;
  for (int r : local) lp.push_back({r, peers_[r].pid});
  std::string why;
  auto attach = [&](Result<std::unique_ptr<shm::Segment>> seg) {
    if (!seg.isOk()) {
      why = seg.status().message();
      return;
    }
    if (leader) shm::HostArea::format(seg.value()->base(), n, opts);
    auto t = shm::HostGroup::attach(std::move(seg).value(), me, lp, opts, failure_.abortFlag());
    if (t.isOk())
      shm_ = std::move(t).value();
    else
      why = t.status().message();
  };
  if (want && leader) {
    mine.nonce =
        mixSecret(secret_, static_cast<uint64_t>(nowNs()), reinterpret_cast<uintptr_t>(this));
    attach(shm::Segment::create(segName(mine.nonce), bytes));
    mine.created = shm_ != nullptr;
  }
  std::vector<Round1> all1(nranks_);
  Deadline deadline(timeoutMs_);
  LOOM_TRY(bootstrap_->allGather(&mine, sizeof(mine), all1.data(), deadline)
               .withContext("setting up shared memory"));
  bool go = true;
  for (int r : local) go &= all1[r].want != 0;
  go &= all1[local[0]].created != 0;
  // Round 2: the others open and map it.
  if (go && !leader) attach(shm::Segment::open(segName(all1[local[0]].nonce), bytes));
  uint8_t mapped = shm_ != nullptr;
  std::vector<uint8_t> all2(nranks_);
  LOOM_TRY(bootstrap_->allGather(&mapped, 1, all2.data(), deadline)
               .withContext("setting up shared memory"));
  for (int r : local) go &= all2[r] != 0;
  // Every local rank has mapped it (or given up): the name can go, so that nothing is left in
  // /dev/shm whatever happens next.
  if (shm_) shm_->area().segment().unlink();
  if (!go) shm_.reset();
  // Rounds 3 and 4: the single-copy probe, between barriers.
  if (shm_) shm_->rings().publishProbe();
  LOOM_TRY(bootstrap_->barrier(deadline).withContext("setting up shared memory"));
  if (shm_) shm_->rings().probePeers();
  LOOM_TRY(bootstrap_->barrier(deadline).withContext("setting up shared memory"));
  if (!want) {
    if (n > 1)
      LOOM_INFO(kSubShm, "shared memory disabled (LOOM_SHM_DISABLE): sockets inside the host");
    return Status();
  }
  if (!shm_) {
    LOOM_WARN(
        "shared memory between the {} ranks of this host is not available ({}); they use "
        "sockets",
        n, why.empty() ? "another rank of this host could not set it up" : why);
    return Status();
  }
  onePassReach_ = shm_->rings().everyPairCanReach();
  oneProcess_ = shm_->rings().allOneProcess();
  llMax_ = std::min(static_cast<size_t>(std::max<int64_t>(0, params::kShmLlMax.asInt())),
                    shm_->area().options().llBytes);
  LOOM_INFO(kSubShm,
            "shared memory with {} local ranks: segment {} ({} KiB, rings of {} x {} KiB, "
            "low-latency buffers of {} KiB), {}{}",
            n, shm_->area().segment().name(), bytes >> 10, opts.slots, opts.slotBytes >> 10,
            opts.llBytes >> 10, shm_->rings().singleCopySummary(),
            yieldWhenIdle_ ? "; more ranks than CPUs: waits yield" : "");
  return Status();
}

void Comm::buildTransportTable() {
  std::vector<net::Handle> handles;
  for (const PeerInfo& p : peers_) handles.push_back(p.netHandle);
  connections_.setPeers(rank_, nranks_, secret_, std::move(handles),
                        [this](int r) { return describe(r); });
  std::vector<net::Transport*> offered = {net_};
  if (shm_) offered.push_back(&shm_->rings());
  connections_.buildTable(offered, rankLayout_ ? rankLayout_->channels() : 1);
}

void Comm::fail(const Status& st) {
  failure_.record(st);
  if (shm_) shm_->setState(shm::PeerState::kFailed);
  // Tell the other ranks first (over the bootstrap ring: it reaches ranks that share no data
  // connection with this one), then close the data connections so that peers blocked on them
  // fail at once.
  failure_.report(rank_, st);
  registrations_.releaseHandles();
  connections_.close(/*withListener=*/true);
}

bool Comm::peerCall(int peer, CallNote* out) const {
  if (!shm_) return false;
  const shm::HostArea& area = shm_->area();
  for (int i = 0; i < area.nlocal(); ++i)
    if (area.peer(i).rank == peer) return *out = area.peerCall(i), true;
  return false;
}

void Comm::noteCall(const CallNote& call) {
  if (shm_) shm_->area().noteCall(call);
}

bool Comm::isClosedPeer(const Status& st) { return st.cause() == Cause::kPeerGone; }

std::string Comm::closedPeerHint() {
  // The rank that closed may have failed because of another one: its report names the cause.
  Status remote = failure_.awaitRemote(250);
  std::string dead = deadPeers();
  if (!remote.isOk()) return "; " + remote.message() + (dead.empty() ? "" : "; " + dead);
  return dead.empty() ? " (that rank failed, was killed or aborted)" : "; " + dead;
}

Status Comm::explainLocalWait(Status st, const std::string& what) {
  if (isClosedPeer(st)) st = st.rewritten(st.code(), st.message() + closedPeerHint());
  return st.withContext(what);
}

}  // namespace loom
