#!/bin/sh
# loom-tune end to end: measures all_reduce algorithms on 3 local ranks, writes a tuning file, and
# checks that loom-perf --plan takes its choices from it, and ignores it (with a warning) on a
# communicator of another layout.
#   tune_test.sh LOOM_TUNE LOOM_PERF
set -u
tune=$1 perf=$2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
python3 "$tune" --perf "$perf" -np 3 -c all_reduce -b 256K -e 1M -f 4 -n 2 -w 1 \
  -o "$out/t.json" >"$out/tune.log" 2>&1 || { cat "$out/tune.log"; fail "loom-tune exited $?"; }
cat "$out/tune.log"
python3 - "$out/t.json" <<'PY' || fail "tuning file content"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["loom_tuning"] == 1, d
assert d["layout"] == {"nranks": 3, "ranks_per_host": [3]}, d["layout"]
e = d["entries"]
assert e and all(x["collective"] == "allreduce" for x in e), e
assert e[0]["min_bytes"] == 0 and e[-1]["max_bytes"] == 1048576, e
for a, b in zip(e, e[1:]):
    assert b["min_bytes"] == a["max_bytes"] + 1 and a["algorithm"] != b["algorithm"], e
print("tuning file ok:", [(x["min_bytes"], x["max_bytes"], x["algorithm"]) for x in e])
PY
LOOM_TUNING_FILE="$out/t.json" "$perf" all_reduce -np 3 -b 256K -e 1M -f 4 --plan >"$out/plan.log" 2>&1 \
  || { cat "$out/plan.log"; fail "loom-perf --plan with the tuning file"; }
cat "$out/plan.log"
# Table rows: size count type root path algorithm source predicted candidates...
rows() { grep -E '^ +[0-9]+ +[0-9]+ ' "$1" | awk '{print $7}'; }
n=$(rows "$out/plan.log" | grep -c '^tuning$')
[ "$n" -eq 2 ] || fail "expected 2 sizes decided by the tuning file, got $n"
LOOM_TUNING_FILE="$out/t.json" "$perf" all_reduce -np 2 -b 256K -e 256K --plan >"$out/other.log" 2>&1 \
  || { cat "$out/other.log"; fail "loom-perf --plan on 2 ranks"; }
grep -q "measured on 3 ranks, ranks per host 3, not on this communicator's 2 ranks.*ignored" \
  "$out/other.log" || { cat "$out/other.log"; fail "no warning for the other layout"; }
rows "$out/other.log" | grep -q '^tuning$' && fail "a tuning file for another layout was used"
[ "$(rows "$out/other.log" | grep -c '^model$')" -eq 1 ] || fail "no row decided by the model"
echo "PASS"
