#!/bin/sh
# The ranks loom-perf -np spawns carry the program's name (ps -e, top and pgrep show the process
# name, which an exec of /proc/self/exe would make "exe"): while a 2-rank run is going, pgrep finds
# three processes of that name (the launcher and both ranks), and none named exe under it.
# Usage: rank_names_test.sh LOOM_PERF
set -u
perf=$1
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$perf" all_reduce -np 2 -b 8 -e 8 -n 2000000 -w 0 > "$out" 2>&1 &
launcher=$!
# Rank 0 prints the table's header once both ranks have joined: both are past their start then
# (a forked child keeps its parent's name until it execs, so looking earlier would prove nothing).
i=0
while [ $i -lt 300 ] && ! grep -q "#  Rank  1 " "$out"; do
  sleep 0.1
  i=$((i + 1))
done
found=$(pgrep -x -P "$launcher" loom-perf | wc -l)
exes=$(pgrep -x -P "$launcher" exe | wc -l)
kill "$launcher" 2> /dev/null
wait "$launcher" 2> /dev/null
if [ "$found" -lt 2 ] || [ "$exes" -ne 0 ]; then
  echo "rank_names_test: children of the launcher named loom-perf: $found, named exe: $exes"
  exit 1
fi
echo "rank_names_test: both ranks are named loom-perf"
