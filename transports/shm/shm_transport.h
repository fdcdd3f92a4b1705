// The shared-memory transport: ranks of one communicator on one host exchange messages through a
// POSIX shared segment, without a system call on the data path: one single-producer/single-consumer
// ring of slots per ordered pair of local ranks.
// Protocols on a ring, chosen per message by the sender:
//   - eager: the payload is copied into slots (several slots for a message larger than one) and
//     out again by the receiver (two copies, lowest latency);
//   - single copy ("RTS"): the slot carries the sender's address, and the receiver copies the
//     message straight out of the sender's memory: with memcpy when both ranks are threads of one
//     process, with process_vm_readv (cross-memory attach) between processes when the kernel
//     allows it (probed at init, shm_probes.cc: ptrace rules may forbid it, then eager is used).
//     The send completes when the receiver acknowledges.
// A receive may reduce instead of copy (irecvReduce): the incoming bytes are combined with a local
// buffer as they are read (from the slot, the peer's memory, or a cache-sized bounce buffer for
// process_vm_readv), so received data crosses memory once.
//
// The segment's layout, the doorbells a waiting rank sleeps on and the peers' state words are the
// host area's (host_area.h); the low-latency exchange and the one-pass guard share the segment
// with the rings (low_latency_exchange.h, one_pass_guard.h), and HostGroup (host_group.h) owns
// all four.
//
// Threads: an instance belongs to one rank of one communicator and is driven by one thread at a
// time (transports/net.h states the rule). Each rank (thread or process) owns its own instance
// over the shared segment.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/loom.h"
#include "src/core/status.h"
#include "transports/net.h"
#include "transports/shm/host_area.h"
#include "transports/shm/shared_alloc.h"

namespace loom::shm {

class Transport final : public net::Transport {
 public:
  // The rings of the segment `area` maps (formatted, attached); area must outlive the transport.
  explicit Transport(HostArea& area);
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
  // This process's view of bytes at ref in local rank i's shared allocation (read and write),
  // mapped on first use.
  Result<char*> mapPeerShared(int local, const SharedRef& ref, size_t bytes);

  // The send and receive comm to/from local rank i (made at construction; no connection phase).
  void* sendConn(int local);
  void* recvConn(int local);
  // The local index of communicator rank `rank`, or -1 when it is not on this segment.
  int localOf(int rank) const;

  // After this rank published that it failed or closed (HostArea::publishState): returns once no
  // peer still reads one of its unacknowledged single-copy messages (at most 5 s; a peer whose
  // process is gone stops mattering), so that its caller may free the buffers.
  void awaitReaders();

  // --- net::Transport ---
  const char* name() const override { return "shm"; }
  int devices() const override { return 1; }
  Status getProperties(int dev, net::Properties* props) const override;
  Status listen(int dev, net::Handle* handle, void** listener) override;
  Status connect(int dev, const net::Handle& handle, void** sendConn) override;
  Status accept(void* listener, void** recvConn) override;
  Status regMr(void* comm, void* data, size_t size, int type, void** mhandle) override;
  Status deregMr(void* comm, void* mhandle) override;
  Status isend(void* sendConn, const void* data, size_t size, int tag, void* mhandle,
               void** request) override;
  Status irecv(void* recvConn, int n, void** data, const size_t* sizes, const int* tags,
               void** mhandles, void** request) override;
  bool supportsRecvReduce() const override { return true; }
  void setStreamingStores(void* recvConn, bool on) override;
  Status irecvReduce(void* recvConn, void* dst, const void* src, size_t size, int tag,
                     loomDataType_t dt, loomRedOp_t op, void** request) override;
  Status test(void* request, int* done, size_t* sizes) override;
  Status closeSend(void* sendConn) override;
  Status closeRecv(void* recvConn) override;
  Status closeListen(void* listener) override;
  void waitActivity(void* const* requests, int n, void* listener, int timeoutMs) override;
  // waitActivity with a finer deadline: the executor naps this long on the doorbell while socket
  // requests are also in flight (a socket's arrival does not ring the doorbell, so the nap must
  // be short for it to be noticed soon).
  void waitActivityUs(int64_t timeoutUs);
  bool napUs(int64_t timeoutUs) override {
    waitActivityUs(timeoutUs);
    return true;
  }
  // The connections to the other ranks of this host exist from construction; channel 0 only (the
  // other channels of a ring go over the network, so that they do not share the slot rings).
  void* presetSendConn(int rank) override;
  void* presetRecvConn(int rank) override;
  net::Reach reach(int rank, int channel) const override;
  bool wantsRegistration() const override { return false; }

  struct Request;
  struct SendComm;
  struct RecvComm;

 private:
  Status progressSend(SendComm* c);
  Status progressRecv(RecvComm* c);
  Status deliver(RecvComm* c, Request* r, const char* slotHdr);
  Status pull(RecvComm* c, Request* r, const void* slotHdr);
  // A receive's bytes (in) into dst: copied, or combined with src when it reduces.
  static void store(const Request* r, char* dst, const char* src, const char* in, size_t bytes);
  bool probeMapping(int local);
  Status checkPeer(int local, int64_t* lastCheckNs);
  bool anythingReady();
  Request* newRequest();
  void freeRequest(Request* r);

  HostArea& area_;
  const Options& opts_;  // area_.options()
  const int me_;         // area_.localIndex()
  std::vector<std::unique_ptr<SendComm>> sends_;
  std::vector<std::unique_ptr<RecvComm>> recvs_;
  std::vector<std::unique_ptr<Request>> owned_;  // every request ever made (reused)
  std::vector<Request*> free_;
  std::vector<std::unique_ptr<PeerMappings>> peerMaps_;  // per local rank
  std::unique_ptr<char[]> bounce_;                       // process_vm_readv target when reducing
  char* bounceAligned_ = nullptr;
  volatile uint64_t probe_ = 0;  // read by peers through process_vm_readv at init
  uint32_t polls_ = 0;  // tests of unfinished requests (peer checks look at the clock 1 in 128)
};

}  // namespace loom::shm
