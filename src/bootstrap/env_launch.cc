// Rank, size and root address from a launcher's environment (torchrun, Open MPI, Slurm), with
// LOOM_COMM_ID overriding the root. LOOM_* variables come from the parameter registry; the
// launchers' own variables are read here with getenv, in envText() only.
#include <cerrno>
#include <cstdlib>
#include <optional>

#include "src/bootstrap/bootstrap.h"
#include "src/bootstrap/wire.h"
#include "src/core/log.h"
#include "src/core/params.h"

namespace loom {
namespace {

// The one place the bootstrap reads non-LOOM environment variables.
std::optional<std::string> envText(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

bool envSet(const char* name) { return envText(name).has_value(); }

Result<int64_t> parseInt(const char* name, const std::string& text, int64_t lo, int64_t hi) {
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || errno != 0 || *end != '\0')
    return LOOM_ERROR(kInvalidArgument, "{}='{}' is not an integer", name, text);
  if (v < lo || v > hi)
    return LOOM_ERROR(kInvalidArgument, "{}={} is out of range [{}, {}]", name, v, lo, hi);
  return static_cast<int64_t>(v);
}

// The integer in variable name; an error naming it when it is missing (if required) or malformed.
Result<int64_t> envInt(const char* name, int64_t lo, int64_t hi) {
  auto v = envText(name);
  if (!v) return LOOM_ERROR(kInvalidArgument, "{} is not set", name);
  return parseInt(name, *v, lo, hi);
}

Result<int> optionalLocalRank(const char* name) {
  if (!envSet(name)) return -1;
  LOOM_ASSIGN(int64_t v, envInt(name, 0, wire::kMaxRanks - 1));
  return static_cast<int>(v);
}

struct Launcher {
  const char* source;
  const char* rankVar;
  const char* sizeVar;
  const char* localVar;
};
constexpr Launcher kTorchrun{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"};
constexpr Launcher kOpenMpi{"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                            "OMPI_COMM_WORLD_LOCAL_RANK"};
constexpr Launcher kSlurm{"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"};

Status readRanks(const Launcher& l, EnvLaunch* out) {
  out->source = l.source;
  const char* sizeVar = l.sizeVar;
  // srun sets SLURM_NTASKS; older versions and some configurations only SLURM_NPROCS.
  if (&l == &kSlurm && !envSet(sizeVar) && envSet("SLURM_NPROCS")) sizeVar = "SLURM_NPROCS";
  if (!envSet(l.rankVar) || !envSet(sizeVar))
    return LOOM_ERROR(kInvalidArgument, "{} environment is incomplete: {} and {} must both be set",
                      l.source, l.rankVar, sizeVar);
  LOOM_ASSIGN(int64_t size, envInt(sizeVar, 1, wire::kMaxRanks));
  LOOM_ASSIGN(int64_t rank, envInt(l.rankVar, 0, wire::kMaxRanks - 1));
  if (rank >= size)
    return LOOM_ERROR(kInvalidArgument, "{}={} is not below {}={}", l.rankVar, rank, sizeVar, size);
  out->rank = static_cast<int>(rank);
  out->nranks = static_cast<int>(size);
  LOOM_ASSIGN(out->localRank, optionalLocalRank(l.localVar));
  return Status();
}

// The first host of a Slurm node list when it is trivially parsable: "n1,n2", "node[03-05,9]",
// "gpu[1-4]-ib". Anything else (nested or several bracket groups) is an error.
Result<std::string> firstSlurmHost(const std::string& list) {
  int depth = 0;
  size_t end = list.size();
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i] == '[') ++depth;
    if (list[i] == ']') --depth;
    if (list[i] == ',' && depth == 0) {
      end = i;
      break;
    }
  }
  std::string first = list.substr(0, end);
  size_t lb = first.find('[');
  if (lb == std::string::npos) {
    if (first.empty() || first.find(']') != std::string::npos)
      return LOOM_ERROR(kInvalidArgument, "cannot parse the Slurm node list '{}'", list);
    return first;
  }
  size_t rb = first.find(']', lb);
  if (rb == std::string::npos || first.find('[', rb) != std::string::npos)
    return LOOM_ERROR(kInvalidArgument, "cannot parse the Slurm node list '{}'", list);
  std::string inner = first.substr(lb + 1, rb - lb - 1);
  size_t stop = inner.find_first_of(",-");
  std::string num = inner.substr(0, stop);
  if (num.empty() || num.find_first_not_of("0123456789") != std::string::npos)
    return LOOM_ERROR(kInvalidArgument, "cannot parse the Slurm node list '{}'", list);
  return first.substr(0, lb) + num + first.substr(rb + 1);
}

std::string jobId() {
  if (auto j = envText("SLURM_JOB_ID")) {
    auto step = envText("SLURM_STEP_ID");
    return "slurm:" + *j + (step ? "." + *step : "");
  }
  if (auto j = envText("OMPI_MCA_ess_base_jobid")) return "ompi:" + *j;
  if (auto j = envText("TORCHELASTIC_RUN_ID")) {
    auto restart = envText("TORCHELASTIC_RESTART_COUNT");
    return "torchelastic:" + *j + (restart ? "." + *restart : "");
  }
  return std::string();
}

}  // namespace

Result<EnvLaunch> launchFromEnv() {
  EnvLaunch out;
  const bool haveCommId = params::kCommId.isSet() && !params::kCommId.str().empty();
  // The most specific launcher wins: torchrun under srun, mpirun inside a Slurm allocation.
  if (envSet("RANK") || envSet("WORLD_SIZE")) {
    LOOM_TRY(readRanks(kTorchrun, &out));
  } else if (envSet("OMPI_COMM_WORLD_RANK") || envSet("OMPI_COMM_WORLD_SIZE")) {
    LOOM_TRY(readRanks(kOpenMpi, &out));
  } else if (envSet("SLURM_PROCID")) {
    LOOM_TRY(readRanks(kSlurm, &out));
  } else if (haveCommId) {
    return LOOM_ERROR(kInvalidArgument,
                      "LOOM_COMM_ID is set but nothing gives this process's rank and size: set "
                      "RANK and WORLD_SIZE (as torchrun does), or launch with mpirun or srun");
  } else {
    return LOOM_ERROR(kInvalidArgument,
                      "no launcher environment found: launch with torchrun, mpirun (Open MPI) or "
                      "srun (Slurm), or set LOOM_COMM_ID=host:port with RANK and WORLD_SIZE");
  }

  std::string rootText;  // as the environment spells it: the same on every rank
  if (haveCommId) {
    rootText = params::kCommId.str();
    auto a = parseSockAddr(rootText);
    if (!a.isOk()) return a.status().withContext("LOOM_COMM_ID");
    out.id.root = a.value();
  } else if (envSet("MASTER_ADDR") || envSet("MASTER_PORT")) {
    auto host = envText("MASTER_ADDR");
    if (!host || host->empty() || !envSet("MASTER_PORT"))
      return LOOM_ERROR(kInvalidArgument,
                        "MASTER_ADDR and MASTER_PORT must both be set (or set LOOM_COMM_ID)");
    LOOM_ASSIGN(int64_t port, envInt("MASTER_PORT", 1, 65535));
    const int64_t offset = params::kBootstrapPortOffset.asInt();  // checked: -65535 to 65535
    if (port + offset < 1 || port + offset > 65535)
      return LOOM_ERROR(kInvalidArgument,
                        "MASTER_PORT={} plus LOOM_BOOTSTRAP_PORT_OFFSET={} is not a valid port",
                        port, offset);
    auto a = resolveHost(*host, static_cast<int>(port + offset));
    if (!a.isOk()) return a.status().withContext("MASTER_ADDR");
    out.id.root = a.value();
    rootText = fmt::format("{}:{}", *host, port + offset);
  } else if (out.source == std::string(kSlurm.source)) {
    // srun places task 0 on the first node of the step; the port comes from the job id so that
    // every task derives the same one.
    auto list = envText("SLURM_STEP_NODELIST");
    if (!list) list = envText("SLURM_JOB_NODELIST");
    if (!list) list = envText("SLURM_NODELIST");
    auto job = envText("SLURM_JOB_ID");
    if (!list || !job)
      return LOOM_ERROR(kInvalidArgument,
                        "Slurm gives rank and size but not the root's address: set "
                        "LOOM_COMM_ID=host:port (the host of task 0 and a free port)");
    auto host = firstSlurmHost(*list);
    if (!host.isOk())
      return host.status().withContext(
          "set LOOM_COMM_ID=host:port (the host of task 0 and a free port)");
    LOOM_ASSIGN(int64_t jobNum, envInt("SLURM_JOB_ID", 0, INT64_MAX));
    int64_t stepNum = 0;
    if (auto step = envText("SLURM_STEP_ID")) {
      auto s = parseInt("SLURM_STEP_ID", *step, 0, INT64_MAX);
      if (s.isOk()) stepNum = s.value();  // "batch"/"extern" steps are not numeric
    }
    int port = 20000 + static_cast<int>((jobNum * 16 + stepNum) % 20000);
    auto a = resolveHost(host.value(), port);
    if (!a.isOk())
      return a.status().withContext("first host of the Slurm node list (set LOOM_COMM_ID)");
    out.id.root = a.value();
    rootText = fmt::format("{}:{}", host.value(), port);
  } else {
    return LOOM_ERROR(
        kInvalidArgument,
        "{} gives rank and size but not the root's address: set "
        "LOOM_COMM_ID=host:port (rank 0's host and a free port){}",
        out.source,
        out.source == std::string(kTorchrun.source) ? ", or MASTER_ADDR and MASTER_PORT" : "");
  }

  if (params::kCommSecret.isSet() && !params::kCommSecret.str().empty()) {
    out.id.secret = wire::hash64(params::kCommSecret.str(), 0x5345435245544b31ull);
  } else {
    // Not a security boundary (anyone who sees the job's environment can derive it); it keeps
    // ranks of other jobs and earlier attempts out of this rendezvous.
    out.id.secret = wire::hash64(fmt::format("loom|{}|{}|{}", rootText, out.nranks, jobId()));
  }
  if (out.id.secret == 0) out.id.secret = 1;
  LOOM_INFO(kSubBootstrap, "{}: rank {} of {} (local rank {}), root {}", out.source, out.rank,
            out.nranks, out.localRank, rootText);
  return out;
}

}  // namespace loom
