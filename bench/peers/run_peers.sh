#!/usr/bin/env bash
# Peer comparison: Loom (loom-perf -np N, TCP sockets) against Open MPI on the same machine, in
# the same run. See bench/peers/README.md.
#
#   bench/peers/run_peers.sh [-r "2 4"] [-c "all_reduce all_gather ..."] [-b 8] [-e 64M] [-f 4]
#                            [-n 20] [-w 5] [-L 4M] [-m 5] [-W 2] [-t 300] [-o /tmp/loom-peers.md]
#                            [-B build-dir] [-k]
#
# Environment: LOOM_PERF=/path/to/loom-perf (else it is built in <repo>/build-peers),
#              MPIRUN, MPICC, CXX to pick the tools; LOOM_PEERS_EXTRA_MPI_ARGS for extra mpirun
#              arguments given to both Open MPI configurations.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$SCRIPT_DIR/../.." && pwd)"

RANKS="2 4"
COLLS="all_reduce all_gather reduce_scatter broadcast alltoall"
MINB=8
MAXB=64M
FACTOR=4
ITERS=20
WARMUP=5
LARGE=4M        # above this size: fewer iterations (ITERS * LARGE / size, at least MIN_ITERS)
MIN_ITERS=5
LARGE_WARMUP=2
RUN_TIMEOUT=300 # seconds, each loom-perf / mpirun invocation
OUT=/tmp/loom-peers.md
BUILD_DIR=""
KEEP=0

usage() {
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  cat <<EOF
Options:
  -r RANKS    rank counts, space separated (default "$RANKS")
  -c COLLS    collectives (default "$COLLS")
  -b/-e/-f    min size, max size (K/M/G suffixes), step factor (default $MINB, $MAXB, $FACTOR);
              the max size is always measured, even off the geometric grid
  -n/-w       timed and warm-up iterations up to -L (default $ITERS, $WARMUP)
  -L SIZE     above SIZE use max(-m, n*SIZE/size) iterations and -W warm-ups (default $LARGE)
  -m/-W       minimum iterations / warm-ups for the large sizes (default $MIN_ITERS, $LARGE_WARMUP)
  -t SECS     timeout of each benchmark process (default $RUN_TIMEOUT)
  -o FILE     Markdown report (a .csv is written next to it; default $OUT)
  -B DIR      build directory for the two helper programs (default: a temporary directory)
  -k          keep the raw logs (they are always kept when something fails)
EOF
}

while getopts "r:c:b:e:f:n:w:L:m:W:t:o:B:kh" opt; do
  case "$opt" in
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
    t) RUN_TIMEOUT="$OPTARG" ;;
    o) OUT="$OPTARG" ;;
    B) BUILD_DIR="$OPTARG" ;;
    k) KEEP=1 ;;
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

MINB_B=$(to_bytes "$MINB")
MAXB_B=$(to_bytes "$MAXB")
LARGE_B=$(to_bytes "$LARGE")
for v in "$FACTOR" "$ITERS" "$WARMUP" "$MIN_ITERS" "$LARGE_WARMUP" "$RUN_TIMEOUT"; do
  [[ "$v" =~ ^[0-9]+$ ]] || die "'$v' is not a non-negative integer"
done
((FACTOR >= 2)) || die "-f must be at least 2"
((ITERS >= 1 && MIN_ITERS >= 1)) || die "-n and -m must be at least 1"
((MINB_B >= 1 && MINB_B <= MAXB_B)) || die "need 1 <= min size <= max size"
for r in $RANKS; do [[ "$r" =~ ^[0-9]+$ ]] && ((r >= 1)) || die "bad rank count '$r'"; done
CANON_COLLS=""
for c in $COLLS; do CANON_COLLS+="$(canon_coll "$c") "; done

# ---- tools ---------------------------------------------------------------------------------
MPIRUN="${MPIRUN:-mpirun}"
MPICC="${MPICC:-mpicc}"
CXX="${CXX:-g++}"
command -v "$MPIRUN" >/dev/null 2>&1 || die "mpirun not found. Install Open MPI 4.1:
  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y openmpi-bin libopenmpi-dev
(or set MPIRUN=/path/to/mpirun)"
command -v "$MPICC" >/dev/null 2>&1 || die "mpicc not found (apt-get install -y libopenmpi-dev, or set MPICC)"
command -v "$CXX" >/dev/null 2>&1 || die "$CXX not found (apt-get install -y g++, or set CXX)"
command -v python3 >/dev/null 2>&1 || die "python3 not found (apt-get install -y python3)"
command -v timeout >/dev/null 2>&1 || die "timeout (coreutils) not found"
"$MPIRUN" --version 2>/dev/null | grep -q "Open MPI" || die "$MPIRUN is not Open MPI's mpirun"

if [[ -z "$BUILD_DIR" ]]; then
  BUILD_DIR="$(mktemp -d /tmp/loom-peers-build.XXXXXX)"
fi
mkdir -p "$BUILD_DIR"
WORK="$(mktemp -d /tmp/loom-peers-run.XXXXXX)"
RAW="$WORK/raw"
mkdir -p "$RAW"
MANIFEST="$WORK/manifest.tsv"
: >"$MANIFEST"

CURRENT_PGID=""
cleanup() {
  local rc=$?
  if [[ -n "$CURRENT_PGID" ]]; then kill -KILL -- "-$CURRENT_PGID" 2>/dev/null || true; fi
  if ((rc != 0)); then log "raw logs kept in $WORK"; fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "building mpi_coll_bench and memcpy_bw in $BUILD_DIR"
"$MPICC" -O2 -Wall -o "$BUILD_DIR/mpi_coll_bench" "$SCRIPT_DIR/mpi_coll_bench.c"
"$CXX" -O2 -Wall -o "$BUILD_DIR/memcpy_bw" "$SCRIPT_DIR/memcpy_bw.cc"

if [[ -z "${LOOM_PERF:-}" ]]; then
  LOOM_BUILD="$REPO_DIR/build-peers"
  log "LOOM_PERF not set: building loom-perf in $LOOM_BUILD (Release)"
  cmake -S "$REPO_DIR" -B "$LOOM_BUILD" -DLOOM_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
  make -C "$LOOM_BUILD" -j2 loom-perf >/dev/null
  LOOM_PERF="$LOOM_BUILD/tools/perf/loom-perf"
fi
[[ -x "$LOOM_PERF" ]] || die "loom-perf not found or not executable: $LOOM_PERF"

# ---- machine -------------------------------------------------------------------------------
META="$WORK/meta.txt"
{
  echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host=$(hostname -s 2>/dev/null || hostname)"
  echo "cpu=$(grep -m1 '^model name' /proc/cpuinfo | sed 's/^[^:]*: *//')"
  echo "logical_cpus=$(nproc --all)"
  echo "online_cpus=$(nproc)"
  if command -v lscpu >/dev/null 2>&1; then
    echo "cores_per_socket=$(lscpu | awk -F: '/^Core\(s\) per socket/{gsub(/ /,"",$2);print $2}')"
    echo "sockets=$(lscpu | awk -F: '/^Socket\(s\)/{gsub(/ /,"",$2);print $2}')"
    echo "threads_per_core=$(lscpu | awk -F: '/^Thread\(s\) per core/{gsub(/ /,"",$2);print $2}')"
  fi
  echo "mem=$(awk '/MemTotal/{printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
  echo "kernel=$(uname -r)"
  echo "ompi=$("$MPIRUN" --version 2>/dev/null | head -1)"
  echo "loom_perf=$LOOM_PERF"
  echo "loom_git=$(git -C "$REPO_DIR" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$REPO_DIR" diff --quiet 2>/dev/null || echo '+dirty')"
  echo "load_before=$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "ranks=$RANKS"
  echo "colls=$CANON_COLLS"
  echo "sizes=$MINB..$MAXB x$FACTOR"
  echo "schedule=$ITERS iters, $WARMUP warm-up; above $LARGE: max($MIN_ITERS, $ITERS*$LARGE/size) iters, $LARGE_WARMUP warmup"
} >"$META"

log "memcpy bandwidth (64 MiB, best of 10)"
timeout -k 5 60 "$BUILD_DIR/memcpy_bw" 64 10 >"$RAW/memcpy.log"
cat "$RAW/memcpy.log" >&2

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

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# (a) TCP over loopback only: Open MPI's ob1 with the tcp and self BTLs, pinned to lo.
MPI_TCP_ARGS=(--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo)
# (b) Open MPI's defaults (on one host: ob1 + vader shared memory with CMA single copy).
MPI_DEF_ARGS=()
# Both: no binding, as loom-perf -np does not bind its ranks either (and Open MPI's default
# core binding would pin ranks onto cores that other work on a shared machine may be using).
MPI_COMMON=(--oversubscribe --bind-to none)
read -r -a MPI_EXTRA <<<"${LOOM_PEERS_EXTRA_MPI_ARGS:-}"

# Runs "$@" under timeout in its own process group; kills anything left in the group afterwards.
# Appends a manifest line. Never fails the script: failures are reported in the table.
bench_run() {
  local impl=$1 coll=$2 np=$3 iters=$4 warm=$5 logf=$6
  shift 6
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
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f\n' "$impl" "$coll" "$np" "$iters" "$warm" "$rc" \
    "$logf" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b - a}')" >>"$MANIFEST"
}

START=$(date +%s)
for np in $RANKS; do
  for coll in $CANON_COLLS; do
    log "np=$np $coll"
    for g in "${GROUPS_LIST[@]}"; do
      read -r lo hi f it wu <<<"$g"
      tag="${coll}_np${np}_${lo}-${hi}"
      bench_run loom "$coll" "$np" "$it" "$wu" "$RAW/loom_$tag.log" \
        "$LOOM_PERF" "$coll" -np "$np" -b "$lo" -e "$hi" -f "$f" -n "$it" -w "$wu" -c 1
      bench_run ompi_tcp "$coll" "$np" "$it" "$wu" "$RAW/ompi_tcp_$tag.log" \
        "$MPIRUN" "${MPI_COMMON[@]}" -np "$np" "${MPI_TCP_ARGS[@]}" "${MPI_EXTRA[@]}" \
        "$BUILD_DIR/mpi_coll_bench" -c "$coll" -b "$lo" -e "$hi" -f "$f" -n "$it" -w "$wu"
      bench_run ompi_default "$coll" "$np" "$it" "$wu" "$RAW/ompi_default_$tag.log" \
        "$MPIRUN" "${MPI_COMMON[@]}" -np "$np" "${MPI_DEF_ARGS[@]}" "${MPI_EXTRA[@]}" \
        "$BUILD_DIR/mpi_coll_bench" -c "$coll" -b "$lo" -e "$hi" -f "$f" -n "$it" -w "$wu"
    done
  done
done
END=$(date +%s)
{
  echo "load_after=$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "elapsed_s=$((END - START))"
} >>"$META"

status=0
python3 "$SCRIPT_DIR/report.py" --meta "$META" --manifest "$MANIFEST" \
  --memcpy "$RAW/memcpy.log" --out "$OUT" || status=$?
if ((KEEP)); then
  log "raw logs kept in $WORK"
elif ((status == 0)); then
  rm -rf "$WORK"
fi
exit $status
