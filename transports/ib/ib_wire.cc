#include "transports/ib/ib_wire.h"

#include <infiniband/verbs.h>

#include <cstddef>

namespace loom {
namespace ib {

Status checkEndpoint(const EndpointWire& w, size_t got, Side side, uint64_t secret) {
  // A field counts once all its bytes have arrived.
  auto has = [&](size_t offset, size_t bytes) { return got >= offset + bytes; };
  const bool acceptor = side == Side::kAcceptor;
  if ((has(offsetof(EndpointWire, magic), sizeof(w.magic)) && w.magic != kIbWireMagic) ||
      (has(offsetof(EndpointWire, version), sizeof(w.version)) && w.version != kIbWireVersion)) {
    if (acceptor) return LOOM_ERROR(kRemote, "not a Loom InfiniBand handshake");
    return LOOM_ERROR(kRemote, "the peer is not a Loom InfiniBand endpoint (version {})",
                      has(offsetof(EndpointWire, version), sizeof(w.version)) ? w.version : 0);
  }
  if (acceptor && has(offsetof(EndpointWire, secret), sizeof(w.secret)) && w.secret != secret)
    return LOOM_ERROR(kRemote, "wrong secret in the handshake");
  if (acceptor && has(offsetof(EndpointWire, nqps), sizeof(w.nqps)) &&
      (w.nqps < 1 || w.nqps > static_cast<uint32_t>(kMaxQps)))
    return LOOM_ERROR(kRemote, "{} queue pairs requested", w.nqps);
  if (!acceptor && has(offsetof(EndpointWire, status), sizeof(w.status)) && w.status != 0)
    return LOOM_ERROR(kRemote,
                      "the peer refused the connection (it could not set it up; see its log)");
  // (A refusal carries no MTU: the connector judges it once the status has arrived.)
  if (has(offsetof(EndpointWire, mtu), sizeof(w.mtu)) &&
      (acceptor || has(offsetof(EndpointWire, status), sizeof(w.status))) &&
      (w.mtu < IBV_MTU_256 || w.mtu > IBV_MTU_4096))
    return LOOM_ERROR(kRemote, "MTU code {} in the handshake (1..5)", w.mtu);
  return Status();
}

Result<bool> ctsComplete(const CtsSlot& s, uint64_t want) {
  if (s.head != want || s.tail != want || s.e[0].seq != want) return false;
  const uint32_t n = s.e[0].n;
  if (n < 1 || n > kMaxRecvs) return LOOM_ERROR(kRemote, "corrupt clear-to-send ({} buffers)", n);
  for (uint32_t i = 1; i < n; ++i) {
    if (s.e[i].seq != want) return false;
    if (s.e[i].n != n)
      return LOOM_ERROR(kRemote, "corrupt clear-to-send (buffer {} says {} buffers, buffer 0 {})",
                        i, s.e[i].n, n);
  }
  return true;
}

Status checkDoneRecord(const DoneRecord& d, uint64_t seq, int n, const size_t* capacity) {
  if (d.seq != seq + 1)
    return LOOM_ERROR(kInternal, "completed without its record (record of {})",
                      static_cast<int64_t>(d.seq) - 1);
  for (int i = 0; i < n && i < kMaxRecvs; ++i)
    if (d.sizes[i] > capacity[i])
      return LOOM_ERROR(kRemote, "corrupt record: buffer {} received {} bytes, it holds {}", i,
                        d.sizes[i], capacity[i]);
  return Status();
}

}  // namespace ib
}  // namespace loom
