#!/usr/bin/env python3
"""Formats run_peers.sh's raw logs into one side-by-side table: Loom vs Open MPI (TCP, default).

Reads the manifest written by run_peers.sh (impl, collective, ranks, iters, warm-up, exit code,
log file, seconds per line), parses loom-perf's nccl-tests table (out-of-place columns) and
mpi_coll_bench's RESULT lines, prints the table to stdout and writes Markdown (--out) and CSV
(--out with a .csv suffix). Exit code: 0, or 1 when any run failed or any value was wrong.
"""
import argparse
import csv
import math
import os
import sys

IMPLS = ("loom", "ompi_tcp", "ompi_default")
COLL_ORDER = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "alltoall")
MPI_NAMES = {"allreduce": "all_reduce", "allgather": "all_gather",
             "reduce_scatter": "reduce_scatter", "broadcast": "broadcast", "alltoall": "alltoall"}


def bus_factor(coll, n):
    if coll == "all_reduce":
        return 2.0 * (n - 1) / n
    if coll == "broadcast":
        return 1.0
    return (n - 1) / n


def busbw(coll, n, size, time_us):
    """busbw in GB/s recomputed from the time, so that small sizes keep their digits."""
    if time_us <= 0 or size <= 0:
        return None
    return size / time_us / 1e3 * bus_factor(coll, n)


def parse_loom(path):
    rows = {}
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("#"):
                continue
            p = line.split()
            if len(p) < 13 or not p[0].isdigit():
                continue
            try:
                wrong = int(p[8]) if p[8].isdigit() else 0
                wrong_ip = int(p[12]) if p[12].isdigit() else 0
                rows[int(p[0])] = {"time_us": float(p[5]), "busbw_printed": float(p[7]),
                                   "wrong": wrong, "wrong_inplace": wrong_ip}
            except ValueError:
                continue
    return rows


def parse_mpi(path):
    rows = {}
    with open(path, errors="replace") as f:
        for line in f:
            if not line.startswith("RESULT "):
                continue
            kv = dict(tok.split("=", 1) for tok in line.split()[1:] if "=" in tok)
            rows[int(kv["bytes"])] = {"time_us": float(kv["time_us"]),
                                      "busbw_printed": float(kv["busbw"]),
                                      "wrong": int(kv.get("wrong", "0")), "wrong_inplace": 0}
    return rows


def human(size):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= div and size % div == 0:
            return f"{size // div}{unit}"
    return str(size)


def fmt_time(t):
    if t is None:
        return "-"
    return f"{t:.1f}" if t < 1e4 else f"{t:.0f}"


def fmt_bw(b):
    if b is None:
        return "-"
    return f"{b:.4f}" if b < 0.1 else f"{b:.3f}" if b < 10 else f"{b:.2f}"


def fmt_ratio(r):
    return "-" if r is None else f"{r:.2f}"


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--meta", required=True)
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--memcpy", required=True)
    ap.add_argument("--out", default="/tmp/loom-peers.md")
    args = ap.parse_args()

    meta = {}
    with open(args.meta) as f:
        for line in f:
            if "=" in line:
                k, v = line.rstrip("\n").split("=", 1)
                meta[k] = v
    memcpy = {}
    if os.path.exists(args.memcpy):
        with open(args.memcpy) as f:
            for line in f:
                if line.startswith("MEMCPY"):
                    memcpy = dict(t.split("=", 1) for t in line.split()[1:] if "=" in t)

    # data[(coll, np)][impl][size] = row
    data = {}
    failures = []
    iters_of = {}  # (coll, np, size) -> iters
    with open(args.manifest) as f:
        for line in f:
            impl, coll, np_, iters, warm, rc, logf, secs = line.rstrip("\n").split("\t")
            np_, rc = int(np_), int(rc)
            rows = parse_loom(logf) if impl == "loom" else parse_mpi(logf)
            if rc != 0:
                why = "timeout" if rc in (124, 137) else f"exit {rc}"
                failures.append(f"{impl} {coll} np={np_} ({why}): {logf}")
            d = data.setdefault((coll, np_), {i: {} for i in IMPLS})
            d[impl].update(rows)
            for s in rows:
                iters_of[(coll, np_, s)] = int(iters)

    header = ["size", "iters", "Loom us", "Loom busbw", "TCP us", "TCP busbw", "shm us",
              "shm busbw", "L/TCP", "L/shm", "wrong"]
    csv_rows = []
    text = []
    md = []
    summary = []
    total_wrong = 0

    def add_line(cells, widths):
        text.append("  ".join(str(c).rjust(w) for c, w in zip(cells, widths)))

    widths = [6, 5, 9, 10, 9, 9, 9, 9, 6, 6, 5]
    keys = sorted(data, key=lambda k: (k[1], COLL_ORDER.index(k[0]) if k[0] in COLL_ORDER else 9))
    for coll, n in keys:
        d = data[(coll, n)]
        sizes = sorted(set(d["loom"]) | set(d["ompi_tcp"]) | set(d["ompi_default"]))
        text.append("")
        text.append(f"== {coll}  np={n}  (float32 sum; busbw GB/s; ratio = Loom busbw / OMPI "
                    f"busbw, >1: Loom faster)")
        add_line(header, widths)
        md.append(f"\n### {coll}, {n} ranks\n")
        md.append("| " + " | ".join(header) + " |")
        md.append("|" + "|".join("---:" for _ in header) + "|")
        small_t, small_d, large_t, large_d = [], [], [], []
        peak = {i: 0.0 for i in IMPLS}
        for s in sizes:
            cells = {}
            for impl in IMPLS:
                r = d[impl].get(s)
                t = r["time_us"] if r else None
                b = busbw(coll, n, s, t) if r else None
                cells[impl] = (t, b)
                if b:
                    peak[impl] = max(peak[impl], b)
            lt, _ = cells["loom"]
            # Same bytes and factor on both sides: the busbw ratio is the inverse time ratio.
            r_tcp = (cells["ompi_tcp"][0] / lt) if lt and cells["ompi_tcp"][0] and s > 0 else None
            r_def = (cells["ompi_default"][0] / lt) if lt and cells["ompi_default"][0] and s > 0 \
                else None
            lr = d["loom"].get(s)
            wrong = (lr["wrong"] + lr["wrong_inplace"]) if lr else None
            mpi_wrong = sum(d[i][s]["wrong"] for i in ("ompi_tcp", "ompi_default")
                            if s in d[i] and d[i][s]["wrong"] > 0)
            total_wrong += (wrong or 0) + mpi_wrong
            wrong_cell = "-" if wrong is None else str(wrong)
            if mpi_wrong:
                wrong_cell += f" (mpi {mpi_wrong})"
            if s > 0 and s <= 64 << 10:
                small_t.append(r_tcp)
                small_d.append(r_def)
            if s >= 1 << 20:
                large_t.append(r_tcp)
                large_d.append(r_def)
            row = [human(s), iters_of.get((coll, n, s), "-"),
                   fmt_time(cells["loom"][0]), fmt_bw(cells["loom"][1]),
                   fmt_time(cells["ompi_tcp"][0]), fmt_bw(cells["ompi_tcp"][1]),
                   fmt_time(cells["ompi_default"][0]), fmt_bw(cells["ompi_default"][1]),
                   fmt_ratio(r_tcp), fmt_ratio(r_def), wrong_cell]
            add_line(row, widths)
            md.append("| " + " | ".join(str(c) for c in row) + " |")
            csv_rows.append({
                "collective": coll, "nranks": n, "bytes": s, "iters": iters_of.get((coll, n, s)),
                "loom_time_us": cells["loom"][0], "loom_busbw": cells["loom"][1],
                "ompi_tcp_time_us": cells["ompi_tcp"][0], "ompi_tcp_busbw": cells["ompi_tcp"][1],
                "ompi_default_time_us": cells["ompi_default"][0],
                "ompi_default_busbw": cells["ompi_default"][1],
                "ratio_loom_ompi_tcp": r_tcp, "ratio_loom_ompi_default": r_def,
                "loom_wrong": wrong, "mpi_wrong": mpi_wrong})
        summary.append([coll, n, fmt_ratio(geomean(small_t)), fmt_ratio(geomean(small_d)),
                        fmt_ratio(geomean(large_t)), fmt_ratio(geomean(large_d)),
                        fmt_bw(peak["loom"]), fmt_bw(peak["ompi_tcp"]),
                        fmt_bw(peak["ompi_default"])])

    sum_header = ["collective", "np", "L/TCP<=64K", "L/shm<=64K", "L/TCP>=1M", "L/shm>=1M",
                  "Loom peak", "TCP peak", "shm peak"]
    sw = [14, 3, 10, 10, 9, 9, 9, 8, 8]
    text.append("")
    text.append("== Summary (geometric mean of the busbw ratios; peak busbw GB/s)")
    add_line(sum_header, sw)
    for row in summary:
        add_line(row, sw)

    mc = memcpy.get("best_gbs", "?")
    head = [
        "Loom vs Open MPI peer benchmark",
        f"machine: {meta.get('cpu', '?')}; {meta.get('online_cpus', '?')} CPUs online "
        f"({meta.get('sockets', '?')} socket(s) x {meta.get('cores_per_socket', '?')} core(s) x "
        f"{meta.get('threads_per_core', '?')} thread(s)); {meta.get('mem', '?')}; "
        f"kernel {meta.get('kernel', '?')}",
        f"single-core memcpy (64 MiB, best of {memcpy.get('reps', '?')}): {mc} GB/s "
        f"(mean {memcpy.get('mean_gbs', '?')})",
        f"load average before: {meta.get('load_before', '?')}; after: "
        f"{meta.get('load_after', '?')}; elapsed {meta.get('elapsed_s', '?')} s",
        f"{meta.get('ompi', '?')}; loom {meta.get('loom_git', '?')} ({meta.get('loom_perf', '?')})",
        f"sizes {meta.get('sizes', '?')}; {meta.get('schedule', '?')}",
        "Loom = loom-perf -np N (TCP sockets, out-of-place); TCP = mpirun --mca pml ob1 "
        "--mca btl tcp,self --mca btl_tcp_if_include lo; shm = mpirun defaults (ob1 + vader/CMA); "
        "both mpirun with --oversubscribe --bind-to none",
    ]
    out = "\n".join(head + text)
    if failures:
        out += "\n\nFAILED RUNS:\n" + "\n".join("  " + f for f in failures)
    out += f"\n\nwrong values (Loom out-of-place + in-place, and MPI checks): {total_wrong}\n"
    print(out)

    mdtext = ["# Loom vs Open MPI peer benchmark", ""]
    mdtext += ["- " + h for h in head[1:]]
    mdtext.append("- ratio columns = Loom busbw / Open MPI busbw (>1: Loom faster)")
    mdtext += md
    mdtext += ["", "### Summary", "", "| " + " | ".join(sum_header) + " |",
               "|" + "|".join("---:" for _ in sum_header) + "|"]
    mdtext += ["| " + " | ".join(str(c) for c in r) + " |" for r in summary]
    if failures:
        mdtext += ["", "## Failed runs", ""] + ["- " + f for f in failures]
    mdtext += ["", f"Wrong values: {total_wrong}", ""]
    with open(args.out, "w") as f:
        f.write("\n".join(mdtext))
    csv_path = os.path.splitext(args.out)[0] + ".csv"
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(csv_rows[0].keys()) if csv_rows else ["none"])
        w.writeheader()
        w.writerows(csv_rows)
    print(f"wrote {args.out} and {csv_path}", file=sys.stderr)
    return 1 if failures or total_wrong else 0


if __name__ == "__main__":
    sys.exit(main())
