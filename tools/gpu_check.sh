#!/usr/bin/env bash
# Loom on a real GPU, in one go (issue 16's check), sized for one H200 and under 8 minutes:
#   tools/gpu_check.sh                 # logs in build-gpu/check (and $OUT, when set)
#   LOOM_CUDA_LIB=.../libloom-fakecuda.so GPU_CHECK_MAX_BYTES=4M tools/gpu_check.sh
#                                      # a dry run of the script over the emulated device
#
# 1. Binaries: gpu-bundle/ when present (made on a development machine by tools/gpu_bundle.sh:
#    built there for sm_90, with the libraries they need, for a GPU machine that lacks Loom's
#    build dependencies), else a build here for sm_90 (cmake, ninja, nvcc, fmt, nlohmann-json,
#    googletest needed).
# 2. The machine: nvidia-smi -L, the driver, and nvidia-smi topo -m beside loom-topo (discovery's
#    GPU, NVML facts, NUMA node and nearest NIC, on a GPU for the first time).
# 3. Loom's reduction kernel against the device-to-device copy in one process (loom-device-bw,
#    float32 and bfloat16 sum, 256 MiB): the target is a ratio >= 0.90.
# 4. DeviceCalls.* (bad device input, stream order, groups, destroy, abort, a killed rank, calls
#    captured into CUDA graphs and replayed: on a real driver for the first time), then
#    loom-perf all_reduce on device buffers at 1, 2 and 4 ranks on the one GPU (-c 1: every result
#    checked; ranks of one GPU run in one pass over each other's buffers through CUDA IPC), the
#    2-rank all_reduce staged through host memory beside it (LOOM_DEVICE_ONE_PASS=0), pipelined
#    in chunks and staged whole (LOOM_DEVICE_STAGE_CHUNK=0), and the 8-byte all_reduce latency on
#    a stream (enqueue to completion), then the latency and a sweep with the calls captured into
#    CUDA graphs (-G).
# 5. The collective matrix on device memory with a NULL stream and on streams (LOOMTEST_DEVICE=1,
#    LOOMTEST_STREAM=1; ranks as threads and as processes, up to 5).
# 6. loom-perf all_gather, reduce_scatter and broadcast on device buffers at 2 and 4 ranks.
# 7. tools/nccl_plugin_gpu_check.sh: real NCCL through libnccl-net-loom.so, with Loom's tuner
#    found in the net plugin and then loaded as libnccl-tuner-loom.so (NCCL_TUNER_PLUGIN).
# 8. compute-sanitizer (memcheck) on one small all_reduce, where it is installed.
# (6b. loom_torch built against the machine's PyTorch: CUDA tensors (tests/torch/cuda_test.py),
#     then CPU tensors: ops against gloo, DDP.)
# A summary table at the end; exit status 1 when a step failed. Each step has its own time limit.
# Every step's processes still running 10 s before the step's limit dump every thread's stack
# (tests/tools/stackdump.cc, preloaded) into the logs' stacks/: a hang comes back with where each
# thread waits (symbolize with addr2line against the unstripped build-gpu-bundle).
# GPU_CHECK_ONLY=REGEX runs only the steps whose names match (a short rerun of what failed),
# GPU_CHECK_STACKS=S dumps S seconds after each process starts, GPU_CHECK_STEP_LIMIT=S caps each
# step's time.
# The whole check keeps within GPU_CHECK_BUDGET seconds (default 480, under the device tool's
# 600-second limit per command): each step's limit is cut to what is left, a step with under 15 s
# left is skipped and named, and the summary and logs reach $OUT after every step, so a run cut
# short still brings back what it did.
set -u
MAXB=${GPU_CHECK_MAX_BYTES:-256M}
BUDGET=${GPU_CHECK_BUDGET:-480}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# Logs in build-gpu/check; with $OUT set (the device tool brings back at most 8 files), the
# summary and one archive of the logs are copied there at the end.
LOGS=$ROOT/build-gpu/check
rm -rf "$LOGS"
mkdir -p "$LOGS"
SUMMARY=$LOGS/summary.txt
: >"$SUMMARY"
failed=0
started=$(date +%s)

note() { printf '%-34s %-5s %s\n' "$1" "$2" "$3" | tee -a "$SUMMARY"; }
# Copies the summary and an archive of the logs so far to $OUT (when set).
publish() {
  [ -n "${OUT:-}" ] || return 0
  cp "$SUMMARY" "$OUT/summary.txt"
  tar -czf "$OUT/gpu_check_logs.tar.gz" -C "$LOGS" .
}
# step NAME LIMIT_S COMMAND...: runs it with a time limit, its output in $LOGS/NAME.log.
step() {
  local name=$1 limit=$2
  shift 2
  if [ -n "${GPU_CHECK_ONLY:-}" ] && [ "$name" != build ] && ! [[ $name =~ $GPU_CHECK_ONLY ]]; then
    return 0
  fi
  local left=$((BUDGET - ($(date +%s) - started)))
  if [ $left -lt 15 ]; then
    note "$name" skip "the check's time budget (${BUDGET}s) is spent"
    return 0
  fi
  [ $limit -gt $left ] && limit=$left
  [ -n "${GPU_CHECK_STEP_LIMIT:-}" ] && [ $limit -gt "$GPU_CHECK_STEP_LIMIT" ] && limit=$GPU_CHECK_STEP_LIMIT
  echo "== $name: $*"
  local t0=$(date +%s)
  # The stacks of a step's processes still running 10 s before its limit (a hang), unless
  # GPU_CHECK_STACKS says when; not under compute-sanitizer, which preloads its own.
  local pre=() after=${GPU_CHECK_STACKS:-$((limit > 20 ? limit - 10 : 10))}
  if [ -n "${STACKDUMP:-}" ] && [ -f "$STACKDUMP" ] && [ "$name" != sanitizer ]; then
    mkdir -p "$LOGS/stacks/$name"
    pre=(env "LD_PRELOAD=$STACKDUMP" "LOOMTEST_STACKS_AFTER=$after"
      "LOOMTEST_STACKS_DIR=$LOGS/stacks/$name")
  fi
  timeout --kill-after=10 "$limit" "${pre[@]}" "$@" >"$LOGS/$name.log" 2>&1
  local rc=$? t=$(($(date +%s) - t0))
  tail -n 25 "$LOGS/$name.log"
  if [ $rc -eq 0 ]; then
    note "$name" ok "${t}s"
  elif [ $rc -eq 77 ]; then
    note "$name" skip "$(grep -m1 SKIP "$LOGS/$name.log")"
  else
    [ $rc -eq 124 ] && note "$name" FAIL "timed out after ${limit}s" || note "$name" FAIL "exit $rc (${t}s)"
    failed=1
  fi
  publish
  return $rc
}

# ---- 1. binaries ----------------------------------------------------------------------------------
if [ -x "$ROOT/gpu-bundle/bin/loom-perf" ]; then
  BIN=$ROOT/gpu-bundle/bin
  export LD_LIBRARY_PATH=$ROOT/gpu-bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # The machine's C++ runtime unless the bundle's binaries need the one they were built with.
  if ! "$BIN/loom-perf" --help >/dev/null 2>&1; then
    export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$ROOT/gpu-bundle/lib-fallback
  fi
  PLUGIN=$ROOT/gpu-bundle/lib/libnccl-net-loom.so
  TUNER=$ROOT/gpu-bundle/lib/libnccl-tuner-loom.so
  STACKDUMP=$ROOT/gpu-bundle/lib/libloom-stackdump.so
  if ! "$BIN/loom-perf" --help >/dev/null 2>&1; then
    note build FAIL "the bundle's loom-perf does not start here: $("$BIN/loom-perf" --help 2>&1 | head -2)"
    cat "$SUMMARY"
    exit 1
  fi
  note build ok "gpu-bundle ($(cat "$ROOT/gpu-bundle/BUILT" 2>/dev/null))"
else
  B=$ROOT/build-gpu
  export PATH=/usr/local/cuda/bin:$PATH
  gen=""
  command -v ninja >/dev/null && gen="-G Ninja"
  step build 300 bash -c "cmake -S '$ROOT' -B '$B' $gen -DCMAKE_BUILD_TYPE=Release \
      -DLOOM_BUILD_TESTS=ON -DLOOM_CUDA_ARCHS=90 && cmake --build '$B' -j \$(nproc) --target \
      loom loom-perf loom-device-bw loom-topo collectives_tests nccl_net_loom nccl_tuner_loom \
      loom_stackdump" || {
    cat "$SUMMARY"
    exit 1
  }
  BIN=$B/bin
  mkdir -p "$BIN"
  for t in tools/perf/loom-perf tools/perf/loom-device-bw tools/topo/loom-topo \
    tests/collectives/collectives_tests; do ln -sf "$B/$t" "$BIN/"; done
  PLUGIN=$B/transports/ncclnet/plugin/libnccl-net-loom.so
  TUNER=$B/transports/ncclnet/tuner/libnccl-tuner-loom.so
  STACKDUMP=$B/tests/tools/libloom-stackdump.so
fi

# ---- 2. the machine ---------------------------------------------------------------------------------
step machine 60 bash -c 'nvidia-smi -L; nvidia-smi --query-gpu=name,pci.bus_id,driver_version,memory.total,clocks.max.mem --format=csv; nvcc --version 2>/dev/null | tail -1; echo; nvidia-smi topo -m'
step loom-topo 60 "$BIN/loom-topo"

# ---- 3. kernel against copy -------------------------------------------------------------------------
step device-bw 120 "$BIN/loom-device-bw" --bytes "$MAXB" --iters 20

# ---- 4. the device calls' tests, then all_reduce on device buffers --------------------------------------
step tests-device-calls 90 "$BIN/collectives_tests" '--gtest_filter=DeviceCalls.*'
for np in 1 2 4; do
  step "perf-all_reduce-np$np" 90 "$BIN/loom-perf" all_reduce -np $np --mem device -c 1 -b 8 \
    -e "$MAXB" -f 8 -n 5 -w 2 -T 60
done
# The same 2-rank all_reduce staged through host memory, beside the one pass above: pipelined in
# chunks (the default LOOM_DEVICE_STAGE_CHUNK), then each call staged whole.
step perf-all_reduce-np2-staged 90 env LOOM_DEVICE_ONE_PASS=0 "$BIN/loom-perf" all_reduce -np 2 \
  --mem device -c 1 -b 1M -e "$MAXB" -f 4 -n 5 -w 2 -T 60
step perf-all_reduce-np2-staged-whole 90 env LOOM_DEVICE_ONE_PASS=0 LOOM_DEVICE_STAGE_CHUNK=0 \
  "$BIN/loom-perf" all_reduce -np 2 --mem device -c 1 -b 1M -e "$MAXB" -f 4 -n 5 -w 2 -T 60
# The model's prices of those paths with the H200's measured speeds, to set beside the runs above.
step plan-device 30 "$BIN/loom-perf" all_reduce -np 2 --mem device --plan -b 8 -e "$MAXB" -f 8
step plan-device-staged 30 env LOOM_DEVICE_ONE_PASS=0 "$BIN/loom-perf" all_reduce -np 2 \
  --mem device --plan -b 1M -e "$MAXB" -f 4
# The one pass's two ways of writing its outputs, each forced (the runs above took the model's
# choice; plan-device lists both prices as one-pass-kernels and one-pass-engines).
for way in kernels engines; do
  for coll in all_reduce all_gather; do
    step "perf-$coll-np4-$way" 60 env LOOM_DEVICE_ONE_PASS_COPIES=$way "$BIN/loom-perf" "$coll" \
      -np 4 --mem device -c 1 -b 8 -e "$MAXB" -f 64 -n 5 -w 2 -T 60
  done
done
step perf-latency-8B 60 "$BIN/loom-perf" all_reduce -np 2 --mem device -b 8 -e 8 -n 2000 -w 100 -T 60
# The same calls captured into CUDA graphs and replayed (-G, as nccl-tests): latency and a sweep.
step perf-latency-8B-graph 60 "$BIN/loom-perf" all_reduce -np 2 --mem device -b 8 -e 8 -n 200 \
  -w 100 -G 10 -T 60
step perf-all_reduce-np2-graph 90 "$BIN/loom-perf" all_reduce -np 2 --mem device -c 1 -b 8 \
  -e "$MAXB" -f 8 -n 5 -w 2 -G 4 -T 60

# ---- 5. the collective matrix on device memory ------------------------------------------------------------
matrix='Ranks/ThreadMatrix.*:Ranks/ProcessMatrix.*-*_8ranks'
step tests-device 120 env LOOMTEST_DEVICE=1 "$BIN/collectives_tests" "--gtest_filter=$matrix"
step tests-device-stream 120 env LOOMTEST_DEVICE=1 LOOMTEST_STREAM=1 "$BIN/collectives_tests" \
  "--gtest_filter=$matrix"

# ---- 6. loom-perf of the other collectives on device buffers --------------------------------------------
for coll in all_gather reduce_scatter broadcast; do
  for np in 2 4; do
    step "perf-$coll-np$np" 90 "$BIN/loom-perf" "$coll" -np $np --mem device -c 1 -b 8 -e "$MAXB" \
      -f 8 -n 5 -w 2 -T 60
  done
done

# ---- 6b. loom_torch against the machine's PyTorch ------------------------------------------------------
# Built here against this machine's torch (another version than CI's) and Loom of step 1: CUDA
# tensors at 2 ranks on the one GPU (tests/torch/cuda_test.py: every operation, stream order,
# async wait, DDP) and their benchmark against gloo and loom-perf (bench/torch/torch_bench.py
# --device cuda), then CPU tensors (every operation against gloo at 2 ranks, and DDP).
if python3 -c "import torch" 2>/dev/null; then
  LOOM_FOR_TORCH=$ROOT/gpu-bundle
  [ -d "$LOOM_FOR_TORCH/include" ] || LOOM_FOR_TORCH=$ROOT/build-gpu
  TORCH_ENV="PYTHONPATH=$LOGS/../python:. OMP_NUM_THREADS=1"
  step torch-build 150 bash -c "cd '$ROOT/src/torch' && LOOM_HOME='$LOOM_FOR_TORCH' MAX_JOBS=4 \
      python3 setup.py -q build_ext --build-lib '$LOGS/../python' --build-temp '$LOGS/../torch-build' \
      && cp loom_torch/__init__.py '$LOGS/../python/loom_torch/'"
  step torch-cuda 120 bash -c "cd '$ROOT/tests/torch' && env $TORCH_ENV python3 cuda_test.py --nprocs 2"
  if python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    step torch-bench-cuda 90 bash -c "cd '$ROOT/tests/torch' && env $TORCH_ENV python3 \
        '$ROOT/bench/torch/torch_bench.py' --device cuda --nprocs 2 --min-bytes 8 --factor 8 --iters 50 \
        --rounds 1 \
        --target-bytes 1e9 --ddp-params 25e6 --loom-perf '$BIN/loom-perf'"
  else
    note torch-bench-cuda skip "torch.cuda.is_available() is False here"
  fi
  step torch-cpu 120 bash -c "cd '$ROOT/tests/torch' && env $TORCH_ENV python3 ops_test.py --nprocs 2 \
      && env $TORCH_ENV python3 ddp_test.py --nprocs 2 --steps 100"
else
  note torch skip "python3 cannot import torch here"
fi

# ---- 7. NCCL through the plugin ------------------------------------------------------------------------
step nccl-plugin 150 "$ROOT/tools/nccl_plugin_gpu_check.sh" "$PLUGIN" "$TUNER"

# ---- 8. compute-sanitizer -------------------------------------------------------------------------------
if command -v compute-sanitizer >/dev/null; then
  step sanitizer 150 compute-sanitizer --tool memcheck --error-exitcode 9 --target-processes all \
    "$BIN/loom-perf" all_reduce -np 2 --mem device -c 1 -b 1M -e 1M -n 2 -w 1 -T 60
else
  note sanitizer skip "compute-sanitizer is not installed"
fi

# ---- summary ----------------------------------------------------------------------------------------------
{
  echo
  echo "== figures"
  grep -h -E '^ +(float|bfloat16) ' "$LOGS/device-bw.log" 2>/dev/null | sed 's/^/device-bw: /'
  for f in "$LOGS"/perf-*.log; do
    [ -f "$f" ] || continue
    n=$(basename "$f" .log)
    last=$(grep -E '^ +[0-9]+ +[0-9]+ ' "$f" | tail -1)
    avg=$(grep -m1 'Avg bus bandwidth' "$f")
    echo "$n: largest: $last | $avg"
  done
  echo "total $(($(date +%s) - started)) s"
} | tee -a "$SUMMARY"
echo "== summary ($SUMMARY)"
cat "$SUMMARY"
publish
exit $failed
