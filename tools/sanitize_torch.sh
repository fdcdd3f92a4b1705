#!/usr/bin/env bash
# loom_torch (Loom's torch.distributed backend) under a sanitizer, with libloom under it too:
#   tools/sanitize_torch.sh thread     # ThreadSanitizer (BUILD_DIR default build-tsan/)
#   tools/sanitize_torch.sh address    # AddressSanitizer + UBSan (BUILD_DIR default build-asan/)
# The PyTorch wheel is not built with a sanitizer, so this script builds the parts that are, in
# BUILD_DIR (tools/tsan_check.sh's, or tools/test.sh's AddressSanitizer build: the same flags):
#   - libloom.so and the emulated GPU (libloom-fakecuda.so);
#   - the extension (src/torch's setup.py, as pip builds it) against that libloom, and tests/torch's
#     loom_emulated_gpu (PyTorch's CUDA device over the emulated GPU);
#   - a python3 that holds the sanitizer's runtime: python3's own main (Py_BytesMain) linked with
#     it against the same libpython, so the runtime starts before anything loads (preloading the
#     runtime into the stock python3 crashes at start). mp.spawn starts the ranks with it too
#     (sys.executable).
# Then runs tests/torch's tests with it, each with a deadline:
#   thread:  every operation against gloo (2 ranks), a send/recv pipeline (4 ranks), an abort
#            with an operation in flight; CUDA tensors on the emulated GPU (stream order at 2
#            ranks, an abort while a stream waits). Only the instrumented code is checked
#            (ignore_noninstrumented_modules: PyTorch's own threads and atomics are invisible to
#            the sanitizer, and its interceptors would report them as races); threads left running
#            by the tests' deliberate os._exit are not reported.
#   address: every operation against gloo (2 ranks), CUDA tensors on the emulated GPU: the
#            paths that compute buffer sizes and hold tensors for the worker. No leak check
#            (Python and PyTorch keep their memory to the end).
# Any report fails the run. Skips, saying why, without torch or python3-config. Used by
# tools/test.sh (the CI) after its sanitizer stages, in their build directories.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SAN=${1:-}
PY=${PYTHON:-python3}
case "$SAN" in
  thread)
    BUILD_DIR=${BUILD_DIR:-$ROOT/build-tsan}
    FLAG=-fsanitize=thread
    CMAKE_SAN=thread
    export TSAN_OPTIONS="halt_on_error=1 ignore_noninstrumented_modules=1 report_thread_leaks=0 ${TSAN_OPTIONS:-}"
    REPORT="WARNING: ThreadSanitizer"
    ;;
  address)
    BUILD_DIR=${BUILD_DIR:-$ROOT/build-asan}
    FLAG=-fsanitize=address,undefined
    CMAKE_SAN=address,undefined
    # Last, so that it holds over tools/test.sh's detect_leaks=1.
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
    REPORT="ERROR: AddressSanitizer|runtime error:"
    ;;
  *)
    echo "usage: tools/sanitize_torch.sh thread|address" >&2
    exit 2
    ;;
esac

if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "sanitize_torch: SKIP: $PY cannot import torch (pip install torch)"
  exit 0
fi
if ! command -v "$PY-config" >/dev/null; then
  echo "sanitize_torch: SKIP: no $PY-config to build a sanitized python3 (apt-get install python3-dev)"
  exit 0
fi
# The compiler of the sanitizer stages: clang where it is installed.
if [ -z "${CXX:-}" ] && [ "${SAN_CC:-clang}" = clang ] && command -v clang++ >/dev/null; then
  export CC=clang CXX=clang++
fi
CC=${CC:-cc}
CXX=${CXX:-c++}

OUT=$BUILD_DIR/sanitized-torch
rm -rf "$OUT" && mkdir -p "$OUT/python/loom_torch"
cmake_flags=(-DLOOM_BUILD_TESTS=ON "-DLOOM_SANITIZE=$CMAKE_SAN" -DLOOM_BUILD_TORCH=OFF)
# tools/tsan_check.sh's build has no device kernels (nothing there runs them).
[ "$SAN" = thread ] && cmake_flags+=(-DLOOM_WITH_CUDA=OFF)
BUILD_DIR=$BUILD_DIR OPT="-O1 -g1" TARGETS="loom loom_fakecuda" "$ROOT/tools/build.sh" \
  "${cmake_flags[@]}" >"$OUT/libloom.log" 2>&1 || { tail -30 "$OUT/libloom.log"; exit 1; }

# python3 with the sanitizer's runtime (linked by the C++ driver: UBSan's C++ checks need its
# C++ part).
cat >"$OUT/python_main.c" <<'EOF'
#include <Python.h>
int main(int argc, char** argv) { return Py_BytesMain(argc, argv); }
EOF
# shellcheck disable=SC2046
"$CC" "$FLAG" -O1 -g $("$PY-config" --includes) -c "$OUT/python_main.c" -o "$OUT/python_main.o"
# shellcheck disable=SC2046
"$CXX" "$FLAG" "$OUT/python_main.o" -o "$OUT/python3-san" $("$PY-config" --embed --ldflags)

# The extension, as src/torch/setup.py builds it for pip, and the emulated GPU's, with the
# sanitizer.
build_ext() {  # directory, setup script, build-temp name
  (cd "$1" && LOOM_HOME=$BUILD_DIR CFLAGS="$FLAG -O1 -g" CXXFLAGS="$FLAG -O1 -g" LDFLAGS="$FLAG" \
    MAX_JOBS=2 "$PY" "$2" -q build_ext --build-lib "$OUT/python" --build-temp "$OUT/$3" \
    >"$OUT/$3.log" 2>&1) || { tail -30 "$OUT/$3.log"; exit 1; }
}
build_ext "$ROOT/src/torch" setup.py build-loom-torch
cp "$ROOT/src/torch/loom_torch/__init__.py" "$OUT/python/loom_torch/"
build_ext "$ROOT/tests/torch" emulated_gpu_setup.py build-emulated-gpu

GPU="LOOM_CUDA_LIB=$BUILD_DIR/tests/device/fake_cuda/libloom-fakecuda.so LOOMTEST_FAKECUDA_DEVICES=1"
# environment|test and arguments
if [ "$SAN" = thread ]; then
  RUNS=(
    "|ops_test.py --nprocs 2"
    "|pipeline_test.py --nprocs 4"
    "|failure_test.py --nprocs 2 --mode abort"
    "$GPU|emulated_gpu_test.py --nprocs 2"
    "$GPU|emulated_gpu_test.py --nprocs 2 --mode abort"
  )
else
  RUNS=(
    "|ops_test.py --nprocs 2"
    "$GPU|emulated_gpu_test.py --nprocs 2"
  )
fi
# Left out to keep CI under 40 minutes, clean when run by hand (stop 42): DDP and FSDP (their
# hooks take the Futures ops_test's async cases take), a dead rank (tools/tsan_check.sh's
# killed-rank cases), the 3-rank ops; under AddressSanitizer the abort, DDP and the pipeline.
failed=0
for entry in "${RUNS[@]}"; do
  envs=${entry%%|*} run=${entry#*|}
  start=$SECONDS
  log=$OUT/$(echo "$run" | tr ' -' '__').log
  rc=0
  # shellcheck disable=SC2086
  (cd "$ROOT/tests/torch" && env $envs PYTHONPATH="$OUT/python:." OMP_NUM_THREADS=1 \
    timeout 600 "$OUT/python3-san" $run >"$log" 2>&1) || rc=$?
  reports=$(grep -cE "$REPORT" "$log" || true)
  printf 'sanitize_torch (%s): %-40s exit %d, %d report(s), %d s\n' "$SAN" "$run" "$rc" \
    "$reports" $((SECONDS - start))
  if [ "$rc" != 0 ] || [ "$reports" != 0 ]; then
    grep -E "$REPORT|SUMMARY|Error|error" "$log" | head -40
    echo "sanitize_torch: the whole log is $log"
    failed=1
  fi
done
exit $failed
