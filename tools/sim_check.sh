#!/usr/bin/env bash
# loom-sim against loom-perf on emulated hosts: the same collectives run (loom-perf over
# tools/emuhosts.sh with shaped links) and predicted (loom-sim's cpu-host machine, fed with the
# rates the runtime measured at init and the link rate), size by size, with the error of each
# prediction. The runtime's planner is told the shaped rate (LOOM_MODEL_NET_MBPS), so that it and
# loom-sim price the same machine; both then choose with the same model.
#
#   tools/sim_check.sh [-H HOSTS] [-R RANKS] [-r MBIT] [-c COLL,...] [-b MIN] [-e MAX] [-n ITERS]
#                      [-o DIR]
# Defaults: 2 hosts of 2 ranks, links shaped to 1000 Mbit/s, all_reduce,all_gather,broadcast,
# 1M to 64M, 5 iterations, output kept in a temporary directory. Needs root (network namespaces),
# tc and python3; exits 77 without them. Prints a table per collective and a summary line:
#   sim_check: COLL sizes >= 1 MiB: N within 15% of M, mean |error| X%, worst Y% at SIZE
# The script reports; it does not pass or fail on accuracy (these machines are shared and noisy).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD_DIR:-$ROOT/build}
HOSTS=2 RANKS=2 MBIT=1000 COLLS=all_reduce,all_gather,broadcast MIN=1M MAX=64M ITERS=5 OUT=""
while getopts "H:R:r:c:b:e:n:o:h" opt; do
  case $opt in
    H) HOSTS=$OPTARG ;;
    R) RANKS=$OPTARG ;;
    r) MBIT=$OPTARG ;;
    c) COLLS=$OPTARG ;;
    b) MIN=$OPTARG ;;
    e) MAX=$OPTARG ;;
    n) ITERS=$OPTARG ;;
    o) OUT=$OPTARG ;;
    *) sed -n '2,16p' "$0"; exit 2 ;;
  esac
done
perf=$BUILD/tools/perf/loom-perf
sim=$BUILD/tools/sim/loom-sim
for b in "$perf" "$sim"; do
  [ -x "$b" ] || { echo "sim_check: $b is not built (BUILD_DIR=$BUILD)"; exit 2; }
done
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
  echo "sim_check: needs root, ip and tc (network namespaces and shaping): skipped"
  exit 77
fi
[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/sim_check.XXXXXX)
mkdir -p "$OUT"
# Each host gets its share of the CPUs (emuhosts -C) when there is at least one per host; with more
# hosts than CPUs they all share them, and the model is told one core per host (it knows no
# fractions: expect the prediction to be optimistic there).
cores=$(( $(nproc) / HOSTS ))
pin=-C
if [ "$cores" -lt 1 ]; then
  cores=1
  pin=""
  echo "sim_check: $HOSTS hosts on $(nproc) CPUs: hosts share the CPUs; the model assumes one each"
fi
status=0
IFS=, read -r -a colls <<<"$COLLS"
for coll in "${colls[@]}"; do
  dir=$OUT/$coll
  rm -rf "$dir"
  mkdir -p "$dir"
  echo "== $coll: loom-perf on $HOSTS hosts x $RANKS ranks, links ${MBIT}mbit, $cores core(s) per host"
  if ! LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=PLAN LOOM_MODEL_NET_MBPS=$MBIT \
      "$ROOT/tools/emuhosts.sh" -H "$HOSTS" -R "$RANKS" -b "${MBIT}mbit" $pin -q -o "$dir" -- \
      "$perf" "$coll" -b "$MIN" -e "$MAX" -f 2 -c 0 -n "$ITERS" -w 2 -a 3 -J "$dir/perf.json" \
      >"$dir/emuhosts.out" 2>&1; then
    echo "sim_check: loom-perf failed; see $dir"
    tail -20 "$dir/emuhosts.out"
    status=1
    continue
  fi
  # The rates rank 0's planner priced with (the runtime's model line).
  line=$(grep -h "cost model: shared memory" "$dir/rank0.log" | head -1 || true)
  if [ -z "$line" ]; then
    echo "sim_check: no 'cost model' line in $dir/rank0.log"
    status=1
    continue
  fi
  read -r memcpy shmus netus reduce < <(python3 - "$line" <<'PY'
import re, sys
l = sys.argv[1]
m = re.search(r"shared memory ([0-9.]+) GB/s, ([0-9.]+) us; network [0-9.]+ GB/s, ([0-9.]+) us; reduce ([0-9.]+) GB/s", l)
print(*m.groups())
PY
)
  "$sim" "$coll" --topo cpu-host --gpus "$RANKS" --nodes "$HOSTS" --cores "$cores" \
    --memcpy-gbps "$memcpy" --reduce-gbps "$reduce" --nic-gbps "$(python3 -c "print($MBIT/1000)")" \
    --loom-intra-us "$shmus" --loom-inter-us "$netus" --tiers 1 --hop-latency 0 \
    -b "$MIN" -e "$MAX" -f 2 --algo auto -J "$dir/sim.json" >"$dir/sim.out"
  python3 - "$coll" "$dir/perf.json" "$dir/sim.json" <<'PY'
import json, sys
coll, perfPath, simPath = sys.argv[1:4]
perf = {r["size"]: r["out_of_place"]["time_us"] for r in json.load(open(perfPath))["results"]}
sim = {r["size"]: (r["out_of_place"]["time_us"], r["algorithm"]) for r in json.load(open(simPath))["results"]
       if r["block"] == "auto" and r["out_of_place"]}
print("%12s %12s %12s %8s  %s" % ("size", "measured_us", "predicted_us", "error", "predicted algorithm"))
errs = []
for size in sorted(perf):
    if size not in sim:
        continue
    m, (p, algo) = perf[size], sim[size]
    e = (p - m) / m
    print("%12d %12.1f %12.1f %7.1f%%  %s" % (size, m, p, 100 * e, algo))
    if size >= 1 << 20:
        errs.append((abs(e), size))
if errs:
    within = sum(1 for e, _ in errs if e <= 0.15)
    worst = max(errs)
    print("sim_check: %s sizes >= 1 MiB: %d within 15%% of %d, mean |error| %.1f%%, worst %.1f%% at %d"
          % (coll, within, len(errs), 100 * sum(e for e, _ in errs) / len(errs), 100 * worst[0], worst[1]))
PY
done
echo "sim_check: output in $OUT"
exit $status
