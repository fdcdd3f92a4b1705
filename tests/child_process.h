// Child processes of a test that are the test binary itself started afresh: the test file defines
// a static initializer that reads an environment variable, and the child runs its part there,
// before main, and exits. A fresh process, unlike a fork of the test, inherits no lock that one of
// the test's threads held at the fork. Used by the transport and device tests.
#pragma once

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "src/core/clock.h"

namespace loom {
namespace testing_util {

// Starts this test binary afresh as a child process, with var=value added to the caller's
// environment and closeInChild (unless -1) closed. Everything is built before the fork; between
// fork and exec only async-signal-safe calls. Returns the child's pid, or -1.
inline pid_t spawnSelf(const char* var, const std::string& value, int closeInChild = -1) {
  std::string entry = std::string(var) + "=" + value;
  const size_t n = std::strlen(var);
  std::vector<char*> env;
  for (char** e = environ; *e; ++e)
    if (!(std::strncmp(*e, var, n) == 0 && (*e)[n] == '=')) env.push_back(*e);
  env.push_back(&entry[0]);
  env.push_back(nullptr);
  char self[] = "/proc/self/exe";
  char* argv[] = {self, nullptr};
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Killed with the test: a test process that dies without its destructors (a sanitizer's
    // halt_on_error, a crash) must not leave the child holding ctest's output pipe until the
    // timeout. The signal follows the forking thread, and every caller forks from the test's own.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    if (closeInChild >= 0) ::close(closeInChild);
    ::execve(self, argv, env.data());
    ::_exit(127);
  }
  return pid;
}

// A child process (from spawnSelf) that goes with the test: killed and reaped on destruction,
// whatever assertion ended the test. Left alive, it would keep the test's output pipe open and
// ctest would wait for it until its timeout.
struct ChildProcess {
  pid_t pid = -1;  // -1 once reaped
  int status = 0;  // its wait status, once reaped
  ChildProcess() = default;
  explicit ChildProcess(pid_t p) : pid(p) {}
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() { kill(); }
  // SIGKILL unless reaped already, and reap; the wait status.
  int kill() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      pid = -1;
    }
    return status;
  }
  // True (and reaped) once it has exited.
  bool exited() {
    if (pid > 0 && ::waitpid(pid, &status, WNOHANG) == pid) pid = -1;
    return pid < 0;
  }
  // The wait status once it exits, waiting at most timeoutMs (then kills it).
  int reap(int64_t timeoutMs) {
    Deadline deadline(timeoutMs);
    while (!exited() && !deadline.expired()) ::usleep(1000);
    return kill();
  }
  // Its exit code, as reap(timeoutMs) waits for it; -1 when it did not exit by itself.
  int exitCode(int64_t timeoutMs) {
    const int st = reap(timeoutMs);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
};

}  // namespace testing_util
}  // namespace loom
