#!/bin/sh
# cmake --install of a build tree into a fresh prefix, then what a user outside the tree does with
# it: a CMake project with find_package(Loom), a compiler line with pkg-config, the installed
# tools run from the prefix (their run paths find the installed libloom.so, not the build tree's).
# Usage: install_test.sh BUILD_DIR SOURCE_DIR
set -eu
build=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "install_test: $*" >&2; exit 1; }
# Whether program $1 loads the installed libloom.so (whatever path ldd shows it by).
loads_installed() {
  loaded=$(ldd "$1" | awk '/libloom\.so/ {print $3}')
  [ -n "$loaded" ] && [ "$(readlink -f "$loaded")" = "$(readlink -f "$tmp/prefix/lib/libloom.so")" ]
}

cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log" || {
  cat "$tmp/install.log"; fail "cmake --install failed"; }
for f in include/loom/loom.h lib/libloom.so lib/libnccl-net-loom.so lib/libnccl-tuner-loom.so \
         lib/pkgconfig/loom.pc lib/cmake/Loom/LoomConfig.cmake lib/cmake/Loom/LoomConfigVersion.cmake \
         bin/loom-perf bin/loom-topo bin/loom-sim bin/all_reduce_perf; do
  [ -e "$tmp/prefix/$f" ] || fail "not installed: $f"
done

# find_package(Loom)
cmake -S "$src/tests/install/consumer" -B "$tmp/cmake-build" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  > "$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; fail "find_package(Loom) failed"; }
cmake --build "$tmp/cmake-build" > "$tmp/build.log" 2>&1 || {
  cat "$tmp/build.log"; fail "the find_package(Loom) project did not build"; }
"$tmp/cmake-build/consumer" || fail "the find_package(Loom) program failed"
loads_installed "$tmp/cmake-build/consumer" ||
  fail "the find_package(Loom) program does not load the installed libloom.so: $(ldd "$tmp/cmake-build/consumer" | grep loom)"

# pkg-config
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig"
flags=$(pkg-config --cflags --libs loom) || fail "pkg-config --cflags --libs loom failed"
cc -o "$tmp/pc-consumer" "$src/tests/install/consumer/consumer.c" $flags -lpthread \
  -Wl,-rpath,"$tmp/prefix/lib" || fail "cc with pkg-config's flags failed ($flags)"
"$tmp/pc-consumer" || fail "the pkg-config program failed"

# The installed tools, with their run paths.
for t in loom-perf loom-topo loom-sim; do
  ldd "$tmp/prefix/bin/$t" | grep -q "not found" && fail "$t: $(ldd "$tmp/prefix/bin/$t" | grep 'not found')"
done
loads_installed "$tmp/prefix/bin/loom-perf" ||
  fail "the installed loom-perf does not load the installed libloom.so: $(ldd "$tmp/prefix/bin/loom-perf" | grep loom)"
"$tmp/prefix/bin/all_reduce_perf" -b 8 -e 4K -f 8 -n 2 -w 1 -c 1 > "$tmp/perf.log" 2>&1 ||
  { cat "$tmp/perf.log"; fail "the installed all_reduce_perf failed"; }
grep -q "Out of bounds values : 0 OK" "$tmp/perf.log" || { cat "$tmp/perf.log"; fail "wrong values"; }
"$tmp/prefix/bin/loom-topo" > /dev/null 2>&1 || fail "the installed loom-topo failed"
"$tmp/prefix/bin/loom-sim" all_reduce --topo dgx-h100 --nodes 2 -b 1M -e 1M > /dev/null 2>&1 ||
  fail "the installed loom-sim failed"
echo "install_test: find_package(Loom), pkg-config and the installed tools work"
