// Fuzz target for every byte layout that another process writes and Loom reads: the bootstrap's
// messages (a rank's hello, the root's reply and table, the ring handshake, allGather frames and
// error frames), the socket transport's hello and frame header, a TCP-based transport's listen
// handle (what NCCL hands Loom's net plugin, too), the InfiniBand handshake record, clear-to-send
// slot and done record, and the shared-memory slot header and low-latency flags. Each is checked
// by the function the production code calls. The first byte of an input picks the layout (mod
// kLayouts) and a variant (div kLayouts: the receiver's state); the rest is the bytes.
//
// Contract checked on every input: the check returns OK or an error of its documented code, never
// crashes; what passes satisfies what the receiver then relies on (counts and lengths in range,
// a chunk inside its slot and buffer); and what can be re-encoded survives its round trip. With
// clang and -DLOOM_FUZZ_LIBFUZZER=ON this is a libFuzzer target, otherwise fuzz_driver.h drives it.
//   wire_fuzz [--seconds 20] [--iterations 1000000] [--seed 1] FILE_OR_DIR...
#include <netinet/in.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "src/bootstrap/wire.h"
#include "src/core/collective.h"
#include "tests/fuzz/fuzz_driver.h"
#include "transports/ib/ib_wire.h"
#include "transports/shm/low_latency_exchange.h"
#include "transports/shm/slot_header.h"
#include "transports/socket/socket_util.h"
#include "transports/socket/socket_wire.h"

namespace {

using loom::Code;
using loom::Status;

constexpr int kLayouts = 10;
constexpr uint64_t kSecret = 0x5ec2e75ec2e75ec2ull;  // the receiver's secret in every layout

[[noreturn]] void die(const std::string& what, std::string_view input) {
  loomfuzz::fail("wire_fuzz", "wire_fuzz_crash.bin", what, input);
}

void expectCode(const Status& st, Code want, const char* what, std::string_view input) {
  if (!st.isOk() && st.code() != want)
    die(std::string(what) + ": an error of another code: " + st.message(), input);
}

// A T made of the bytes at offset off (zeros past the end), as a receiver's buffer holds them.
template <typename T>
T take(std::string_view body, size_t off) {
  T v;
  std::memset(static_cast<void*>(&v), 0, sizeof(v));
  if (off < body.size())
    std::memcpy(static_cast<void*>(&v), body.data() + off, std::min(sizeof(T), body.size() - off));
  return v;
}

bool sameAddr(const loom::SockAddr& a, const loom::SockAddr& b) {
  return a.family() == b.family() && a.toString() == b.toString();
}

bool validAddr(const loom::SockAddr& a) {
  return (a.family() == AF_INET || a.family() == AF_INET6) && a.port() != 0;
}

// ---- bootstrap ----

void hello(std::string_view body, int variant, std::string_view input) {
  namespace wire = loom::wire;
  const int known = variant % 3 == 0 ? 0 : 4;  // the root has (not) seen a first rank
  bool foreign = false;
  auto h = wire::decodeHello(body.data(), body.size(), kSecret, known, &foreign);
  if (!h.isOk()) {
    expectCode(h.status(), Code::kInvalidArgument, "hello", input);
    return;
  }
  const wire::Hello& v = h.value();
  if (foreign) die("a hello that passed is foreign", input);
  if (body.size() < wire::kHelloBytes) die("a truncated hello passed", input);
  if (v.nranks < 1 || v.nranks > wire::kMaxRanks || v.rank < 0 || v.rank >= v.nranks ||
      (known && v.nranks != known) || v.blobLen > wire::kMaxBlob || !validAddr(v.listener) ||
      v.secret != kSecret)
    die("a hello out of range passed", input);
  std::string again = wire::encodeHello(v, std::string(v.blobLen, 'b'));
  if (again.size() != wire::kHelloBytes + v.blobLen) die("hello re-encodes to another size", input);
  auto back = wire::decodeHello(again.data(), again.size(), kSecret, known, &foreign);
  if (!back.isOk()) die("hello does not round-trip: " + back.status().message(), input);
  const wire::Hello& b = back.value();
  if (b.rank != v.rank || b.nranks != v.nranks || b.blobLen != v.blobLen ||
      !sameAddr(b.listener, v.listener))
    die("hello round-trips to other fields", input);
}

void checkTable(std::string_view payload, int nranks, std::string_view input) {
  namespace wire = loom::wire;
  std::vector<loom::SockAddr> listeners;
  std::vector<std::string> blobs;
  Status st = wire::decodeTable(payload.data(), payload.size(), nranks, &listeners, &blobs);
  if (!st.isOk()) {
    expectCode(st, Code::kInvalidArgument, "table", input);
    return;
  }
  if (static_cast<int>(listeners.size()) != nranks || static_cast<int>(blobs.size()) != nranks)
    die("a table of another size passed", input);
  std::string again;
  for (int i = 0; i < nranks; ++i) {
    if (!validAddr(listeners[i]) || blobs[i].size() > wire::kMaxBlob)
      die("a table entry out of range passed", input);
    wire::appendTableEntry(&again, listeners[i], blobs[i].data(), blobs[i].size());
  }
  if (again.size() != payload.size()) die("table re-encodes to another size", input);
  std::vector<loom::SockAddr> l2;
  std::vector<std::string> b2;
  st = wire::decodeTable(again.data(), again.size(), nranks, &l2, &b2);
  if (!st.isOk()) die("table does not round-trip: " + st.message(), input);
  for (int i = 0; i < nranks; ++i)
    if (!sameAddr(l2[i], listeners[i]) || b2[i] != blobs[i])
      die("table round-trips to other entries", input);
}

void reply(std::string_view body, int variant, std::string_view input) {
  namespace wire = loom::wire;
  const int nranks = 1 + variant % 5;
  const int rank = variant % nranks;
  auto r = wire::decodeReplyHeader(body.data(), body.size(), rank, nranks);
  if (!r.isOk()) {
    expectCode(r.status(), Code::kInvalidArgument, "reply", input);
  } else if (r.value().kind == wire::kReplyError) {
    Code c = wire::replyErrorCode(r.value().code);
    if (c != Code::kTimeout && c != Code::kInvalidArgument && c != Code::kRemote)
      die("an error reply's code passes as another", input);
  } else {
    const wire::Reply& v = r.value();
    if (v.kind == wire::kReplyAck
            ? static_cast<int>(v.code) != rank || v.payloadBytes != 0
            : v.kind != wire::kReplyTable || static_cast<int>(v.code) != nranks ||
                  v.payloadBytes >
                      static_cast<uint64_t>(nranks) * (wire::kAddrBytes + 4 + wire::kMaxBlob))
      die("a reply out of range passed", input);
    std::string sent(body.substr(0, wire::kReplyBytes));
    std::memset(&sent[12], 0, 4);  // the reserved word
    if (wire::encodeReplyHeader(v.kind, v.code, v.payloadBytes) != sent)
      die("reply header does not round-trip", input);
  }
  // The rest as a table's payload, whatever the header said.
  if (body.size() >= wire::kReplyBytes) checkTable(body.substr(wire::kReplyBytes), nranks, input);
}

void ring(std::string_view body, int variant, std::string_view input) {
  namespace wire = loom::wire;
  const uint32_t magic = variant & 1 ? wire::kAckMagic : wire::kRingMagic;
  const int from = 0, to = 1, nranks = 3;
  Status st = wire::checkRing(body.data(), body.size(), magic, kSecret, from, to, nranks);
  if (!st.isOk()) {
    expectCode(st, Code::kInvalidArgument, "ring handshake", input);
    return;
  }
  if (std::string(body.substr(0, wire::kRingBytes)) !=
      wire::encodeRing(magic, kSecret, from, to, nranks))
    die("a ring handshake passed that is not the expected one", input);
}

void frame(std::string_view body, int variant, std::string_view input) {
  namespace wire = loom::wire;
  auto f = wire::decodeFrameHeader(body.data(), body.size());
  if (!f.isOk()) {
    expectCode(f.status(), Code::kInvalidArgument, "frame header", input);
  } else {
    const wire::Frame& v = f.value();
    if (body.size() < wire::kFrameBytes) die("a truncated frame header passed", input);
    if (wire::encodeFrameHeader(v.kind, v.bytes) != body.substr(0, wire::kFrameBytes))
      die("frame header does not round-trip", input);
    if (v.kind == wire::kFrameError) {
      if (v.bytes < 4 || v.bytes > wire::kMaxErrorText)
        die("an error frame of a length out of range passed", input);
      std::string_view rest = body.substr(wire::kFrameBytes);
      if (rest.size() >= v.bytes) {
        auto e = wire::decodeErrorBody(rest.data(), v.bytes);
        if (!e.isOk()) die("an error frame's body fails: " + e.status().message(), input);
        std::string again =
            wire::encodeErrorFrame(static_cast<Code>(e.value().code), e.value().text);
        if (again != body.substr(0, wire::kFrameBytes + v.bytes))
          die("error frame does not round-trip", input);
      }
    } else if (v.kind != wire::kFrameData && v.kind != wire::kFrameBye) {
      die("a frame of an unknown kind passed", input);
    }
  }
  // The bytes as an error frame's body, of every length the variant picks.
  size_t n = std::min<size_t>(body.size(), static_cast<size_t>(variant) * 97);
  auto e = wire::decodeErrorBody(body.data(), n);
  if (!e.isOk())
    expectCode(e.status(), Code::kInvalidArgument, "error body", input);
  else if (n < 4 || n > wire::kMaxErrorText || e.value().text.size() != n - 4)
    die("an error body out of range passed", input);
}

// ---- socket transport ----

void socketWire(std::string_view body, int variant, std::string_view input) {
  namespace net = loom::net;
  auto m = take<net::SocketHello>(body, 0);
  Status st = net::checkHello(m, kSecret);
  expectCode(st, Code::kRemote, "socket hello", input);
  if (st.isOk() && (m.magic != net::kSocketHelloMagic || m.secret != kSecret ||
                    m.version != net::kSocketWireVersion || m.nsocks < 1 ||
                    m.nsocks > net::kSocketMaxSocks || m.index >= m.nsocks))
    die("a socket hello out of range passed", input);
  auto h = take<net::FrameHeader>(body, sizeof(net::SocketHello));
  const uint64_t n = static_cast<uint64_t>(h.seq) + (variant % 2) * (uint64_t(1) << 32);
  st = net::checkFrameHeader(h, n + static_cast<uint64_t>(variant % 3 == 2));
  expectCode(st, Code::kRemote, "frame header", input);
  if (st.isOk() && (h.magic != net::kSocketFrameMagic || (h.flags & ~net::kFrameSplit)))
    die("a corrupt frame header passed", input);
  // framePart cuts [0, size) into contiguous parts, one per socket. (The receiver calls it only
  // for a size its posted buffer holds: far below 2^56.)
  if (h.size >= (uint64_t(1) << 56)) return;
  const int nsocks = 1 + static_cast<int>(m.nsocks % net::kSocketMaxSocks);
  const bool split = (h.flags & net::kFrameSplit) != 0;
  uint64_t next = 0;
  for (int i = 0; i < nsocks; ++i) {
    uint64_t b = 0, e = 0;
    net::framePart(h.size, split, nsocks, i, &b, &e);
    if (b > e || e > h.size || (e > b && b != next))
      die("framePart parts overlap or leave gaps", input);
    if (e > b) next = e;
  }
  if (next != h.size) die("framePart parts do not cover the frame", input);
}

// A listener's handle, as Loom's socket and InfiniBand transports (and Loom's NCCL net plugin,
// through them) read what the peer's listen() wrote.
template <typename H>
void handleOf(uint64_t magic, std::string_view body, std::string_view input) {
  loom::net::Handle hb{};
  std::memcpy(hb.bytes, body.data(), std::min(body.size(), sizeof(hb.bytes)));
  H h;
  loom::SockAddr addr;
  Status st = loom::readListenHandle(magic, hb.bytes, &h, &addr);
  if (!st.isOk()) {
    expectCode(st, Code::kInvalidArgument, "listen handle", input);
    return;
  }
  if (!validAddr(addr) ||
      addr.len != (addr.family() == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6)))
    die("a handle with an unusable address passed", input);
  loom::net::Handle again{};
  st = loom::writeListenHandle<H>(magic, h.secret, addr, again.bytes);
  if (!st.isOk()) die("a handle's address does not fit a handle: " + st.message(), input);
  H h2;
  loom::SockAddr a2;
  st = loom::readListenHandle(magic, again.bytes, &h2, &a2);
  if (!st.isOk() || h2.secret != h.secret || a2.len != addr.len ||
      std::memcmp(&a2.ss, &addr.ss, addr.len) != 0)
    die("listen handle does not round-trip", input);
}

void handles(std::string_view body, int variant, std::string_view input) {
  handleOf<loom::net::SocketHandle>(loom::net::kSocketHandleMagic, body, input);
  handleOf<loom::ib::IbHandle>(loom::ib::kIbHandleMagic, body, input);
}

// ---- InfiniBand ----

void ibEndpoint(std::string_view body, int variant, std::string_view input) {
  namespace ib = loom::ib;
  const ib::EndpointWire full = take<ib::EndpointWire>(body, 0);
  for (ib::Side side : {ib::Side::kAcceptor, ib::Side::kConnector}) {
    // As the bytes arrive: once a prefix is refused, every longer one is (the transport judges
    // each prefix, and the complete record last).
    bool refused = false;
    for (size_t got = 0; got <= sizeof(full); ++got) {
      ib::EndpointWire w;
      std::memset(static_cast<void*>(&w), 0, sizeof(w));
      std::memcpy(static_cast<void*>(&w), &full, got);
      Status st = ib::checkEndpoint(w, got, side, kSecret);
      expectCode(st, Code::kRemote, "endpoint", input);
      if (refused && st.isOk()) die("a longer handshake prefix passes a refused one", input);
      refused = !st.isOk();
    }
    if (refused) continue;
    const bool ok =
        full.magic == ib::kIbWireMagic && full.version == ib::kIbWireVersion && full.mtu >= 1 &&
        full.mtu <= 5 &&
        (side == ib::Side::kConnector ? full.status == 0
                                      : full.secret == kSecret && full.nqps >= 1 &&
                                            full.nqps <= static_cast<uint32_t>(ib::kMaxQps));
    if (!ok) die("an endpoint out of range passed", input);
  }
}

void ibRecords(std::string_view body, int variant, std::string_view input) {
  namespace ib = loom::ib;
  const ib::CtsSlot s = take<ib::CtsSlot>(body, 0);
  const uint64_t want = variant % 2 ? s.head : s.head + 1;
  auto c = ib::ctsComplete(s, want);
  if (!c.isOk()) {
    expectCode(c.status(), Code::kRemote, "clear-to-send", input);
  } else if (c.value()) {
    const uint32_t n = s.e[0].n;
    if (n < 1 || n > static_cast<uint32_t>(ib::kMaxRecvs) || s.head != want || s.tail != want)
      die("a clear-to-send out of range passed", input);
    for (uint32_t i = 0; i < n; ++i)
      if (s.e[i].seq != want) die("a clear-to-send with entries still arriving passed", input);
  }
  const ib::DoneRecord d = take<ib::DoneRecord>(body, sizeof(ib::CtsSlot));
  const int n = 1 + variant % ib::kMaxRecvs;
  size_t capacity[ib::kMaxRecvs];
  const size_t posted = sizeof(ib::CtsSlot) + sizeof(ib::DoneRecord);  // the buffers' sizes
  for (int i = 0; i < ib::kMaxRecvs; ++i) capacity[i] = take<uint32_t>(body, posted + 4 * i);
  const uint64_t seq = variant % 3 == 0 ? d.seq - 1 : d.seq;
  Status st = ib::checkDoneRecord(d, seq, n, capacity);
  if (!st.isOk() && st.code() != Code::kRemote && st.code() != Code::kInternal)
    die("done record: an error of another code: " + st.message(), input);
  if (st.isOk()) {
    if (d.seq != seq + 1) die("another receive's record passed", input);
    for (int i = 0; i < n; ++i)
      if (d.sizes[i] > capacity[i]) die("a record larger than its buffer passed", input);
  }
}

// ---- shared memory ----

void shmSlot(std::string_view body, int variant, std::string_view input) {
  namespace shm = loom::shm;
  const shm::SlotHdr h = take<shm::SlotHdr>(body, 0);
  // The receive's state, as the transport keeps it: moved <= msgBytes <= capacity, slots of a
  // multiple of 64 bytes.
  shm::SlotExpect e;
  e.tag = variant % 2 ? h.tag : take<int32_t>(body, 64);
  e.capacity = take<uint32_t>(body, 68);
  e.reduce = (variant / 2) % 2;
  e.started = (variant / 4) % 2;
  e.msgBytes =
      e.started ? std::min<size_t>(e.capacity, variant % 3 ? h.msgBytes : take<uint32_t>(body, 72))
                : 0;
  e.moved = e.started ? std::min<size_t>(e.msgBytes, take<uint32_t>(body, 76)) : 0;
  e.slotBytes = 64 * (1 + take<uint16_t>(body, 80) % 2048);
  if (e.reduce && e.started) e.msgBytes = e.capacity;
  Status st = shm::checkSlot(h, e);
  if (!st.isOk()) {
    if (st.code() != Code::kInternal &&
        !(st.code() == Code::kRemote && st.cause() == loom::Cause::kMismatch))
      die("slot: an error of another code: " + st.message(), input);
    return;
  }
  const uint64_t msgBytes = h.msgBytes;
  if (msgBytes > e.capacity || (e.reduce && msgBytes != e.capacity) ||
      (e.started && (msgBytes != e.msgBytes || h.tag != e.tag)) || (!e.started && h.tag != e.tag))
    die("a slot of a message that does not fit the receive passed", input);
  if (h.kind == shm::kRts) {
    if (e.started) die("a single-copy slot in the middle of a message passed", input);
    return;
  }
  const uint64_t moved = e.started ? e.moved : 0;
  if (h.kind != shm::kData || h.offset != moved || h.chunk > e.slotBytes ||
      h.offset + h.chunk > msgBytes || h.offset + h.chunk < h.offset)
    die("a data slot outside its slot or message passed", input);
}

void shmFlags(std::string_view body, int variant, std::string_view input) {
  namespace shm = loom::shm;
  shm::LlFlags f;
  f.seq.store(take<uint64_t>(body, 0), std::memory_order_relaxed);
  f.bytes = take<uint64_t>(body, 8);
  f.signature = take<uint64_t>(body, 16);
  f.call = take<loom::CallNote>(body, 24);
  const loom::CallNote mine = take<loom::CallNote>(body, 40);
  const uint64_t signature = variant % 2 ? f.signature : take<uint64_t>(body, 56);
  const size_t llBytes = size_t(64) << (variant % 12);
  Status st = shm::checkPublished(f, variant % 7, signature, 3, mine, llBytes);
  if (st.isOk()) {
    if (f.signature != signature || f.bytes > llBytes) die("flags out of range passed", input);
  } else if (!(st.code() == Code::kInvalidUsage && st.cause() == loom::Cause::kMismatch) &&
             st.code() != Code::kInternal) {
    die("flags: an error of another code: " + st.message(), input);
  }
  // The call notes a rank reads of its peers (HostArea::peerCall), described.
  (void)loom::describeCall(f.call);
  (void)loom::differentCalls(1, &mine, 0, f.call);
}

void runOne(std::string_view input) {
  if (input.empty()) return;
  const uint8_t selector = static_cast<uint8_t>(input[0]);
  const int variant = selector / kLayouts;
  const std::string body(input.substr(1));  // a copy: no read past it goes unnoticed
  const std::string_view b(body);
  switch (selector % kLayouts) {
    case 0:
      return hello(b, variant, input);
    case 1:
      return reply(b, variant, input);
    case 2:
      return ring(b, variant, input);
    case 3:
      return frame(b, variant, input);
    case 4:
      return socketWire(b, variant, input);
    case 5:
      return handles(b, variant, input);
    case 6:
      return ibEndpoint(b, variant, input);
    case 7:
      return ibRecords(b, variant, input);
    case 8:
      return shmSlot(b, variant, input);
    default:
      return shmFlags(b, variant, input);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  runOne(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}

#ifndef LOOM_LIBFUZZER

namespace {

template <typename T>
std::string bytesOf(const T& v) {
  return std::string(reinterpret_cast<const char*>(&v), sizeof(v));
}

std::string with(int layout, int variant, const std::string& body) {
  return std::string(1, static_cast<char>(layout + kLayouts * variant)) + body;
}

// One valid input of each layout (and of several variants), made by the code that writes them.
std::vector<std::string> builtInSeeds() {
  namespace wire = loom::wire;
  namespace net = loom::net;
  namespace ib = loom::ib;
  namespace shm = loom::shm;
  std::vector<std::string> seeds;
  loom::SockAddr v4 = loom::parseSockAddr("10.1.2.3:4000").value();
  loom::SockAddr v6 = loom::parseSockAddr("[fe80::1]:5000").value();
  wire::Hello h;
  h.secret = kSecret;
  h.rank = 2;
  h.nranks = 4;
  h.listener = v4;
  seeds.push_back(with(0, 1, wire::encodeHello(h, "blob")));
  h.rank = 0;
  h.listener = v6;
  seeds.push_back(with(0, 0, wire::encodeHello(h, "")));
  std::string table;
  wire::appendTableEntry(&table, v4, "ab", 2);
  wire::appendTableEntry(&table, v6, "", 0);
  seeds.push_back(with(1, 1, wire::encodeReplyHeader(wire::kReplyTable, 2, table.size()) + table));
  seeds.push_back(with(1, 0, wire::encodeReplyError(Code::kTimeout, "rendezvous timed out")));
  seeds.push_back(with(1, 3, wire::encodeReplyHeader(wire::kReplyAck, 3, 0)));
  seeds.push_back(with(2, 0, wire::encodeRing(wire::kRingMagic, kSecret, 0, 1, 3)));
  seeds.push_back(with(2, 1, wire::encodeRing(wire::kAckMagic, kSecret, 0, 1, 3)));
  seeds.push_back(with(3, 1, wire::encodeFrameHeader(wire::kFrameData, 8) + "12345678"));
  seeds.push_back(with(3, 2, wire::encodeErrorFrame(Code::kRemote, "rank 3 failed")));
  seeds.push_back(with(3, 0, wire::encodeFrameHeader(wire::kFrameBye, 0)));
  net::SocketHello sh{net::kSocketHelloMagic, kSecret, 42, net::kSocketWireVersion, 1, 3};
  net::FrameHeader fh{net::kSocketFrameMagic, 7, 300000, 5, net::kFrameSplit};
  seeds.push_back(with(4, 0, bytesOf(sh) + bytesOf(fh)));
  net::Handle hb{};
  (void)loom::writeListenHandle<net::SocketHandle>(net::kSocketHandleMagic, kSecret, v4, hb.bytes);
  seeds.push_back(with(5, 0, bytesOf(hb)));
  (void)loom::writeListenHandle<ib::IbHandle>(ib::kIbHandleMagic, kSecret, v6, hb.bytes);
  seeds.push_back(with(5, 1, bytesOf(hb)));
  ib::EndpointWire ew;
  std::memset(static_cast<void*>(&ew), 0, sizeof(ew));
  ew.magic = ib::kIbWireMagic;
  ew.secret = kSecret;
  ew.version = ib::kIbWireVersion;
  ew.nqps = 2;
  ew.lid = 7;
  ew.linkLayer = 1;
  ew.mtu = 5;
  ew.bufAddr = 0x7f0000001000ull;
  ew.bufRkey = 0x1234;
  ew.qps[0] = {0x11, 0x22};
  ew.qps[1] = {0x33, 0x44};
  std::snprintf(ew.device, sizeof(ew.device), "mlx5_0:1");
  seeds.push_back(with(6, 0, bytesOf(ew)));
  ib::CtsSlot cts;
  std::memset(static_cast<void*>(&cts), 0, sizeof(cts));
  cts.head = cts.tail = 5;
  for (int i = 0; i < 3; ++i) cts.e[i] = ib::CtsEntry{0x1000u * (i + 1), 4096, 9, i, 3, 0, 5};
  ib::DoneRecord done;
  std::memset(static_cast<void*>(&done), 0, sizeof(done));
  done.seq = 5;
  done.sizes[0] = 100;
  done.sizes[1] = 4096;
  std::string capacities;
  for (int i = 0; i < ib::kMaxRecvs; ++i) capacities += bytesOf(uint32_t{4096});
  seeds.push_back(with(7, 3, bytesOf(cts) + bytesOf(done) + capacities));
  shm::SlotHdr slot{shm::kData, 3, 200000, 65536, 65536, 0, 0, 0, 0};
  std::string expect = bytesOf(int32_t{3}) + bytesOf(uint32_t{262144}) + bytesOf(uint32_t{200000}) +
                       bytesOf(uint32_t{65536}) + bytesOf(uint16_t{1023});
  seeds.push_back(with(8, 5, bytesOf(slot) + expect));
  shm::SlotHdr rts{shm::kRts, 3, 100000, 0, 0, 0x7f0000002000ull, 12, 5, 4096};
  seeds.push_back(with(8, 1, bytesOf(rts) + expect));
  loom::CallNote note;
  note.coll = static_cast<uint8_t>(loom::CollKind::kAllReduce);
  note.dtype = 7;
  note.count = 1024;
  std::string flags = bytesOf(uint64_t{9}) + bytesOf(uint64_t{4096}) + bytesOf(uint64_t{0xabcd}) +
                      bytesOf(note) + bytesOf(note) + bytesOf(uint64_t{0xabce});
  seeds.push_back(with(9, 7, flags));
  seeds.push_back(with(9, 2, flags));
  return seeds;
}

}  // namespace

int main(int argc, char** argv) {
  auto le32 = [](uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); };
  auto le64 = [](uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); };
  const std::vector<std::string> tokens = {le32(loom::wire::kHelloMagic),
                                           le32(loom::wire::kReplyMagic),
                                           le32(loom::wire::kRingMagic),
                                           le32(loom::wire::kAckMagic),
                                           le32(loom::wire::kFrameMagic),
                                           le32(loom::wire::kVersion),
                                           le32(loom::net::kSocketFrameMagic),
                                           le64(loom::net::kSocketHelloMagic),
                                           le64(loom::net::kSocketHandleMagic),
                                           le64(loom::ib::kIbHandleMagic),
                                           le64(loom::ib::kIbWireMagic),
                                           le64(kSecret),
                                           le32(1),
                                           le32(2),
                                           le32(3),
                                           le32(16),
                                           le32(0x7fffffff),
                                           le64(uint64_t(1) << 20),
                                           std::string(4, '\xff'),
                                           std::string(8, '\xff'),
                                           std::string(8, '\0'),
                                           std::string("\x02\x00", 2),
                                           std::string("\x0a\x00", 2)};
  return loomfuzz::fuzzMain(argc, argv, "wire_fuzz", builtInSeeds(), tokens, runOne);
}
#endif
