#!/usr/bin/env bash
# Installs dependencies, builds Loom and runs the main job: loom-perf all_reduce over 4 local ranks
# that loom-perf spawns itself (no MPI, no setup). Extra arguments go to loom-perf.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
"$ROOT/tools/install_deps.sh"
export BUILD_DIR=${BUILD_DIR:-$ROOT/build}
"$ROOT/tools/build.sh" -DLOOM_BUILD_TESTS=OFF
if [ $# -eq 0 ]; then set -- -b 8 -e 64M -f 2 -c 1; fi
exec "$BUILD_DIR/tools/perf/loom-perf" all_reduce -np 4 "$@"
