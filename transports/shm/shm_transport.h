// The shared-memory transport: ranks of one communicator on one host exchange messages through a
// POSIX shared segment, without a system call on the data path.
//
// Layout of the segment (all offsets, no pointers, so every rank may map it anywhere):
//   header | per-rank areas (state, futex doorbell, low-latency buffers) | can-read matrix |
//   one single-producer/single-consumer ring of slots per ordered pair of local ranks.
// Protocols on a ring, chosen per message by the sender:
//   - eager: the payload is copied into slots (several slots for a message larger than one) and
//     out again by the receiver (two copies, lowest latency);
//   - single copy ("RTS"): the slot carries the sender's address, and the receiver copies the
//     message straight out of the sender's memory: with memcpy when both ranks are threads of one
//     process, with process_vm_readv (cross-memory attach) between processes when the kernel
//     allows it (probed at init: ptrace rules may forbid it, then eager is used). The send
//     completes when the receiver acknowledges.
// A receive may reduce instead of copy (irecvReduce): the incoming bytes are combined with a local
// buffer as they are read (from the slot, the peer's memory, or a cache-sized bounce buffer for
// process_vm_readv), so received data crosses memory once.
//
// Waiting: a rank that has nothing to do sleeps on its doorbell (a process-shared futex) after
// registering as a waiter; peers ring the doorbell only when someone waits, so the fast path is
// plain loads and stores. Peers that die are detected by pid (and by the state word they set when
// they fail or close), never by waiting for a deadline alone.
//
// Threads: an instance belongs to one rank of one communicator and is driven by one thread at a
// time (transports/net.h states the rule). Each rank (thread or process) owns its own instance
// over the shared segment.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loom/loom.h"
#include "src/core/clock.h"
#include "src/core/status.h"
#include "transports/net.h"
#include "transports/shm/shared_alloc.h"
#include "transports/shm/shm_segment.h"

namespace loom::shm {

struct Options {
  size_t slotBytes = 64 << 10;  // payload bytes per slot (a multiple of 64)
  int slots = 8;                // slots per ring
  size_t llBytes = 64 << 10;    // low-latency buffer per rank (two of them)
  size_t rtsMin = 64 << 10;     // messages at least this large use single copy when possible
  // Single copy (LOOM_SHM_SINGLE_COPY): between threads of one process (memcpy from the peer's
  // buffer), and between processes with process_vm_readv where the kernel allows it.
  bool singleCopyThreads = true;
  bool singleCopyProcesses = false;
  // Between processes, messages from loomMemAlloc buffers are read through a mapping of the
  // sender's allocation (no system call per message), where /proc/<pid>/fd may be opened.
  bool singleCopyMapped = true;
  // The one-pass collectives (LOOM_SHM_MAPPED_CMA) may read and write plain buffers of other
  // processes with process_vm_readv/writev: probe whether the kernel allows it.
  bool cmaOnePass = true;
  bool yieldWhenIdle = false;       // waits yield the core between polls (more ranks than cores)
  size_t budgetBytes = 256u << 20;  // rings shrink (slot size, then count) to fit this total
};

// The geometry every rank derives from (nlocal, options): rings shrunk to fit the budget.
Options fitOptions(int nlocal, Options opts);
size_t segmentBytes(int nlocal, const Options& opts);

struct LocalPeer {
  int rank = 0;  // rank in the communicator (for messages)
  int pid = 0;
};

enum class PeerState : uint32_t { kAlive = 0, kClosed = 1, kFailed = 2 };

class Transport final : public net::Transport {
 public:
  // Formats a freshly created segment (the creator calls it once, before anyone opens it).
  static void format(char* base, int nlocal, const Options& opts);
  // Wraps a mapped, formatted segment. peers[i] is local rank i; me is this rank's index.
  static Result<std::unique_ptr<Transport>> attach(std::unique_ptr<Segment> seg, int me,
                                                   std::vector<LocalPeer> peers, Options opts,
                                                   const std::atomic<bool>* abortFlag);
  ~Transport() override;

  // Single-copy setup, between barriers of all local ranks: publishProbe(); barrier;
  // probePeers(); barrier; then sends pick their protocol from what the receivers could read.
  void publishProbe();
  void probePeers();
  // "single copy with 3 peers (process_vm_readv), eager with 0" and the like, for the log.
  std::string singleCopySummary() const;
  bool receiverCanRead(int local) const;  // can local rank `local` read this rank's memory?
  // Can local rank `reader` map local rank `owner`'s shared allocations (loomMemAlloc)?
  bool canMapShared(int reader, int owner) const;
  // May local rank `reader` use process_vm_readv/writev on local rank `owner`'s memory (another
  // process, ptrace rules permitting; probed at init when Options::cmaOnePass or
  // singleCopyProcesses)?
  bool canCma(int reader, int owner) const;
  // Can every local rank reach the buffers of every local rank in another process, by mapping its
  // shared allocations or through process_vm_readv/writev? Threads of one process reach each
  // other's memory anyway. The same answer on every rank.
  bool everyPairCanReach() const;
  // Are all local ranks threads of this process?
  bool allOneProcess() const;
  int peerPid(int local) const { return peers_[local].pid; }
  // This process's view of bytes at ref in local rank i's shared allocation (read and write),
  // mapped on first use.
  Result<char*> mapPeerShared(int local, const SharedRef& ref, size_t bytes);

  Segment& segment() { return *seg_; }
  int localIndex() const { return me_; }
  int nlocal() const { return static_cast<int>(peers_.size()); }
  const Options& options() const { return opts_; }

  // The send and receive comm to/from local rank i (made at attach; no connection phase).
  void* sendComm(int local);
  void* recvComm(int local);
  // The local index of communicator rank `rank`, or -1 when it is not on this segment.
  int localOf(int rank) const;

  // Sets this rank's state word (peers waiting on it see it at once) and rings every doorbell.
  // Failed or closed: returns once no peer still reads this rank's buffers (single copy) or works
  // in a one pass over them (at most 5 s; a peer whose process is gone stops mattering).
  void setState(PeerState s);
  // Around a one pass over the peers' buffers (src/runtime/shared_direct.h): beginOnePass says
  // this rank is about to touch them, then fails (without touching anything) if a peer has
  // failed or closed; endOnePass says it is done. Call endOnePass before failing, so that peers
  // failing at the same time do not wait for this rank.
  Status beginOnePass();
  void endOnePass();

  // --- the low-latency exchange (flag per rank and sequence, double-buffered) ---
  // The buffer rank `local` writes for sequence seq (options().llBytes bytes).
  char* llBuffer(int local, uint64_t seq);
  // Publishes this rank's buffer for seq with `bytes` valid bytes and a caller-defined signature
  // (the operation's shape: readers check it matches theirs), and wakes waiting peers.
  void llPublish(uint64_t seq, uint64_t bytes, uint64_t signature);
  // Waits until every local rank published seq and checks that their signatures equal
  // `signature`. Every rank publishes every sequence (a broadcast's non-roots publish 0 bytes):
  // a rank reuses its buffer for seq + 2 only after it saw every rank publish seq + 1, which they
  // do only after they finished reading seq, so no buffer is overwritten while being read.
  Status llWaitAll(uint64_t seq, uint64_t signature, int64_t spinNs, int64_t timeoutMs);

  // --- what a waiting rank reads of a peer (each a fresh acquire load) ---
  uint64_t peerLlSeq(int local) const;      // the last low-latency sequence it published
  bool messageQueuedFrom(int local) const;  // a slot from it this rank has not consumed yet
  PeerState peerState(int local) const;

  // Test seam: called by a waiting rank's periodic check after it saw that local peer `local` has
  // not yet done what it waits for, before it reads the evidence it judges the peer on (the
  // low-latency wait and a request's wait). A test installs one to hold the rank there while the
  // peer moves on (issue 21); null (the default) costs one load per check, every 20 ms.
  enum class CheckPoint { kLowLatencyWait, kRequestWait };
  using CheckHook = void (*)(Transport* t, int local, CheckPoint where);
  static void setCheckHookForTesting(CheckHook hook);

  // --- net::Transport ---
  const char* name() const override { return "shm"; }
  int devices() const override { return 1; }
  Status getProperties(int dev, net::Properties* props) const override;
  Status listen(int dev, net::Handle* handle, void** listenComm) override;
  Status connect(int dev, const net::Handle& handle, void** sendComm) override;
  Status accept(void* listenComm, void** recvComm) override;
  Status regMr(void* comm, void* data, size_t size, int type, void** mhandle) override;
  Status deregMr(void* comm, void* mhandle) override;
  Status isend(void* sendComm, const void* data, size_t size, int tag, void* mhandle,
               void** request) override;
  Status irecv(void* recvComm, int n, void** data, const size_t* sizes, const int* tags,
               void** mhandles, void** request) override;
  bool supportsRecvReduce() const override { return true; }
  Status irecvReduce(void* recvComm, void* dst, const void* src, size_t size, int tag,
                     loomDataType_t dt, loomRedOp_t op, void** request) override;
  Status test(void* request, int* done, size_t* sizes) override;
  Status closeSend(void* sendComm) override;
  Status closeRecv(void* recvComm) override;
  Status closeListen(void* listenComm) override;
  void waitActivity(void* const* requests, int n, void* listenComm, int timeoutMs) override;
  // waitActivity with a finer deadline: the executor naps this long on the doorbell while socket
  // requests are also in flight (a socket's arrival does not ring the doorbell, so the nap must
  // be short for it to be noticed soon).
  void waitActivityUs(int64_t timeoutUs);
  bool napUs(int64_t timeoutUs) override {
    waitActivityUs(timeoutUs);
    return true;
  }
  // The connections to the other ranks of this host exist from attach; channel 0 only (the other
  // channels of a ring go over the network, so that they do not share the slot rings).
  void* presetSendComm(int rank) override;
  void* presetRecvComm(int rank) override;
  net::Reach reach(int rank, int channel) const override;
  bool wantsRegistration() const override { return false; }

  struct Request;
  struct SendComm;
  struct RecvComm;
  struct RankArea;
  struct Ring;

 private:
  Transport() = default;
  RankArea* area(int local) const;
  Ring* ring(int from, int to) const;
  uint8_t* canRead(int reader, int owner) const;

  Status progressSend(SendComm* c);
  Status progressRecv(RecvComm* c);
  Status deliver(RecvComm* c, Request* r, const char* slotHdr);
  Status pull(RecvComm* c, Request* r, const void* slotHdr);
  bool probeMapping(int local);
  // An error when local rank i is known to be gone (its state word, or its pid no longer runs).
  Status peerGone(int local);
  Status checkPeer(int local, int64_t* lastCheckNs);
  void wake(int local);  // rings local rank i's doorbell if it waits
  bool anythingReady();
  // Sleeps on this rank's doorbell up to timeoutMs unless ready() (checked after registering as
  // a waiter) is already true.
  void sleepOnBell(int timeoutMs, const std::function<bool()>& ready);
  void sleepOnBellUs(int64_t timeoutUs, const std::function<bool()>& ready);
  bool llAllReady(uint64_t seq);
  char* llBufferOf(int local, uint64_t seq) const;
  static CheckHook checkHook();
  bool llOneReady(int local, uint64_t seq);
  Request* newRequest();
  void freeRequest(Request* r);

  std::unique_ptr<Segment> seg_;
  int me_ = 0;
  std::vector<LocalPeer> peers_;
  Options opts_;
  const std::atomic<bool>* abort_ = nullptr;
  size_t areaOffset_ = 0, areaBytes_ = 0, matrixOffset_ = 0, ringOffset_ = 0, ringBytes_ = 0;
  std::vector<std::unique_ptr<SendComm>> sends_;
  std::vector<std::unique_ptr<RecvComm>> recvs_;
  std::vector<std::unique_ptr<Request>> owned_;  // every request ever made (reused)
  std::vector<Request*> free_;
  std::vector<std::unique_ptr<PeerMappings>> peerMaps_;  // per local rank
  std::unique_ptr<char[]> bounce_;                       // process_vm_readv target when reducing
  char* bounceAligned_ = nullptr;
  volatile uint64_t probe_ = 0;  // read by peers through process_vm_readv at init
  int myPid_ = 0;
  uint64_t llSeq_ = 0;  // the last sequence this rank published
  uint32_t polls_ = 0;  // tests of unfinished requests (peer checks look at the clock 1 in 128)
};

}  // namespace loom::shm
