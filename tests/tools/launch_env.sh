#!/bin/sh
# Runs loom-perf as N separate processes started the way a launcher starts them, with only the
# launcher's environment to find each other, and checks every rank's exit status and the table.
#   launch_env.sh torchrun|ompi|slurm|mpirun N LOOM_PERF [loom-perf args...]
# mpirun: the real Open MPI launcher (skipped with exit 77 when mpirun is not installed).
set -u
mode=$1 n=$2 perf=$3
shift 3
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if [ "$mode" = mpirun ]; then
  if ! command -v mpirun >/dev/null 2>&1; then
    echo "SKIP: mpirun is not installed (apt-get install openmpi-bin)"
    exit 77
  fi
  timeout 120 mpirun --allow-run-as-root --oversubscribe -np "$n" -x LOOM_COMM_ID="127.0.0.1:$port" \
    "$perf" "$@" >"$out/all" 2>&1
  rc=$?
  cat "$out/all"
  [ $rc -eq 0 ] || { echo "FAIL: mpirun exited $rc"; exit 1; }
  grep -q "Out of bounds values : 0 OK" "$out/all" || { echo "FAIL: no clean footer"; exit 1; }
  echo "PASS: $n ranks under mpirun"
  exit 0
fi
pids=""
r=0
while [ $r -lt "$n" ]; do
  case "$mode" in
    torchrun)
      env MASTER_ADDR=127.0.0.1 MASTER_PORT=$((port - 1)) RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r \
        LOCAL_WORLD_SIZE=$n timeout 120 "$perf" "$@" >"$out/$r" 2>&1 &
      ;;
    ompi)
      env LOOM_COMM_ID=127.0.0.1:$port OMPI_COMM_WORLD_RANK=$r OMPI_COMM_WORLD_SIZE=$n \
        OMPI_COMM_WORLD_LOCAL_RANK=$r timeout 120 "$perf" "$@" >"$out/$r" 2>&1 &
      ;;
    slurm)
      env LOOM_COMM_ID=127.0.0.1:$port SLURM_PROCID=$r SLURM_NTASKS=$n SLURM_LOCALID=$r \
        SLURM_JOB_ID=4242 timeout 120 "$perf" "$@" >"$out/$r" 2>&1 &
      ;;
    *) echo "unknown mode $mode"; exit 2 ;;
  esac
  pids="$pids $!"
  r=$((r + 1))
done
fail=0
r=0
for p in $pids; do
  wait "$p" || { echo "FAIL: rank $r exited $?"; fail=1; }
  r=$((r + 1))
done
cat "$out/0"
for f in "$out"/*; do
  [ "$f" = "$out/0" ] || [ ! -s "$f" ] || { echo "--- ${f##*/}:"; cat "$f"; }
done
grep -q "Out of bounds values : 0 OK" "$out/0" || { echo "FAIL: rank 0 printed no clean footer"; fail=1; }
grep -q "Rank  $((n - 1)) Group" "$out/0" || { echo "FAIL: rank 0 does not list $n ranks"; fail=1; }
[ $fail -eq 0 ] && echo "PASS: $n ranks launched as $mode"
exit $fail
