#!/usr/bin/env bash
# Peer comparison: Loom (loom-perf -np N) against Open MPI (shared memory and TCP), MPICH and Gloo
# (TCP over loopback) on the same machine, in the same run, one table per collective and rank
# count side by side, plus the single-core memcpy bandwidth and the machine's memory bound (every
# core copying at once), each size both in an nccl-tests sweep and alone. See bench/peers/README.md.
#
#   bench/peers/run_peers.sh [-p "loom ompi-shm ompi-tcp mpich gloo"] [-r "2 4"]
#                            [-c "all_reduce all_gather ..."] [-b 8] [-e 64M] [-f 2] [-n 20] [-w 5]
#                            [-L 4M] [-m 5] [-W 2] [-M "sweep alone"] [-N 1] [-t 300]
#                            [-o /tmp/loom-peers.md] [-B dir] [-k] [-I]
#
# Environment: LOOM_PERF=/path/to/loom-perf (else it is built in <repo>/build-peers);
#   OMPI_MPIRUN, OMPI_MPICC (or MPIRUN, MPICC), MPICH_MPIRUN, MPICH_MPICC, CXX to pick the tools;
#   GLOO_CXXFLAGS, GLOO_LIBS for a Gloo outside /usr; LOOM_PEERS_EXTRA_MPI_ARGS (both Open MPI
#   configurations) and LOOM_PEERS_EXTRA_MPICH_ARGS: extra mpirun arguments;
#   LOOM_PEERS_RATIO_TARGET (1.0), LOOM_PEERS_MEMCPY_TARGET (0.5): pass marks of the targets.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$SCRIPT_DIR/../.." && pwd)"

ALL_PEERS="loom loom-mem ompi-shm ompi-tcp mpich gloo"
PEERS="$ALL_PEERS"
RANKS="2 4"
COLLS="all_reduce all_gather reduce_scatter broadcast alltoall"
MINB=8
MAXB=64M
FACTOR=2
ITERS=20
WARMUP=5
LARGE=4M        # above this size: fewer iterations (ITERS * LARGE / size, at least MIN_ITERS)
MIN_ITERS=5
LARGE_WARMUP=2
MODES="sweep alone"  # sweep: one call from -b to -e (nccl-tests' way); alone: large sizes apart
ROUNDS=1        # each benchmark invocation this many times, the implementations taking turns
RUN_TIMEOUT=300 # seconds, each benchmark invocation
OUT=/tmp/loom-peers.md
BUILD_DIR=""
KEEP=0
INSTALL=1
APT_PACKAGES="openmpi-bin libopenmpi-dev mpich libmpich-dev libgloo-dev"

usage() {
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
  cat <<EOF
Options:
  -p PEERS    libraries to run (default: all of "$ALL_PEERS";
              MPICH is skipped with a message when it is not installed)
  -r RANKS    rank counts, space separated (default "$RANKS")
  -c COLLS    collectives (default "$COLLS")
  -b/-e/-f    min size, max size (K/M/G suffixes), step factor (default $MINB, $MAXB, $FACTOR);
              the max size is always measured, even off the geometric grid
  -n/-w       timed and warm-up iterations up to -L (default $ITERS, $WARMUP)
  -L SIZE     above SIZE use max(-m, n*SIZE/size) iterations and -W warm-ups (default $LARGE)
  -m/-W       minimum iterations / warm-ups for the large sizes (default $MIN_ITERS, $LARGE_WARMUP)
  -M MODES    how the sizes run (default "$MODES"): sweep = one call from -b to -e with -n
              iterations, as nccl-tests users run it (buffers of the largest size, each iteration
              at the next offset: large sizes are cache-cold); alone = each size above -L in a
              call of its own (-L, -m, -W), cache-warm where it fits. One report per mode
              (<out>.<mode>.md when both run)
  -N ROUNDS   run every benchmark ROUNDS times, the implementations taking turns in each round,
              and keep each implementation's best time per size (default $ROUNDS): on a shared
              host a burst of other work then lands on one round, not on one implementation
  -t SECS     timeout of each benchmark process (default $RUN_TIMEOUT)
  -o FILE     Markdown report (a .csv is written next to it; default $OUT)
  -B DIR      build directory for the helper programs (default: a temporary directory)
  -k          keep the raw logs (they are always kept when something fails)
  -I          do not install missing packages (default: apt-get install what is absent:
              $APT_PACKAGES)
EOF
}

while getopts "p:r:c:b:e:f:n:w:L:m:W:M:N:t:o:B:kIh" opt; do
  case "$opt" in
    p) PEERS="$OPTARG" ;;
    r) RANKS="$OPTARG" ;;
    c) COLLS="$OPTARG" ;;
    b) MINB="$OPTARG" ;;
    e) MAXB="$OPTARG" ;;
    f) FACTOR="$OPTARG" ;;
    n) ITERS="$OPTARG" ;;
    w) WARMUP="$OPTARG" ;;
    L) LARGE="$OPTARG" ;;
    m) MIN_ITERS="$OPTARG" ;;
    W) LARGE_WARMUP="$OPTARG" ;;
    M) MODES="$OPTARG" ;;
    N) ROUNDS="$OPTARG" ;;
    t) RUN_TIMEOUT="$OPTARG" ;;
    o) OUT="$OPTARG" ;;
    B) BUILD_DIR="$OPTARG" ;;
    k) KEEP=1 ;;
    I) INSTALL=0 ;;
    h) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done

die() { echo "run_peers: error: $*" >&2; exit 1; }
log() { echo "run_peers: $*" >&2; }

to_bytes() {  # 64M -> 67108864
  local v="${1%[bB]}" mult=1
  case "$v" in
    *[kK]) mult=1024; v="${v%[kK]}" ;;
    *[mM]) mult=$((1024 * 1024)); v="${v%[mM]}" ;;
    *[gG]) mult=$((1024 * 1024 * 1024)); v="${v%[gG]}" ;;
  esac
  [[ "$v" =~ ^[0-9]+$ ]] || die "bad size '$1'"
  echo $((v * mult))
}

canon_coll() {  # accept loom-perf, nccl-tests and MPI-ish names
  case "$1" in
    all_reduce|allreduce|all_reduce_perf) echo all_reduce ;;
    all_gather|allgather|all_gather_perf) echo all_gather ;;
    reduce_scatter|reducescatter|reduce_scatter_perf) echo reduce_scatter ;;
    broadcast|bcast|broadcast_perf) echo broadcast ;;
    alltoall|all_to_all|alltoall_perf) echo alltoall ;;
    *) die "unknown collective '$1' (all_reduce all_gather reduce_scatter broadcast alltoall)" ;;
  esac
}

canon_peer() {
  case "$1" in
    loom) echo loom ;;
    loom-mem|loom_mem) echo loom-mem ;;
    ompi-shm|ompi_shm|ompi|openmpi|ompi-default|ompi_default) echo ompi-shm ;;
    ompi-tcp|ompi_tcp) echo ompi-tcp ;;
    mpich) echo mpich ;;
    gloo) echo gloo ;;
    *) die "unknown peer '$1' ($ALL_PEERS)" ;;
  esac
}

MINB_B=$(to_bytes "$MINB")
MAXB_B=$(to_bytes "$MAXB")
LARGE_B=$(to_bytes "$LARGE")
for v in "$FACTOR" "$ITERS" "$WARMUP" "$MIN_ITERS" "$LARGE_WARMUP" "$RUN_TIMEOUT" "$ROUNDS"; do
  [[ "$v" =~ ^[0-9]+$ ]] || die "'$v' is not a non-negative integer"
done
((FACTOR >= 2)) || die "-f must be at least 2"
((ITERS >= 1 && MIN_ITERS >= 1)) || die "-n and -m must be at least 1"
((RUN_TIMEOUT >= 1)) || die "-t must be at least 1"
((ROUNDS >= 1)) || die "-N must be at least 1"
((MINB_B >= 1 && MINB_B <= MAXB_B)) || die "need 1 <= min size <= max size"
for m in $MODES; do
  [[ "$m" == sweep || "$m" == alone ]] || die "unknown mode '$m' (-M: sweep, alone)"
done
[[ -n "${MODES// /}" ]] || die "no mode selected (-M)"
for r in $RANKS; do
  if ! [[ "$r" =~ ^[0-9]+$ ]] || ((r < 1)); then die "bad rank count '$r'"; fi
done
CANON_COLLS=""
for c in $COLLS; do CANON_COLLS+="$(canon_coll "$c") "; done
[[ -n "$CANON_COLLS" ]] || die "no collective selected"
# Peers in the canonical order (the table's column order), without duplicates.
want_peer() { [[ " $SEL " == *" $1 "* ]]; }
SEL=" "
for p in $PEERS; do SEL+="$(canon_peer "$p") "; done
ACTIVE=()
for p in $ALL_PEERS; do if want_peer "$p"; then ACTIVE+=("$p"); fi; done
((${#ACTIVE[@]} > 0)) || die "no peer selected"
have_active() { [[ " ${ACTIVE[*]} " == *" $1 "* ]]; }
drop_active() {
  local keep=() p
  for p in "${ACTIVE[@]}"; do [[ "$p" == "$1" ]] || keep+=("$p"); done
  ACTIVE=("${keep[@]}")
}
SKIPPED=()  # "peer: reason" for the report header

# ---- tools ---------------------------------------------------------------------------------
CXX="${CXX:-g++}"
have() { command -v "$1" >/dev/null 2>&1; }

# Open MPI: the explicit Debian binaries, else mpirun/mpicc if they are Open MPI's.
find_ompi() {
  OMPI_MPIRUN="${OMPI_MPIRUN:-${MPIRUN:-}}"
  OMPI_MPICC="${OMPI_MPICC:-${MPICC:-}}"
  if [[ -z "$OMPI_MPIRUN" ]]; then
    if have mpirun.openmpi; then OMPI_MPIRUN=mpirun.openmpi
    elif have mpirun && mpirun --version 2>/dev/null | grep -Eq "Open MPI|OpenRTE"; then OMPI_MPIRUN=mpirun; fi
  fi
  if [[ -z "$OMPI_MPICC" ]]; then
    if have mpicc.openmpi; then OMPI_MPICC=mpicc.openmpi
    elif have mpicc && mpicc --showme:version 2>/dev/null | grep -q "Open MPI"; then OMPI_MPICC=mpicc; fi
  fi
  [[ -n "$OMPI_MPIRUN" && -n "$OMPI_MPICC" ]] && have "$OMPI_MPIRUN" && have "$OMPI_MPICC"
}
# MPICH: hydra's mpirun.mpich / mpiexec.hydra and mpicc.mpich, else mpirun/mpicc if MPICH's.
find_mpich() {
  MPICH_MPIRUN="${MPICH_MPIRUN:-}"
  MPICH_MPICC="${MPICH_MPICC:-}"
  if [[ -z "$MPICH_MPIRUN" ]]; then
    if have mpirun.mpich; then MPICH_MPIRUN=mpirun.mpich
    elif have mpiexec.hydra; then MPICH_MPIRUN=mpiexec.hydra
    elif have mpirun && mpirun --version 2>/dev/null | grep -q "HYDRA"; then MPICH_MPIRUN=mpirun; fi
  fi
  if [[ -z "$MPICH_MPICC" ]]; then
    if have mpicc.mpich; then MPICH_MPICC=mpicc.mpich
    elif have mpicc && mpicc -v 2>&1 | grep -q "MPICH"; then MPICH_MPICC=mpicc; fi
  fi
  [[ -n "$MPICH_MPIRUN" && -n "$MPICH_MPICC" ]] && have "$MPICH_MPIRUN" && have "$MPICH_MPICC"
}
GLOO_CXXFLAGS="${GLOO_CXXFLAGS:-}"
GLOO_LIBS="${GLOO_LIBS:--lgloo -pthread}"
find_gloo() {
  # Debian's libgloo-dev: headers in /usr/include/gloo, /usr/lib/libgloo.so (its own NEEDED
  # entries pull in libibverbs and libhiredis; nothing else to link).
  local inc
  for inc in /usr/include /usr/local/include ${GLOO_CXXFLAGS:+$(sed -n 's/.*-I *\([^ ]*\).*/\1/p' <<<"$GLOO_CXXFLAGS")}; do
    [[ -e "$inc/gloo/allreduce.h" ]] && return 0
  done
  return 1
}

# Install what the selected peers need when it is absent (Debian/Ubuntu), unless -I.
missing_pkgs() {
  local pk=()
  if have_active ompi-shm || have_active ompi-tcp; then find_ompi || pk+=(openmpi-bin libopenmpi-dev); fi
  if have_active mpich; then find_mpich || pk+=(mpich libmpich-dev); fi
  if have_active gloo; then find_gloo || pk+=(libgloo-dev); fi
  have "$CXX" || pk+=(g++)
  have python3 || pk+=(python3)
  echo "${pk[*]}"
}
MISSING="$(missing_pkgs)"
if [[ -n "$MISSING" ]]; then
  if ((INSTALL == 0)); then
    log "not installing (-I); absent: $MISSING"
  elif ! have apt-get; then
    log "no apt-get: install by hand the equivalents of: $MISSING"
  else
    SUDO=()
    if ((EUID != 0)); then
      if have sudo; then SUDO=(sudo); else log "not root and no sudo: cannot install $MISSING"; fi
    fi
    if ((EUID == 0)) || ((${#SUDO[@]} > 0)); then
      log "installing: $MISSING"
      # shellcheck disable=SC2086  # word splitting of the package list is intended
      if ! { "${SUDO[@]}" apt-get update -qq &&
             "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
               --no-install-recommends $MISSING; } >&2; then
        log "apt-get install failed; continuing with what is installed"
      fi
    fi
  fi
fi

have "$CXX" || die "$CXX not found (apt-get install -y g++, or set CXX)"
have python3 || die "python3 not found (apt-get install -y python3)"
have timeout || die "timeout (coreutils) not found"

if have_active ompi-shm || have_active ompi-tcp; then
  find_ompi || die "Open MPI not found (mpirun.openmpi/mpicc.openmpi, or mpirun that is Open MPI's).
  apt-get install -y openmpi-bin libopenmpi-dev, set OMPI_MPIRUN/OMPI_MPICC, or leave it out with -p"
  # (mpirun says "Open MPI"; the same binary started as mpirun.openmpi says "OpenRTE")
  "$OMPI_MPIRUN" --version 2>/dev/null | grep -Eq "Open MPI|OpenRTE" ||
    die "$OMPI_MPIRUN is not Open MPI's mpirun"
fi
if have_active mpich && ! find_mpich; then
  log "MPICH not installed (mpirun.mpich/mpicc.mpich): skipping its column"
  drop_active mpich
  SKIPPED+=("mpich: not installed")
fi
if have_active gloo && ! find_gloo; then
  die "Gloo headers not found (apt-get install -y libgloo-dev, set GLOO_CXXFLAGS/GLOO_LIBS, or
  leave it out with -p)"
fi

TMP_BUILD=""
if [[ -z "$BUILD_DIR" ]]; then
  BUILD_DIR="$(mktemp -d /tmp/loom-peers-build.XXXXXX)"
  TMP_BUILD="$BUILD_DIR"
fi
mkdir -p "$BUILD_DIR"
WORK="$(mktemp -d /tmp/loom-peers-run.XXXXXX)"
RAW="$WORK/raw"
mkdir -p "$RAW"
MANIFEST="$WORK/manifest.tsv"
: >"$MANIFEST"

CURRENT_PGID=""
# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
  local rc=$?
  if [[ -n "$CURRENT_PGID" ]]; then kill -KILL -- "-$CURRENT_PGID" 2>/dev/null || true; fi
  if [[ -n "$TMP_BUILD" ]]; then rm -rf "$TMP_BUILD"; fi
  if ((rc != 0)); then log "raw logs kept in $WORK"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "building the helper programs in $BUILD_DIR"
"$CXX" -O2 -Wall -o "$BUILD_DIR/memcpy_bw" "$SCRIPT_DIR/memcpy_bw.cc"
"$CXX" -O2 -Wall -o "$BUILD_DIR/cma_bw" "$SCRIPT_DIR/cma_bw.cc"
# -O3: its reduction loop vectorized, as Loom's kernels are.
"$CXX" -O3 -march=native -Wall -o "$BUILD_DIR/push_bw" "$SCRIPT_DIR/push_bw.cc"
"$CXX" -O2 -Wall -pthread -o "$BUILD_DIR/xcore_bw" "$SCRIPT_DIR/xcore_bw.cc"
if have_active ompi-shm || have_active ompi-tcp; then
  "$OMPI_MPICC" -O2 -Wall -o "$BUILD_DIR/mpi_coll_bench.ompi" "$SCRIPT_DIR/mpi_coll_bench.c"
fi
if have_active mpich; then
  if ! "$MPICH_MPICC" -O2 -Wall -o "$BUILD_DIR/mpi_coll_bench.mpich" "$SCRIPT_DIR/mpi_coll_bench.c"; then
    log "cannot build mpi_coll_bench with $MPICH_MPICC: skipping MPICH"
    drop_active mpich
    SKIPPED+=("mpich: build failed")
  fi
fi
if have_active gloo; then
  # shellcheck disable=SC2086  # the flag lists are meant to split
  "$CXX" -std=c++17 -O2 -Wall $GLOO_CXXFLAGS -o "$BUILD_DIR/gloo_coll_bench" \
    "$SCRIPT_DIR/gloo_coll_bench.cc" $GLOO_LIBS ||
    die "cannot build gloo_coll_bench (compile line: $CXX -std=c++17 -O2 $GLOO_CXXFLAGS ... $GLOO_LIBS)"
fi

if have_active loom || have_active loom-mem; then
  LOOM_PERF_GIVEN="${LOOM_PERF:-}"
  if [[ -z "${LOOM_PERF:-}" ]]; then
    LOOM_BUILD="$REPO_DIR/build-peers"
    log "LOOM_PERF not set: building loom-perf in $LOOM_BUILD (Release)"
    cmake -S "$REPO_DIR" -B "$LOOM_BUILD" -DLOOM_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$LOOM_BUILD" -j2 --target loom-perf >/dev/null
    LOOM_PERF="$LOOM_BUILD/tools/perf/loom-perf"
  fi
  [[ -x "$LOOM_PERF" ]] || die "loom-perf not found or not executable: $LOOM_PERF"
fi

# ---- machine and library versions -----------------------------------------------------------
META="$WORK/meta.txt"
{
  echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host=$(hostname -s 2>/dev/null || hostname)"
  echo "cpu=$(grep -m1 '^model name' /proc/cpuinfo | sed 's/^[^:]*: *//')"
  echo "logical_cpus=$(nproc --all)"
  echo "online_cpus=$(nproc)"
  if have lscpu; then
    echo "cores_per_socket=$(lscpu | awk -F: '/^Core\(s\) per socket/{gsub(/ /,"",$2);print $2}')"
    echo "sockets=$(lscpu | awk -F: '/^Socket\(s\)/{gsub(/ /,"",$2);print $2}')"
    echo "threads_per_core=$(lscpu | awk -F: '/^Thread\(s\) per core/{gsub(/ /,"",$2);print $2}')"
  fi
  echo "mem=$(awk '/MemTotal/{printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
  echo "kernel=$(uname -r)"
  echo "peers=${ACTIVE[*]}"
  skipped_list=""
  for x in "${SKIPPED[@]}"; do skipped_list+="${skipped_list:+; }$x"; done
  echo "skipped=$skipped_list"
  if have_active ompi-shm || have_active ompi-tcp; then
    echo "ompi=Open MPI $("$OMPI_MPIRUN" --version 2>/dev/null | head -1 | grep -o '[0-9][0-9.]*$') ($OMPI_MPIRUN)"
  fi
  if have_active mpich; then
    mv=""
    if have mpichversion; then
      mv="$(mpichversion 2>/dev/null | awk '/^MPICH (Version|Device):/{sub(/^[^:]*:[ \t]*/, ""); x = x (x ? ", device " : "MPICH ") $0} END{print x}')"
    fi
    echo "mpich=${mv:-MPICH} ($MPICH_MPIRUN)"
  fi
  if have_active gloo; then
    echo "gloo=Gloo $(dpkg-query -W -f='${Version}' libgloo-dev 2>/dev/null || echo '(version unknown)')"
  fi
  if have_active loom || have_active loom-mem; then
    echo "loom_perf=$LOOM_PERF"
    # With LOOM_PERF given, the binary may come from another tree: say so.
    echo "loom_git=${LOOM_PERF_GIVEN:+tree of this script at }$(git -C "$REPO_DIR" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$REPO_DIR" diff --quiet 2>/dev/null || echo '+dirty')"
  fi
  echo "ranks=$RANKS"
  echo "colls=$CANON_COLLS"
  echo "sizes=$MINB..$MAXB x$FACTOR"
  echo "schedule=$ITERS iters, $WARMUP warm-up; above $LARGE: max($MIN_ITERS, $ITERS*$LARGE/size) iters, $LARGE_WARMUP warm-up"
  echo "rounds=$ROUNDS"
} >"$META"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# MPICH: which shared-memory path its device picked (Debian's 4.0 is ch4:ucx; UCX logs its
# transports at info level). One tiny 2-rank run; the answer goes in the header.
if have_active mpich; then
  tr="$(UCX_LOG_LEVEL=info timeout -k 5 60 "$MPICH_MPIRUN" -np 2 "$BUILD_DIR/mpi_coll_bench.mpich" \
          -c allreduce -b 8 -e 8 -n 1 -w 0 2>&1 |
        sed -n 's/.*ep_cfg\[[0-9]*\]: tag(\([^)]*\)).*/\1/p' | tr ' ' '\n' |
        grep -v '^self/' | sort -u | tr '\n' ' ' || true)"
  echo "mpich_transport=${tr:+UCX tag transports: ${tr% }}" >>"$META"
fi

log "memcpy bandwidth (64 MiB, best of 10)"
timeout -k 5 60 "$BUILD_DIR/memcpy_bw" 64 10 >"$RAW/memcpy.log" || log "memcpy_bw failed"
cat "$RAW/memcpy.log" >&2
# The memory bound: every core copying at once. Measured here and, with -N, again in every round
# of every invocation, taking turns with the libraries: the report takes the best of all, so a
# burst of other work during one measurement does not lower the bound the libraries are held to.
measure_bound() {
  timeout -k 5 120 "$BUILD_DIR/memcpy_bw" 64 10 "$(nproc)" >>"$RAW/membound.log" ||
    log "memcpy_bw with $(nproc) threads failed"
}
log "memory bound: every core copying at once ($(nproc) x 64 MiB, best of 10)"
: >"$RAW/membound.log"
measure_bound
cat "$RAW/membound.log" >&2
log "process_vm_readv/writev against loads and stores, one core, cold buffers (64 MiB, best of 5)"
timeout -k 5 120 "$BUILD_DIR/cma_bw" 64 5 >"$RAW/cma.log" || log "cma_bw failed"
cat "$RAW/cma.log" >&2
log "a 2-rank AllReduce's peer half: process_vm_readv against pushed through shared memory"
timeout -k 5 120 "$BUILD_DIR/push_bw" 1,4,16 6 40 >"$RAW/push.log" || log "push_bw failed"
cat "$RAW/push.log" >&2
# Before and after the runs: on a VM whose host moves its vCPUs, what the one pass's result tiles
# cost changes with it (src/runtime/tile_choice.h).
log "two cores handing data over through their caches (xcore_bw, before the runs)"
timeout -k 5 120 "$BUILD_DIR/xcore_bw" 5 >"$RAW/xcore.log" || log "xcore_bw failed"
cat "$RAW/xcore.log" >&2

# ---- sizes and iteration groups ------------------------------------------------------------
SIZES=()
s=$MINB_B
while ((s <= MAXB_B)); do
  SIZES+=("$s")
  s=$((s * FACTOR))
done
((SIZES[${#SIZES[@]} - 1] == MAXB_B)) || SIZES+=("$MAXB_B")

# Each group: "min max factor iters warmup". Sizes up to LARGE run in one call; each larger size
# runs alone with its own iteration count (loom-perf has one -n per call).
GROUPS_LIST=()
small_lo="" small_hi=""
for s in "${SIZES[@]}"; do
  if ((s <= LARGE_B)); then
    [[ -n "$small_lo" ]] || small_lo=$s
    # The off-grid max size cannot share the geometric call.
    if [[ -n "$small_hi" ]] && ((s != small_hi * FACTOR)); then
      GROUPS_LIST+=("$s $s $FACTOR $ITERS $WARMUP")
    else
      small_hi=$s
    fi
  else
    it=$((ITERS * LARGE_B / s))
    ((it >= MIN_ITERS)) || it=$MIN_ITERS
    GROUPS_LIST+=("$s $s $FACTOR $it $LARGE_WARMUP")
  fi
done
[[ -z "$small_lo" ]] || GROUPS_LIST=("$small_lo $small_hi $FACTOR $ITERS $WARMUP" "${GROUPS_LIST[@]}")
# The sweep: one call over every size on the grid (the off-grid max size only when it is on it).
SWEEP_HI=$MINB_B
while ((SWEEP_HI * FACTOR <= MAXB_B)); do SWEEP_HI=$((SWEEP_HI * FACTOR)); done
SWEEP_LIST=("$MINB_B $SWEEP_HI $FACTOR $ITERS $WARMUP")

# Open MPI (a) shm: its defaults (on one host: ob1 + the vader shared-memory BTL with CMA
# single copy); (b) tcp: TCP over loopback only (ob1 with the tcp and self BTLs, pinned to lo).
MPI_SHM_ARGS=()
# shellcheck disable=SC2054  # "tcp,self" is one argument
MPI_TCP_ARGS=(--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo)
# Both: no binding, as loom-perf -np does not bind its ranks either (and Open MPI's default core
# binding would pin ranks onto cores that other work on a shared machine may be using).
MPI_COMMON=(--oversubscribe --bind-to none)
read -r -a MPI_EXTRA <<<"${LOOM_PEERS_EXTRA_MPI_ARGS:-}"
# MPICH (hydra): its default device and shared memory; no binding either.
MPICH_ARGS=(-bind-to none)
read -r -a MPICH_EXTRA <<<"${LOOM_PEERS_EXTRA_MPICH_ARGS:-}"

# Runs "$@" under timeout in its own process group; kills anything left in the group afterwards.
# Appends a manifest line. Never fails the script: failures are reported in the table.
bench_run() {
  local impl=$1 coll=$2 np=$3 lo=$4 hi=$5 f=$6 iters=$7 warm=$8 logf=$9
  shift 9
  local rc=0 t0 t1
  t0=$(date +%s.%N)
  timeout -k 10 "$RUN_TIMEOUT" "$@" >"$logf" 2>&1 &
  CURRENT_PGID=$!
  wait "$CURRENT_PGID" || rc=$?
  kill -KILL -- "-$CURRENT_PGID" 2>/dev/null || true
  CURRENT_PGID=""
  t1=$(date +%s.%N)
  if ((rc == 124 || rc == 137)); then
    log "  TIMEOUT after ${RUN_TIMEOUT}s: $impl $coll np=$np ($logf)"
  elif ((rc != 0)); then
    log "  FAILED rc=$rc: $impl $coll np=$np ($logf)"; tail -5 "$logf" | sed 's/^/    /' >&2
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f\n' "$impl" "$coll" "$np" "$lo" "$hi" "$f" \
    "$iters" "$warm" "$rc" "$logf" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b - a}')" \
    >>"$MANIFEST.$MODE"
}

START=$(date +%s)
echo "load_before=$(cut -d' ' -f1-3 /proc/loadavg)" >>"$META"
for MODE in $MODES; do
  : >"$MANIFEST.$MODE"
  if [[ "$MODE" == sweep ]]; then RUNS=("${SWEEP_LIST[@]}"); else RUNS=("${GROUPS_LIST[@]}"); fi
for np in $RANKS; do
  for coll in $CANON_COLLS; do
    log "$MODE: np=$np $coll (${ACTIVE[*]})"
    for g in "${RUNS[@]}"; do
      read -r lo hi f it wu <<<"$g"
      tag="${MODE}_${coll}_np${np}_${lo}-${hi}"
      args=(-b "$lo" -e "$hi" -f "$f" -n "$it" -w "$wu")
      for ((round = 1; round <= ROUNDS; round++)); do
        ((ROUNDS == 1)) || measure_bound
        for p in "${ACTIVE[@]}"; do
          logf="$RAW/${p}_$tag.log"
          ((ROUNDS == 1)) || logf="$RAW/${p}_${tag}_r$round.log"
          case "$p" in
            loom)
              bench_run loom "$coll" "$np" "$lo" "$hi" "$f" "$it" "$wu" "$logf" \
                "$LOOM_PERF" "$coll" -np "$np" "${args[@]}" -c 1 ;;
            loom-mem)
              bench_run loom-mem "$coll" "$np" "$lo" "$hi" "$f" "$it" "$wu" "$logf" \
                "$LOOM_PERF" "$coll" -np "$np" "${args[@]}" -c 1 -R 1 ;;
            ompi-shm)
              bench_run ompi-shm "$coll" "$np" "$lo" "$hi" "$f" "$it" "$wu" "$logf" \
                "$OMPI_MPIRUN" "${MPI_COMMON[@]}" -np "$np" "${MPI_SHM_ARGS[@]}" "${MPI_EXTRA[@]}" \
                "$BUILD_DIR/mpi_coll_bench.ompi" -c "$coll" "${args[@]}" ;;
            ompi-tcp)
              bench_run ompi-tcp "$coll" "$np" "$lo" "$hi" "$f" "$it" "$wu" "$logf" \
                "$OMPI_MPIRUN" "${MPI_COMMON[@]}" -np "$np" "${MPI_TCP_ARGS[@]}" "${MPI_EXTRA[@]}" \
                "$BUILD_DIR/mpi_coll_bench.ompi" -c "$coll" "${args[@]}" ;;
            mpich)
              bench_run mpich "$coll" "$np" "$lo" "$hi" "$f" "$it" "$wu" "$logf" \
                "$MPICH_MPIRUN" -np "$np" "${MPICH_ARGS[@]}" "${MPICH_EXTRA[@]}" \
                "$BUILD_DIR/mpi_coll_bench.mpich" -c "$coll" "${args[@]}" ;;
            gloo)
              bench_run gloo "$coll" "$np" "$lo" "$hi" "$f" "$it" "$wu" "$logf" \
                "$BUILD_DIR/gloo_coll_bench" -np "$np" -c "$coll" "${args[@]}" -T "$RUN_TIMEOUT" ;;
          esac
        done
      done
    done
  done
done
done
END=$(date +%s)
log "two cores handing data over through their caches (xcore_bw, after the runs)"
timeout -k 5 120 "$BUILD_DIR/xcore_bw" 5 >>"$RAW/xcore.log" || log "xcore_bw failed"
tail -1 "$RAW/xcore.log" >&2
{
  echo "load_after=$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "elapsed_s=$((END - START))"
} >>"$META"

status=0
nmodes=$(wc -w <<<"$MODES")
for MODE in $MODES; do
  out="$OUT"
  ((nmodes == 1)) || out="${OUT%.md}.$MODE.md"
  python3 "$SCRIPT_DIR/report.py" --meta "$META" --manifest "$MANIFEST.$MODE" \
    --memcpy "$RAW/memcpy.log" --membound "$RAW/membound.log" --mode "$MODE" --out "$out" ||
    status=$?
  # Pictures of each table (busbw against size, one line per implementation, the memory bound).
  if python3 -c "import matplotlib" 2>/dev/null; then
    for np in $RANKS; do
      for coll in $CANON_COLLS; do
        python3 "$REPO_DIR/tools/plot_results.py" "${out%.md}.csv" --collective "$coll" \
          --nranks "$np" --title "$coll, $np ranks ($MODE)" -o "${out%.md}.$coll.np$np" >&2 ||
          log "no plot of $coll np=$np ($MODE)"
      done
    done
  else
    log "matplotlib missing: no plots (python3 -m pip install matplotlib)"
  fi
done
if ((KEEP)); then
  log "raw logs kept in $WORK"
elif ((status == 0)); then
  rm -rf "$WORK"
fi
exit $status
