// Wire formats of the InfiniBand transport: the listener's handle, the out-of-band handshake over
// TCP, and the two arrays the peers RDMA-write into each other's memory. Both ends share byte
// order (as in NCCL).
//
// Data path (one send comm -> one recv comm, requests numbered 0, 1, 2, ... on each side):
// 1. irecv number s writes a clear-to-send slot (CtsSlot: address, size, rkey, tag of each of its
//    n buffers) with RDMA write into the sender's FIFO at slot s % kMaxRequests.
// 2. The sender matches its next n isends, by tag, with the slot's buffers, RDMA-writes each
//    payload (split across the queue pairs when large), RDMA-writes a DoneRecord (sizes sent, or
//    why a buffer could not be filled: truncation, unknown tag) into the receiver's record array
//    on queue pair 0, and then an RDMA write with immediate (value s) on every queue pair.
// 3. The receiver's request is complete once the immediates of all queue pairs arrived: RC
//    ordering places every write of a queue pair before its immediate.
// At most kMaxRequests requests are outstanding per comm and direction, so a slot is rewritten
// only after its previous use completed.
#pragma once

#include <netinet/in.h>

#include <cstddef>
#include <cstdint>

#include "src/core/status.h"
#include "transports/net.h"

namespace loom {
namespace ib {

constexpr uint64_t kIbHandleMagic = 0x444e48424d4f4f4cull;  // "LOOMBHND"
constexpr uint64_t kIbWireMagic = 0x4552494242494f4cull;    // "LOIBBIRE"
constexpr uint32_t kIbWireVersion = 1;
constexpr int kMaxRequests = 32;  // outstanding requests per comm (NCCL_NET_MAX_REQUESTS)
constexpr int kMaxRecvs = 8;      // buffers of a grouped receive
constexpr int kMaxQps = 16;

struct IbHandle {
  uint64_t magic;
  uint64_t secret;  // random per listener; the connector presents it
  uint32_t addrLen;
  uint32_t reserved;
  unsigned char addr[sizeof(sockaddr_in6)];
};
static_assert(sizeof(IbHandle) <= net::kHandleSize, "IB handle too large");

struct QpWire {
  uint32_t qpn;
  uint32_t psn;
};

// Each side's half of the handshake. The connector (sender) sends its own first; the acceptor
// answers with its own; the connector then sends one byte once its queue pairs are ready to send.
struct EndpointWire {
  uint64_t magic;
  uint64_t secret;
  uint32_t version;
  uint32_t nqps;
  uint16_t lid;
  uint8_t linkLayer;
  uint8_t mtu;      // ibv_mtu
  uint32_t status;  // acceptor: 0, or non-zero when it refused (the connector reports it)
  uint8_t gid[16];
  uint64_t bufAddr;  // sender: its CTS FIFO; receiver: its DoneRecord array
  uint32_t bufRkey;
  uint32_t reserved;
  QpWire qps[kMaxQps];
  char device[32];  // "mlx5_0:1", for messages
};

// One buffer of a posted receive, as the sender sees it.
struct CtsEntry {
  uint64_t addr;
  uint64_t size;
  uint32_t rkey;
  int32_t tag;
  uint32_t n;  // buffers in this receive (1..kMaxRecvs)
  uint32_t reserved;
  uint64_t seq;  // receive number + 1 (0: never written)
};

struct CtsSlot {
  uint64_t head;  // receive number + 1, written with the slot
  CtsEntry e[kMaxRecvs];
  uint64_t tail;  // same as head: a slot is complete when both and every entry agree
};

enum class DoneError : uint32_t { kNone = 0, kTruncated = 1, kTagMismatch = 2, kMissing = 3 };

// Written by the sender into the receiver's record array, slot s % kMaxRequests.
struct DoneRecord {
  uint64_t seq;  // receive number + 1
  uint64_t sizes[kMaxRecvs];
  uint32_t error;  // DoneError
  int32_t errIndex;
  int32_t errTag;
  uint32_t reserved;
  uint64_t errSize;      // bytes the sender had
  uint64_t errCapacity;  // bytes the buffer holds
};

// ---- The checks of what a peer wrote, shared by the transport and the fuzz target
// (tests/fuzz/wire_fuzz.cc). None trusts a field it has not checked; each error names the field.

// Which end checks the other's EndpointWire.
enum class Side { kAcceptor, kConnector };
// Checks the fields of a peer's half of the handshake that have arrived (the first `got` bytes of
// w; the rest may be anything), so that a stranger is dropped as soon as its bytes give it away.
// The acceptor checks the connector's half against its listener's secret (kRemote: not a Loom
// handshake, wrong secret, queue pairs out of range, an MTU that is no ibv_mtu); the connector
// checks the acceptor's answer (not a Loom endpoint, a refusal, an MTU that is no ibv_mtu). OK
// for a complete record means Comm::connect may use it.
Status checkEndpoint(const EndpointWire& w, size_t got, Side side, uint64_t secret);

// Whether a clear-to-send slot copied out of the FIFO is complete for receive number want - 1:
// false while its head, tail or entries are still arriving; kRemote when it is corrupt (a buffer
// count out of 1..kMaxRecvs, or entries that disagree on it). true means entries [0, e[0].n)
// are the receive's.
Result<bool> ctsComplete(const CtsSlot& s, uint64_t want);

// Checks the DoneRecord of receive number seq, whose n buffers hold capacity[i] bytes: kInternal
// when it is not that receive's record, kRemote when it claims more bytes for a buffer than the
// buffer holds. (Its error field is reported by the receive, not checked here.)
Status checkDoneRecord(const DoneRecord& d, uint64_t seq, int n, const size_t* capacity);

}  // namespace ib
}  // namespace loom
