// Cost model: predicts how long a schedule takes on a modelled machine by simulating the lowered
// schedule (pieces and their dependencies, as the executor runs them) of every rank together.
//
// The simulation is discrete-event with fluid bandwidth sharing:
// - Each rank's schedule is lowered exactly as the runtime lowers it (lowerSchedule with the rank's
//   buffer layout and the same piece size), so pipelining, staging and dependencies are the
//   executor's. A piece starts when its dependencies have completed; network pieces (Send, Recv,
//   RecvReduce) are posted in order per (peer, channel, direction) queue, each once its own
//   dependencies are done and the queue's earlier pieces are posted.
// - The k-th send piece from a to b on channel c and the k-th receive piece of b from a on c form
//   one transfer (rendezvous): it is ready when both are posted. The transfers of one connection
//   (a, b, c) are served one after the other in that order; each occupies the connection for
//   alpha (no bandwidth used: per-message latency and overhead, not overlapped with the previous
//   message of the same connection) and then moves its bytes as a fluid flow. Transfers on
//   different connections, hence on different channels, proceed concurrently.
// - Flows share resources max-min fairly (progressive filling): each host's NIC egress and ingress
//   (inter-host transfers), each rank's memory (intra-host transfers of both endpoints, local
//   copies and reductions of that rank); each flow is also capped by its own rate (the link's
//   bytesPerSec, or the reduce / copy speed).
// - The send piece completes when its transfer's bytes have moved. A Recv piece completes with the
//   transfer; a RecvReduce piece then reduces its piece (a flow at reduceBytesPerSec on the
//   receiver's memory) and completes after it: receive into staging, then reduce, as the executor
//   does without a fusing transport. With fuseIntraRecvReduce, an intra-host RecvReduce instead
//   reduces while it receives (the shared-memory transport's irecvReduce): one flow capped by the
//   slower of the link and the reduction.
// - Copy and Reduce pieces are local flows at copyBytesPerSec / reduceBytesPerSec.
//
// What it ignores: the executor's single progress thread (local work of one rank only shares
// memBytesPerSec, it is not serialized unless memBytesPerSec says so), the transports' inflight
// limits and internal chunking, eager (non-rendezvous) sends, protocol differences by message size,
// topology inside a host (all intra-host pairs cost alike) and inside the network (full bisection:
// only the hosts' ports are shared), cache effects, and the final LOOM_AVG division.
//
// Pricing speed is proportional to the number of pieces times the number of concurrent flows: a
// larger pieceBytes prices faster and fewer pieces pipeline less (closer to the step-level
// alpha-beta formulas); pricing with the runtime's LOOM_CHUNK_SIZE predicts what the runtime does.
#pragma once

#include <cstddef>
#include <vector>

#include "algorithms/schedule.h"
#include "src/core/status.h"

namespace loom {

// One class of link. A rate of 0 means unlimited.
struct LinkCost {
  double alphaSec = 0;     // seconds per message (piece), serialized per connection
  double bytesPerSec = 0;  // the most one connection (peer pair and channel) moves per second
};

// The machine a schedule is priced on. Every rate is in bytes per second, 0 meaning unlimited
// (free); the runtime fills it from the topology and measured kernel speeds.
struct CostMachine {
  std::vector<int> hostOf;  // rank -> host id (any non-negative ints); size = nranks
  LinkCost intra;           // between two ranks of one host (shared memory)
  LinkCost inter;           // between ranks of different hosts (network)
  // Each host's network port, per direction: shared by all transfers leaving (egress) or entering
  // (ingress) the host. Rail-optimized multi-NIC hosts: the sum of their ports.
  double nicBytesPerSec = 0;
  // Each rank's memory / copy engine: shared by its copies, its reductions, and the intra-host
  // transfers it sends or receives (each counts the piece's bytes once).
  double memBytesPerSec = 0;
  double reduceBytesPerSec = 0;  // gamma^-1: bytes one rank reduces per second (one piece)
  // process_vm_readv/writev's time over memcpy's for the same bytes (0: unknown), for the one
  // pass over peers' plain buffers (the runtime's dispatch).
  double cmaSlowdown = 0;
  double copyBytesPerSec = 0;  // local Copy steps
  // Per host id (hostOf's values; missing or 0: unlimited): the cores' copy bandwidth that all
  // ranks of the host share, for hosts with more ranks than cores. A rank's copies and
  // reductions count once; an intra-host transfer twice (the sender copies in, the receiver
  // copies out). Ranks that wait leave their share to the busy ones.
  std::vector<double> hostMemBytesPerSec;
  // Per host id (missing or 0: memBytesPerSec): the most one rank of the host moves per second,
  // for hosts with more ranks than cores. A rank that does more than its share of the work (the
  // root of a direct broadcast) cannot take a whole core while its peers wait on the others: they
  // wait by yielding, and each yield takes the core back for a moment.
  std::vector<double> hostRankMemBytesPerSec;
  // Intra-host RecvReduce reduces while receiving (the shm transport fuses them) instead of
  // receiving into staging and reducing afterwards.
  bool fuseIntraRecvReduce = false;
  // The inter-host alpha of the transfers a rank sends is paid one after another (the sender's
  // CPU posts each message: LogP's o), not once per connection in parallel: a rank sending to k
  // hosts' ranks at once pays k alphas before its last message starts.
  bool serialInterAlphaPerRank = false;

  // nranks ranks, ranksPerHost consecutive ranks per host (the last host may hold fewer).
  static CostMachine uniform(int nranks, int ranksPerHost);
};

// Hosts of CPU ranks as the runtime prices them (Comm::buildPlanner) and loom-sim predicts them:
// ranks on host memory, shared memory inside a host (or sockets when it is off), the network
// between hosts, every rate measured once (rank 0's copy and reduction speeds) so that every rank
// derives the same machine.
struct HostCluster {
  std::vector<int> hostOf;             // rank -> host index (0 .. hosts-1)
  std::vector<uint32_t> coresPerHost;  // CPUs a host's ranks may run on (0: unknown)
  double memcpyBytesPerSec = 5e9;
  double reduceBytesPerSec = 4e9;
  double cmaSlowdown = 0;            // process_vm_readv/writev against memcpy (0: unknown)
  double netBytesPerSec = 10e9 / 8;  // one port per host
  double netAlphaSec = 30e-6;
  double shmAlphaSec = 2e-6;
  bool shm = true;  // false: ranks of one host talk over sockets too (LOOM_SHM_DISABLE)
};
CostMachine hostCostMachine(const HostCluster& c);

struct CostEstimate {
  double seconds = 0;               // completion of the last piece of any rank (all start at 0)
  std::vector<double> rankSeconds;  // per rank: completion of its last piece (0: no pieces)
  double bytesInter = 0;            // bytes moved between hosts, all transfers
  double bytesIntra = 0;            // bytes moved between ranks of one host
  double bytesReduced = 0;          // bytes reduced (RecvReduce and Reduce pieces), all ranks
  double bytesCopied = 0;           // bytes of Copy pieces, all ranks
  double maxNicBytes = 0;           // the busiest host port direction's bytes
  size_t messagesInter = 0;         // transfers (pieces) between hosts
  size_t messagesIntra = 0;         // transfers within a host
  int maxSteps = 0;                 // most schedule steps of any rank (before lowering)
  size_t maxPieces = 0;             // most pieces of any rank (after lowering)
  size_t events = 0;                // simulation events processed (pricing cost)
};

// Prices schedule (every rank's steps) on machine: elemSize bytes per element, pieces of
// pieceBytes bytes as the executor splits steps (pieceElems = max(1, pieceBytes / elemSize), as
// the runtime computes it from LOOM_CHUNK_SIZE; 0 = steps are not split). Errors: inconsistent
// arguments (hostOf size, elemSize 0, negative rates, bad peers), a transfer whose two sides
// differ in size, and schedules that cannot finish (deadlock or unmatched transfers), which the
// simulation detects instead of hanging. Pure function; thread-safe.
Result<CostEstimate> estimateCost(const Schedule& schedule, const CostMachine& machine,
                                  size_t elemSize, size_t pieceBytes);

}  // namespace loom
