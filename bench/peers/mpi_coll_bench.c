/*
 * mpi_coll_bench: times MPI collectives with NVIDIA nccl-tests' conventions, so that its numbers
 * compare line by line with loom-perf's out-of-place columns.
 *
 *   mpirun -np N mpi_coll_bench -c allreduce -b 8 -e 64M -f 4 -n 20 -w 5 [-k 1]
 *
 * Collectives (-c): allreduce (MPI_Allreduce), allgather (MPI_Allgather), reduce_scatter
 * (MPI_Reduce_scatter_block), broadcast (MPI_Bcast, root 0), alltoall (MPI_Alltoall). float32, sum.
 *
 * Size is the whole buffer as nccl-tests defines it: for allreduce and broadcast the buffer
 * reduced/broadcast; for allgather, reduce_scatter and alltoall the gathered (total) buffer, with
 * the per-rank count = (bytes / 4 / nranks) rounded down to 16 bytes, as loom-perf does.
 * Per size: -w warm-up ops, a barrier, -n timed ops; each rank's seconds per op are averaged over
 * the ranks (MPI_Allreduce, as nccl-tests -a 1). algbw = bytes / time (decimal GB/s); busbw =
 * algbw x 2(n-1)/n (allreduce), (n-1)/n (allgather, reduce_scatter, alltoall), 1 (broadcast).
 * The send/recv offsets rotate through a max-size buffer between iterations, as nccl-tests does.
 * With -k 1 (default) one extra op on crafted inputs is validated; "wrong" counts bad elements on
 * all ranks.
 *
 * Output, rank 0, one line per size (machine-readable; '#' lines are comments):
 *   RESULT coll=allreduce nranks=4 bytes=1024 count=256 iters=20 time_us=12.3 algbw=0.08
 *          busbw=0.12 wrong=0
 */
#include <ctype.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

enum coll { ALLREDUCE, ALLGATHER, REDUCE_SCATTER, BROADCAST, ALLTOALL };

static const char* kNames[] = {"allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall"};

static int parse_coll(const char* s) {
  /* Also accept loom-perf / nccl-tests names. */
  if (!strcmp(s, "allreduce") || !strcmp(s, "all_reduce")) return ALLREDUCE;
  if (!strcmp(s, "allgather") || !strcmp(s, "all_gather")) return ALLGATHER;
  if (!strcmp(s, "reduce_scatter") || !strcmp(s, "reducescatter")) return REDUCE_SCATTER;
  if (!strcmp(s, "broadcast") || !strcmp(s, "bcast")) return BROADCAST;
  if (!strcmp(s, "alltoall") || !strcmp(s, "all_to_all")) return ALLTOALL;
  return -1;
}

struct counts {
  size_t send;  /* elements in the send buffer */
  size_t recv;  /* elements in the receive buffer */
  size_t param; /* count passed to MPI: per-rank/per-peer block for the gathering collectives */
};

static struct counts coll_counts(int coll, size_t bytes, int n) {
  const size_t el = sizeof(float);
  size_t count = bytes / el;
  size_t align = 16 / el;
  size_t base = (count / (size_t)n) / align * align;
  struct counts c;
  switch (coll) {
    case ALLGATHER:
      c.send = base;
      c.recv = base * n;
      c.param = base;
      break;
    case REDUCE_SCATTER:
      c.send = base * n;
      c.recv = base;
      c.param = base;
      break;
    case ALLTOALL:
      c.send = base * n;
      c.recv = base * n;
      c.param = base;
      break;
    default:
      c.send = count;
      c.recv = count;
      c.param = count;
      break;
  }
  return c;
}

static double bus_factor(int coll, int n) {
  switch (coll) {
    case ALLREDUCE:
      return 2.0 * (n - 1) / n;
    case BROADCAST:
      return 1.0;
    default:
      return (double)(n - 1) / n;
  }
}

static void run_coll(int coll, float* send, float* recv, const struct counts* c) {
  int cnt = (int)c->param;
  switch (coll) {
    case ALLREDUCE:
      MPI_Allreduce(send, recv, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case ALLGATHER:
      MPI_Allgather(send, cnt, MPI_FLOAT, recv, cnt, MPI_FLOAT, MPI_COMM_WORLD);
      break;
    case REDUCE_SCATTER:
      MPI_Reduce_scatter_block(send, recv, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case BROADCAST: {
      /* Out of place as nccl-tests' broadcast: root sends from send, everyone lands in recv. */
      int rank;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      if (rank == 0 && cnt > 0) memcpy(recv, send, (size_t)cnt * sizeof(float));
      MPI_Bcast(recv, cnt, MPI_FLOAT, 0, MPI_COMM_WORLD);
      break;
    }
    case ALLTOALL:
      MPI_Alltoall(send, cnt, MPI_FLOAT, recv, cnt, MPI_FLOAT, MPI_COMM_WORLD);
      break;
  }
}

/* Inputs are small integers so that float sums are exact. */
static float input_value(int rank, size_t i) { return (float)((rank + 1) + (int)(i % 13)); }

static long long check(int coll, float* send, float* recv, const struct counts* c, int rank,
                       int n) {
  for (size_t i = 0; i < c->send; ++i) send[i] = input_value(rank, i);
  for (size_t i = 0; i < c->recv; ++i) recv[i] = -1.0f;
  run_coll(coll, send, recv, c);
  long long bad = 0;
  for (size_t i = 0; i < c->recv; ++i) {
    float want = 0;
    switch (coll) {
      case ALLREDUCE:
        for (int r = 0; r < n; ++r) want += input_value(r, i);
        break;
      case ALLGATHER: /* block r of the result is rank r's input */
        want = input_value((int)(i / c->param), i % c->param);
        break;
      case REDUCE_SCATTER: /* element i of this rank's block */
        for (int r = 0; r < n; ++r) want += input_value(r, (size_t)rank * c->param + i);
        break;
      case BROADCAST:
        want = input_value(0, i);
        break;
      case ALLTOALL: /* block r came from rank r's block for this rank */
        want = input_value((int)(i / c->param), (size_t)rank * c->param + i % c->param);
        break;
    }
    if (recv[i] != want) ++bad;
  }
  return bad;
}

static void usage(void) {
  fprintf(stderr,
          "usage: mpi_coll_bench -c allreduce|allgather|reduce_scatter|broadcast|alltoall\n"
          "       [-b minbytes] [-e maxbytes] [-f factor] [-n iters] [-w warmup] [-k check]\n");
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);

  int coll = ALLREDUCE, iters = 20, warmup = 5, do_check = 1;
  size_t minb = 8, maxb = 64u << 20, factor = 2;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    int ok = v != NULL;
    if (ok && !strcmp(a, "-c")) {
      coll = parse_coll(v);
      ok = coll >= 0;
    } else if (ok && !strcmp(a, "-b")) {
      ok = parse_bytes(v, &minb) == 0;
    } else if (ok && !strcmp(a, "-e")) {
      ok = parse_bytes(v, &maxb) == 0;
    } else if (ok && !strcmp(a, "-f")) {
      ok = parse_bytes(v, &factor) == 0 && factor >= 2;
    } else if (ok && !strcmp(a, "-n")) {
      iters = atoi(v);
      ok = iters >= 1;
    } else if (ok && !strcmp(a, "-w")) {
      warmup = atoi(v);
      ok = warmup >= 0;
    } else if (ok && !strcmp(a, "-k")) {
      do_check = atoi(v);
    } else {
      ok = 0;
    }
    if (!ok || minb > maxb) {
      if (rank == 0) {
        fprintf(stderr, "mpi_coll_bench: bad option near '%s'\n", a);
        usage();
      }
      MPI_Finalize();
      return 2;
    }
    ++i;
  }

  /* Buffers as nccl-tests: max bytes each (enough for every size), page-aligned and touched. */
  size_t buf_bytes = (maxb + 4095) / 4096 * 4096 + 4096;
  float* sendbuf = NULL;
  float* recvbuf = NULL;
  if (posix_memalign((void**)&sendbuf, 4096, buf_bytes) ||
      posix_memalign((void**)&recvbuf, 4096, buf_bytes)) {
    fprintf(stderr, "mpi_coll_bench: rank %d: cannot allocate 2 x %zu bytes\n", rank, buf_bytes);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  memset(sendbuf, 0, buf_bytes);
  memset(recvbuf, 0, buf_bytes);

  if (rank == 0) {
    int len = 0;
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    MPI_Get_library_version(lib, &len);
    char* nl = strchr(lib, '\n');
    if (nl) *nl = '\0';
    printf("# mpi_coll_bench %s nranks=%d iters=%d warmup=%d library=%s\n", kNames[coll], n, iters,
           warmup, lib);
    fflush(stdout);
  }

  long long total_wrong = 0;
  for (size_t bytes = minb; bytes <= maxb; bytes *= factor) {
    struct counts c = coll_counts(coll, bytes, n);
    size_t total = (c.send > c.recv ? c.send : c.recv) * sizeof(float);
    size_t steps = total ? maxb / total : 1;
    if (steps == 0) steps = 1;

    for (int w = 0; w < warmup; ++w) {
      size_t shift = total * ((size_t)w % steps);
      run_coll(coll, (float*)((char*)sendbuf + shift), (float*)((char*)recvbuf + shift), &c);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int it = 0; it < iters; ++it) {
      size_t shift = total * ((size_t)it % steps);
      run_coll(coll, (float*)((char*)sendbuf + shift), (float*)((char*)recvbuf + shift), &c);
    }
    double sec = (MPI_Wtime() - t0) / iters;
    double sum = 0;
    MPI_Allreduce(&sec, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    sec = sum / n;

    long long wrong = 0;
    if (do_check) {
      long long bad = check(coll, sendbuf, recvbuf, &c, rank, n);
      MPI_Allreduce(&bad, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
      total_wrong += wrong;
    }
    double size = (double)total; /* nccl-tests' "size": the whole buffer */
    double algbw = sec > 0 ? size / 1.0e9 / sec : 0;
    double busbw = algbw * bus_factor(coll, n);
    if (rank == 0) {
      printf(
          "RESULT coll=%s nranks=%d bytes=%zu count=%zu iters=%d time_us=%.2f algbw=%.4f "
          "busbw=%.4f wrong=%lld\n",
          kNames[coll], n, total, c.param, iters, sec * 1e6, algbw, busbw, do_check ? wrong : -1LL);
      fflush(stdout);
    }
    if (bytes > maxb / factor) break; /* no overflow past maxb */
  }
  free(sendbuf);
  free(recvbuf);
  MPI_Finalize();
  return total_wrong > 0 ? 3 : 0;
}
