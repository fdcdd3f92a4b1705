#!/usr/bin/env bash
# Configures and builds Loom in BUILD_DIR (default build/). Extra arguments go to cmake.
# FRESH=1 removes the build directory first (a build from scratch). Where ccache is installed it
# keeps compiled objects between builds, and between clones at one path (CCACHE_BASEDIR makes its
# keys relative to the clone); LOOM_CCACHE=0 compiles everything. OPT="-O1 -g1" sets the
# optimization and debug flags of the (RelWithDebInfo) build; TARGETS="a b" builds only those.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
if [ "${FRESH:-0}" = 1 ]; then rm -rf "$BUILD_DIR"; fi
launcher=()
if [ "${LOOM_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null; then
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT}
  # The precompiled headers (LOOM_PCH) are cached too: ccache then needs these.
  export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:+$CCACHE_SLOPPINESS,}pch_defines,time_macros,include_file_mtime,include_file_ctime
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
flags=()
if [ -n "${OPT:-}" ]; then
  flags=(-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$OPT -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="$OPT -DNDEBUG")
fi
# Ninja where it is installed (tools/install_deps.sh installs it): it schedules the whole tree's
# compiles at once and starts faster than make. A build directory keeps the generator it was made
# with; CMAKE_GENERATOR chooses another for a new one.
if [ -z "${CMAKE_GENERATOR:-}" ] && [ ! -f "$BUILD_DIR/CMakeCache.txt" ] && command -v ninja >/dev/null; then
  export CMAKE_GENERATOR=Ninja
fi
cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} "${launcher[@]}" \
  "${flags[@]}" "$@"
# shellcheck disable=SC2086
cmake --build "$BUILD_DIR" -j "$(nproc)" ${TARGETS:+--target $TARGETS}
