// The shared-memory transport's single-copy probes (shm_transport.h): what each local rank can
// read of the others' memory, found at init and written into the segment's can-read matrix,
// which the sends (Transport::sendConn) and the one pass (src/runtime/one_pass.cc) read.
#include <sys/prctl.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>

#include "src/core/log.h"
#include "transports/shm/shared_alloc.h"
#include "transports/shm/shm_transport.h"

namespace loom::shm {

// Yama's ptrace_scope 1 (Ubuntu's default) lets a process attach only to its descendants, so
// process_vm_readv between sibling ranks fails with EPERM unless the target names its tracers.
// As Open MPI does for its CMA path, the process allows any process of its user (once per
// process, and only where Yama is at 1; 2 and 3 stay closed).
static void allowCmaUnderYama() {
  static std::once_flag once;
  std::call_once(once, [] {
    FILE* f = std::fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
    if (!f) return;
    int scope = -1;
    if (std::fscanf(f, "%d", &scope) != 1) scope = -1;
    std::fclose(f);
    if (scope != 1) return;
    if (prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) == 0)
      LOOM_INFO(kSubShm,
                "Yama ptrace_scope is 1: this process lets processes of its user attach "
                "(PR_SET_PTRACER_ANY) so that local ranks can use process_vm_readv/writev; "
                "LOOM_SHM_MAPPED_CMA=0 and LOOM_SHM_SINGLE_COPY<2 prevent it");
  });
}

void Transport::publishProbe() {
  if (opts_.cmaOnePass || opts_.singleCopyProcesses) allowCmaUnderYama();
  std::random_device rd;
  probe_ = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ 0x5a5a5a5a5a5a5a5aull;
  RankArea* a = area_.rankArea(me_);
  a->probeAddr = reinterpret_cast<uint64_t>(&probe_);
  a->probeValue = probe_;
  a->memfdProbeFd = -1;
  if (opts_.singleCopyMapped) {
    Result<ProbeInfo> pi = probeAllocation();
    if (pi.isOk()) {
      a->memfdProbeFd = pi.value().fd;
      a->memfdProbeSerial = pi.value().serial;
      a->memfdProbeValue = pi.value().value;
    } else {
      LOOM_INFO(kSubShm, "no shared allocation to probe ({}): loomMemAlloc buffers are copied",
                pi.status().message());
    }
  }
}

// Can this rank map local rank i's shared allocations (loomMemAlloc)? Mapping its probe page
// tells, and leaves that mapping cached.
bool Transport::probeMapping(int i) {
  RankArea* a = area_.rankArea(i);
  if (!opts_.singleCopyMapped || a->memfdProbeFd < 0) return false;
  Result<const char*> m = peerMaps_[i]->map(area_.peer(i).pid, a->memfdProbeFd, a->memfdProbeSerial,
                                            0, sizeof(uint64_t));
  uint64_t got = 0;
  if (m.isOk()) std::memcpy(&got, m.value(), sizeof(got));
  if (m.isOk() && got == a->memfdProbeValue) return true;
  LOOM_INFO(kSubShm, "cannot map the shared buffers of rank {} (pid {}): {}", area_.peer(i).rank,
            area_.peer(i).pid, m.isOk() ? "wrong data" : m.status().message());
  return false;
}

void Transport::probePeers() {
  for (int i = 0; i < area_.nlocal(); ++i) {
    uint8_t ok = 0;
    if (i == me_) {
      ok = kReadsAny;
    } else if (area_.peer(i).pid == area_.myPid()) {
      ok = opts_.singleCopyThreads ? kReadsAny : 0;  // a thread of this process: plain memcpy
    } else if (!opts_.singleCopyProcesses && !opts_.cmaOnePass) {
      ok = probeMapping(i) ? kMapsShared : 0;
    } else {
      RankArea* a = area_.rankArea(i);
      uint64_t got = 0;
      iovec local{&got, sizeof(got)};
      iovec remote{reinterpret_cast<void*>(a->probeAddr), sizeof(got)};
      ssize_t n = process_vm_readv(area_.peer(i).pid, &local, 1, &remote, 1, 0);
      bool cma = n == static_cast<ssize_t>(sizeof(got)) && got == a->probeValue;
      if (cma) ok = kCma | (opts_.singleCopyProcesses ? kReadsAny : 0);
      if (probeMapping(i)) ok |= kMapsShared;
      if (!cma)
        LOOM_INFO(kSubShm, "process_vm_readv from rank {} (pid {}) is not allowed ({}): eager copy",
                  area_.peer(i).rank, area_.peer(i).pid,
                  n < 0 ? std::strerror(errno) : "wrong data");
    }
    *area_.canRead(me_, i) = ok;
  }
}

bool Transport::canMapShared(int reader, int owner) const {
  return (*area_.canRead(reader, owner) & kMapsShared) != 0;
}

bool Transport::canCma(int reader, int owner) const {
  return opts_.cmaOnePass && (*area_.canRead(reader, owner) & kCma) != 0;
}

bool Transport::allOneProcess() const {
  for (int i = 0; i < area_.nlocal(); ++i)
    if (area_.peer(i).pid != area_.myPid()) return false;
  return true;
}

bool Transport::everyPairCanReach() const {
  for (int r = 0; r < area_.nlocal(); ++r)
    for (int o = 0; o < area_.nlocal(); ++o)
      if (area_.peer(r).pid != area_.peer(o).pid && !canMapShared(r, o) && !canCma(r, o))
        return false;
  return true;
}

Result<char*> Transport::mapPeerShared(int local, const SharedRef& ref, size_t bytes) {
  LOOM_ASSIGN(const char* p,
              peerMaps_[local]->map(area_.peer(local).pid, ref.fd, ref.serial, ref.offset, bytes));
  return const_cast<char*>(p);  // mapped read-write
}

bool Transport::receiverCanRead(int local) const {
  return (*area_.canRead(local, me_) & kReadsAny) != 0;
}

std::string Transport::singleCopySummary() const {
  int direct = 0, cma = 0, mapped = 0, eager = 0;
  for (int i = 0; i < area_.nlocal(); ++i) {
    if (i == me_) continue;
    uint8_t both = *area_.canRead(i, me_) & *area_.canRead(me_, i);
    if (area_.peer(i).pid == area_.myPid() && (both & kReadsAny))
      ++direct;
    else if (both & kReadsAny)
      ++cma;
    else if (both & kMapsShared)
      ++mapped;
    else
      ++eager;
  }
  return fmt::format(
      "single copy with {} peer(s) by memcpy (threads), {} by process_vm_readv, {} by mapping "
      "loomMemAlloc buffers (other buffers eager), eager copy with {}",
      direct, cma, mapped, eager);
}

}  // namespace loom::shm
