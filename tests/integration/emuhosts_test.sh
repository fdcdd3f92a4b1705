#!/usr/bin/env bash
# Integration tests of tools/emuhosts.sh: loom-perf over emulated hosts (network namespaces
# joined by a bridge), checked for correct results, for the transport each pair of ranks uses
# (shared memory inside a host, sockets between hosts), and for a teardown that leaves nothing.
#   emuhosts_test.sh EMUHOSTS LOOM_PERF CASE [ARGS...]
# Cases:
#   coll COLL      2 hosts x 2 ranks, COLL with -c 1, transports checked from LOOM_DEBUG=INFO
#   uneven         3 ranks on host 0, 1 on host 1
#   shaped         links shaped to 200mbit with tbf (in place on every host), still correct
#   torchrun       ranks from torchrun's variables instead of Open MPI's
#   rank_fails     one rank exits 3: non-zero exit, the rank named, the others stopped
#   signal SIG     the script killed with SIG (INT, TERM) mid-run removes everything
#   clean          a run killed with SIGKILL leaves namespaces; --clean removes them
# Exits 77 (skipped) without root, `ip netns` or tc.
set -u
emu=$1 perf=$2 case=$3
shift 3

skip() {
  echo "SKIP: $*"
  exit 77
}
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces, veths, a bridge)"
command -v ip >/dev/null 2>&1 || skip "ip is not installed (iproute2)"
command -v tc >/dev/null 2>&1 || skip "tc is not installed (iproute2)"
probe="loomemuprobe-$$"
ip netns add "$probe" >/dev/null 2>&1 || skip "'ip netns add' does not work here"
ip netns del "$probe"

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail=0
bad() {
  echo "FAIL: $*"
  fail=1
}

# run_emu ARGS...: runs emuhosts.sh in the background (so that its pid, which names its
# namespaces, is known), waits for it; sets emu_rc and emu_pid; its output is in $out/emu.
run_emu() {
  bash "$emu" "$@" >"$out/emu" 2>&1 &
  emu_pid=$!
  wait "$emu_pid"
  emu_rc=$?
  cat "$out/emu"
}

# Whether process $1 still runs (a zombie waiting for its parent to reap it does not).
running() {
  local state
  state=$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$1/status" 2>/dev/null)
  [ -n "$state" ] && [ "$state" != Z ]
}

# check_stopped PID...: each process is gone within 5 s.
check_stopped() {
  local p i
  for p in "$@"; do
    for ((i = 0; i < 50; i++)); do
      running "$p" || break
      sleep 0.1
    done
    ! running "$p" || bad "process $p survived"
  done
}

namespaces_of() { ip netns list | awk '{print $1}' | grep "^loomemu-$1-"; }

# Nothing of run $1 is left: no namespace (hence no veth, bridge or qdisc: they lived in them).
check_gone() {
  local left
  left=$(namespaces_of "$1")
  [ -z "$left" ] || bad "namespaces left behind: $left"
}

# check_transports HOST_OF_RANK...: reads $out/logs/rank*.log (LOOM_DEBUG=INFO, subsystems
# INIT,NET,SHM,TOPO) and checks that each rank shares memory with the ranks of its host and
# opens sockets only to ranks of other hosts, and that sockets were used at all.
check_transports() {
  local -a host_of=("$@")
  local n=${#host_of[@]} r p addr peer local_n sockets=0
  declare -A listener_rank
  for ((r = 0; r < n; r++)); do
    addr=$(sed -n 's/.*socket transport: listening on emu0 \([0-9.]*:[0-9]*\).*/\1/p' \
      "$out/logs/rank$r.log" | head -n 1)
    [ -n "$addr" ] || { bad "rank $r logged no socket listener"; continue; }
    listener_rank[$addr]=$r
  done
  for ((r = 0; r < n; r++)); do
    local log="$out/logs/rank$r.log"
    local_n=0
    for ((p = 0; p < n; p++)); do [ "${host_of[p]}" != "${host_of[r]}" ] || local_n=$((local_n + 1)); done
    if [ "$local_n" -gt 1 ]; then
      grep -q "ready: $local_n ranks on this host (shared memory)" "$log" ||
        bad "rank $r does not use shared memory with its $local_n local ranks"
      grep -q "shared memory with $local_n local ranks" "$log" ||
        bad "rank $r set up no shared memory for $local_n local ranks"
    else
      grep -q "ready: 1 ranks on this host" "$log" || bad "rank $r is not alone on its host"
    fi
    # Each socket this rank opened: to which rank (by the listener's address), on which host.
    # shellcheck disable=SC2013  # addresses have no spaces
    for addr in $(sed -n 's/.*socket transport: connected to \([0-9.]*:[0-9]*\) .*/\1/p' "$log"); do
      peer=${listener_rank[$addr]:-}
      if [ -z "$peer" ]; then
        bad "rank $r connected to $addr, which is no rank's listener"
      elif [ "${host_of[peer]}" = "${host_of[r]}" ]; then
        bad "rank $r used a socket to rank $peer on its own host (expected shared memory)"
      else
        echo "rank $r (host ${host_of[r]}) -> rank $peer (host ${host_of[peer]}): socket"
        sockets=$((sockets + 1))
      fi
    done
  done
  [ $sockets -gt 0 ] || bad "no rank opened a socket to another host"
}

# check_perf NRANKS: rank 0's table is complete and every value checked out.
check_perf() {
  grep -q "Out of bounds values : 0 OK" "$out/logs/rank0.log" || bad "rank 0 printed no clean footer"
  grep -q "Rank  $(($1 - 1)) Group" "$out/logs/rank0.log" || bad "rank 0 does not list $1 ranks"
}

debug=(env LOOM_DEBUG=INFO "LOOM_DEBUG_SUBSYS=INIT,NET,SHM,TOPO")
sizes=(-b 8 -e 4M -f 8 -c 1 -n 2 -w 1 -T 60)
case "$case" in
  coll)
    run_emu -H 2 -R 2 -t 90 -o "$out/logs" -- "${debug[@]}" "$perf" "$1" "${sizes[@]}"
    [ "$emu_rc" = 0 ] || bad "emuhosts.sh exited $emu_rc"
    check_perf 4
    grep -q "4 ranks on 2 host(s) (ranks per host: 2,2)" "$out/logs/rank0.log" ||
      bad "rank 0 did not see 2 hosts of 2 ranks"
    check_transports 0 0 1 1
    check_gone "$emu_pid"
    ;;
  uneven)
    run_emu -R 3,1 -t 90 -o "$out/logs" -- "${debug[@]}" "$perf" all_reduce "${sizes[@]}"
    [ "$emu_rc" = 0 ] || bad "emuhosts.sh exited $emu_rc"
    check_perf 4
    grep -q "4 ranks on 2 host(s) (ranks per host: 3,1)" "$out/logs/rank0.log" ||
      bad "rank 0 did not see hosts of 3 and 1 ranks"
    check_transports 0 0 0 1
    check_gone "$emu_pid"
    ;;
  cpus)
    # -C: each host's ranks see only that host's share of the CPUs (one each on 2 CPUs).
    ncpu=$(nproc)
    [ "$ncpu" -ge 2 ] || skip "-C needs 2 CPUs for 2 hosts; this machine has $ncpu"
    run_emu -C -H 2 -R 1 -o "$out/cpus" -- sh -c 'taskset -pc $$'
    [ "$emu_rc" = 0 ] || bad "emuhosts.sh exited $emu_rc"
    for r in 0 1; do
      list=$(sed 's/.*: //' "$out/cpus/rank$r.log")
      [ -n "$list" ] || bad "rank $r printed no CPU list"
      [ "$(echo "$list" | tr ',' '\n' | wc -l)" -le $((ncpu / 2)) ] ||
        bad "rank $r may run on $list: more than its host's share of $ncpu CPUs"
    done
    [ "$(sed 's/.*: //' "$out/cpus/rank0.log")" != "$(sed 's/.*: //' "$out/cpus/rank1.log")" ] ||
      bad "both hosts got the same CPUs"
    check_gone "$emu_pid"
    ;;
  shaped)
    # The qdiscs are in place (seen from inside each host), then a correct run through them.
    run_emu -H 2 -R 1 -b 200mbit -o "$out/tc" -- tc qdisc show dev emu0
    [ "$emu_rc" = 0 ] || bad "emuhosts.sh exited $emu_rc"
    for r in 0 1; do
      grep -q "tbf .*rate 200Mbit" "$out/tc/rank$r.log" || bad "no tbf at 200Mbit on host $r's link"
    done
    check_gone "$emu_pid"
    run_emu -H 2 -R 2 -b 200mbit -t 90 -o "$out/logs" -- "${debug[@]}" "$perf" all_reduce \
      "${sizes[@]}"
    [ "$emu_rc" = 0 ] || bad "emuhosts.sh exited $emu_rc"
    grep -q "links shaped to 200mbit" "$out/emu" || bad "the run does not say it is shaped"
    check_perf 4
    check_transports 0 0 1 1
    check_gone "$emu_pid"
    ;;
  torchrun)
    run_emu -H 2 -R 2 -L torchrun -t 90 -o "$out/logs" -- "${debug[@]}" "$perf" all_gather \
      "${sizes[@]}"
    [ "$emu_rc" = 0 ] || bad "emuhosts.sh exited $emu_rc"
    check_perf 4
    grep -q "rank 0 of 4 from torchrun" "$out/logs/rank0.log" || bad "rank 0 was not launched as torchrun"
    check_gone "$emu_pid"
    ;;
  rank_fails)
    # Rank 1 fails at once; the others would sleep for a minute: they get 1 s (-g 1).
    # shellcheck disable=SC2016  # expanded by each rank's sh
    run_emu -H 2 -R 2 -g 1 -t 90 -- sh -c '[ "$EMUHOSTS_RANK" = 1 ] && exit 3; sleep 60'
    [ "$emu_rc" = 1 ] || bad "emuhosts.sh exited $emu_rc, expected 1"
    grep -q "rank 1 host 0 (10.77.0.1) FAILED: exit status 3" "$out/emu" || bad "rank 1 not named"
    grep -q "rank 2 host 1 (10.77.0.2) FAILED: killed" "$out/emu" || bad "rank 2 was not stopped"
    check_gone "$emu_pid"
    ;;
  signal)
    sig=$1
    # A background job of a script ignores SIGINT unless told otherwise, as a terminal's
    # foreground job would not.
    env --default-signal=INT bash "$emu" -H 2 -R 2 -- sleep 60 >"$out/emu" 2>&1 &
    emu_pid=$!
    for _ in $(seq 100); do
      [ "$(ip netns pids "loomemu-$emu_pid-h1" 2>/dev/null | wc -l)" -ge 2 ] && break
      sleep 0.1
    done
    pids=$(for ns in $(namespaces_of "$emu_pid"); do ip netns pids "$ns"; done)
    [ "$(echo "$pids" | wc -w)" -ge 4 ] || bad "the 4 ranks did not start: $pids"
    kill -"$sig" "$emu_pid"
    wait "$emu_pid"
    emu_rc=$?
    cat "$out/emu"
    [ "$emu_rc" != 0 ] || bad "emuhosts.sh exited 0 after SIG$sig"
    check_gone "$emu_pid"
    # shellcheck disable=SC2086
    check_stopped $pids
    ;;
  clean)
    bash "$emu" -H 2 -R 1 -- sleep 60 >"$out/emu" 2>&1 &
    emu_pid=$!
    for _ in $(seq 100); do
      [ -n "$(ip netns pids "loomemu-$emu_pid-h1" 2>/dev/null)" ] && break
      sleep 0.1
    done
    pids=$(for ns in $(namespaces_of "$emu_pid"); do ip netns pids "$ns"; done)
    kill -KILL "$emu_pid"
    wait "$emu_pid" 2>/dev/null
    [ "$(namespaces_of "$emu_pid" | wc -l)" = 3 ] || bad "a SIGKILLed run should leave 3 namespaces"
    bash "$emu" --clean
    check_gone "$emu_pid"
    # shellcheck disable=SC2086
    check_stopped $pids
    ;;
  *)
    echo "unknown case $case"
    exit 2
    ;;
esac
[ $fail = 0 ] && echo "PASS: $case $*"
exit $fail
