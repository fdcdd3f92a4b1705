// Bootstrap: how ranks find each other before any transport exists.
//
// loomGetUniqueId opens a root listener in the calling process (a thread that lives until every
// rank of one communicator has checked in, or LOOM_TIMEOUT passes) and packs its address, port and
// a random 64-bit secret into the id. Each rank connects to the root, presents the secret, its
// rank, nranks, the address of its own bootstrap listener and an opaque blob (host identity and
// transport addresses, chosen by the runtime), and receives every rank's listener address and
// blob. A connection that does not present the secret (a stranger, a port scanner, a rank of
// another job) is dropped and logged; the real ranks still form the communicator. After that the
// ranks are joined in a ring (each connects to its successor's listener and accepts its
// predecessor, again checking the secret) over which allGather and barrier run.
//
// Every wait has a deadline and aborts when the abort flag is raised (loomCommAbort).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/loom.h"
#include "src/core/clock.h"
#include "src/core/status.h"
#include "transports/socket/socket_util.h"

namespace loom {

// What a loomUniqueId carries (serialised into its 128 bytes).
struct UniqueIdInfo {
  SockAddr root;
  uint64_t secret = 0;
};
void packUniqueId(const UniqueIdInfo& info, loomUniqueId* id);
Result<UniqueIdInfo> unpackUniqueId(const loomUniqueId& id);

// Opens a root listener on the default interface (or at `at` if given) and starts the root thread
// that serves one rendezvous. Fills id.
Status createRootAndId(loomUniqueId* id, const SockAddr* at = nullptr, uint64_t secret = 0);

// Rank and size taken from a launcher's environment.
struct EnvLaunch {
  int rank = -1;
  int nranks = 0;
  int localRank = -1;
  std::string source;  // "LOOM_COMM_ID", "torchrun", "Open MPI", "Slurm"
  UniqueIdInfo id;     // root address and secret every rank derives the same way
};
// Reads LOOM_COMM_ID / MASTER_ADDR+MASTER_PORT (port + LOOM_BOOTSTRAP_PORT_OFFSET) for the root,
// and RANK/WORLD_SIZE/LOCAL_RANK, OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK or
// SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID for the rank. The secret is LOOM_COMM_SECRET, or a hash
// of the root address, size and job id. Error naming what is missing when the environment does
// not describe a job.
Result<EnvLaunch> launchFromEnv();
// For LOOM_COMM_ID with loomGetUniqueId/CommInitRank: rank 0 must host the root at that address.
// Starts it (once per process and address).
Status startRootAt(const UniqueIdInfo& info);

class Bootstrap {
 public:
  ~Bootstrap();

  // Rendezvous through the root named by id. `blob` is this rank's info; afterwards blob(r) is
  // rank r's. Blocks until every rank has checked in, the deadline, or *abort.
  static Result<std::unique_ptr<Bootstrap>> connect(const UniqueIdInfo& id, int rank, int nranks,
                                                    const std::string& blob,
                                                    const Deadline& deadline,
                                                    const std::atomic<bool>* abort);

  // A bootstrap among a subset of an existing communicator's ranks (CommSplit): the caller has
  // exchanged every member's listener address and blob already (through the parent).
  struct Member {
    SockAddr listener;
    std::string blob;
  };
  // Opens a listener for a later joinRing() (see listenAddress()). The listener is on the
  // interface that reaches `near` (pass the parent's listenAddress() so that a split of a
  // loopback communicator stays on loopback), or on the default interface when near is null.
  static Result<std::unique_ptr<Bootstrap>> prepare(uint64_t secret,
                                                    const SockAddr* near = nullptr);
  const SockAddr& listenAddress() const;
  // Joins the ring among members (members[rank] is this one; every member calls it with the same
  // list). Blocks until both ring neighbours are connected, the deadline, or *abort. Only after
  // prepare(), once.
  Status joinRing(int rank, std::vector<Member> members, const Deadline& deadline,
                  const std::atomic<bool>* abort);

  int rank() const;
  int nranks() const;
  const std::string& blob(int rank) const;
  uint64_t secret() const;

  // all must hold nranks * bytes; all[rank*bytes..] = mine on every rank (mine may point there).
  // Every rank must call it with the same bytes. A failure (a peer died, the deadline passed)
  // is passed on to the other ranks over the ring and breaks the bootstrap: later calls return
  // the same error. allGather and barrier are not thread safe against each other.
  Status allGather(const void* mine, size_t bytes, void* all, const Deadline& deadline);
  Status barrier(const Deadline& deadline);
  // Wakes any blocked call (it returns kAborted) and closes the sockets. Thread safe.
  void abort();

  // Failure propagation between collectives: reportFailure tells both ring neighbours that this
  // rank failed, with st's message, and breaks the bootstrap; pollFailure (never blocks) returns
  // the failure a neighbour reported, or its death, and passes it on around the ring. So a failure
  // seen by one rank reaches every rank, even ranks that share no data connection with it, within
  // a few milliseconds per hop. Both are called by the thread that drives the communicator.
  void reportFailure(const Status& st);
  Status pollFailure();

  struct Impl;

 private:
  explicit Bootstrap(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom
