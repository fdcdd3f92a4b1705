#!/usr/bin/env bash
# Emulated hosts: runs a multi-host job on one machine. Each emulated host is a network namespace
# with its own hostname and one interface (emu0); a switch namespace joins them with a Linux
# bridge through veth pairs, and each host's link can be shaped with tbf (both directions).
# R ranks run in each host's namespace, started with the environment a launcher gives (Open MPI's
# variables and LOOM_COMM_ID by default, or torchrun's), with LOOM_HOSTID set per emulated host:
# ranks of one namespace share memory, ranks of different namespaces talk over TCP sockets.
#
#   tools/emuhosts.sh [options] -- PROGRAM [ARGS...]
#   tools/emuhosts.sh -H 2 -R 2 -- build/tools/perf/loom-perf all_reduce -b 8 -e 4M -f 8 -c 1
#   tools/emuhosts.sh -R 3,1 -b 1gbit -o /tmp/out -- build/tools/perf/loom-perf alltoall
#   tools/emuhosts.sh --clean        # remove what crashed runs (killed with SIGKILL) left behind
#
#   -H K          emulated hosts (default 2; at most 200)
#   -R N|A,B,...  ranks per host: one count for every host, or one count per host (uneven
#                 layouts such as 3,1; the list's length sets K)
#   -b RATE       shape each host's link to RATE with tbf, egress on both ends of its veth, so
#                 each direction of each link gets RATE (tc units: 200mbit, 1gbit, 10gbit)
#   -B BURST      tbf bucket size (default: 2 ms at RATE, at least 64 KiB; tc units: 256kb)
#   -L LAUNCHER   ompi (default: OMPI_COMM_WORLD_* and LOOM_COMM_ID) or torchrun (RANK,
#                 WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)
#   -p PORT       root rendezvous port in host 0's namespace (default 29500; the namespaces are
#                 new, so no other program holds it)
#   -t SECONDS    kill every rank still running after SECONDS (default 900; 0: no limit)
#   -g SECONDS    once a rank fails, how long the others get to finish (default 15)
#   -o DIR        keep each rank's output (stdout and stderr) in DIR/rankN.log (default: a
#                 temporary folder, removed at exit after failed ranks' output is printed)
#   -q            print only the per-rank summary, not rank 0's output
#   -C            give each host its own share of this machine's CPUs (taskset), as separate
#                 machines have: without it every rank of every host runs on every CPU, and a
#                 host whose ranks fit its view of the CPUs spins while another host's ranks wait
#                 for a core. Needs at least one CPU per host
#   --clean       remove the namespaces (and their processes) of runs of this script whose
#                 process is gone, then exit
#
# Every rank gets, besides the launcher's variables: LOOM_HOSTID (one per emulated host),
# LOOM_SOCKET_IFNAME=emu0 (unless set), EMUHOSTS_HOST (host index), EMUHOSTS_RANK, EMUHOSTS_NS.
# Other LOOM_* variables pass through from the caller's environment. Host h has the address
# 10.77.0.(h+1)/24 on emu0, its hostname is emuhost<h>, and the root address is host 0's.
#
# Nothing is created in the caller's network namespace: the veths, the bridge and the qdiscs all
# live in namespaces named loomemu-<pid>-h<h> and loomemu-<pid>-sw (pid: this script's), so
# concurrent runs cannot collide and 10.77.0.0/24 is never visible outside. The bridge has its
# own namespace also because bridge netfilter (bridge-nf-call-iptables, per namespace since
# Linux 5.3) is turned off there without touching the machine's setting. On exit, failure,
# Ctrl-C or SIGTERM, every rank and every process in those namespaces is killed and the
# namespaces are deleted, which removes their interfaces, bridge and qdiscs with them.
#
# Prints one line per rank (exit status, time, log) and rank 0's output; exits 0 when every rank
# exited 0, 1 when one failed or timed out, 2 on a usage error, 3 when the hosts cannot be set up
# (not root, no `ip netns`, no `tc` with -b). Needs root, iproute2 (ip, tc) and util-linux.
set -euo pipefail

readonly kPrefix=loomemu
readonly kSubnet=10.77.0
readonly kIf=emu0

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//'
  exit "${1:-2}"
}
die() {
  echo "emuhosts: $*" >&2
  exit 2
}
fail_setup() {
  echo "emuhosts: $*" >&2
  exit 3
}

# Kills every process inside namespace $1 and deletes it (its interfaces and qdiscs go with it).
remove_ns() {
  local ns=$1 pids tries=0
  pids=$(ip netns pids "$ns" 2>/dev/null || true)
  # shellcheck disable=SC2086
  [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
  while [ -n "$pids" ] && [ $tries -lt 50 ]; do
    sleep 0.05
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    tries=$((tries + 1))
  done
  ip netns del "$ns" 2>/dev/null || true
}

# Namespaces of runs whose script is no longer running.
clean_stale() {
  local ns pid n=0
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${kPrefix}-[0-9]*-" || true); do
    pid=${ns#"${kPrefix}"-}
    pid=${pid%%-*}
    if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q emuhosts; then
      continue  # a live run
    fi
    remove_ns "$ns"
    echo "emuhosts: removed stale namespace $ns"
    n=$((n + 1))
  done
  echo "emuhosts: $n stale namespace(s) removed"
}

hosts=2
ranks_spec=1
rate=""
burst=""
launcher=ompi
port=29500
limit=900
grace=15
outdir=""
quiet=0
split_cpus=0
while [ $# -gt 0 ]; do
  case "$1" in
    -H) hosts=${2:-}; shift ;;
    -R) ranks_spec=${2:-}; shift ;;
    -b) rate=${2:-}; shift ;;
    -B) burst=${2:-}; shift ;;
    -L) launcher=${2:-}; shift ;;
    -p) port=${2:-}; shift ;;
    -t) limit=${2:-}; shift ;;
    -g) grace=${2:-}; shift ;;
    -o) outdir=${2:-}; shift ;;
    -q) quiet=1 ;;
    -C) split_cpus=1 ;;
    --clean) [ "$(id -u)" = 0 ] || fail_setup "--clean needs root"; clean_stale; exit 0 ;;
    -h | --help) usage 0 ;;
    --) shift; break ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
  shift
done
[ $# -gt 0 ] || die "no program given: emuhosts.sh [options] -- PROGRAM [ARGS...] (see --help)"

is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }
if ! is_uint "$hosts" || [ "$hosts" -lt 1 ] || [ "$hosts" -gt 200 ]; then die "-H wants 1 to 200 hosts"; fi
IFS=, read -r -a per_host <<<"$ranks_spec"
for n in "${per_host[@]}"; do
  if ! is_uint "$n" || [ "$n" -lt 1 ]; then die "-R wants counts of at least 1 ('$ranks_spec')"; fi
done
if [ ${#per_host[@]} -gt 1 ]; then
  hosts=${#per_host[@]}
else
  for ((h = 1; h < hosts; h++)); do per_host[h]=${per_host[0]}; done
fi
case "$launcher" in ompi | torchrun) ;; *) die "-L wants ompi or torchrun" ;; esac
if ! is_uint "$port" || [ "$port" -lt 2 ] || [ "$port" -gt 65535 ]; then die "-p wants a port"; fi
is_uint "$limit" || die "-t wants seconds"
is_uint "$grace" || die "-g wants seconds"
if [ -n "$rate" ]; then
  # Only bit rates: tc reads "mbps" as megabytes per second, a classic mistake.
  [[ $rate =~ ^([0-9]+(\.[0-9]+)?)([kmgt]?)bit$ ]] || die "-b wants a rate like 200mbit or 1gbit"
  if [ -z "$burst" ]; then
    # tbf's bucket must hold at least one full (GSO) packet; 2 ms at the rate keeps the shaping
    # smooth without letting bursts beat the rate on the message sizes worth measuring.
    burst=$(awk -v v="${BASH_REMATCH[1]}" -v u="${BASH_REMATCH[3]}" 'BEGIN {
      m = 1; if (u == "k") m = 1e3; if (u == "m") m = 1e6; if (u == "g") m = 1e9; if (u == "t") m = 1e12
      b = v * m / 8 * 0.002; if (b < 65536) b = 65536; printf "%d", b }')
  fi
fi

[ "$(id -u)" = 0 ] || fail_setup "needs root (network namespaces, veths, bridge, tc)"
command -v ip >/dev/null || fail_setup "ip (iproute2) is not installed"
ip netns list >/dev/null 2>&1 || fail_setup "'ip netns' is not available"
if [ -n "$rate" ]; then command -v tc >/dev/null || fail_setup "-b needs tc (iproute2)"; fi
have_unshare=0
command -v unshare >/dev/null && command -v hostname >/dev/null && have_unshare=1

name="${kPrefix}-$$"
sw="${name}-sw"
created=()
rank_pids=()
tmpout=""
if [ -z "$outdir" ]; then
  tmpout=$(mktemp -d)
  outdir=$tmpout
else
  mkdir -p "$outdir"
fi

# shellcheck disable=SC2317  # reached through the EXIT trap
teardown() {
  local rc=$? pid ns i alive
  set +e
  trap - EXIT INT TERM HUP
  # The ranks first (TERM, then KILL whatever remains in the namespaces), so that no process holds
  # a namespace alive after its name is gone.
  for pid in "${rank_pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for ((i = 0; i < 20; i++)); do
    alive=0
    for pid in "${rank_pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for ns in "${created[@]}"; do remove_ns "$ns"; done
  wait 2>/dev/null
  [ -z "$tmpout" ] || rm -rf "$tmpout"
  exit "$rc"
}
trap teardown EXIT
trap 'echo "emuhosts: interrupted" >&2; exit 130' INT
trap 'echo "emuhosts: terminated" >&2; exit 143' TERM
trap 'exit 129' HUP

# shape NS DEV: tbf as DEV's root qdisc (egress).
shape() {
  tc -n "$1" qdisc replace dev "$2" root tbf rate "$rate" burst "$burst" latency 50ms ||
    fail_setup "tc tbf on $2 in $1 failed (is sch_tbf available?)"
}

setup() {
  local h ns
  ip netns add "$sw" || fail_setup "cannot create namespace $sw"
  created+=("$sw")
  ip -n "$sw" link set lo up
  # Bridged IPv4 must not go through iptables (br_netfilter): this namespace's switch is a plain
  # wire. The files exist only when br_netfilter is loaded.
  local f
  for f in bridge-nf-call-iptables bridge-nf-call-ip6tables bridge-nf-call-arptables; do
    [ ! -e "/proc/sys/net/bridge/$f" ] ||
      ip netns exec "$sw" sh -c "echo 0 > /proc/sys/net/bridge/$f" 2>/dev/null || true
  done
  ip -n "$sw" link add br0 type bridge forward_delay 0 stp_state 0 ||
    fail_setup "cannot create a bridge"
  ip -n "$sw" link set br0 up
  for ((h = 0; h < hosts; h++)); do
    ns="${name}-h$h"
    ip netns add "$ns" || fail_setup "cannot create namespace $ns"
    created+=("$ns")
    ip -n "$ns" link set lo up
    ip -n "$sw" link add "h$h" type veth peer name "$kIf" netns "$ns" ||
      fail_setup "cannot create a veth pair"
    ip -n "$sw" link set "h$h" master br0 up
    # IPv4 only, so that the socket transport cannot pick a link-local IPv6 address.
    ip netns exec "$ns" sh -c "echo 1 > /proc/sys/net/ipv6/conf/$kIf/disable_ipv6" 2>/dev/null ||
      true
    ip -n "$ns" addr add "$kSubnet.$((h + 1))/24" dev "$kIf"
    ip -n "$ns" link set "$kIf" up
    if [ -n "$rate" ]; then
      shape "$ns" "$kIf"
      shape "$sw" "h$h"
    fi
  done
  # Carrier on every host link before the ranks start.
  for ((h = 0; h < hosts; h++)); do
    local tries=0
    until ip -n "${name}-h$h" link show "$kIf" | grep -q LOWER_UP; do
      tries=$((tries + 1))
      [ $tries -lt 100 ] || fail_setup "link of host $h did not come up"
      sleep 0.02
    done
  done
}

# launch RANK HOST LOCAL_RANK PROGRAM [ARGS...]: starts one rank in the background inside the host's namespace.
launch() {
  local r=$1 h=$2 lr=$3 ns="${name}-h$2"
  shift 3
  local -a vars=(
    "LOOM_HOSTID=${name}-h$h" "LOOM_SOCKET_IFNAME=${LOOM_SOCKET_IFNAME:-$kIf}"
    "EMUHOSTS_HOST=$h" "EMUHOSTS_RANK=$r" "EMUHOSTS_NS=$ns"
  )
  if [ "$launcher" = ompi ]; then
    vars+=("LOOM_COMM_ID=$kSubnet.1:$port" "OMPI_COMM_WORLD_RANK=$r"
      "OMPI_COMM_WORLD_SIZE=$total" "OMPI_COMM_WORLD_LOCAL_RANK=$lr"
      "OMPI_COMM_WORLD_LOCAL_SIZE=${per_host[h]}" "OMPI_COMM_WORLD_NODE_RANK=$h")
  else
    # Loom's root listens on MASTER_PORT + LOOM_BOOTSTRAP_PORT_OFFSET (torch's store owns
    # MASTER_PORT itself).
    vars+=("MASTER_ADDR=$kSubnet.1" "MASTER_PORT=$((port - ${LOOM_BOOTSTRAP_PORT_OFFSET:-1}))"
      "RANK=$r" "WORLD_SIZE=$total" "LOCAL_RANK=$lr" "LOCAL_WORLD_SIZE=${per_host[h]}"
      "GROUP_RANK=$h")
  fi
  local -a pre=()
  if [ "$have_unshare" = 1 ]; then
    # Own hostname per emulated host (UTS namespace), so logs and errors name the host.
    # shellcheck disable=SC2016  # expanded by that sh
    pre=(unshare --uts -- sh -c 'hostname "$1" && shift && exec "$@"' sh "emuhost$h")
  fi
  local -a lim=()
  [ "$limit" = 0 ] || lim=(timeout -k 5 "$limit")
  [ "$split_cpus" = 0 ] || lim+=(taskset -c "${host_cpus[h]}")
  # Launcher variables inherited from whatever started this script would confuse the ranks.
  ip netns exec "$ns" "${pre[@]}" "${lim[@]}" env -u LOOM_COMM_ID -u SLURM_NTASKS -u SLURM_PROCID \
    -u SLURM_LOCALID -u OMPI_COMM_WORLD_SIZE -u OMPI_COMM_WORLD_RANK \
    -u OMPI_COMM_WORLD_LOCAL_RANK -u WORLD_SIZE -u RANK -u LOCAL_RANK -u MASTER_ADDR \
    -u MASTER_PORT "${vars[@]}" "$@" </dev/null >"$outdir/rank$r.log" 2>&1 &
  rank_pids[r]=$!
}

# -C: host h gets the h-th of `hosts` equal slices of the CPUs this script may use.
declare -a host_cpus
if [ "$split_cpus" = 1 ]; then
  command -v taskset >/dev/null || fail_setup "-C needs taskset (util-linux)"
  mapfile -t cpus < <(taskset -pc $$ | sed 's/.*: //' | tr ',' '\n' |
    awk -F- '{ if (NF == 2) { for (i = $1; i <= $2; i++) print i } else print $1 }')
  per=$((${#cpus[@]} / hosts))
  [ "$per" -ge 1 ] || die "-C needs at least one CPU per host (${#cpus[@]} CPUs, $hosts hosts)"
  for ((h = 0; h < hosts; h++)); do
    host_cpus[h]=$(IFS=,; echo "${cpus[*]:$((h * per)):$per}")
  done
fi

setup
total=0
for n in "${per_host[@]}"; do total=$((total + n)); done
echo "emuhosts: $hosts host(s) (ranks per host: $(
  IFS=,
  echo "${per_host[*]}"
)), $total rank(s), namespaces ${name}-*${rate:+, links shaped to $rate (burst $burst)}$(
  [ "$split_cpus" = 0 ] || echo ", CPUs per host: ${host_cpus[*]}")"

declare -a rank_host rank_rc rank_start rank_end
start_all=$(date +%s.%N)
r=0
for ((h = 0; h < hosts; h++)); do
  for ((lr = 0; lr < per_host[h]; lr++)); do
    rank_host[r]=$h
    rank_start[r]=$(date +%s.%N)
    launch "$r" "$h" "$lr" "$@"
    r=$((r + 1))
  done
done

# Wait for every rank; once one fails, the others get `grace` seconds (Loom propagates failures,
# so they normally end at once) before they are killed.
remaining=$total
failed_at=""
while [ "$remaining" -gt 0 ]; do
  for ((r = 0; r < total; r++)); do
    [ -z "${rank_rc[r]:-}" ] || continue
    if ! kill -0 "${rank_pids[r]}" 2>/dev/null; then
      rc=0
      wait "${rank_pids[r]}" || rc=$?
      rank_rc[r]=$rc
      rank_end[r]=$(date +%s.%N)
      remaining=$((remaining - 1))
      if [ "$rc" != 0 ] && [ -z "$failed_at" ]; then failed_at=$(date +%s); fi
    fi
  done
  if [ -n "$failed_at" ] && [ $(($(date +%s) - failed_at)) -ge "$grace" ]; then
    for ((r = 0; r < total; r++)); do
      [ -n "${rank_rc[r]:-}" ] || kill -KILL "${rank_pids[r]}" 2>/dev/null || true
    done
  fi
  [ "$remaining" -eq 0 ] || sleep 0.05
done

status=0
for ((r = 0; r < total; r++)); do
  rc=${rank_rc[r]}
  case "$rc" in
    0) what="ok" ;;
    124) what="FAILED: timed out after ${limit}s" ;;
    137) what="FAILED: killed" ;;
    *) what="FAILED: exit status $rc" ;;
  esac
  [ "$rc" = 0 ] || status=1
  secs=$(awk -v a="${rank_start[r]}" -v b="${rank_end[r]}" 'BEGIN { printf "%.1f", b - a }')
  h=${rank_host[r]}
  log="$outdir/rank$r.log"
  [ -z "$tmpout" ] || log="(not kept: -o DIR keeps it)"
  echo "emuhosts: rank $r host $h ($kSubnet.$((h + 1))) $what ${secs}s $log"
done
if [ "$quiet" = 0 ]; then
  echo "emuhosts: --- rank 0 output:"
  cat "$outdir/rank0.log"
fi
for ((r = 1 - quiet; r < total; r++)); do
  if [ "${rank_rc[r]}" != 0 ]; then
    echo "emuhosts: --- rank $r output (last 30 lines):"
    tail -n 30 "$outdir/rank$r.log"
  fi
done
elapsed=$(awk -v a="$start_all" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
if [ $status = 0 ]; then
  echo "emuhosts: all $total rank(s) succeeded in ${elapsed}s"
else
  echo "emuhosts: some rank(s) failed (${elapsed}s)"
fi
exit $status
