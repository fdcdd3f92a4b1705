/* loom-wait-cpu: the CPU time a rank spends while it waits for a late peer. Two ranks (this
 * process and a forked child) make a communicator and warm it up with one call; then rank 1
 * sleeps before its next call while rank 0 is already in it, and rank 0 reports how long that call
 * took and how much CPU time (user plus system, all its threads) it used meanwhile. The transport
 * is whatever the environment selects (LOOM_NET, LOOM_SHM_DISABLE, LOOM_IBVERBS_LIB, ...), as for
 * any Loom program.
 *
 *   loom-wait-cpu [-l LATE_SECONDS] [-c allreduce|broadcast] [-n COUNT]
 *
 * allreduce: rank 0 sends and receives (over InfiniBand its send waits for the receiver's
 * clear-to-send); broadcast from rank 1: rank 0 only receives. Exit status 0, or 1 on bad
 * arguments, 3 when a Loom call fails (with loomGetLastError's message). */
#include <loom/loom.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double cpuSeconds(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return (double)u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + (double)u.ru_stime.tv_sec +
         u.ru_stime.tv_usec / 1e6;
}

static double wallSeconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec / 1e9;
}

static int usage(const char* why) {
  fprintf(stderr,
          "loom-wait-cpu: %s\nusage: loom-wait-cpu [-l LATE_SECONDS (0..3600, default 2)] "
          "[-c allreduce|broadcast] [-n COUNT (floats, 1..2^28, default 1024)]\n",
          why);
  return 1;
}

static int failed(int rank, const char* what) {
  fprintf(stderr, "loom-wait-cpu: rank %d: %s failed: %s\n", rank, what, loomGetLastError());
  return 3;
}

/* One call of the chosen collective. */
static loomResult_t call(int broadcast, float* buf, size_t count, loomComm_t comm) {
  if (broadcast) return loomBroadcast(buf, buf, count, loomFloat32, 1, comm, NULL);
  return loomAllReduce(buf, buf, count, loomFloat32, loomSum, comm, NULL);
}

int main(int argc, char** argv) {
  double late = 2;
  int broadcast = 0;
  long count = 1024;
  int opt;
  while ((opt = getopt(argc, argv, "l:c:n:h")) != -1) {
    char* end = NULL;
    switch (opt) {
      case 'l':
        late = strtod(optarg, &end);
        if (end == optarg || *end || !(late >= 0 && late <= 3600)) return usage("bad -l");
        break;
      case 'c':
        if (strcmp(optarg, "allreduce") && strcmp(optarg, "broadcast")) return usage("bad -c");
        broadcast = strcmp(optarg, "broadcast") == 0;
        break;
      case 'n':
        count = strtol(optarg, &end, 10);
        if (end == optarg || *end || count < 1 || count > (1L << 28)) return usage("bad -n");
        break;
      default:
        return usage(opt == 'h' ? "help" : "unknown option");
    }
  }
  if (optind != argc) return usage("unexpected argument");

  loomUniqueId id;
  if (loomGetUniqueId(&id) != loomSuccess) return failed(0, "loomGetUniqueId");
  fflush(NULL);
  pid_t child = fork();
  if (child < 0) {
    perror("loom-wait-cpu: fork");
    return 3;
  }
  const int rank = child == 0 ? 1 : 0;
  float* buf = calloc((size_t)count, sizeof(float));
  if (buf == NULL) return failed(rank, "calloc");
  loomComm_t comm;
  if (loomCommInitRank(&comm, 2, id, rank) != loomSuccess) return failed(rank, "loomCommInitRank");
  int rc = 0;
  if (call(broadcast, buf, (size_t)count, comm) != loomSuccess) rc = failed(rank, "warm-up call");
  if (rc == 0 && rank == 1) {
    struct timespec ts = {(time_t)late, (long)((late - (double)(time_t)late) * 1e9)};
    nanosleep(&ts, NULL);
  }
  const double cpu0 = cpuSeconds(), wall0 = wallSeconds();
  if (rc == 0 && call(broadcast, buf, (size_t)count, comm) != loomSuccess)
    rc = failed(rank, "timed call");
  const double cpu = cpuSeconds() - cpu0, wall = wallSeconds() - wall0;
  if (rc == 0 && rank == 0)
    printf(
        "loom-wait-cpu: %s of %ld floats, rank 1 %.2f s late: rank 0 waited %.3f s and used "
        "%.3f s of CPU (%.1f%% of a core)\n",
        broadcast ? "broadcast from rank 1" : "allreduce", count, late, wall, cpu,
        wall > 0 ? 100 * cpu / wall : 0.0);
  loomCommDestroy(comm);
  free(buf);
  if (child > 0) {
    int status = 0;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
      rc = rc ? rc : 3;
  }
  return rc;
}
