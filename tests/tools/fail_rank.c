/* Preloaded into loom-perf by its launcher tests (LD_PRELOAD): makes one spawned rank fail on
 * purpose, so that a test can check which rank the launcher names as the one that failed first.
 * In the rank LOOMTEST_FAIL_RANK (as LOOMPERF_CHILD_RANK numbers them), the LOOMTEST_FAIL_CALL-th
 * loomAllReduce (default 3) does LOOMTEST_FAIL_HOW:
 *   kill  the process dies by SIGKILL;
 *   hang  the call never returns (the others time out waiting for it; the launcher kills it).
 * Every other call goes to Loom's loomAllReduce. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/loom.h"

typedef loomResult_t (*AllReduceFn)(const void*, void*, size_t, loomDataType_t, loomRedOp_t,
                                    loomComm_t, loomStream_t);

static int gCalls = 0;

static int failsHere(void) {
  const char* rank = getenv("LOOMPERF_CHILD_RANK");
  const char* target = getenv("LOOMTEST_FAIL_RANK");
  const char* call = getenv("LOOMTEST_FAIL_CALL");
  if (!rank || !target || strcmp(rank, target) != 0) return 0;
  return ++gCalls == (call ? atoi(call) : 3);
}

loomResult_t loomAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           loomDataType_t datatype, loomRedOp_t op, loomComm_t comm,
                           loomStream_t stream) {
  static AllReduceFn real = NULL;
  if (!real) real = (AllReduceFn)dlsym(RTLD_NEXT, "loomAllReduce");
  if (failsHere()) {
    const char* how = getenv("LOOMTEST_FAIL_HOW");
    if (how && strcmp(how, "hang") == 0)
      for (;;) pause();
    raise(SIGKILL);
  }
  return real(sendbuff, recvbuff, count, datatype, op, comm, stream);
}
