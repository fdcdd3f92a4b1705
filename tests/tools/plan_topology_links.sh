#!/bin/sh
# The device plan prices the one pass between two GPUs with the links the host's topology gives
# them: two emulated GPUs, planned without a topology file (the measured peer speed) and with one
# that puts them behind a PCIe 1.0 x1 switch. The second one-pass price must be the slow link's,
# the plan must stage there, and the ranks must stage too (they agree in the one pass's first round).
# On the measured links the one pass must run unless a rank priced staging lower (the emulated
# GPU's speeds are the host's, and move with the machine's load: no margin is safe there).
#   plan_topology_links.sh LOOM_PERF TOPOLOGY_XML   (LOOM_CUDA_LIB: the emulated device)
set -eu
perf=$1
xml=$2
plan() {
  "$perf" all_reduce -np 2 --mem device --plan -b 16M -e 16M | grep '^ *16777216 '
}
ran() {
  LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=SHM "$perf" all_reduce -np 2 --mem device -b 16M -e 16M \
    -n 1 -w 0 2>&1
}
a=$(LOOMTEST_FAKECUDA_DEVICES=2 plan)
b=$(LOOMTEST_FAKECUDA_DEVICES=2 LOOM_TOPO_FILE=$xml plan)
pa=$(echo "$a" | sed -n 's/.* one-pass \([0-9.]*\) .*/\1/p')
pb=$(echo "$b" | sed -n 's/.* one-pass \([0-9.]*\) .*/\1/p')
echo "one pass of 16 MiB on two GPUs: ${pa:-?} us measured links, ${pb:-?} us with $xml"
echo "plans: $a"
echo "       $b"
# The slow link bounds the price (16 MiB over PCIe 1.0 x1 takes more than 50 ms), never lowers it.
# (Not a ratio to the measured links: the emulated GPU's speeds are the host's, and under the
# sanitizers they fall to a few GB/s.)
[ -n "$pa" ] && [ -n "$pb" ] && awk -v a="$pa" -v b="$pb" 'BEGIN { exit !(a > 0 && b >= a && b > 50000) }'
echo "$b" | grep -q ' device-one-pass ' && { echo "FAIL: slow links: the one pass"; exit 1; }
ra=$(LOOMTEST_FAKECUDA_DEVICES=2 ran)
rb=$(LOOMTEST_FAKECUDA_DEVICES=2 LOOM_TOPO_FILE=$xml ran)
n1=$(echo "$ra" | grep -c "ran in one pass over the peers' device buffers" || true)
n2=$(echo "$rb" | grep -c "ran in one pass over the peers' device buffers" || true)
n3=$(echo "$rb" | grep -c "staging priced lower than the one pass" || true)
n4=$(echo "$ra" | grep -c "staging priced lower than the one pass" || true)
echo "runs: one pass logged $n1 times on the measured links ($n4 times staging priced lower), $n2 with $xml ($n3 times staging priced lower)"
echo "$ra" | grep -q "Out of bounds values : 0 OK" || { echo "FAIL: wrong values"; echo "$ra"; exit 1; }
echo "$rb" | grep -q "Out of bounds values : 0 OK" || { echo "FAIL: wrong values"; echo "$rb"; exit 1; }
{ [ "$n1" -gt 0 ] || [ "$n4" -gt 0 ]; } && [ "$n2" -eq 0 ] && [ "$n3" -gt 0 ]
