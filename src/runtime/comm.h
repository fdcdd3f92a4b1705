// The communicator: a rank's view of its peers, its bootstrap, its network connections and the
// state that makes every failure visible (async error, abort flag).
//
// Thread safety: one thread drives a communicator at a time (the public API's rule); abort() and
// asyncError() may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "algorithms/planner.h"
#include "loom/loom.h"
#include "src/bootstrap/bootstrap.h"
#include "src/core/status.h"
#include "topology/discover.h"
#include "topology/system.h"
#include "transports/net.h"
#include "transports/shm/shm_transport.h"

namespace loom {

class PlanCache;
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
  uint32_t cores = 0;  // CPUs this process may run on

  std::string serialize() const;
  static Result<PeerInfo> deserialize(const std::string& blob);
};

// This process's host identity: LOOM_HOSTID, else hostname plus the kernel boot id.
std::string localHostId();

// This host's topology (LOOM_TOPO_FILE, or discovery), computed once per process. When it cannot
// be had, a warning says why and the graph is empty (the communicator still works).
const topo::Graph& localTopology();

// One direction of one (peer, channel) connection.
struct Connection {
  void* comm = nullptr;      // transport sendComm / recvComm
  bool ready = false;        // send side: hello posted; recv side: hello received
  void* helloReq = nullptr;  // send side: the hello's request until it completes
  unsigned char hello[24] = {};
};

class Comm {
 public:
  ~Comm();

  // Collective init over nranks ranks through the rendezvous named by id.
  static Result<std::unique_ptr<Comm>> create(const UniqueIdInfo& id, int nranks, int rank,
                                              const loomConfig_t* config);
  // Collective over this comm: the communicator of the ranks with the same color (nullptr for
  // LOOM_SPLIT_NOCOLOR).
  Result<std::unique_ptr<Comm>> split(int color, int key, const loomConfig_t* config);

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  const PeerInfo& peer(int r) const { return peers_[r]; }
  const std::string& name() const { return name_; }
  int64_t timeoutMs() const { return timeoutMs_; }
  // The network transport (sockets); transportFor(peer) is what carries traffic to that peer:
  // shared memory for ranks of this host when it is set up, else the network.
  net::Transport* transport() const { return net_; }
  net::Transport* transportFor(int peer, int channel) const {
    return shm_ && channel == 0 && localIndex_[peer] >= 0 ? static_cast<net::Transport*>(shm_.get())
                                                          : net_;
  }
  // The shared-memory transport of this host's ranks (nullptr when they are alone, shared
  // memory is disabled, or it could not be set up).
  shm::Transport* shm() const { return shm_.get(); }
  // Every rank of this communicator shares this host and its shared memory.
  bool allLocal() const { return shm_ && shm_->nlocal() == nranks_; }
  // Sequence number of the next low-latency operation (the same on every rank).
  uint64_t nextLlSeq() { return ++llSeq_; }
  // Largest contribution (bytes per rank) of the low-latency exchange: LOOM_SHM_LL_MAX as read at
  // init, bounded by the buffers; 0 without shared memory.
  size_t llMax() const { return llMax_; }
  PlanCache& plans() { return *plans_; }
  // The cost-model planner of this communicator (built at init from the exchanged topology and
  // rank 0's kernel speeds: the same on every rank).
  const Planner* planner() const { return planner_.get(); }
  // The planner's choice for op under filter, computed once per call shape and logged (PLAN).
  Result<Plan> planFor(const CollArgs& args, size_t elemSize, const AlgoFilter& filter);
  // loomCommSetAlgo: this communicator's algorithm filter in place of LOOM_ALGO's (null: none).
  void setAlgoOverride(std::shared_ptr<const AlgoFilter> f) { algoOverride_ = std::move(f); }
  const std::shared_ptr<const AlgoFilter>& algoOverride() const { return algoOverride_; }

  // Nonblocking connection setup, driven by the executor. Returns the transport comm once the
  // connection is usable, nullptr while it is being established.
  Result<void*> sendConn(int peer, int channel);
  Result<void*> recvConn(int peer, int channel);
  void* listenComm() const { return listenComm_; }
  // Describes a rank for error messages: "rank 3 (host h1, pid 1234)".
  std::string describe(int r) const;
  // Ranks known to be dead (processes on this host that no longer exist), as a sentence for
  // error messages ("" if none is known): when a connection breaks, the rank that closed it may
  // only be reporting another rank's death.
  std::string deadPeers() const;

  // Marks the communicator failed with st (first error wins) and closes its connections so that
  // peers blocked on it fail promptly instead of waiting for their deadline.
  void fail(const Status& st);
  Status asyncError() const;
  // A failure another rank reported (or a ring neighbour's death), checked at most every 10 ms
  // (never blocks). The executor calls it while it waits.
  Status pollRemoteFailure();
  // Waits up to ms for the failure report of a rank whose connection just closed: a rank that
  // fails reports why over the bootstrap ring before it closes its data connections, but the
  // close can arrive first. Returns the report (naming the rank that failed first), or OK.
  Status awaitRemoteFailure(int ms);
  // Whether a transport error says the peer went away (Cause::kPeerGone: it closed or reset its
  // end, its process is gone, or it deregistered the buffer an RDMA write was aimed at).
  static bool isClosedPeer(const Status& st);
  // What to add to such an error: the failure report that explains why the peer closed (it may
  // have failed because of another rank), waited for up to 250 ms, and the ranks known dead.
  std::string closedPeerHint();
  // st from a wait on shared-memory flags (the low-latency and one-pass paths), explained as
  // above and prefixed with what.
  Status explainLocalWait(Status st, const std::string& what);
  bool aborted() const { return abort_.load(std::memory_order_acquire); }
  const std::atomic<bool>* abortFlag() const { return &abort_; }
  // Sets the abort flag and wakes blocked calls; safe from any thread.
  void requestAbort();

  // Scratch memory reused across calls (64-byte aligned). It is registered with the network
  // transport like a user buffer (it is Loom's, and reused): a block that grows is deregistered
  // and the new one registered. Called only while no request of this comm is in flight.
  char* scratch(size_t bytes);

  // Buffer registration (loomCommRegister): the range [buff, buff + size) is kept until
  // deregisterBuffer; ranges may overlap. The handle is opaque, never null, and unique in the
  // process (a stale or foreign handle is recognised, never dereferenced).
  Result<void*> registerBuffer(void* buff, size_t size);
  // Releases the registration and the transport handles made for it (deregMr on every
  // connection). Deregistering while a request that uses the range is in flight is the caller's
  // bug (as in NCCL).
  Status deregisterBuffer(void* handle);
  // The network transport's memory handle for [p, p + n) on connection conn (a sendComm or
  // recvComm of transport()), or nullptr when no registration contains the range (the transport
  // then registers the buffer per message). Made lazily with regMr over the whole registration,
  // once per (connection, registration), and cached until the registration or the connection
  // goes. A failed regMr is logged once and the range goes the per-message way on that
  // connection. Cheap when nothing is registered; O(log registrations) otherwise.
  void* netMemHandle(void* conn, const void* p, size_t n);
  // Registrations alive (user ones, and the scratch block's when it exists).
  size_t registrationCount() const;

  // Calls currently running on this comm (abort waits for them to leave).
  std::atomic<int> activeCalls{0};
  // Ranks (threads or processes) of this communicator on this host.
  int localRanks() const { return localRanks_; }
  // Hosts, ranks per host and the devices of every rank, the same on every rank.
  const topo::SystemTopo& system() const { return system_; }
  // The same as a RankLayout for the schedule generators (hosts from system(), rings by host then
  // rank, one channel), built once with it.
  const std::shared_ptr<const RankLayout>& rankLayout() const { return rankLayout_; }
  // How long the progress loop polls (yielding the core between polls) without progress before
  // it sleeps in poll(): LOOM_SPIN_US.
  int64_t spinNs() const { return spinNs_; }
  // More ranks of this host than usable CPUs: waits yield the core between polls.
  bool yieldWhenIdle() const { return yieldWhenIdle_; }
  // One-pass attempts on buffers of unknown kind (shared_direct.h). An attempt that finds some
  // rank's buffers out of reach (or too dear to reach) costs a flag round; after each such miss
  // the next 1, 2, 4 ... 256 candidate calls skip the attempt. Every rank sees the same outcome of
  // every attempt, so every rank skips the same calls. mappedAttemptDue consumes one skip.
  bool mappedAttemptDue();
  void noteMappedAttempt(bool ran);

 private:
  Comm() = default;
  Status initNet(const loomConfig_t* config);
  Status acceptPending();
  void closeConnections();

  // One registered range and the transport handles made for it, per connection.
  struct Registration {
    uint64_t id = 0;
    uintptr_t begin = 0, end = 0;
    bool internal = false;            // Loom's scratch block: not the user's to deregister
    bool warned = false;              // a regMr failure was logged
    std::map<void*, void*> mhandles;  // connection -> regMr's handle (nullptr: regMr failed)
  };
  uint64_t addRegistration(uintptr_t begin, size_t size, bool internal);
  // Caller holds regMu_; false when id is not registered.
  bool dropRegistrationLocked(uint64_t id);
  // deregMr of every handle made on the network connections (before they close).
  void releaseNetHandles();
  // deregMr of r's handles on every connection; caller holds regMu_.
  void releaseHandlesLocked(Registration* r);
  mutable std::mutex regMu_;  // the executor reads the map; loomCommDeregister may run elsewhere
  std::multimap<uintptr_t, std::unique_ptr<Registration>> regs_;  // by begin
  std::map<uint64_t, Registration*> regById_;
  std::set<uint64_t> deregistered_;  // recent ids, to tell "deregistered twice" (bounded)
  size_t regMaxLen_ = 0;             // the longest range registered since the map was empty
  uint64_t scratchRegId_ = 0;

  int rank_ = 0;
  int nranks_ = 0;
  std::string name_;
  int64_t timeoutMs_ = 0;
  uint64_t secret_ = 0;
  std::unique_ptr<Bootstrap> bootstrap_;
  std::vector<PeerInfo> peers_;
  net::Transport* net_ = nullptr;
  void* listenComm_ = nullptr;
  std::map<std::pair<int, int>, Connection> send_, recv_;
  struct Pending {
    void* comm;
    void* req;
    unsigned char hello[24];
  };
  std::vector<std::unique_ptr<Pending>> pendingAccepts_;  // accepted, hello not yet read
  std::unique_ptr<PlanCache> plans_;
  std::unique_ptr<Planner> planner_;
  std::mutex planMu_;
  std::map<std::string, Plan> planChoices_;         // by call shape and LOOM_ALGO
  std::shared_ptr<const AlgoFilter> algoOverride_;  // loomCommSetAlgo; used by the calling thread
  Status buildPlanner();
  std::atomic<bool> abort_{false};
  mutable std::mutex errMu_;
  Status error_;
  std::atomic<bool> failed_{false};
  std::unique_ptr<char[]> scratchMem_;
  char* scratchAligned_ = nullptr;
  size_t scratchBytes_ = 0;
  int splitCount_ = 0;
  int localRanks_ = 1;
  int64_t lastFailurePoll_ = 0;
  int64_t spinNs_ = 0;
  bool yieldWhenIdle_ = false;
  int mappedSkip_ = 0, mappedBackoff_ = 0;
  std::unique_ptr<shm::Transport> shm_;
  std::vector<int> localIndex_;  // rank -> index among the ranks on shared memory, or -1
  uint64_t llSeq_ = 0;
  size_t llMax_ = 0;
  topo::SystemTopo system_;
  std::shared_ptr<const RankLayout> rankLayout_;
  void computeLocality();
  // Builds system_ from every rank's PeerInfo::topo.
  Status buildSystem();
  // Collective over all ranks (every rank calls it, whatever its host): sets up shared memory
  // among the ranks of each host, or leaves them on the network when it cannot (with a warning).
  Status initShm();
};

}  // namespace loom
