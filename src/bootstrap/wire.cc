#include "src/bootstrap/wire.h"

#include <netinet/in.h>

#include <cstring>

#include "src/core/clock.h"

namespace loom {
namespace wire {

void Writer::u16(uint16_t v) {
  uint8_t b[2] = {static_cast<uint8_t>(v), static_cast<uint8_t>(v >> 8)};
  bytes(b, 2);
}

void Writer::u32(uint32_t v) {
  uint8_t b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
  bytes(b, 4);
}

void Writer::u64(uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
  bytes(b, 8);
}

void Writer::addr(const SockAddr& a) {
  uint8_t raw[16] = {0};
  uint32_t scope = 0;
  uint16_t fam = 0;
  if (a.family() == AF_INET) {
    fam = 4;
    std::memcpy(raw, &reinterpret_cast<const sockaddr_in*>(&a.ss)->sin_addr, 4);
  } else if (a.family() == AF_INET6) {
    fam = 6;
    const auto* s6 = reinterpret_cast<const sockaddr_in6*>(&a.ss);
    std::memcpy(raw, &s6->sin6_addr, 16);
    scope = s6->sin6_scope_id;
  }
  u16(fam);
  u16(static_cast<uint16_t>(a.port()));
  bytes(raw, 16);
  u32(scope);
}

const uint8_t* Reader::bytes(size_t n) {
  if (!ok_ || n > n_ - off_) {
    ok_ = false;
    return nullptr;
  }
  const uint8_t* p = p_ + off_;
  off_ += n;
  return p;
}

uint16_t Reader::u16() {
  const uint8_t* b = bytes(2);
  return b ? static_cast<uint16_t>(b[0] | (b[1] << 8)) : 0;
}

uint32_t Reader::u32() {
  const uint8_t* b = bytes(4);
  if (!b) return 0;
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(b[i]) << (8 * i);
  return v;
}

uint64_t Reader::u64() {
  const uint8_t* b = bytes(8);
  if (!b) return 0;
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(b[i]) << (8 * i);
  return v;
}

Result<SockAddr> Reader::addr() {
  uint16_t fam = u16();
  uint16_t port = u16();
  const uint8_t* raw = bytes(16);
  uint32_t scope = u32();
  if (!ok()) return LOOM_ERROR(kInvalidArgument, "truncated address");
  SockAddr a;
  if (fam == 4) {
    auto* s4 = reinterpret_cast<sockaddr_in*>(&a.ss);
    s4->sin_family = AF_INET;
    std::memcpy(&s4->sin_addr, raw, 4);
    a.len = sizeof(sockaddr_in);
  } else if (fam == 6) {
    auto* s6 = reinterpret_cast<sockaddr_in6*>(&a.ss);
    s6->sin6_family = AF_INET6;
    std::memcpy(&s6->sin6_addr, raw, 16);
    s6->sin6_scope_id = scope;
    a.len = sizeof(sockaddr_in6);
  } else {
    return LOOM_ERROR(kInvalidArgument, "bad address family {}", fam);
  }
  if (port == 0) return LOOM_ERROR(kInvalidArgument, "address with port 0");
  a.setPort(port);
  return a;
}

std::string encodeHello(const Hello& h, const std::string& blob) {
  std::string out;
  Writer w(&out);
  w.u32(kHelloMagic);
  w.u32(kVersion);
  w.u64(h.secret);
  w.i32(h.rank);
  w.i32(h.nranks);
  w.addr(h.listener);
  w.u32(static_cast<uint32_t>(blob.size()));
  w.bytes(blob.data(), blob.size());
  return out;
}

Result<Hello> decodeHello(const void* p, size_t n, uint64_t secret, int knownNranks,
                          bool* foreign) {
  *foreign = false;
  Reader r(p, n < kHelloBytes ? n : kHelloBytes);
  uint32_t magic = r.u32();
  uint32_t version = r.u32();
  Hello h;
  h.secret = r.u64();
  h.rank = r.i32();
  h.nranks = r.i32();
  auto listener = r.addr();
  h.blobLen = r.u32();
  if (n < 4 || magic != kHelloMagic) {
    *foreign = true;
    return LOOM_ERROR(kInvalidArgument, "not a Loom bootstrap hello (magic 0x{:08x})", magic);
  }
  if (!r.ok()) return LOOM_ERROR(kInvalidArgument, "truncated hello ({} bytes)", n);
  if (version != kVersion)
    return LOOM_ERROR(kInvalidArgument, "protocol version {}, this root speaks {}", version,
                      kVersion);
  if (h.secret != secret)
    return LOOM_ERROR(kInvalidArgument,
                      "wrong secret (a rank of another job, or a stale unique id?)");
  if (h.nranks < 1 || h.nranks > kMaxRanks)
    return LOOM_ERROR(kInvalidArgument, "nranks {} out of range", h.nranks);
  if (h.rank < 0 || h.rank >= h.nranks)
    return LOOM_ERROR(kInvalidArgument, "rank {} out of range for nranks {}", h.rank, h.nranks);
  if (knownNranks != 0 && h.nranks != knownNranks)
    return LOOM_ERROR(kInvalidArgument, "rank {} says nranks {}, the first rank said {}", h.rank,
                      h.nranks, knownNranks);
  if (h.blobLen > kMaxBlob)
    return LOOM_ERROR(kInvalidArgument, "rank {} sent a {} byte blob (limit {})", h.rank, h.blobLen,
                      kMaxBlob);
  if (!listener.isOk())
    return LOOM_ERROR(kInvalidArgument, "rank {}: bad listener address: {}", h.rank,
                      listener.status().message());
  h.listener = listener.value();
  return h;
}

std::string encodeReplyHeader(uint32_t kind, uint32_t code, uint64_t payloadBytes) {
  std::string out;
  Writer w(&out);
  w.u32(kReplyMagic);
  w.u32(kind);
  w.u32(code);
  w.u32(0);
  w.u64(payloadBytes);
  return out;
}

std::string encodeReplyError(Code code, const std::string& text) {
  std::string out = encodeReplyHeader(kReplyError, static_cast<uint32_t>(code), text.size());
  out += text;
  return out;
}

Result<Reply> decodeReplyHeader(const void* p, size_t n, int rank, int nranks) {
  Reader r(p, n < kReplyBytes ? n : kReplyBytes);
  uint32_t magic = r.u32();
  Reply h;
  h.kind = r.u32();
  h.code = r.u32();
  r.u32();
  h.payloadBytes = r.u64();
  if (n < 4 || magic != kReplyMagic)
    return LOOM_ERROR(kInvalidArgument, "not a Loom bootstrap root (magic 0x{:08x})", magic);
  if (!r.ok()) return LOOM_ERROR(kInvalidArgument, "truncated reply ({} bytes)", n);
  if (h.kind == kReplyError) return h;
  if (h.kind == kReplyAck) {
    if (static_cast<int>(h.code) != rank || h.payloadBytes != 0)
      return LOOM_ERROR(kInvalidArgument, "malformed acknowledgement (rank {}, {} bytes)", h.code,
                        h.payloadBytes);
    return h;
  }
  const uint64_t maxPayload =
      nranks < 1 ? 0 : static_cast<uint64_t>(nranks) * (kAddrBytes + 4 + kMaxBlob);
  if (h.kind != kReplyTable || static_cast<int>(h.code) != nranks || h.payloadBytes > maxPayload)
    return LOOM_ERROR(kInvalidArgument, "malformed reply (kind {}, nranks {}, {} bytes)", h.kind,
                      h.code, h.payloadBytes);
  return h;
}

Code replyErrorCode(uint32_t code) {
  Code c = static_cast<Code>(code);
  return c == Code::kTimeout || c == Code::kInvalidArgument ? c : Code::kRemote;
}

void appendTableEntry(std::string* payload, const SockAddr& listener, const void* blob,
                      size_t blobLen) {
  Writer w(payload);
  w.addr(listener);
  w.u32(static_cast<uint32_t>(blobLen));
  w.bytes(blob, blobLen);
}

Status decodeTable(const void* p, size_t n, int nranks, std::vector<SockAddr>* listeners,
                   std::vector<std::string>* blobs) {
  if (nranks < 1 || nranks > kMaxRanks)
    return LOOM_ERROR(kInvalidArgument, "a table for {} ranks", nranks);
  Reader t(p, n);
  listeners->assign(nranks, SockAddr());
  blobs->assign(nranks, std::string());
  for (int i = 0; i < nranks; ++i) {
    auto a = t.addr();
    uint32_t len = t.u32();
    const uint8_t* b = t.bytes(len);
    if (!a.isOk() || !t.ok() || len > kMaxBlob)
      return LOOM_ERROR(kInvalidArgument, "malformed table (entry {}{}{})", i, a.isOk() ? "" : ": ",
                        a.isOk() ? "" : a.status().message());
    (*listeners)[i] = a.value();
    (*blobs)[i].assign(reinterpret_cast<const char*>(b), len);
  }
  if (t.left() != 0)
    return LOOM_ERROR(kInvalidArgument, "malformed table ({} bytes after its {} entries)", t.left(),
                      nranks);
  return Status();
}

std::string encodeRing(uint32_t magic, uint64_t secret, int from, int to, int nranks) {
  std::string out;
  Writer w(&out);
  w.u32(magic);
  w.u32(kVersion);
  w.u64(secret);
  w.i32(from);
  w.i32(to);
  w.i32(nranks);
  return out;
}

Status checkRing(const void* p, size_t n, uint32_t magic, uint64_t secret, int from, int to,
                 int nranks) {
  Reader r(p, n < kRingBytes ? n : kRingBytes);
  uint32_t m = r.u32();
  uint32_t version = r.u32();
  uint64_t s = r.u64();
  int f = r.i32();
  int t = r.i32();
  int nr = r.i32();
  if (n < 4 || m != magic)
    return LOOM_ERROR(kInvalidArgument, "not a Loom ring handshake (magic 0x{:08x})", m);
  if (!r.ok()) return LOOM_ERROR(kInvalidArgument, "truncated ring handshake ({} bytes)", n);
  if (version != kVersion) return LOOM_ERROR(kInvalidArgument, "protocol version {}", version);
  if (s != secret) return LOOM_ERROR(kInvalidArgument, "wrong secret");
  if (nr != nranks || t != to)
    return LOOM_ERROR(kInvalidArgument, "handshake for rank {} of {}, this is rank {} of {}", t, nr,
                      to, nranks);
  if (f != from)
    return LOOM_ERROR(kInvalidArgument, "handshake from rank {}, expected rank {}", f, from);
  return Status();
}

std::string encodeFrameHeader(uint32_t kind, uint64_t bytes) {
  std::string out;
  Writer w(&out);
  w.u32(kFrameMagic);
  w.u32(kind);
  w.u64(bytes);
  return out;
}

Result<Frame> decodeFrameHeader(const void* p, size_t n) {
  Reader r(p, n < kFrameBytes ? n : kFrameBytes);
  uint32_t magic = r.u32();
  Frame f;
  f.kind = r.u32();
  f.bytes = r.u64();
  if (n < 4 || magic != kFrameMagic)
    return LOOM_ERROR(kInvalidArgument, "not a bootstrap frame (magic 0x{:08x})", magic);
  if (!r.ok()) return LOOM_ERROR(kInvalidArgument, "truncated frame header ({} bytes)", n);
  if (f.kind != kFrameData && f.kind != kFrameError && f.kind != kFrameBye)
    return LOOM_ERROR(kInvalidArgument, "unknown frame kind {}", f.kind);
  if (f.kind == kFrameError && (f.bytes < 4 || f.bytes > kMaxErrorText))
    return LOOM_ERROR(kInvalidArgument, "malformed error frame ({} bytes)", f.bytes);
  return f;
}

std::string encodeErrorFrame(Code code, const std::string& text) {
  std::string cut = text.substr(0, kMaxErrorText - 4);
  std::string out = encodeFrameHeader(kFrameError, 4 + cut.size());
  Writer w(&out);
  w.u32(static_cast<uint32_t>(code));
  w.bytes(cut.data(), cut.size());
  return out;
}

Result<ErrorReport> decodeErrorBody(const void* p, size_t n) {
  if (n < 4 || n > kMaxErrorText)
    return LOOM_ERROR(kInvalidArgument, "malformed error frame ({} bytes)", n);
  Reader r(p, n);
  ErrorReport e;
  e.code = r.u32();
  e.text.assign(static_cast<const char*>(p) + 4, n - 4);
  return e;
}

uint64_t hash64(const void* data, size_t bytes, uint64_t seed) {
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

std::string formatRanks(const int* ranks, size_t count, size_t maxItems) {
  std::string out;
  size_t items = 0;
  for (size_t i = 0; i < count;) {
    size_t j = i;
    while (j + 1 < count && ranks[j + 1] == ranks[j] + 1) ++j;
    if (items == maxItems) {
      out += ",...";
      break;
    }
    if (!out.empty()) out += ",";
    out += j > i ? fmt::format("{}-{}", ranks[i], ranks[j]) : fmt::format("{}", ranks[i]);
    ++items;
    i = j + 1;
  }
  return out;
}

int64_t handshakeTimeoutMs() {
  constexpr int64_t kCapMs = 10000;
  int64_t t = defaultTimeoutMs();
  return t > 0 && t < kCapMs ? t : kCapMs;
}

}  // namespace wire
}  // namespace loom
