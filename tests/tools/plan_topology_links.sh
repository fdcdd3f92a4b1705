#!/bin/sh
# The device plan prices the one pass between two GPUs with the links the host's topology gives
# them: two emulated GPUs, planned without a topology file (the measured peer speed) and with one
# that puts them behind a PCIe 1.0 x1 switch; the second one-pass price must be far higher.
#   plan_topology_links.sh LOOM_PERF TOPOLOGY_XML   (LOOM_CUDA_LIB: the emulated device)
set -eu
perf=$1
xml=$2
price() {
  "$perf" all_reduce -np 2 --mem device --plan -b 16M -e 16M |
    sed -n 's/.* one-pass \([0-9.]*\) .*/\1/p'
}
a=$(LOOMTEST_FAKECUDA_DEVICES=2 price)
b=$(LOOMTEST_FAKECUDA_DEVICES=2 LOOM_TOPO_FILE=$xml price)
echo "one pass of 16 MiB on two GPUs: ${a:-?} us measured links, ${b:-?} us with $xml"
[ -n "$a" ] && [ -n "$b" ] && awk -v a="$a" -v b="$b" 'BEGIN { exit !(a > 0 && b > 10 * a) }'
