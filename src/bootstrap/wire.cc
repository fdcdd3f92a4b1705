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
