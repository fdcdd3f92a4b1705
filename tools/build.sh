#!/usr/bin/env bash
# Configures and builds Loom in BUILD_DIR (default build/). Extra arguments go to cmake.
# FRESH=1 removes the build directory first (a build from scratch).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
if [ "${FRESH:-0}" = 1 ]; then rm -rf "$BUILD_DIR"; fi
cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} "$@"
cmake --build "$BUILD_DIR" -j "$(nproc)"
