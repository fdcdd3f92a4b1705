#include "src/core/log.h"

#include <pthread.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <sstream>

#include "src/core/params.h"

namespace loom {
namespace {

struct LogConfig {
  std::atomic<int> level{-1};  // -1: not read yet
  std::atomic<uint32_t> mask{kSubAll};
  std::mutex mu;  // serialises configuration and writes
  FILE* out = stderr;
  char host[64] = {0};
};

LogConfig& config() {
  // Held across fork() like the parameter cache (see params.cc).
  static LogConfig* c = [] {
    auto* fresh = new LogConfig();
    pthread_atfork([] { config().mu.lock(); }, [] { config().mu.unlock(); },
                   [] { config().mu.unlock(); });
    return fresh;
  }();
  return *c;
}

// Made while the library loads, on the loading thread, rather than by whichever of Loom's threads
// asks first: ThreadSanitizer, with PyTorch's uninstrumented modules ignored
// (tools/sanitize_torch.sh), missed the first asker's initialization and reported its later
// readers.
[[maybe_unused]] const LogConfig& kLogConfigAtLoad = config();

thread_local int tRank = -1;

// setLogSink: the sink, and the level it wants while set.
std::atomic<LogSink> gSink{nullptr};
std::atomic<int> gSinkLevel{static_cast<int>(LogLevel::kWarn)};

const struct {
  const char* name;
  uint32_t bit;
} kSubsysNames[] = {{"INIT", kSubInit},           {"NET", kSubNet}, {"COLL", kSubColl},
                    {"BOOTSTRAP", kSubBootstrap}, {"SHM", kSubShm}, {"PLAN", kSubPlan},
                    {"TOPO", kSubTopo},           {"ENV", kSubEnv}, {"P2P", kSubP2p}};

uint32_t parseMask(const std::string& text) {
  if (text.empty() || text == "ALL") return kSubAll;
  bool exclude = text[0] == '^';
  uint32_t mask = 0;
  std::stringstream ss(exclude ? text.substr(1) : text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item == "ALL") mask = kSubAll;
    for (const auto& s : kSubsysNames)
      if (strcasecmp(item.c_str(), s.name) == 0) mask |= s.bit;
  }
  return exclude ? ~mask : mask;
}

void configure(LogConfig& c) {
  // The parameters are read before the log's lock is taken: the fork handlers take the two locks
  // in the order they were registered, and holding one while taking the other here could
  // deadlock against a fork.
  const std::string lvl = params::kDebug.str();
  const std::string subsys = params::kDebugSubsys.str();
  const std::string file = params::kDebugFile.str();
  std::lock_guard<std::mutex> lk(c.mu);
  if (c.level.load(std::memory_order_relaxed) >= 0) return;
  gethostname(c.host, sizeof(c.host) - 1);
  if (char* dot = strchr(c.host, '.')) *dot = '\0';
  int level = static_cast<int>(LogLevel::kWarn);
  if (strcasecmp(lvl.c_str(), "NONE") == 0 || lvl == "0")
    level = 0;
  else if (strcasecmp(lvl.c_str(), "INFO") == 0)
    level = static_cast<int>(LogLevel::kInfo);
  else if (strcasecmp(lvl.c_str(), "TRACE") == 0)
    level = static_cast<int>(LogLevel::kTrace);
  c.mask.store(parseMask(subsys), std::memory_order_relaxed);
  if (!file.empty()) {
    std::string path;
    for (size_t i = 0; i < file.size(); ++i) {
      if (file[i] == '%' && i + 1 < file.size() && file[i + 1] == 'h')
        path += c.host, ++i;
      else if (file[i] == '%' && i + 1 < file.size() && file[i + 1] == 'p')
        path += std::to_string(getpid()), ++i;
      else
        path += file[i];
    }
    if (FILE* f = fopen(path.c_str(), "a")) c.out = f;
  }
  c.level.store(level, std::memory_order_release);
}

}  // namespace

bool logEnabled(LogLevel level, uint32_t subsys) {
  if (gSink.load(std::memory_order_acquire) != nullptr)
    return static_cast<int>(level) <= gSinkLevel.load(std::memory_order_relaxed);
  LogConfig& c = config();
  int lv = c.level.load(std::memory_order_acquire);
  if (lv < 0) {
    configure(c);
    lv = c.level.load(std::memory_order_acquire);
  }
  if (static_cast<int>(level) > lv) return false;
  if (level == LogLevel::kWarn) return true;
  return (c.mask.load(std::memory_order_relaxed) & subsys) != 0;
}

void logSetThreadRank(int rank) { tRank = rank; }

const char* subsysName(uint32_t subsys) {
  for (const auto& s : kSubsysNames)
    if (s.bit == subsys) return s.name;
  return "ALL";
}

void logWrite(LogLevel level, uint32_t subsys, const char* file, int line, const std::string& msg) {
  if (LogSink sink = gSink.load(std::memory_order_acquire)) {
    sink(level, subsys, file, line, msg.c_str());
    return;
  }
  LogConfig& c = config();
  const char* lvl = level == LogLevel::kWarn ? "WARN" : level == LogLevel::kInfo ? "INFO" : "TRACE";
  std::string rank = tRank >= 0 ? fmt::format(" rank {}", tRank) : std::string();
  std::string where;
  if (level == LogLevel::kTrace) {
    const char* base = strrchr(file, '/');
    where = fmt::format(" {}:{}", base ? base + 1 : file, line);
  }
  std::string text =
      fmt::format("{}:{}:{}{} LOOM {} {}{} {}\n", c.host, getpid(), gettid(), rank, lvl,
                  level == LogLevel::kWarn ? "" : subsysName(subsys), where, msg);
  std::lock_guard<std::mutex> lk(c.mu);
  fputs(text.c_str(), c.out);
  fflush(c.out);
}

void logReconfigure() {
  LogConfig& c = config();
  c.level.store(-1, std::memory_order_release);
}

void setLogSink(LogSink sink, LogLevel maxLevel) {
  gSinkLevel.store(static_cast<int>(maxLevel), std::memory_order_relaxed);
  gSink.store(sink, std::memory_order_release);
}

}  // namespace loom
