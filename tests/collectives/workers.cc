#include "tests/collectives/workers.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "loom/loom.h"
#include "tests/collectives/harness.h"
#include "tests/collectives/soak.h"

extern char** environ;

namespace loomtest {

namespace {

std::string toHex(const void* p, size_t n) {
  static const char* k = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    unsigned char c = static_cast<const unsigned char*>(p)[i];
    s += k[c >> 4];
    s += k[c & 15];
  }
  return s;
}

bool fromHex(const std::string& s, void* out, size_t n) {
  if (s.size() != 2 * n) return false;
  auto val = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (size_t i = 0; i < n; ++i)
    static_cast<unsigned char*>(out)[i] =
        static_cast<unsigned char>(val(s[2 * i]) << 4 | val(s[2 * i + 1]));
  return true;
}

}  // namespace

bool WorkerResult::exitedWith(int rank, int code) const {
  int st = status[rank];
  return st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == code;
}

bool WorkerResult::killedBySignal(int rank) const {
  int st = status[rank];
  return st != -1 && WIFSIGNALED(st);
}

std::string WorkerResult::describe(int rank) const {
  int st = status[rank];
  std::string s = st == -1        ? "not collected"
                  : WIFEXITED(st) ? "exit " + std::to_string(WEXITSTATUS(st))
                                  : "signal " + std::to_string(WTERMSIG(st));
  return s + "; output: " + output[rank];
}

WorkerResult runWorkers(int n, const std::string& mode,
                        const std::vector<std::pair<std::string, std::string>>& env,
                        int deadlineSec) {
  WorkerResult res;
  res.status.assign(n, -1);
  res.output.assign(n, "");
  loomUniqueId id;
  if (loomGetUniqueId(&id) != loomSuccess) {
    for (auto& o : res.output) o = std::string("loomGetUniqueId failed: ") + loomGetLastError();
    return res;
  }
  std::string idHex = toHex(&id, sizeof(id));
  std::vector<pid_t> pids(n, -1);
  std::vector<int> fds(n, -1);
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> vars;
    for (char** e = environ; *e; ++e) vars.emplace_back(*e);
    vars.push_back("LOOM_TEST_WORKER=" + mode);
    vars.push_back("LOOM_TEST_RANK=" + std::to_string(r));
    vars.push_back("LOOM_TEST_NRANKS=" + std::to_string(n));
    vars.push_back("LOOM_TEST_ID=" + idHex);
    for (auto& [k, v] : env) vars.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& v : vars) envp.push_back(v.data());
    envp.push_back(nullptr);
    char exe[] = "/proc/self/exe";
    char* argv[] = {exe, nullptr};
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) break;
    pid_t pid = fork();
    if (pid == 0) {
      dup2(p[1], 2);
      execve(exe, argv, envp.data());
      _exit(127);
    }
    close(p[1]);
    pids[r] = pid;
    fds[r] = p[0];
    fcntl(fds[r], F_SETFL, O_NONBLOCK);
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(deadlineSec);
  int left = n;
  while (left > 0) {
    for (int r = 0; r < n; ++r) {
      char buf[4096];
      ssize_t k;
      while (fds[r] >= 0 && (k = read(fds[r], buf, sizeof(buf))) > 0) res.output[r].append(buf, k);
      if (pids[r] > 0 && res.status[r] == -1) {
        int st;
        if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
          res.status[r] = st;
          --left;
        }
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < n; ++r)
        if (res.status[r] == -1 && pids[r] > 0) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], &res.status[r], 0);
          res.output[r] += " [killed by the test after " + std::to_string(deadlineSec) + " s]";
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int r = 0; r < n; ++r) {
    char buf[4096];
    ssize_t k;
    while (fds[r] >= 0 && (k = read(fds[r], buf, sizeof(buf))) > 0) res.output[r].append(buf, k);
    if (fds[r] >= 0) close(fds[r]);
  }
  return res;
}

namespace {

// The victim kills itself 30 ms into a series of allreduces of `count` floats (large: the direct
// path with single copy; small: the low-latency exchange), which lasts up to 20 s.
int killMode(loomComm_t comm, int rank, int victim, size_t count, bool shared = false) {
  std::vector<float> va(shared ? 0 : count, 1.0f), vb(shared ? 0 : count);
  float* a = va.data();
  float* b = vb.data();
  void *sa = nullptr, *sb = nullptr;
  if (shared) {
    if (loomMemAlloc(&sa, count * sizeof(float)) != loomSuccess ||
        loomMemAlloc(&sb, count * sizeof(float)) != loomSuccess) {
      fprintf(stderr, "rank %d: loomMemAlloc failed: %s\n", rank, loomGetLastError());
      return 4;
    }
    a = static_cast<float*>(sa);
    b = static_cast<float*>(sb);
    std::fill(a, a + count, 1.0f);
  }
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (int it = 0; std::chrono::steady_clock::now() < end; ++it) {
    if (rank == victim && it == 1) {
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        raise(SIGKILL);
      }).detach();
    }
    loomResult_t r = loomAllReduce(a, b, count, loomFloat32, loomSum, comm, nullptr);
    if (r != loomSuccess) {
      std::string msg = loomGetLastError();
      fprintf(stderr, "rank %d: %s: %s\n", rank, loomGetErrorString(r), msg.c_str());
      return msg.find("rank " + std::to_string(victim)) != std::string::npos ? 0 : 3;
    }
  }
  fprintf(stderr, "rank %d: every allreduce succeeded although rank %d was killed\n", rank, victim);
  return 2;
}

// Rank 0's buffers come from loomMemAlloc, the others' from malloc: the ranks must agree to go
// through the transport (nobody can map a malloc buffer) and still get the right sums.
int mixedAllocMode(loomComm_t comm, int rank, int n) {
  const size_t count = size_t(1) << 20;
  void* mem = nullptr;
  std::vector<float> heap;
  float* buf = nullptr;
  if (rank == 0) {
    if (loomMemAlloc(&mem, 2 * count * sizeof(float)) != loomSuccess) return 4;
    buf = static_cast<float*>(mem);
  } else {
    heap.resize(2 * count);
    buf = heap.data();
  }
  for (int it = 0; it < 3; ++it) {
    for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>(rank + 1 + (i % 7) + it);
    loomResult_t r = loomAllReduce(buf, buf + count, count, loomFloat32, loomSum, comm, nullptr);
    if (r != loomSuccess) {
      fprintf(stderr, "rank %d: %s\n", rank, loomGetLastError());
      return 1;
    }
    for (size_t i = 0; i < count; ++i) {
      float want = static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>((i % 7) + it));
      if (buf[count + i] != want) {
        fprintf(stderr, "rank %d: element %zu is %g, expected %g\n", rank, i, buf[count + i], want);
        return 1;
      }
    }
  }
  if (mem) loomMemFree(mem);
  fprintf(stderr, "mixed allocations: ok\n");
  return 0;
}

// Registration over the emulated InfiniBand device (LOOM_NET=ib, LOOM_IBVERBS_LIB naming
// libloom-fakeverbs.so): allreduces on buffers registered with loomCommRegister make no
// ibv_reg_mr call once the first one has set up the connections; the same on unregistered
// buffers do (the transport registers each message), which shows the count can tell them apart.
// Every result is checked. Prints "reg_mr_calls registered +R unregistered +U".
int regCountMode(loomComm_t comm, int rank, int n) {
  const char* lib = getenv("LOOM_IBVERBS_LIB");
  void* h = lib ? dlopen(lib, RTLD_NOW | RTLD_LOCAL) : nullptr;
  auto count =
      h ? reinterpret_cast<int (*)(const char*)>(dlsym(h, "loomtest_fakeverbs_count")) : nullptr;
  if (!count) {
    fprintf(stderr, "rank %d: no loomtest_fakeverbs_count in LOOM_IBVERBS_LIB=%s\n", rank,
            lib ? lib : "(unset)");
    return 5;
  }
  const size_t kCount = size_t(1) << 18;  // 1 MiB of floats: many pieces per step
  const int kIters = 8;
  std::vector<float> regIn(kCount), regOut(kCount), in(kCount), out(kCount);
  auto allreduce = [&](std::vector<float>& a, std::vector<float>& b, int it) -> bool {
    for (size_t i = 0; i < kCount; ++i) a[i] = static_cast<float>(rank + 1 + (i + it) % 5);
    loomResult_t r = loomAllReduce(a.data(), b.data(), kCount, loomFloat32, loomSum, comm, nullptr);
    if (r != loomSuccess) {
      fprintf(stderr, "rank %d: allreduce: %s\n", rank, loomGetLastError());
      return false;
    }
    for (size_t i = 0; i < kCount; ++i) {
      float want = static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>((i + it) % 5));
      if (b[i] != want) {
        fprintf(stderr, "rank %d: iteration %d element %zu is %g, expected %g\n", rank, it, i, b[i],
                want);
        return false;
      }
    }
    return true;
  };
  void *hIn = nullptr, *hOut = nullptr;
  if (loomCommRegister(comm, regIn.data(), kCount * sizeof(float), &hIn) != loomSuccess ||
      loomCommRegister(comm, regOut.data(), kCount * sizeof(float), &hOut) != loomSuccess) {
    fprintf(stderr, "rank %d: loomCommRegister: %s\n", rank, loomGetLastError());
    return 4;
  }
  if (!allreduce(regIn, regOut, 0)) return 1;  // connects, and registers once per connection
  int before = count("reg_mr_calls");
  for (int it = 1; it <= kIters; ++it)
    if (!allreduce(regIn, regOut, it)) return 1;
  int registered = count("reg_mr_calls") - before;
  int mrsBefore = count("mr");
  if (loomCommDeregister(comm, hIn) != loomSuccess ||
      loomCommDeregister(comm, hOut) != loomSuccess) {
    fprintf(stderr, "rank %d: loomCommDeregister: %s\n", rank, loomGetLastError());
    return 4;
  }
  int mrsAfter = count("mr");
  if (!allreduce(in, out, 0)) return 1;
  before = count("reg_mr_calls");
  for (int it = 1; it <= kIters; ++it)
    if (!allreduce(in, out, it)) return 1;
  int unregistered = count("reg_mr_calls") - before;
  fprintf(stderr, "reg_mr_calls registered +%d unregistered +%d; live MRs %d -> %d at deregister\n",
          registered, unregistered, mrsBefore, mrsAfter);
  if (registered != 0 || unregistered <= 0 || mrsAfter >= mrsBefore) return 2;
  return 0;
}

}  // namespace

int workerMain() {
  std::string mode = getenv("LOOM_TEST_WORKER");
  int rank = atoi(getenv("LOOM_TEST_RANK"));
  int n = atoi(getenv("LOOM_TEST_NRANKS"));
  loomUniqueId id;
  if (!fromHex(getenv("LOOM_TEST_ID"), &id, sizeof(id))) {
    fprintf(stderr, "bad LOOM_TEST_ID\n");
    return 10;
  }
  fprintf(stderr, "worker pid %d\n", static_cast<int>(getpid()));
  // LOOM_TEST_HOSTS: a comma list of host ids, one per rank, that become each worker's
  // LOOM_HOSTID: several hosts simulated on one machine (ranks of different ids use sockets).
  if (const char* hosts = getenv("LOOM_TEST_HOSTS")) {
    std::vector<std::string> ids(1);
    for (const char* p = hosts; *p; ++p) {
      if (*p == ',') {
        ids.emplace_back();
      } else {
        ids.back() += *p;
      }
    }
    if (rank < static_cast<int>(ids.size())) setenv("LOOM_HOSTID", ids[rank].c_str(), 1);
  } else if (const char* k = getenv("LOOM_TEST_RANKS_PER_HOST")) {
    // Emulated hosts: ranks k*h to k*h+k-1 share the host id "test-host-h", so one communicator
    // mixes shared memory (inside a host) and sockets.
    std::string host = "test-host-" + std::to_string(rank / std::max(1, atoi(k)));
    setParam("LOOM_HOSTID", host.c_str());
  }
  loomComm_t comm = nullptr;
  if (loomCommInitRank(&comm, n, id, rank) != loomSuccess) {
    fprintf(stderr, "rank %d: init failed: %s\n", rank, loomGetLastError());
    return 11;
  }
  int rc = 0;
  if (mode.rfind("matrix:", 0) == 0) {
    std::string collText = mode.substr(7);
    int ran = 0;
    for (Coll c : allColls()) {
      if (collText != collName(c)) continue;
      for (const auto& cs :
           matrix(c, n, standardCounts(n), {loomSum, loomProd, loomMax, loomMin, loomAvg})) {
        std::string e = runCase(comm, rank, n, cs);
        ++ran;
        if (!e.empty()) {
          fprintf(stderr, "%s\n", e.c_str());
          rc = 1;
          if (e.find("expected") == std::string::npos) break;
        }
      }
    }
    fprintf(stderr, "ran %d cases\n", ran);
    if (ran == 0) rc = 13;
  } else if (mode == "tiles" || mode == "tiles:mixed") {
    // AllReduce, Broadcast (both roots) and AllGather of plain buffers large enough for several
    // result tiles per rank (the one pass's, LOOM_SHM_RESULT_TILES), a partial last one and uneven
    // slices, in and out of place. Mixed: rank 0 turns the tiles off, so every rank must agree to
    // write with process_vm_writev.
    if (mode == "tiles:mixed" && rank == 0) setParam("LOOM_SHM_RESULT_TILES", "0");
    const size_t sliced = static_cast<size_t>(n) * 300000 + 7, perRank = 300007;
    int ran = 0;
    for (Coll c : {Coll::kAllReduce, Coll::kBroadcast, Coll::kAllGather}) {
      for (const auto& cs :
           matrix(c, n, {c == Coll::kAllGather ? perRank : sliced}, {loomSum, loomMax, loomAvg})) {
        std::string e = runCase(comm, rank, n, cs);
        ++ran;
        if (!e.empty()) {
          fprintf(stderr, "%s\n", e.c_str());
          rc = 1;
        }
      }
    }
    fprintf(stderr, "ran %d cases\n", ran);
  } else if (mode.rfind("kill:", 0) == 0) {
    rc = killMode(comm, rank, atoi(mode.c_str() + 5), size_t(4) << 20);
  } else if (mode.rfind("killsmall:", 0) == 0) {
    rc = killMode(comm, rank, atoi(mode.c_str() + 10), 16);
  } else if (mode.rfind("killmapped:", 0) == 0) {
    rc = killMode(comm, rank, atoi(mode.c_str() + 11), size_t(4) << 20, true);
  } else if (mode == "regcount") {
    rc = regCountMode(comm, rank, n);
  } else if (mode.rfind("soak:", 0) == 0) {
    // soak:SEED:SECONDS
    SoakOptions o;
    o.seed = strtoull(mode.c_str() + 5, nullptr, 10);
    const char* secs = strchr(mode.c_str() + 5, ':');
    o.seconds = secs ? atof(secs + 1) : 10;
    uint64_t calls = 0;
    std::string e = soak(comm, rank, n, o, &calls);
    if (!e.empty()) {
      fprintf(stderr, "%s\n", e.c_str());
      rc = 1;
    } else {
      fprintf(stderr, "soak: %llu calls checked\n", static_cast<unsigned long long>(calls));
    }
  } else if (mode == "mixedalloc") {
    rc = mixedAllocMode(comm, rank, n);
  } else if (mode.rfind("dev", 0) == 0) {
    rc = deviceWorker(mode, comm, rank, n);
  } else {
    fprintf(stderr, "unknown worker mode %s\n", mode.c_str());
    rc = 12;
  }
  loomCommDestroy(comm);
  return rc;
}

}  // namespace loomtest
