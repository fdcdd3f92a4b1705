#!/usr/bin/env bash
# Configures and builds Loom in BUILD_DIR (default build/). Extra arguments go to cmake.
# FRESH=1 removes the build directory first (a build from scratch). Where ccache is installed it
# keeps compiled objects between builds, and between clones at one path (CCACHE_BASEDIR makes its
# keys relative to the clone); LOOM_CCACHE=0 compiles everything.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
if [ "${FRESH:-0}" = 1 ]; then rm -rf "$BUILD_DIR"; fi
launcher=()
if [ "${LOOM_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null; then
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT}
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} "${launcher[@]}" "$@"
cmake --build "$BUILD_DIR" -j "$(nproc)"
