#include "src/runtime/registrations.h"

#include <algorithm>
#include <atomic>

#include "src/core/log.h"

namespace loom {

namespace {

// Handles are numbers from one counter for the whole process: a handle of another communicator,
// or one already deregistered, is never mistaken for a live registration of this one.
std::atomic<uint64_t> gNextRegistrationId{1};

constexpr size_t kDeregisteredRemembered = 4096;

}  // namespace

char* Registrations::scratch(size_t bytes) {
  if (bytes > scratchBytes_) {
    if (scratchId_ != 0) {
      std::lock_guard<std::mutex> lk(mu_);
      dropLocked(scratchId_);
      scratchId_ = 0;
    }
    scratchMem_.reset(new char[bytes + 64]);
    scratchAligned_ = reinterpret_cast<char*>(
        (reinterpret_cast<uintptr_t>(scratchMem_.get()) + 63) & ~uintptr_t(63));
    scratchBytes_ = bytes;
    scratchId_ = addRange(reinterpret_cast<uintptr_t>(scratchAligned_), bytes, true);
  }
  return scratchAligned_;
}

uint64_t Registrations::addRange(uintptr_t begin, size_t size, bool internal) {
  auto r = std::make_unique<Registration>();
  r->internal = internal;
  r->id = gNextRegistrationId.fetch_add(1, std::memory_order_relaxed);
  r->begin = begin;
  r->end = begin + size;
  uint64_t id = r->id;
  std::lock_guard<std::mutex> lk(mu_);
  maxLen_ = std::max(maxLen_, size);
  byId_[id] = r.get();
  regs_.emplace(begin, std::move(r));
  return id;
}

bool Registrations::dropLocked(uint64_t id) {
  auto byId = byId_.find(id);
  if (byId == byId_.end()) return false;
  Registration* r = byId->second;
  releaseHandlesLocked(r);
  auto range = regs_.equal_range(r->begin);
  for (auto it = range.first; it != range.second; ++it) {
    if (it->second.get() == r) {
      regs_.erase(it);
      break;
    }
  }
  byId_.erase(byId);
  if (regs_.empty()) maxLen_ = 0;
  return true;
}

Result<void*> Registrations::add(void* buff, size_t size) {
  uintptr_t b = reinterpret_cast<uintptr_t>(buff);
  if (b + size < b)
    return LOOM_ERROR(kInvalidArgument, "buffer of {} bytes at {} wraps around the address space",
                      size, buff);
  uint64_t id = addRange(b, size, false);
  LOOM_TRACE(kSubNet, "registered {} bytes at {} (handle {})", size, buff, id);
  return reinterpret_cast<void*>(static_cast<uintptr_t>(id));
}

Status Registrations::remove(void* handle) {
  uint64_t id = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(handle));
  std::lock_guard<std::mutex> lk(mu_);
  auto it = byId_.find(id);
  if (it == byId_.end() || it->second->internal || !dropLocked(id)) {
    if (deregistered_.count(id))
      return LOOM_ERROR(kInvalidArgument, "handle {} was deregistered already", handle);
    return LOOM_ERROR(kInvalidArgument,
                      "handle {} is not a registration of this communicator (not from "
                      "loomCommRegister on it, or deregistered long ago)",
                      handle);
  }
  if (deregistered_.size() >= kDeregisteredRemembered) deregistered_.erase(deregistered_.begin());
  deregistered_.insert(id);
  return Status();
}

void* Registrations::memHandle(void* conn, const void* p, size_t n) {
  if (!p || n == 0 || !net_) return nullptr;
  uintptr_t b = reinterpret_cast<uintptr_t>(p), e = b + n;
  std::lock_guard<std::mutex> lk(mu_);
  if (regs_.empty()) return nullptr;
  // The registrations that begin at or before b, nearest first; none that begins before
  // e - maxLen_ can reach e.
  Registration* found = nullptr;
  for (auto it = regs_.upper_bound(b); it != regs_.begin();) {
    --it;
    if (it->first + maxLen_ < e) break;
    if (it->second->end >= e) {
      found = it->second.get();
      break;
    }
  }
  if (!found) return nullptr;
  auto h = found->mhandles.find(conn);
  if (h != found->mhandles.end()) return h->second;
  void* mh = nullptr;
  Status st = net_->regMr(conn, reinterpret_cast<void*>(found->begin), found->end - found->begin,
                          net::kPtrHost, &mh);
  if (!st.isOk()) {
    mh = nullptr;
    if (!found->warned)
      LOOM_WARN(
          "registering {} bytes at {:#x} with {} failed ({}); that buffer is registered per "
          "message instead",
          found->end - found->begin, found->begin, net_->name(), st.message());
    found->warned = true;
  }
  found->mhandles.emplace(conn, mh);
  return mh;
}

size_t Registrations::count() const {
  std::lock_guard<std::mutex> lk(mu_);
  return regs_.size();
}

void Registrations::releaseHandlesLocked(Registration* r) {
  for (auto& [conn, mh] : r->mhandles) {
    if (!mh) continue;
    Status st = net_->deregMr(conn, mh);
    if (!st.isOk()) LOOM_WARN("deregistering a buffer from {}: {}", net_->name(), st.message());
  }
  r->mhandles.clear();
}

void Registrations::releaseHandles() {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [begin, r] : regs_) releaseHandlesLocked(r.get());
}

}  // namespace loom
