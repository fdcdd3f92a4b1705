#!/usr/bin/env bash
# Makes gpu-bundle/ (ignored by git) for tools/gpu_check.sh on a GPU machine that lacks Loom's
# build dependencies (fmt, nlohmann-json, googletest, hwloc, pugixml): Loom built here for sm_90
# (Release, stripped), the binaries the check runs, and every shared library they load except the
# C library's own (libc, libm, libdl, libpthread, librt and the loader), which the GPU machine's
# must be as new as this machine's (glibc 2.36 on Debian 12). With the device tool:
#   tools/gpu_bundle.sh && run(command="tools/gpu_check.sh", carry=["gpu-bundle"])
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${BUILD_DIR:-$ROOT/build-gpu-bundle}
DEST=$ROOT/gpu-bundle
export PATH=/usr/local/cuda/bin:$PATH
command -v nvcc >/dev/null || { echo "gpu_bundle: nvcc is needed (the kernels for sm_90)"; exit 1; }
gen=""
command -v ninja >/dev/null && gen="-G Ninja"
launcher=""
command -v ccache >/dev/null && launcher="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache"
cmake -S "$ROOT" -B "$B" $gen $launcher -DCMAKE_BUILD_TYPE=Release -DLOOM_BUILD_TESTS=ON \
  -DLOOM_CUDA_ARCHS=90
cmake --build "$B" -j "$(nproc)" --target loom loom-perf loom-device-bw loom-topo \
  collectives_tests nccl_net_loom nccl_tuner_loom loom_stackdump
rm -rf "$DEST"
mkdir -p "$DEST/bin" "$DEST/lib" "$DEST/lib-fallback" "$DEST/include/loom"
# loom.h and a libloom.so link: loom_torch builds against the bundle there (LOOM_HOME=gpu-bundle).
cp "$ROOT/include/loom/loom.h" "$DEST/include/loom/"
bins=("$B/tools/perf/loom-perf" "$B/tools/perf/loom-device-bw" "$B/tools/topo/loom-topo"
  "$B/tests/collectives/collectives_tests")
libs=("$B/libloom.so.0" "$B/transports/ncclnet/plugin/libnccl-net-loom.so"
  "$B/transports/ncclnet/tuner/libnccl-tuner-loom.so"
  "$B/tests/tools/libloom-stackdump.so")
cp "${bins[@]}" "$DEST/bin/"
cp -L "${libs[@]}" "$DEST/lib/"
ln -sf libloom.so.0 "$DEST/lib/libloom.so"
# The libraries they load, but the C library's.
for f in "${bins[@]}" "${libs[@]}"; do
  ldd "$f" | awk '/=> \// {print $3}'
done | sort -u | grep -v -E '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' |
  while read -r lib; do
    # The C++ runtime goes aside: the GPU machine's own (newer, and used by its tools) is taken
    # unless ours is needed (tools/gpu_check.sh tries without it first).
    case "$(basename "$lib")" in
      libstdc++.so*|libgcc_s.so*) cp -L "$lib" "$DEST/lib-fallback/" ;;
      *) cp -L "$lib" "$DEST/lib/" ;;
    esac
  done
# hwloc's plugins and libibverbs' providers are loaded at run time: hwloc's GPU plugins are off
# in Loom, and the check needs no verbs provider.
strip --strip-unneeded "$DEST"/bin/* "$DEST"/lib/*.so* "$DEST"/lib-fallback/*.so* 2>/dev/null || true
echo "$(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet || echo +changes), $(date -u +%F)" \
  >"$DEST/BUILT"
grep -q '^/gpu-bundle/$' "$ROOT/.git/info/exclude" 2>/dev/null || echo /gpu-bundle/ >>"$ROOT/.git/info/exclude"
du -sh "$DEST"
ls "$DEST/lib" "$DEST/lib-fallback"
