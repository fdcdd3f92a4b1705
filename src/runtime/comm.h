// The communicator: a rank's view of its peers and their hosts, its bootstrap, and the pieces it is
// made of, each with one concern: its connections and transport table (connections.h), its buffer
// registrations and scratch (registrations.h), its failure state (failure.h), its shared memory
// with the other ranks of this host, and its planner with the decisions dispatch makes for it.
//
// Threads: one thread drives a communicator at a time (the public API's rule); requestAbort(),
// aborted() and asyncError() may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "algorithms/planner.h"
#include "loom/loom.h"
#include "src/bootstrap/bootstrap.h"
#include "src/core/cache_key.h"
#include "src/core/params.h"
#include "src/core/status.h"
#include "src/runtime/connections.h"
#include "src/runtime/dispatch.h"
#include "src/runtime/failure.h"
#include "src/runtime/registrations.h"
#include "src/runtime/tile_choice.h"
#include "topology/discover.h"
#include "topology/system.h"
#include "transports/net.h"

namespace loom {

namespace shm {
class HostGroup;
}
class DeviceRunner;
class ScheduleCache;
class RankLayout;

// What each rank tells the others at init (through the bootstrap).
struct PeerInfo {
  std::string hostId;  // ranks with equal hostId share a host
  std::string hostName;
  int pid = 0;
  net::Handle netHandle{};  // the rank's transport listener
  std::string topo;         // topo::RankTopo::serialize(): the devices this rank sees
  uint32_t memcpyMBps = 0;  // this rank's measured kernel speeds (calibrate.h), MB/s
  uint32_t reduceMBps = 0;
  uint32_t cmaSlowdownMilli = 0;  // KernelSpeeds::cmaSlowdown x 1000 (0: not measured)
  uint32_t cores = 0;             // CPUs this process may run on
  // kPeerNetCuda: its network transport reads and writes CUDA device memory (GPUDirect RDMA) and
  // LOOM_DEVICE_GDR is on; kPeerShm: its shared memory is on (LOOM_SHM_DISABLE=0).
  uint32_t flags = 0;
  static constexpr uint32_t kPeerNetCuda = 1, kPeerShm = 2;

  std::string serialize() const;
  static Result<PeerInfo> deserialize(const std::string& blob);
};

// This process's host identity: LOOM_HOSTID, else hostname plus the kernel boot id.
std::string localHostId();

// This host's topology (LOOM_TOPO_FILE, or discovery), computed once per process. When discovery
// fails, a warning says why and the graph is empty (the communicator still works). A topology or
// dump file the user named that cannot be read, parsed or written is an error: *error (when
// given) gets it, every communicator's init fails with it, and the graph is empty.
const topo::Graph& localTopology(Status* error = nullptr);

class Comm {
 public:
  ~Comm();

  // Collective init over nranks ranks through the rendezvous named by id.
  static Result<std::unique_ptr<Comm>> create(const UniqueIdInfo& id, int nranks, int rank,
                                              const loomConfig_t* config);
  // Collective over this comm: the communicator of the ranks with the same color (nullptr for
  // LOOM_SPLIT_NOCOLOR).
  Result<std::unique_ptr<Comm>> split(int color, int key, const loomConfig_t* config);

  // --- identity and placement ---
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  const PeerInfo& peer(int r) const { return peers_[r]; }
  const std::string& name() const { return name_; }
  int64_t timeoutMs() const { return timeoutMs_; }
  // Describes a rank for error messages: "rank 3 (host h1, pid 1234)".
  std::string describe(int r) const;
  // Ranks of this communicator on this host.
  int localRanks() const { return localRanks_; }
  // Hosts, ranks per host and the devices of every rank, the same on every rank.
  const topo::SystemTopo& system() const { return system_; }
  // The same as a RankLayout for the schedule generators (hosts from system(), rings by host then
  // rank, one channel), built once with it.
  const std::shared_ptr<const RankLayout>& rankLayout() const { return rankLayout_; }
  // How long a wait polls (yielding the core between polls) before it sleeps: LOOM_SPIN_US.
  int64_t spinNs() const { return spinNs_; }
  // More ranks of this host than usable CPUs: waits yield the core between polls.
  bool yieldWhenIdle() const { return yieldWhenIdle_; }
  // Waits should yield between polls: the host is oversubscribed, or no transport of this
  // communicator is polled through memory (a socket's progress needs its helper or the kernel).
  bool yieldWhileWaiting() const { return yieldWhenIdle_ || !shm_; }

  // --- transports ---
  Connections& connections() { return connections_; }
  // The network transport (every rank reaches every rank through it).
  net::Transport* transport() const { return net_; }
  net::Transport* transportFor(int peer, int channel) const {
    return connections_.transportFor(peer, channel);
  }
  // The shared memory of this host's ranks (transports/shm/host_group.h; nullptr when they are
  // alone, shared memory is disabled, or it could not be set up): its rings are in the transport
  // table, the low-latency path uses its exchange and the one pass its exchange and guard.
  shm::HostGroup* shm() const { return shm_.get(); }
  // What rank `peer` of this host last noted it calls (runCall), read from shared memory; false
  // for a rank of another host (its call is not known here).
  bool peerCall(int peer, CallNote* out) const;
  // Notes this rank's call for its peers of the host (peerCall).
  void noteCall(const CallNote& call);
  // Every rank of this communicator shares this host and its shared memory.
  bool allLocal() const;
  // Every rank is a thread of this process (shared memory's finding; false without it).
  bool oneProcess() const { return oneProcess_; }
  // Some other rank of this communicator is a thread of this process.
  bool sharesProcess() const;
  // Sequence number of the next low-latency operation (the same on every rank).
  uint64_t nextLlSeq() { return ++llSeq_; }
  // The one pass's measured choice of how cold results reach the peers (src/runtime/tile_choice.h),
  // one for its AllReduces and one for its Broadcasts (their rates differ).
  ResultTileChoice& resultTileChoice(bool broadcast) { return resultTiles_[broadcast ? 1 : 0]; }
  // The memory handle transport t wants for [p, p + n) on connection conn: a registered buffer's
  // (Registrations::memHandle) where t registers memory, else nullptr.
  void* memHandle(net::Transport* t, void* conn, const void* p, size_t n) {
    return t->wantsRegistration() ? registrations_.memHandle(conn, p, n) : nullptr;
  }
  Registrations& registrations() { return registrations_; }
  char* scratch(size_t bytes) { return registrations_.scratch(bytes); }

  // --- decisions ---
  ScheduleCache& schedules() { return *schedules_; }
  // The cost-model planner of this communicator (built at init from the exchanged topology and
  // rank 0's kernel speeds: the same on every rank).
  const Planner* planner() const { return planner_.get(); }
  // The planner's choice for op under filter, computed once per call shape.
  Result<std::shared_ptr<const Plan>> planFor(const CollArgs& args, size_t elemSize,
                                              const AlgoFilter& filter);
  // loomCommSetAlgo: this communicator's algorithm filter in place of LOOM_ALGO's (null: none).
  void setAlgoOverride(std::shared_ptr<const AlgoFilter> f) {
    algoOverride_ = std::move(f);
    factsGeneration_.store(0);  // the facts hold the filter: rebuild them
  }
  // The algorithm filter in force: loomCommSetAlgo's, else LOOM_ALGO's (parsed once per distinct
  // value; an error names a bad spec).
  Result<std::shared_ptr<const AlgoFilter>> algoFilter() const;
  // What dispatch reads of this communicator (src/runtime/dispatch.h): built once and again only
  // when the parameters are reloaded or loomCommSetAlgo changes the filter. Errors: a bad
  // LOOM_ALGO. Any thread: the device runner decides host calls while the posting thread decides
  // the next device job's (DeviceRunner::reserveStaging); a rebuild makes a new one and keeps
  // the last kKeptFacts, so a pointer handed out stays valid for the call that asked for it.
  Result<const DispatchFacts*> dispatchFacts() {
    const DispatchFacts* f = facts_.load();
    if (f != nullptr && paramsGeneration() == factsGeneration_.load()) return f;
    return rebuildDispatchFacts();
  }
  // dispatch() for call on this communicator (the planner's plans are cached per call shape),
  // logged at rank 0 once per call shape (LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=PLAN).
  Result<Decision> decide(const CallShape& call, bool explain = false);
  // One-pass attempts (one_pass.h). An attempt that finds some rank's buffers out of reach (or
  // too dear to reach) costs a flag round; after each such miss the next 1, 2, 4 ... 256 calls
  // that dispatch sends to the one pass skip the attempt and run the decision's schedule. Every
  // rank sees the same outcome of every attempt, so every rank skips the same calls.
  // onePassAttemptDue consumes one skip.
  bool onePassAttemptDue();
  void noteOnePassAttempt(bool ran);

  // --- device calls (device_runner.h) ---
  // The runner of this communicator's calls on device memory or CUDA streams, created on first
  // use for `device`; from then on every call on the communicator runs on it (one thread drives
  // the communicator) and the communicator is bound to that device.
  Result<DeviceRunner*> deviceRunner(int device);
  DeviceRunner* runner() const { return runner_.get(); }
  // Calls on device memory run on the schedule with the network reading and writing the device
  // buffers (GPUDirect RDMA), not staged: every rank's network takes device memory
  // (PeerInfo::kPeerNetCuda) and no two ranks of a host talk through shared memory (which does
  // not). The same answer on every rank: it reads what every rank published at init (found once,
  // with the locality).
  bool deviceSchedule() const { return deviceSchedule_; }
  // Why not, in words (empty when it does).
  const std::string& deviceScheduleWhyNot() const { return deviceScheduleWhyNot_; }
  // Waits until the runner (if any) has finished every call queued on it: the calling thread may
  // then use the communicator's state.
  Status quiesce();

  // --- failure ---
  // Marks the communicator failed with st (first error wins), tells the other ranks, and closes
  // its connections so that peers blocked on it fail promptly instead of waiting for their
  // deadline.
  void fail(const Status& st);
  Status asyncError() const { return failure_.error(); }
  // A failure another rank reported, checked at most every 10 ms (never blocks). The executor
  // calls it while it waits.
  Status pollRemoteFailure() { return failure_.pollRemote(); }
  // Ranks known to be dead (processes on this host that no longer exist), as a sentence for
  // error messages ("" if none is known): when a connection breaks, the rank that closed it may
  // only be reporting another rank's death.
  std::string deadPeers() const;
  // Whether a transport error says the peer went away (Cause::kPeerGone: it closed or reset its
  // end, its process is gone, or it deregistered the buffer an RDMA write was aimed at).
  static bool isClosedPeer(const Status& st);
  // What to add to such an error: the failure report that explains why the peer closed (it may
  // have failed because of another rank), waited for up to 250 ms, and the ranks known dead.
  std::string closedPeerHint();
  // The failure another rank reported, waiting up to ms for it (OK when none came).
  Status remoteFailure(int ms) { return failure_.awaitRemote(ms); }
  // st from a wait on shared-memory flags (the low-latency and one-pass paths), explained as
  // above and prefixed with what.
  Status explainLocalWait(Status st, const std::string& what);
  bool aborted() const { return failure_.aborted(); }
  const std::atomic<bool>* abortFlag() const { return failure_.abortFlag(); }
  // Sets the abort flag and wakes blocked calls; safe from any thread.
  void requestAbort() { failure_.requestAbort(); }

 private:
  Comm() = default;
  Status initNet(const loomConfig_t* config);
  void computeLocality();
  // deviceSchedule's answer, from peers_, and why not (for the runner's log).
  bool findDeviceSchedule(std::string* whyNot) const;
  // Builds system_ from every rank's PeerInfo::topo.
  Status buildSystem();
  // Collective over all ranks (every rank calls it, whatever its host): sets up shared memory
  // among the ranks of each host, or leaves them on the network when it cannot (with a warning).
  Status initShm();
  // After initShm: the transport table (the network and, for this host's ranks, shared memory).
  void buildTransportTable();
  Status buildPlanner();
  Result<const DispatchFacts*> rebuildDispatchFacts();

  // Identity and placement.
  int rank_ = 0;
  int nranks_ = 0;
  std::string name_;
  int64_t timeoutMs_ = 0;
  uint64_t secret_ = 0;
  std::vector<PeerInfo> peers_;
  topo::SystemTopo system_;
  std::shared_ptr<const RankLayout> rankLayout_;
  int splitCount_ = 0;
  bool deviceSchedule_ = false;  // deviceSchedule()
  std::string deviceScheduleWhyNot_;
  std::string gdrWhyNot_;  // why this rank publishes no kPeerNetCuda (empty: it does)
  int localRanks_ = 1;
  int64_t spinNs_ = 0;
  bool yieldWhenIdle_ = false;

  // The pieces. ~Comm releases the registrations' handles, then closes the connections.
  FailureState failure_;
  std::unique_ptr<Bootstrap> bootstrap_;
  net::Transport* net_ = nullptr;  // the process's network transport (not owned)
  Registrations registrations_;
  Connections connections_;

  // Shared memory with this host's ranks.
  std::unique_ptr<shm::HostGroup> shm_;
  uint64_t llSeq_ = 0;
  size_t llMax_ = 0;
  bool onePassReach_ = false;  // shm_->rings().everyPairCanReach(), fixed once the probes ran
  bool oneProcess_ = false;    // shm_->rings().allOneProcess()
  int onePassSkip_ = 0, onePassBackoff_ = 0;
  ResultTileChoice resultTiles_[2];

  std::unique_ptr<DeviceRunner> runner_;

  // Decisions.
  std::unique_ptr<ScheduleCache> schedules_;
  std::unique_ptr<Planner> planner_;
  std::mutex planMu_;
  std::unordered_map<CacheKey, std::shared_ptr<const Plan>, CacheKeyHash>
      planChoices_;                                 // by call shape and filter
  std::set<std::string> planLogged_;                // call shapes whose decision rank 0 logged
  std::shared_ptr<const AlgoFilter> algoOverride_;  // loomCommSetAlgo; used by the calling thread
  // dispatchFacts(): the facts in force, and the ones built (each with the filter it points to).
  struct BuiltFacts {
    DispatchFacts facts;
    std::shared_ptr<const AlgoFilter> filter;
  };
  static constexpr size_t kKeptFacts = 16;
  std::mutex factsMu_;  // factsBuilt_, and a rebuild
  std::deque<std::unique_ptr<BuiltFacts>> factsBuilt_;
  std::atomic<const DispatchFacts*> facts_{nullptr};
  std::atomic<uint64_t> factsGeneration_{0};  // paramsGeneration() facts_ was built at
};

}  // namespace loom
