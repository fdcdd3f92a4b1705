// Facts about processes of this host.
#pragma once

namespace loom {

// True when process pid no longer runs: kill() reports it gone, or it is a zombie (dead, not yet
// reaped by its parent). False for pid <= 0 and for processes that may merely not be ours.
bool processGone(int pid);

// A hint to the CPU that this thread is spinning (x86 pause); lets a sibling hyperthread run.
inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// CPUs this process may run on (sched_getaffinity), at least 1.
int usableCpus();

}  // namespace loom
