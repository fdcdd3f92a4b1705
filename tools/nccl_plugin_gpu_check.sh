#!/usr/bin/env bash
# Real-NCCL check of libnccl-net-loom.so and Loom's tuner, for a machine with a GPU and NCCL:
#   tools/nccl_plugin_gpu_check.sh [path/to/libnccl-net-loom.so [path/to/libnccl-tuner-loom.so]]
# Two ranks on one GPU, made to look like two hosts (distinct NCCL_HOSTID) so that NCCL connects
# them through its network layer, i.e. through the plugin (NCCL_NET_PLUGIN=path, NCCL_NET=Loom).
# Passes when each rank's AllReduce results are right and NCCL's log says it used Loom's network,
# twice: first with the tuner NCCL finds in the net plugin (no NCCL_TUNER_PLUGIN), then with
# NCCL_TUNER_PLUGIN naming libnccl-tuner-loom.so; each time the log holds the tuner's decisions
# (TUNER/Loom lines).
# Exits 77 (skip) with the reason where there is no GPU, no NCCL or no compiler; 1 on a failure.
# The network is Loom's choice (LOOM_NET from the environment: ib where an IB port is active,
# else sockets).
set -u
here="$(cd "$(dirname "$0")/.." && pwd)"
plugin="${1:-$here/build/transports/ncclnet/plugin/libnccl-net-loom.so}"
tuner="${2:-$here/build/transports/ncclnet/tuner/libnccl-tuner-loom.so}"
cuda="${CUDA_HOME:-/usr/local/cuda}"
nccl_home="${NCCL_HOME:-$cuda}"

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

command -v nvidia-smi >/dev/null 2>&1 || skip "no GPU: nvidia-smi is not installed"
ngpu="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
[ "${ngpu:-0}" -ge 1 ] || skip "no GPU: nvidia-smi lists none"
[ -f "$nccl_home/include/nccl.h" ] || skip "no NCCL headers in $nccl_home/include (set NCCL_HOME)"
compgen -G "$nccl_home/lib*/libnccl.so*" >/dev/null || skip "no libnccl.so in $nccl_home/lib* (set NCCL_HOME)"
[ -f "$plugin" ] || fail "plugin not found: $plugin (build the nccl_net_loom target)"
if ldd "$plugin" | grep -q "not found"; then
  fail "the plugin's libraries are missing here: $(ldd "$plugin" | grep 'not found' | tr -s ' \t' ' ')"
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cat >"$work/allreduce.c" <<'EOF'
/* Rank r of 2: AllReduce(sum) of rank-dependent floats on GPU 0; checks every element. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(call, what)                                                   \
  do {                                                                      \
    if ((call) != 0) {                                                      \
      fprintf(stderr, "rank %d: %s failed\n", rank, what);                  \
      return 1;                                                             \
    }                                                                       \
  } while (0)

int main(int argc, char** argv) {
  int rank = atoi(argv[1]);
  const char* idFile = argv[2];
  ncclUniqueId id;
  if (rank == 0) {
    if (ncclGetUniqueId(&id) != ncclSuccess) return 1;
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", idFile);
    FILE* f = fopen(tmp, "wb");
    if (!f || fwrite(&id, sizeof(id), 1, f) != 1) return 1;
    fclose(f);
    rename(tmp, idFile);
  } else {
    FILE* f = NULL;
    for (int i = 0; i < 600 && !(f = fopen(idFile, "rb")); ++i) usleep(100000);
    if (!f || fread(&id, sizeof(id), 1, f) != 1) return 1;
    fclose(f);
  }
  CHECK(cudaSetDevice(0), "cudaSetDevice");
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, 2, id, rank), "ncclCommInitRank");
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s), "cudaStreamCreate");
  const size_t counts[] = {1, 1000, 1 << 20, 64 << 20};
  for (int k = 0; k < 4; ++k) {
    size_t n = counts[k];
    float* h = (float*)malloc(n * sizeof(float));
    float* d;
    for (size_t i = 0; i < n; ++i) h[i] = (float)((rank + 1) * (i % 97));
    CHECK(cudaMalloc((void**)&d, n * sizeof(float)), "cudaMalloc");
    CHECK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
    CHECK(ncclAllReduce(d, d, n, ncclFloat, ncclSum, comm, s), "ncclAllReduce");
    CHECK(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    CHECK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy back");
    for (size_t i = 0; i < n; ++i) {
      if (h[i] != (float)(3 * (i % 97))) {
        fprintf(stderr, "rank %d: AllReduce of %zu floats: element %zu is %g, want %g\n", rank, n,
                i, h[i], (double)(3 * (i % 97)));
        return 1;
      }
    }
    printf("rank %d: AllReduce of %zu floats correct\n", rank, n);
    cudaFree(d);
    free(h);
  }
  ncclCommDestroy(comm);
  printf("rank %d: RESULT OK\n", rank);
  return 0;
}
EOF
libdir=""
for lib in "$nccl_home"/lib*/libnccl.so*; do
  libdir="$(dirname "$lib")"
  break
done
if command -v "$cuda/bin/nvcc" >/dev/null 2>&1; then
  "$cuda/bin/nvcc" -x cu -o "$work/allreduce" "$work/allreduce.c" -I"$nccl_home/include" \
    -L"$libdir" -lnccl || fail "could not compile the NCCL check program"
elif command -v cc >/dev/null 2>&1; then
  cc -o "$work/allreduce" "$work/allreduce.c" -I"$cuda/include" -I"$nccl_home/include" \
    -L"$libdir" -L"$cuda/lib64" -lnccl -lcudart || fail "could not compile the NCCL check program"
else
  skip "no compiler (nvcc or cc) for the NCCL check program"
fi

export LD_LIBRARY_PATH="$libdir:$cuda/lib64:${LD_LIBRARY_PATH:-}"
export NCCL_NET_PLUGIN="$plugin" NCCL_NET=Loom NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,TUNING
# One run of the two ranks; $1 names it, the environment says which tuner NCCL takes.
run_pair() {
  local name=$1 pids=() status=0
  for r in 0 1; do
    NCCL_HOSTID="loom-plugin-check-host$r" timeout 300 "$work/allreduce" "$r" "$work/id.$name" \
      >"$work/$name.rank$r.log" 2>&1 &
    pids+=($!)
  done
  for r in 0 1; do
    wait "${pids[$r]}" || status=1
  done
  for r in 0 1; do
    echo "---- $name: rank $r (NCCL log lines about the network and the tuner) ----"
    grep -E "NET/Loom|TUNER/Loom|Using network|tuner|via NET|RESULT|AllReduce|WARN|failed" \
      "$work/$name.rank$r.log" | head -40
  done
  [ "$status" -eq 0 ] || fail "$name: a rank failed (logs above)"
  for r in 0 1; do
    local log="$work/$name.rank$r.log"
    grep -q "RESULT OK" "$log" || fail "$name: rank $r did not finish its AllReduce checks"
    grep -q "NET/Loom" "$log" || fail "$name: rank $r: no log line from the Loom plugin"
    grep -qi "Using network Loom" "$log" || fail "$name: rank $r: NCCL did not report 'Using network Loom'"
    grep -q "TUNER/Loom" "$log" || fail "$name: rank $r: no log line from Loom's tuner"
  done
}
run_pair net-route
if [ -f "$tuner" ]; then
  NCCL_TUNER_PLUGIN="$tuner" run_pair tuner-route
else
  fail "tuner not found: $tuner (build the nccl_tuner_loom target)"
fi
echo "PASS: NCCL AllReduce between 2 ranks over libnccl-net-loom.so ($(grep -h -o 'plugin Loom over[^,]*' "$work/net-route.rank0.log" | head -1)), Loom's tuner found in the net plugin and loaded as $(basename "$tuner"); its decisions: $(grep -h -o 'TUNER/Loom : AllReduce[^;]*' "$work/net-route.rank0.log" | head -2 | tr '\n' ' ')"
