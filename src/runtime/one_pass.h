// The one pass over the peers' buffers, for collectives of a communicator whose ranks all share a
// host and can reach each other's buffers (threads of one process by address, buffers from
// loomMemAlloc by mapping, plain buffers of other processes with process_vm_readv/writev): no
// messages, no staging. For an AllReduce each rank reduces its slice of every rank's input, in rank
// order, and writes the result straight into every rank's output, so each byte of input is read
// once and each byte of output written once: the least memory traffic any algorithm can have on
// shared memory. Two flag rounds of the low-latency exchange frame it: the first publishes each
// rank's buffers (and whether its peers can reach them: every rank must agree before anyone
// touches a peer's memory), the second says every rank is done, so no rank returns while peers
// still use its buffers. LOOM_SHM_MAPPED=0 turns it off.
//
// When it runs is dispatch's decision (src/runtime/dispatch.h, Path::kOnePass): where the planner
// chose "direct", or where the model prices the one pass below the planner's choice. The buffers'
// reach is known only in the first round, so a call on buffers some rank cannot reach (or reach
// only through process_vm_readv/writev at a price above Decision::onePassLimitSec) pays that round
// and falls back, on every rank, to the decision's schedule; the communicator then skips the next
// attempts with a growing backoff (Comm::onePassAttemptDue).
#pragma once

#include "src/core/status.h"
#include "src/runtime/dispatch.h"
#include "src/runtime/executor.h"

namespace loom {

class Comm;

// Runs op in one pass when every rank's buffers can be reached by its peers (and, where some are
// reached through process_vm_readv/writev, the one pass still costs less than
// decision.onePassLimitSec); *ran says whether it did (false: nothing happened on any rank; the
// caller runs the decision's schedule). On failure the communicator is marked failed.
Status runOnePass(Comm* comm, const OpArgs& op, const Decision& decision, bool* ran);

// Before peers reach a plain buffer of this process through process_vm_readv/writev: the second
// time a range is seen (a buffer used again, as a training step's buckets and a benchmark's are;
// one used once is left alone), the 2 MiB-aligned interior of what was seen is collapsed into
// transparent huge pages (madvise MADV_COLLAPSE, Linux 6.1: the same contents at the same
// addresses, copied once), where the kernel pins one page per 2 MiB instead of one per 4 KiB;
// with it the rest of its mapping (/proc/self/maps) where that is at most 4 times as large, so
// that a benchmark rotating through a buffer pays once, not again for each new part.
// Best effort: a kernel without it, memory it may not collapse (MADV_NOHUGEPAGE) or no free huge
// page leaves the range as it is, and it is not tried again. Returns whether it collapsed now.
bool collapseReusedBuffer(const void* p, size_t bytes);

// The size of a transparent huge page on the machines Loom runs on (x86-64, aarch64 with 4 KiB
// base pages).
constexpr size_t kHugePageBytes = size_t(2) << 20;

// madvise(MADV_COLLAPSE) over the whole huge pages of [p, p + bytes): 0 when collapsed (or when
// the range holds no whole huge page), else the errno the kernel gave (EINVAL where it predates
// Linux 6.1, ENOSYS off Linux).
int collapseHugePages(const void* p, size_t bytes);

}  // namespace loom
