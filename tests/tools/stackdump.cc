// libloom-stackdump.so: where every thread of a process is, some seconds after it starts, for
// hangs on machines without a debugger (the GPU check's machine). Preloaded:
//   LD_PRELOAD=libloom-stackdump.so LOOMTEST_STACKS_AFTER=20 LOOMTEST_STACKS_DIR=/tmp/stacks cmd
// After LOOMTEST_STACKS_AFTER seconds a thread of its own sends a signal to every thread of the
// process; each writes its backtrace (glibc's backtrace_symbols_fd: "library(+offset)", which
// addr2line turns into lines against the unstripped build) to LOOMTEST_STACKS_DIR/stacks.PID (or
// to stderr without the directory). Processes the program starts inherit the variables and dump
// too. Nothing happens without LOOMTEST_STACKS_AFTER.
#include <dirent.h>
#include <execinfo.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace {

int gFd = 2;

void writeAll(const char* s, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(gFd, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

void onSignal(int) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  char head[96];
  char name[32] = {};
  pthread_getname_np(pthread_self(), name, sizeof(name));
  const int len = std::snprintf(head, sizeof(head), "--- thread %ld (%s)\n",
                                static_cast<long>(::syscall(SYS_gettid)), name);
  if (len > 0) writeAll(head, static_cast<size_t>(len));
  backtrace_symbols_fd(frames, n, gFd);
}

void* dumper(void* arg) {
  const long seconds = reinterpret_cast<long>(arg);
  timespec t{seconds, 0};
  while (nanosleep(&t, &t) != 0) {
  }
  if (const char* dir = std::getenv("LOOMTEST_STACKS_DIR"); dir && *dir) {
    char path[512];
    std::snprintf(path, sizeof(path), "%s/stacks.%d", dir, static_cast<int>(::getpid()));
    const int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) gFd = fd;
  }
  char cmd[256] = {};
  const int cfd = ::open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
  if (cfd >= 0) {
    const ssize_t r = ::read(cfd, cmd, sizeof(cmd) - 1);
    for (ssize_t i = 0; i < r; ++i)
      if (cmd[i] == '\0') cmd[i] = ' ';
    ::close(cfd);
  }
  char head[400];
  const int len = std::snprintf(head, sizeof(head), "=== pid %d after %ld s: %s\n",
                                static_cast<int>(::getpid()), seconds, cmd);
  if (len > 0) writeAll(head, static_cast<size_t>(len));
  const long self = ::syscall(SYS_gettid);
  DIR* d = ::opendir("/proc/self/task");
  if (!d) return nullptr;
  while (dirent* e = ::readdir(d)) {
    const long tid = std::strtol(e->d_name, nullptr, 10);
    if (tid <= 0 || tid == self) continue;
    ::syscall(SYS_tgkill, ::getpid(), tid, SIGRTMIN + 5);
    timespec gap{0, 50 * 1000 * 1000};  // one thread's dump at a time
    nanosleep(&gap, nullptr);
  }
  ::closedir(d);
  return nullptr;
}

__attribute__((constructor)) void start() {
  const char* after = std::getenv("LOOMTEST_STACKS_AFTER");
  if (!after || !*after) return;
  const long seconds = std::strtol(after, nullptr, 10);
  if (seconds <= 0) return;
  void* warm[2];
  backtrace(warm, 2);  // loads libgcc now, not inside the signal handler
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGRTMIN + 5, &sa, nullptr);
  pthread_t t;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_create(&t, &attr, dumper, reinterpret_cast<void*>(seconds));
  pthread_attr_destroy(&attr);
}

}  // namespace
