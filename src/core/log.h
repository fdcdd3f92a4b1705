// Logging. LOOM_DEBUG=WARN|INFO|TRACE sets the level (default WARN); LOOM_DEBUG_SUBSYS=INIT,NET,...
// (or ^NET to exclude, ALL) selects subsystems for INFO and TRACE. Level and subsystem are checked
// before anything is formatted. Each line carries host, pid and, where known, the rank.
// LOOM_DEBUG_FILE=path (%h host, %p pid) sends the log to a file instead of stderr.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>

namespace loom {

enum class LogLevel : int { kNone = 0, kWarn = 1, kInfo = 2, kTrace = 3 };

enum Subsys : uint32_t {
  kSubInit = 1u << 0,
  kSubNet = 1u << 1,
  kSubColl = 1u << 2,
  kSubBootstrap = 1u << 3,
  kSubShm = 1u << 4,
  kSubPlan = 1u << 5,
  kSubTopo = 1u << 6,
  kSubEnv = 1u << 7,
  kSubP2p = 1u << 8,
  kSubAll = 0xffffffffu,
};

bool logEnabled(LogLevel level, uint32_t subsys);
void logWrite(LogLevel level, uint32_t subsys, const char* file, int line, const std::string& msg);
// Rank shown in this thread's log lines (-1: none). Set by the runtime while it runs for a rank.
void logSetThreadRank(int rank);
const char* subsysName(uint32_t subsys);
// Rereads LOOM_DEBUG* on the next log call (after reloadParams()).
void logReconfigure();

// Where log lines go instead of stderr / LOOM_DEBUG_FILE, for a host that has its own logger (the
// NCCL net plugin hands Loom's lines to NCCL's logger). The sink gets the bare message (no host,
// pid or level prefix: the host adds its own). While a sink is set, maxLevel replaces LOOM_DEBUG's
// level and LOOM_DEBUG_SUBSYS is not applied (the host filters by subsystem itself). The sink may
// be called from any thread, concurrently. nullptr restores the normal output.
using LogSink = void (*)(LogLevel level, uint32_t subsys, const char* file, int line,
                         const char* msg);
void setLogSink(LogSink sink, LogLevel maxLevel);

}  // namespace loom

#define LOOM_LOG_AT(level, subsys, ...)                                                \
  do {                                                                                 \
    if (::loom::logEnabled(level, subsys))                                             \
      ::loom::logWrite(level, subsys, __FILE__, __LINE__, ::fmt::format(__VA_ARGS__)); \
  } while (0)

#define LOOM_WARN(...) LOOM_LOG_AT(::loom::LogLevel::kWarn, ::loom::kSubAll, __VA_ARGS__)
#define LOOM_INFO(subsys, ...) LOOM_LOG_AT(::loom::LogLevel::kInfo, ::loom::subsys, __VA_ARGS__)
#define LOOM_TRACE(subsys, ...) LOOM_LOG_AT(::loom::LogLevel::kTrace, ::loom::subsys, __VA_ARGS__)
