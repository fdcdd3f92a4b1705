#!/usr/bin/env bash
# ThreadSanitizer over the transports, the bootstrap, the executor and the failure paths: builds
# the four test programs that hold them with -fsanitize=thread in BUILD_DIR (default
# build-tsan/) and runs them two at a time (TSAN_JOBS), each with a deadline. Ranks run as threads
# of one process here (the thread matrix), so the sanitizer sees every rank's side of each
# exchange:
#   transports_tests   every transport's conformance (sockets, shared memory, the emulated IB
#                      device, the NCCL net plugin both ways), setup and failure cases
#   bootstrap_tests    the rendezvous, the ring, strangers and killed ranks
#   runtime_tests      dispatch and connection setup
#   collectives_tests  the thread matrix, groups, split, bad input, the low-latency race and the
#                      failure cases (a killed rank, abort, deadlines), over shared memory, then
#                      sockets (up to 5 ranks) and the emulated IB device (up to 3): the 8-rank
#                      matrix runs over shared memory only, to keep CI's time; then CUDA device
#                      buffers on the emulated GPU (libloom-fakecuda.so, which runs without nvcc's
#                      kernels): the device calls (streams, the one pass, staging, GPUDirect,
#                      faults, abort) and the thread matrix on device buffers with streams (up to
#                      5 ranks), and at 2 and 3 ranks on the GPUDirect schedule through an imported
#                      NCCL net plugin (Loom's own, built with collectives_tests)
# Any report fails the run (halt_on_error). Used by tools/test.sh (the CI); alone:
#   tools/tsan_check.sh            # build and run
#   FRESH=1 tools/tsan_check.sh    # from scratch
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build-tsan}
TARGETS=(transports_tests bootstrap_tests runtime_tests collectives_tests loom_fakecuda)

# By clang where it is installed, as tools/test.sh's sanitizer stages (a new build directory only:
# one made before keeps its compiler); SAN_CC=gcc, or CC/CXX, choose another. -O1 -g1 as for the
# other sanitizers; no device kernels (nothing here runs them).
if [ -z "${CXX:-}" ] && [ "${SAN_CC:-clang}" = clang ] && command -v clang++ >/dev/null; then
  export CC=clang CXX=clang++
fi
BUILD_DIR=$BUILD_DIR OPT="-O1 -g1" TARGETS="${TARGETS[*]}" "$ROOT/tools/build.sh" \
  -DLOOM_SANITIZE=thread -DLOOM_BUILD_TESTS=ON -DLOOM_BUILD_TORCH=OFF -DLOOM_WITH_CUDA=OFF

export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
B=$BUILD_DIR/tests
FAKEVERBS=$B/transports/ib/libloom-fakeverbs.so
FAKECUDA=$B/device/fake_cuda/libloom-fakecuda.so
PLUGIN=$BUILD_DIR/transports/ncclnet/plugin/libnccl-net-loom.so
THREADS='Ranks/ThreadMatrix.*:*AllReduceAlgorithms*:Collectives.*:Group.*:Comm.*:Failure.*'
# Cases run over shared memory only, left out over sockets and the emulated IB device: the largest
# messages (the same pipeline of chunks over each; 2 of those runs' 4.5 minutes under gcc's TSan)
# and the killed-rank cases named for shared memory's paths (with shared memory off they repeat
# Failure.KilledRankIsNamedBySurvivors).
SHM_ONLY='Collectives.LargeMessages*:Failure.KilledRankOnThe*'
# The tests' quick mode (tests/quick.h), as under the other sanitizers: the first stage ran them all.
export LOOMTEST_QUICK=1
LOGS=$BUILD_DIR/tsan-logs
rm -rf "$LOGS" && mkdir -p "$LOGS"

# name|environment|program and arguments
RUNS=(
  "transports||transports/transports_tests"
  "collectives_shm||collectives/collectives_tests --gtest_filter=$THREADS:BadInput.*:LowLatencyRace.*"
  "collectives_sockets|LOOM_SHM_DISABLE=1|collectives/collectives_tests --gtest_filter=$THREADS:BadInput.Counts*-*_8ranks:$SHM_ONLY"
  "collectives_ib|LOOM_NET=ib LOOM_IBVERBS_LIB=$FAKEVERBS LOOM_SHM_DISABLE=1|collectives/collectives_tests --gtest_filter=$THREADS:BadInput.Counts*-*_8ranks:*_5ranks:*_4ranks:$SHM_ONLY"
  "device_calls|LOOM_CUDA_LIB=$FAKECUDA LOOMTEST_FAKECUDA_DEVICES=2|collectives/collectives_tests --gtest_filter=DeviceCalls.*"
  "device_matrix|LOOM_CUDA_LIB=$FAKECUDA LOOMTEST_DEVICE=1 LOOMTEST_STREAM=1|collectives/collectives_tests --gtest_filter=Ranks/ThreadMatrix.*-*_8ranks"
  "device_plugin_gdr|LOOM_NET_PLUGIN=$PLUGIN LOOM_IBVERBS_LIB=$FAKEVERBS LOOM_SHM_DISABLE=1 LOOM_CUDA_LIB=$FAKECUDA LOOMTEST_DEVICE=1 LOOMTEST_STREAM=1 LOOM_NET_GDR_LEVEL=SYS LOOMTEST_FAKEVERBS_GPU_WRITE_DELAY_MS=200|collectives/collectives_tests --gtest_filter=Ranks/ThreadMatrix.*_2ranks:Ranks/ThreadMatrix.*_3ranks"
  "bootstrap||bootstrap/bootstrap_tests"
  "runtime||runtime/runtime_tests"
)

run_one() {
  local name=${1%%|*} rest=${1#*|}
  local envs=${rest%%|*} cmd=${rest#*|}
  local start=$SECONDS rc=0
  # shellcheck disable=SC2086
  (cd "$B" && env $envs timeout 600 $cmd >"$LOGS/$name.log" 2>&1) || rc=$?
  local reports
  reports=$(grep -c "WARNING: ThreadSanitizer" "$LOGS/$name.log" || true)
  printf 'tsan: %-20s exit %d, %d report(s), %d s\n' "$name" "$rc" "$reports" $((SECONDS - start))
  if [ "$rc" != 0 ] || [ "$reports" != 0 ]; then
    grep -E -A6 "WARNING: ThreadSanitizer|SUMMARY|FAILED|: Failure$" "$LOGS/$name.log" | head -60
    echo "tsan: the whole log is $LOGS/$name.log"
    # 2: a failure without a report, which may be the load of the run beside it; 1: a report.
    [ "$reports" != 0 ] && return 1
    return 2
  fi
}

# Two runs at a time (TSAN_JOBS), as ctest -j2 runs the other stages: most runs are one process
# whose ranks wait on each other more than they compute, so a pair takes little more than the
# longer of the two (4 minutes of runs in 2.5 on the 2-core CI machine). A run that fails without
# a report runs again alone (as ctest's --repeat until-pass:2 does for the other stages); a report
# fails the stage.
JOBS=${TSAN_JOBS:-2}
declare -A pid_of=()
failed=0
retry=()
reap() {
  local done_pid rc=0
  wait -n -p done_pid || rc=$?
  local r=${pid_of[$done_pid]}
  unset "pid_of[$done_pid]"
  case $rc in
    0) ;;
    2) retry+=("$r") ;;
    *) failed=1 ;;
  esac
}
for r in "${RUNS[@]}"; do
  while [ "${#pid_of[@]}" -ge "$JOBS" ]; do reap; done
  run_one "$r" &
  pid_of[$!]=$r
done
while [ "${#pid_of[@]}" -gt 0 ]; do reap; done
for r in "${retry[@]}"; do
  name=${r%%|*}
  mv "$LOGS/$name.log" "$LOGS/$name.first.log"
  echo "tsan: $name again, alone (the first run's log: $LOGS/$name.first.log)"
  run_one "$r" || failed=1
done
if [ "$failed" != 0 ]; then
  echo "tsan: FAILED (logs in $LOGS)"
  exit 1
fi
echo "tsan: all ${#RUNS[@]} runs clean"
