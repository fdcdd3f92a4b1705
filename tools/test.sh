#!/usr/bin/env bash
# The whole test suite from nothing: installs dependencies, builds from scratch, runs every test.
#   tools/test.sh            # what CI runs
#   CTEST_ARGS="-R Socket" tools/test.sh   # a subset
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
"$ROOT/tools/install_deps.sh"
"$ROOT/tools/check_format.sh"
export BUILD_DIR=${BUILD_DIR:-$ROOT/build-test}
FRESH=1 "$ROOT/tools/build.sh" -DLOOM_BUILD_TESTS=ON -DLOOM_WERROR=ON
cd "$BUILD_DIR"
# Tests start their own ranks (threads, forked processes); keep them off each other's cores.
# A test that fails is run once more before it counts as failed: a few tests fork ranks from a
# multithreaded process and kill them, and a loaded 2-core machine can starve them past their
# deadlines. A real failure fails twice.
ctest --output-on-failure -j "$(nproc)" --timeout 600 --repeat until-pass:2 ${CTEST_ARGS:-}
