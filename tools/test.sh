#!/usr/bin/env bash
# The whole test suite from nothing: installs dependencies, checks formatting, builds from scratch
# with gcc (warnings are errors) and runs every test; then builds again with AddressSanitizer and
# UndefinedBehaviorSanitizer (clang) and runs every test under them, and the PyTorch backend; then
# builds the transport, executor and failure tests with ThreadSanitizer (clang) and runs them, and
# the PyTorch backend under it. Each stage's start is logged with the minutes since the start.
#   tools/test.sh                          # what CI runs
#   SANITIZE=0 tools/test.sh               # skip every sanitizer stage
#   TSAN=0 tools/test.sh                   # skip the ThreadSanitizer stages
#   SAN_CC=gcc tools/test.sh               # the sanitizer builds with gcc too
#   CTEST_ARGS="-R Socket" tools/test.sh   # a subset
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
stage() { printf '== %s (at %d min %02d s)\n' "$1" $((SECONDS / 60)) $((SECONDS % 60)); }
stage "dependencies"
"$ROOT/tools/install_deps.sh"
"$ROOT/tools/check_format.sh"

# A test that fails is run once more before it counts as failed: a few tests fork ranks from a
# multithreaded process and kill them, and a loaded 2-core machine can starve them past their
# deadlines. A real failure fails twice.
run_ctest() {
  local dir=$1
  shift
  (cd "$dir" && ctest --output-on-failure -j "$(nproc)" --timeout 600 --repeat until-pass:2 "$@" ${CTEST_ARGS:-})
}

# Line tables only (-g1): enough for every backtrace and sanitizer report to name file and line,
# and it compiles about 40% faster than full debug information.
# The fuzz targets run 5 s each here: without the sanitizers a memory error they cause goes
# unseen unless it crashes, and the AddressSanitizer stage below runs each for its full time (20 s,
# or 10).
stage "build (warnings are errors)"
BUILD_DIR=${BUILD_DIR:-$ROOT/build-test} FRESH=1 OPT="-O2 -g1" "$ROOT/tools/build.sh" \
  -DLOOM_BUILD_TESTS=ON -DLOOM_WERROR=ON -DLOOM_BUILD_BENCH=ON -DLOOM_FUZZ_SECONDS=5
stage "every test"
run_ctest "${BUILD_DIR:-$ROOT/build-test}"

# loom_torch installed as a user installs it (one pip install from the repository, against this
# build's libloom), then imported from outside the repository: "loom" is a torch backend.
if python3 -c "import torch" 2>/dev/null; then
  stage "pip install src/torch (loom_torch)"
  LOOM_HOME=${BUILD_DIR:-$ROOT/build-test} python3 -m pip install -q --no-build-isolation \
    "$ROOT/src/torch"
  (cd / && python3 -c "import loom_torch, torch.distributed as d; \
assert 'loom' in d.Backend.backend_list, d.Backend.backend_list; \
print('loom_torch', loom_torch.loom_version(), 'registered as', loom_torch.BACKEND)")
fi

if [ "${SANITIZE:-1}" != 0 ]; then
  # The sanitizer builds use clang where it is installed (tools/install_deps.sh installs it, with
  # its sanitizer runtimes and llvm-symbolizer for the reports' file and line): it compiles them in
  # about half of gcc's time. The first stage built with gcc; SAN_CC=gcc keeps gcc here too.
  if [ "${SAN_CC:-clang}" = clang ] && command -v clang++ >/dev/null; then
    export CC=clang CXX=clang++
  fi
  stage "build with AddressSanitizer + UndefinedBehaviorSanitizer (${CXX:-c++})"
  # loom_torch is not built here (tools/sanitize_torch.sh builds it after the tests). -O1 -g1,
  # as the sanitizers' authors advise: it compiles in half the time of -O2 -g under them (and
  # warnings, checked in the first stage, are not errors). No device kernels (nvcc: 30 s of one
  # core): the emulated GPU runs their host build, as in the ThreadSanitizer stage.
  BUILD_DIR=$ROOT/build-test-asan FRESH=1 OPT="-O1 -g1" "$ROOT/tools/build.sh" \
    -DLOOM_BUILD_TESTS=ON -DLOOM_SANITIZE=address,undefined -DLOOM_BUILD_TORCH=OFF \
    -DLOOM_WITH_CUDA=OFF
  stage "every test under AddressSanitizer + UndefinedBehaviorSanitizer"
  export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
  export ASAN_OPTIONS=detect_leaks=1
  # The generators' proofs over every layout ran in the first stage; under the sanitizers (about
  # 5x slower) the layout tests check three layouts per rank count instead of ten, and past 16
  # ranks the proofs take five of each shard's 16 rank counts (tests/algorithms/shards.h).
  export LOOMTEST_QUICK=1
  # Collective variants whose paths other tests already run under the sanitizers ran in the first
  # stage only, to keep CI under 40 minutes (about 3.5 of this stage's 13):
  # - the eager shm paths, sockets, and registration over sockets, the emulated IB device and the
  #   plugin (the adaptor runs in NetPlugin.*, ib_tests_plugin_gpu and
  #   tools.perf.device.gdr_plugin.np2);
  # - the collective matrix over the emulated IB device (its transport's code runs here in
  #   ib_tests, NetPlugin.EmulatedIb.* and the transports' conformance suite, and the matrix over
  #   it in the first stage and under ThreadSanitizer);
  # - the collective matrix over an imported NCCL plugin;
  # - device buffers staged through host memory (DeviceCalls.* run them) and over GPUDirect RDMA,
  #   over the emulated IB device and through the plugin (DeviceCalls.GpuDirect* and
  #   tools.perf.device.gdr.np3 run them);
  # - loom-perf at 5 ranks (the same code as at 3, which stays), with local registration, and its
  #   first-failure report;
  # - the generators' proofs at 33 to 64 ranks (the same code as at 1 to 32, which stays, on
  #   bigger tables: 3 of the 4 minutes the proofs take here) and the 5-rank soak (3 ranks stay);
  # - the install test, which builds a program without the sanitizers against the sanitized
  #   libloom.so, which cannot load.
  # The single-copy and mapped shm paths (up to 4 ranks here) and device buffers on streams (the
  # one pass over the peers' device buffers; 2 and 3 ranks here) stay
  # (tests/collectives/CMakeLists.txt).
  run_ctest "$ROOT/build-test-asan" -E \
    '^(collectives_shm_direct_eager|collectives_shm_ring_eager|collectives_sockets|collectives_sockets_registered|collectives_ncclnet_plugin|collectives_ncclnet_plugin_registered|collectives_device|collectives_device_stream_sockets|collectives_device_ib_gdr|collectives_device_plugin_gdr|collectives_ib_emulated|collectives_ib_emulated_registered|install\..*|tools\.perf\.local_register\..*|tools\.perf\.[a-z_]+\.np5|tools\.perf\.first_failure\..*|Registered/.*_n(33to48|49to64) .*|Ranks/SoakProcesses\..*/5ranks .*)$'
  # loom_torch under the same sanitizers, in a python3 linked with them (tools/sanitize_torch.sh):
  # every operation, CUDA tensors on the emulated GPU; 0.5 to 1.5 minutes (ccache warm or not).
  stage "AddressSanitizer + UndefinedBehaviorSanitizer: loom_torch"
  BUILD_DIR=$ROOT/build-test-asan "$ROOT/tools/sanitize_torch.sh" address

  if [ "${TSAN:-1}" != 0 ]; then
    # ThreadSanitizer over the transports, the bootstrap, the executor and the failure paths, ranks
    # as threads of one process (tools/tsan_check.sh says what runs), by the same compiler as the
    # stage above, two runs at a time: about 5 minutes with the build.
    stage "ThreadSanitizer: transports, bootstrap, executor, failures (${CXX:-c++})"
    BUILD_DIR=$ROOT/build-test-tsan FRESH=1 "$ROOT/tools/tsan_check.sh"
    # And over loom_torch with libloom (its worker thread, Works and Futures, a pipeline, abort,
    # CUDA tensors on the emulated GPU), in a python3 linked with the sanitizer
    # (tools/sanitize_torch.sh): 1 to 2 minutes (ccache warm or not).
    stage "ThreadSanitizer: loom_torch (${CXX:-c++})"
    BUILD_DIR=$ROOT/build-test-tsan "$ROOT/tools/sanitize_torch.sh" thread
  fi
fi
stage "done"
