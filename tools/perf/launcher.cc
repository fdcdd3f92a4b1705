#include "tools/perf/launcher.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "src/core/clock.h"
#include "src/core/params.h"
#include "tools/perf/bench.h"
#include "transports/shm/host_area.h"

extern char** environ;

namespace loom {
namespace perf {
namespace {

// Handed from the -np parent to each rank it spawns; internal to loom-perf.
constexpr const char* kEnvRank = "LOOMPERF_CHILD_RANK";
constexpr const char* kEnvNranks = "LOOMPERF_CHILD_NRANKS";
constexpr const char* kEnvId = "LOOMPERF_CHILD_ID";
// The write end of the pipe on which a spawned rank reports its failure to the launcher.
constexpr const char* kEnvReportFd = "LOOMPERF_CHILD_REPORT_FD";
// A report line: "rank<TAB>ns<TAB>code<TAB>message\n", at most this long (one atomic write).
constexpr size_t kReportMax = 3000;

std::string hexEncode(const void* data, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  const unsigned char* p = static_cast<const unsigned char*>(data);
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += kDigits[p[i] >> 4];
    out += kDigits[p[i] & 15];
  }
  return out;
}

bool hexDecode(const std::string& text, void* data, size_t n) {
  if (text.size() != 2 * n) return false;
  unsigned char* p = static_cast<unsigned char*>(data);
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < n; ++i) {
    int hi = digit(text[2 * i]), lo = digit(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    p[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  return true;
}

bool parseInt(const char* text, int* out) {
  if (!text || !*text) return false;
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  if (*end != '\0') return false;
  *out = static_cast<int>(v);
  return true;
}

Status loomCall(loomResult_t res, const char* what) {
  if (res == loomSuccess) return Status::ok();
  return Status(static_cast<Code>(res), fmt::format("{} failed: {}: {}", what,
                                                    loomGetErrorString(res), loomGetLastError()));
}

// argv without -np N / -np=N / --np N / --np=N.
std::vector<std::string> argsWithoutNp(int argc, char** argv) {
  std::vector<std::string> out;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (i > 0 && (a == "-np" || a == "--np")) {
      ++i;
      continue;
    }
    if (i > 0 && (a.rfind("-np=", 0) == 0 || a.rfind("--np=", 0) == 0)) continue;
    out.push_back(a);
  }
  return out;
}

// Seconds a rank gets to fail by itself after another rank failed.
int graceSeconds(const Options& opts) {
  int64_t timeout = opts.timeoutSec > 0 ? opts.timeoutSec : params::kTimeout.asInt();
  if (timeout <= 0) timeout = 30;  // LOOM_TIMEOUT=0 waits forever; we do not
  return static_cast<int>(std::min<int64_t>(timeout, 3600)) + 5;
}

std::string describeStatus(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status),
                       strsignal(WTERMSIG(status)));
  return "stopped";
}

bool launchedByEnvironment() {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("WORLD_SIZE")) return true;
  if (std::getenv("SLURM_NTASKS")) {
    if (params::kCommId.isSet()) return true;
    int ntasks = 0;
    if (parseInt(std::getenv("SLURM_NTASKS"), &ntasks) && ntasks > 1)
      std::fprintf(stderr,
                   "loom-perf: note: SLURM_NTASKS=%d but LOOM_COMM_ID is not set; each process "
                   "runs as a single rank (set LOOM_COMM_ID=host:port to join them)\n",
                   ntasks);
  }
  return false;
}

// Bytes of memory this machine can still give (MemAvailable), or 0 when unknown.
uint64_t memAvailable() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

std::string gib(uint64_t bytes) {
  if (bytes < (1ull << 30)) return fmt::format("{:.1f} MiB", bytes / double(1ull << 20));
  return fmt::format("{:.1f} GiB", bytes / double(1ull << 30));
}

}  // namespace

bool isSpawnedRank() { return std::getenv(kEnvRank) != nullptr; }

bool mayHoldRankZero() {
  for (const char* name :
       {kEnvRank, "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", "RANK"}) {
    const char* v = std::getenv(name);
    if (v && *v) return std::strcmp(v, "0") == 0;
  }
  return true;
}

std::string tooLargeForMachine(const Options& opts, uint64_t available, uint64_t shmFree) {
  const int ranks = opts.np * opts.nThreads * opts.nGpus;
  if (ranks < 2) return std::string();
  // The shared segment the ranks of this host map (unless LOOM_SHM_DISABLE), and each rank's
  // send and receive buffers of maxbytes (nccl-tests' allocation; loom-perf's is the same).
  uint64_t segment = 0;
  if (!params::kShmDisable.asBool())
    segment = shm::segmentBytes(ranks, shm::fitOptions(ranks, shm::optionsFromParams()));
  const uint64_t buffers = 2 * static_cast<uint64_t>(opts.maxBytes) * static_cast<uint64_t>(ranks);
  if (segment > 0 && shmFree > 0 && segment > shmFree)
    return fmt::format(
        "-np {}: {} ranks on this host need a shared-memory segment of {} and /dev/shm has {} "
        "free (fewer ranks, or a larger /dev/shm)",
        opts.np, ranks, gib(segment), gib(shmFree));
  if (available > 0 && segment + buffers > available)
    return fmt::format(
        "-np {}: {} ranks need about {} of memory ({} of buffers: 2 x {} bytes per rank, and a "
        "shared segment of {}) and this machine has {} available (fewer ranks or a smaller -e)",
        opts.np, ranks, gib(segment + buffers), gib(buffers), opts.maxBytes, gib(segment),
        gib(available));
  return std::string();
}

void reportFailure(int rank, const Status& st) {
  const char* fdText = std::getenv(kEnvReportFd);
  int fd = -1;
  if (!fdText || !parseInt(fdText, &fd) || fd < 0) return;
  std::string message = st.message().substr(0, kReportMax - 64);
  for (char& c : message)
    if (c == '\n' || c == '\t') c = ' ';
  const std::string line =
      fmt::format("{}\t{}\t{}\t{}\n", rank, nowNs(), static_cast<int>(st.code()), message);
  ssize_t ignored = write(fd, line.data(), line.size());
  (void)ignored;
}

int spawnedFirstRank(const Options& opts) {
  int proc = -1;
  if (!parseInt(std::getenv(kEnvRank), &proc) || proc < 0) return -1;
  return proc * opts.nThreads * opts.nGpus;
}

namespace {

// The rank whose failure `message` relays ("rank N failed: ..."), or -1.
int relayedFrom(const std::string& message, int self) {
  static const std::string kMark = " failed: ";
  for (size_t at = message.find("rank "); at != std::string::npos;
       at = message.find("rank ", at + 1)) {
    size_t end = at + 5;
    while (end < message.size() && std::isdigit(static_cast<unsigned char>(message[end]))) ++end;
    if (end == at + 5 || message.compare(end, kMark.size(), kMark) != 0) continue;
    const int r = std::atoi(message.c_str() + at + 5);
    if (r != self) return r;
  }
  return -1;
}

// Parses the report lines in `text` into ends (by rank).
void parseReports(const std::string& text, std::map<int, RankEnd>* ends) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) break;
    const std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    size_t t1 = line.find('\t'), t2 = line.find('\t', t1 + 1), t3 = line.find('\t', t2 + 1);
    if (t1 == std::string::npos || t2 == std::string::npos || t3 == std::string::npos) continue;
    RankEnd& e = (*ends)[std::atoi(line.c_str())];
    if (e.reported) continue;  // the first report of a rank counts
    e.rank = std::atoi(line.c_str());
    e.reported = true;
    e.atNs = std::strtoll(line.c_str() + t1 + 1, nullptr, 10);
    e.code = static_cast<Code>(std::atoi(line.c_str() + t2 + 1));
    e.message = line.substr(t3 + 1);
  }
}

}  // namespace

std::string failureSummary(const std::vector<RankEnd>& failed) {
  if (failed.empty()) return std::string();
  const RankEnd* first = nullptr;
  std::string why;
  for (const RankEnd& e : failed)
    if (!first && !e.killedByUs && WIFSIGNALED(e.waitStatus)) {
      first = &e;
      why = describeStatus(e.waitStatus);
    }
  auto earliest = [&](auto&& accept) {
    const RankEnd* best = nullptr;
    for (const RankEnd& e : failed)
      if (e.reported && accept(e) && (!best || e.atNs < best->atNs)) best = &e;
    return best;
  };
  if (!first) {
    first = earliest([](const RankEnd& e) {
      return e.code != Code::kTimeout && relayedFrom(e.message, e.rank) < 0;
    });
    if (first) why = first->message;
  }
  if (!first) {
    for (const RankEnd& e : failed)
      if (!first && e.killedByUs) first = &e;
    if (first)
      why = "it stopped making progress (the others failed waiting for it, and it was killed)";
  }
  if (!first) {
    first = earliest([](const RankEnd&) { return true; });
    if (first) why = first->message;
  }
  if (!first) return std::string();
  std::vector<int> after;
  for (const RankEnd& e : failed)
    if (&e != first) after.push_back(e.rank);
  std::sort(after.begin(), after.end());
  std::string line = fmt::format("rank {} failed first: {}", first->rank, why);
  if (!after.empty())
    line += fmt::format("; rank{} {} failed after it", after.size() > 1 ? "s" : "",
                        fmt::join(after, ","));
  return line;
}

int spawnRanks(const Options& opts, int argc, char** argv) {
  struct statvfs shm {};
  const uint64_t shmFree =
      statvfs("/dev/shm", &shm) == 0 ? uint64_t{shm.f_bavail} * shm.f_frsize : uint64_t{0};
  const std::string refused = tooLargeForMachine(opts, memAvailable(), shmFree);
  if (!refused.empty()) {
    std::fprintf(stderr, "loom-perf: %s\n", refused.c_str());
    return kExitUsage;
  }
  loomUniqueId id;
  loomResult_t res = loomGetUniqueId(&id);
  if (res != loomSuccess) {
    std::fprintf(stderr, "loom-perf: loomGetUniqueId failed: %s: %s\n", loomGetErrorString(res),
                 loomGetLastError());
    return kExitLoomError;
  }
  const std::string idHex = hexEncode(&id, sizeof(id));

  // Everything the children need is built before fork: the parent may have threads now.
  std::vector<std::string> args = argsWithoutNp(argc, argv);
  std::vector<char*> childArgv;
  for (auto& a : args) childArgv.push_back(&a[0]);
  childArgv.push_back(nullptr);
  std::vector<std::string> baseEnv;
  for (char** e = environ; *e; ++e) {
    if (std::strncmp(*e, "LOOMPERF_CHILD_", 15) == 0) continue;
    baseEnv.push_back(*e);
  }
  baseEnv.push_back(std::string(kEnvNranks) + "=" + std::to_string(opts.np));
  baseEnv.push_back(std::string(kEnvId) + "=" + idHex);

  // Ranks report their failures on this pipe (the read end stays here; the write end is the
  // only descriptor a rank inherits from it).
  int report[2] = {-1, -1};
  if (pipe2(report, O_CLOEXEC | O_NONBLOCK) != 0) report[0] = report[1] = -1;
  if (report[1] >= 0) baseEnv.push_back(fmt::format("{}={}", kEnvReportFd, report[1]));

  const pid_t parent = getpid();
  std::map<pid_t, int> alive;  // pid -> rank
  int exitCode = 0;
  bool failed = false;
  for (int rank = 0; rank < opts.np && !failed; ++rank) {
    std::vector<std::string> env = baseEnv;
    env.push_back(std::string(kEnvRank) + "=" + std::to_string(rank));
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(&e[0]);
    envp.push_back(nullptr);
    std::fflush(nullptr);
    pid_t pid = fork();
    if (pid < 0) {
      std::fprintf(stderr, "loom-perf: fork for rank %d failed: %s\n", rank, std::strerror(errno));
      exitCode = kExitLoomError;
      failed = true;
      break;
    }
    if (pid == 0) {
      // A rank must not outlive the parent (ctest or the user may kill it).
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(kExitLoomError);
      if (report[1] >= 0) fcntl(report[1], F_SETFD, 0);  // kept across execve
      execve("/proc/self/exe", childArgv.data(), envp.data());
      const char msg[] = "loom-perf: execve(/proc/self/exe) failed\n";
      ssize_t ignored = write(2, msg, sizeof(msg) - 1);
      (void)ignored;
      _exit(127);
    }
    alive[pid] = rank;
  }
  if (report[1] >= 0) ::close(report[1]);
  std::string reports;
  auto readReports = [&] {
    char buf[4096];
    for (;;) {
      ssize_t n = report[0] >= 0 ? ::read(report[0], buf, sizeof(buf)) : -1;
      if (n <= 0) return;
      reports.append(buf, static_cast<size_t>(n));
    }
  };
  std::map<int, RankEnd> ends;   // by rank, of the ranks that failed
  std::vector<int> failedOrder;  // ranks, in the order their processes ended

  using Clock = std::chrono::steady_clock;
  const int grace = graceSeconds(opts);
  Clock::time_point deadline = Clock::now() + std::chrono::seconds(grace);
  int firstFailedRank = -1;
  bool killed = false;
  if (failed && !alive.empty()) deadline = Clock::now() + std::chrono::seconds(grace);
  while (!alive.empty()) {
    int status = 0;
    readReports();
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid == 0 && (!failed || killed)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    if (pid == 0) {
      if (Clock::now() >= deadline) {
        for (const auto& [p, rank] : alive) {
          std::fprintf(stderr,
                       "loom-perf: rank %d (pid %d) did not exit within %d s after rank %d "
                       "failed; killing it\n",
                       rank, static_cast<int>(p), grace, firstFailedRank);
          kill(p, SIGKILL);
          ends[rank].killedByUs = true;
        }
        killed = true;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      continue;
    }
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    auto it = alive.find(pid);
    if (it == alive.end()) continue;
    const int rank = it->second;
    alive.erase(it);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    if (!(WIFEXITED(status) &&
          (WEXITSTATUS(status) == kExitWrong || WEXITSTATUS(status) == kExitUsage))) {
      RankEnd& e = ends[rank];
      e.rank = rank;
      e.waitStatus = status;
      failedOrder.push_back(rank);
    }
    if (ends.count(rank) && ends[rank].killedByUs) continue;  // already reported
    // Wrong values and usage errors are reported by the ranks; anything else deserves a line here.
    if (!(WIFEXITED(status) &&
          (WEXITSTATUS(status) == kExitWrong || WEXITSTATUS(status) == kExitUsage)))
      std::fprintf(stderr, "loom-perf: rank %d (pid %d) %s\n", rank, static_cast<int>(pid),
                   describeStatus(status).c_str());
    if (!failed) {
      failed = true;
      firstFailedRank = rank;
      exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : kExitLoomError;
      deadline = Clock::now() + std::chrono::seconds(grace);
    }
  }
  readReports();
  if (report[0] >= 0) ::close(report[0]);
  parseReports(reports, &ends);
  std::vector<RankEnd> failedEnds;
  for (int r : failedOrder) failedEnds.push_back(ends[r]);
  const std::string summary = failureSummary(failedEnds);
  if (!summary.empty()) std::fprintf(stderr, "loom-perf: %s\n", summary.c_str());
  return exitCode;
}

namespace {

// The ranks of this process (-t threads x -g GPUs, consecutive: rank = process * perProcess + i),
// each initialized on a thread of its own since loomCommInitRank blocks until all have joined.
Status initRanks(const loomUniqueId& id, int nranks, int firstRank, int count, loomConfig_t config,
                 std::vector<RankContext>* out) {
  std::vector<loomComm_t> comms(static_cast<size_t>(count), nullptr);
  std::vector<Status> results(static_cast<size_t>(count));
  auto init = [&](int i) {
    results[i] = loomCall(loomCommInitRankConfig(&comms[i], nranks, id, firstRank + i, &config),
                          "loomCommInitRankConfig")
                     .withContext(fmt::format("rank {} of {}", firstRank + i, nranks));
  };
  if (count == 1) {
    init(0);
  } else {
    std::vector<std::thread> threads;
    for (int i = 0; i < count; ++i) threads.emplace_back(init, i);
    for (auto& t : threads) t.join();
  }
  Status first;
  for (int i = 0; i < count; ++i) {
    if (!results[i].isOk() && first.isOk()) first = results[i];
    if (comms[i]) out->push_back({comms[i], firstRank + i, nranks});
  }
  return first;
}

}  // namespace

Status initComms(const Options& opts, std::vector<RankContext>* ranks) {
  loomConfig_t config = LOOM_CONFIG_INITIALIZER;
  config.timeoutMs = opts.timeoutSec > 0 ? opts.timeoutSec * 1000 : -1;
  config.commName = "loom-perf";
  const int perProcess = opts.nThreads * opts.nGpus;
  int proc = 0, nprocs = 1;
  loomUniqueId id;

  if (isSpawnedRank()) {
    const char* idText = std::getenv(kEnvId);
    if (!parseInt(std::getenv(kEnvRank), &proc) || !parseInt(std::getenv(kEnvNranks), &nprocs) ||
        !idText || !hexDecode(idText, &id, sizeof(id)) || proc < 0 || proc >= nprocs) {
      return Status(Code::kInvalidArgument,
                    fmt::format("bad {}/{}/{} in the environment", kEnvRank, kEnvNranks, kEnvId));
    }
  } else if (launchedByEnvironment()) {
    loomComm_t world = nullptr;
    LOOM_TRY(loomCall(loomCommInitFromEnv(&world, &config), "loomCommInitFromEnv"));
    int rank = 0, n = 1;
    Status st = loomCall(loomCommUserRank(world, &rank), "loomCommUserRank");
    if (st.isOk()) st = loomCall(loomCommCount(world, &n), "loomCommCount");
    if (!st.isOk()) {
      loomCommAbort(world);
      return st;
    }
    if (perProcess == 1) {
      ranks->push_back({world, rank, n});
      return Status::ok();
    }
    // Several ranks per process: the launcher's processes agree on a new id over a communicator
    // of one rank each (as nccl-tests broadcasts its id over MPI), then make the ranks from it.
    proc = rank;
    nprocs = n;
    if (proc == 0) st = loomCall(loomGetUniqueId(&id), "loomGetUniqueId");
    if (st.isOk())
      st = loomCall(loomBroadcast(&id, &id, sizeof(id), loomUint8, 0, world, nullptr),
                    "loomBroadcast (the unique id of the -t/-g ranks)");
    if (!st.isOk()) {
      loomCommAbort(world);
      return st;
    }
    LOOM_TRY(loomCall(loomCommDestroy(world), "loomCommDestroy"));
  } else {
    LOOM_TRY(loomCall(loomGetUniqueId(&id), "loomGetUniqueId"));
  }
  return initRanks(id, nprocs * perProcess, proc * perProcess, perProcess, config, ranks);
}

}  // namespace perf
}  // namespace loom
