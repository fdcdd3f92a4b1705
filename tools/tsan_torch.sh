#!/usr/bin/env bash
# ThreadSanitizer over loom_torch (Loom's torch.distributed backend): its worker thread, the
# caller's blocking calls run in place, Works and Futures completed by the worker, coalescing,
# abort and a dead peer, with libloom under the sanitizer too. The PyTorch wheel is not built with
# it, so this script builds the parts that are:
#   - libloom.so with -fsanitize=thread, in BUILD_DIR (default build-tsan/, tools/tsan_check.sh's);
#   - the extension (src/torch's setup.py, as pip builds it) with -fsanitize=thread, against it;
#   - a python3 that holds the sanitizer's runtime: python3's own main (Py_BytesMain) linked with
#     -fsanitize=thread against the same libpython, so the runtime starts before anything loads
#     (preloading the runtime into the stock python3 crashes at start). mp.spawn starts the ranks
#     with it too (sys.executable).
# Then runs tests/torch's tests with it: every operation against gloo (2 ranks), DDP, a send/recv
# pipeline (4 ranks) and the failures (a dead rank, an abort); and the CUDA path on the emulated
# GPU (libloom-fakecuda.so and tests/torch's loom_emulated_gpu, built with the sanitizer too):
# all_reduce on CUDA tensors with stream order at 2 ranks, an abort while a stream waits, a dead
# peer. Only the instrumented code is checked (ignore_noninstrumented_modules: PyTorch's own
# threads and atomics are invisible to the sanitizer, and its interceptors would report them as
# races); threads left running by the tests' deliberate os._exit are not reported; any report
# fails the run.
#   tools/tsan_torch.sh                  # build and run (skips, saying why, without torch)
# Used by tools/test.sh (the CI) after tools/tsan_check.sh, in the same build directory.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build-tsan}
PY=${PYTHON:-python3}

if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "tsan_torch: SKIP: $PY cannot import torch (pip install torch)"
  exit 0
fi
if ! command -v "$PY-config" >/dev/null; then
  echo "tsan_torch: SKIP: no $PY-config to build a sanitized python3 (apt-get install python3-dev)"
  exit 0
fi
# The compiler of tools/tsan_check.sh: clang where it is installed.
if [ -z "${CXX:-}" ] && [ "${SAN_CC:-clang}" = clang ] && command -v clang++ >/dev/null; then
  export CC=clang CXX=clang++
fi
CC=${CC:-cc}
CXX=${CXX:-c++}

OUT=$BUILD_DIR/tsan-torch
rm -rf "$OUT" && mkdir -p "$OUT/python/loom_torch"
BUILD_DIR=$BUILD_DIR OPT="-O1 -g1" TARGETS="loom loom_fakecuda" "$ROOT/tools/build.sh" \
  -DLOOM_SANITIZE=thread -DLOOM_BUILD_TESTS=ON -DLOOM_BUILD_TORCH=OFF -DLOOM_WITH_CUDA=OFF \
  >"$OUT/libloom.log" 2>&1 || { tail -30 "$OUT/libloom.log"; exit 1; }

# python3 with the sanitizer's runtime.
cat >"$OUT/python_main.c" <<'EOF'
#include <Python.h>
int main(int argc, char** argv) { return Py_BytesMain(argc, argv); }
EOF
# shellcheck disable=SC2046
"$CC" -fsanitize=thread -O1 -g $("$PY-config" --includes) "$OUT/python_main.c" \
  -o "$OUT/python3-tsan" $("$PY-config" --embed --ldflags)

# The extension, as src/torch/setup.py builds it for pip, with the sanitizer.
(cd "$ROOT/src/torch" &&
  LOOM_HOME=$BUILD_DIR CFLAGS="-fsanitize=thread -O1 -g" CXXFLAGS="-fsanitize=thread -O1 -g" \
    LDFLAGS="-fsanitize=thread" MAX_JOBS=2 "$PY" setup.py -q build_ext \
    --build-lib "$OUT/python" --build-temp "$OUT/build" >"$OUT/build.log" 2>&1) ||
  { tail -30 "$OUT/build.log"; exit 1; }
cp "$ROOT/src/torch/loom_torch/__init__.py" "$OUT/python/loom_torch/"
(cd "$ROOT/tests/torch" &&
  CFLAGS="-fsanitize=thread -O1 -g" CXXFLAGS="-fsanitize=thread -O1 -g" LDFLAGS="-fsanitize=thread" \
    MAX_JOBS=2 "$PY" emulated_gpu_setup.py -q build_ext --build-lib "$OUT/python" \
    --build-temp "$OUT/build-egpu" >"$OUT/build-egpu.log" 2>&1) ||
  { tail -30 "$OUT/build-egpu.log"; exit 1; }
FAKECUDA=$BUILD_DIR/tests/device/fake_cuda/libloom-fakecuda.so
GPU="LOOM_CUDA_LIB=$FAKECUDA LOOMTEST_FAKECUDA_DEVICES=1"

export TSAN_OPTIONS="halt_on_error=1 ignore_noninstrumented_modules=1 report_thread_leaks=0 ${TSAN_OPTIONS:-}"
# environment|test and arguments
RUNS=(
  "|ops_test.py --nprocs 2"
  "|ddp_test.py --nprocs 2"
  "|pipeline_test.py --nprocs 4"
  "|failure_test.py --nprocs 2 --mode dead"
  "|failure_test.py --nprocs 2 --mode abort"
  "$GPU|emulated_gpu_test.py --nprocs 2"
  "$GPU|emulated_gpu_test.py --nprocs 2 --mode abort"
  "$GPU|emulated_gpu_test.py --nprocs 2 --mode dead"
)
failed=0
for entry in "${RUNS[@]}"; do
  envs=${entry%%|*} run=${entry#*|}
  start=$SECONDS
  log=$OUT/$(echo "$run" | tr ' -' '__').log
  rc=0
  # shellcheck disable=SC2086
  (cd "$ROOT/tests/torch" && env $envs PYTHONPATH="$OUT/python:." OMP_NUM_THREADS=1 \
    timeout 600 "$OUT/python3-tsan" $run >"$log" 2>&1) || rc=$?
  reports=$(grep -c "WARNING: ThreadSanitizer" "$log" || true)
  printf 'tsan_torch: %-40s exit %d, %d report(s), %d s\n' "$run" "$rc" "$reports" \
    $((SECONDS - start))
  if [ "$rc" != 0 ] || [ "$reports" != 0 ]; then
    grep -E "WARNING: ThreadSanitizer|SUMMARY|Error|error" "$log" | head -40
    echo "tsan_torch: the whole log is $log"
    failed=1
  fi
done
exit $failed
