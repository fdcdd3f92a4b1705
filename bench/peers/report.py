#!/usr/bin/env python3
"""Formats run_peers.sh's raw logs into side-by-side tables: Loom vs Open MPI (shm, TCP), MPICH
and Gloo, one table per (collective, rank count), a summary, and a "targets" section.

Reads the manifest written by run_peers.sh (impl, collective, ranks, min size, max size, factor,
iters, warm-up, exit code, log file, seconds per line), parses loom-perf's nccl-tests table
(out-of-place columns) and the RESULT lines of mpi_coll_bench / gloo_coll_bench, prints the report
to stdout and writes Markdown (--out), CSV (--out with a .csv suffix) and the targets as CSV
(.targets.csv). A cell is "fail" when its run failed or timed out without a result for that size,
"n/a" when the library has no such collective. Exit code: 0, or 1 when any run failed, any result
is missing or any value was wrong (the report is written anyway).
"""
import argparse
import csv
import math
import os
import sys

ALL_IMPLS = ("loom", "loom-mem", "ompi-shm", "ompi-tcp", "mpich", "gloo")
LABEL = {"loom": "Loom", "loom-mem": "Loom-mem", "ompi-shm": "OMPI-shm", "ompi-tcp": "OMPI-tcp",
         "mpich": "MPICH", "gloo": "Gloo"}
DESC = {"loom": "Loom = loom-perf -np N (out-of-place columns)",
        "loom-mem": "Loom-mem = loom-perf -np N -R 1: buffers from loomMemAlloc, which peers on "
                    "the host map (as nccl-tests -R uses ncclMemAlloc)",
        "ompi-shm": "OMPI-shm = Open MPI defaults (ob1 + vader/CMA), --oversubscribe --bind-to none",
        "ompi-tcp": "OMPI-tcp = Open MPI --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include "
                    "lo --oversubscribe --bind-to none",
        "mpich": "MPICH = mpirun.mpich -bind-to none (its default device)",
        "gloo": "Gloo = gloo_coll_bench (gloo::allreduce etc.), TCP over loopback"}
COLL_ORDER = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "alltoall")
KIB, MIB = 1 << 10, 1 << 20


def bus_factor(coll, n):
    if coll == "all_reduce":
        return 2.0 * (n - 1) / n
    if coll == "broadcast":
        return 1.0
    return (n - 1) / n


def traffic_factor(coll, n):
    """Bytes every rank together must at least read and write in memory per byte of the size
    nccl-tests reports (its algbw's numerator): AllReduce reads the n inputs and writes the n
    outputs; AllGather and AllToAll write n outputs of the size, each read from somewhere;
    ReduceScatter reads n inputs and writes n slices; Broadcast copies the root's buffer to the
    n - 1 others."""
    if coll == "reduce_scatter":
        return n + 1.0
    if coll == "broadcast":
        return 2.0 * max(1, n - 1)
    return 2.0 * n


def bound_busbw(coll, n, traffic_gbs):
    """The busbw a collective reaches when it moves only the bytes it must at the machine's
    streaming bandwidth (all cores, reads plus writes)."""
    if not traffic_gbs:
        return None
    return traffic_gbs / traffic_factor(coll, n) * bus_factor(coll, n)


def busbw(coll, n, size, time_us):
    """busbw in GB/s recomputed from the time, so that small sizes keep their digits."""
    if time_us is None or time_us <= 0 or size <= 0:
        return None
    return size / time_us / 1e3 * bus_factor(coll, n)


def row_size(coll, n, req):
    """The size a tool reports for a requested size (nccl-tests: the gathering collectives use a
    per-rank count of bytes / 4 / n rounded down to 16 bytes)."""
    if coll in ("all_gather", "reduce_scatter", "alltoall"):
        return (req // 4 // n) // 4 * 4 * n * 4
    return req // 4 * 4


def geometric(lo, hi, f):
    s, out = lo, []
    while s <= hi:
        out.append(s)
        if s > hi // f:
            break
        s *= f
    return out


def parse_loom(path):
    rows = {}
    try:
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
                    rows[int(p[0])] = {"time_us": float(p[5]), "wrong": wrong + wrong_ip}
                except ValueError:
                    continue
    except OSError:
        pass
    return rows, False


def parse_result_lines(path):
    """mpi_coll_bench and gloo_coll_bench: 'RESULT k=v ...' lines; 'UNSUPPORTED ...' = n/a."""
    rows, unsupported = {}, False
    try:
        with open(path, errors="replace") as f:
            for line in f:
                if line.startswith("UNSUPPORTED"):
                    unsupported = True
                if not line.startswith("RESULT "):
                    continue
                kv = dict(tok.split("=", 1) for tok in line.split()[1:] if "=" in tok)
                try:
                    rows[int(kv["bytes"])] = {"time_us": float(kv["time_us"]),
                                              "wrong": max(0, int(kv.get("wrong", "0")))}
                except (KeyError, ValueError):
                    continue
    except OSError:
        pass
    return rows, unsupported


def read_memcpy(path, key="best_gbs"):
    """The key=value fields of memcpy_bw's MEMCPY line ({} without one); of several (the bound
    measured again in every round), the one of the highest `key`, with `measurements` added."""
    if not path or not os.path.exists(path):
        return {}
    lines = []
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("MEMCPY"):
                lines.append(dict(t.split("=", 1) for t in line.split()[1:] if "=" in t))
    if not lines:
        return {}
    best = max(lines, key=lambda d: number(d.get(key)) or 0.0)
    best["measurements"] = str(len(lines))
    return best


def bound_note(membound):
    """How the memory bound was measured: once, or the best of several (one per round)."""
    k = int(membound.get("measurements", "1"))
    return "measured once" if k == 1 else (f"the best of {k} measurements, one before the runs "
                                           "and one in every round of every invocation")


def number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def human(size):
    for unit, div in (("G", 1 << 30), ("M", MIB), ("K", KIB)):
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
    if b < 0.001:
        return f"{b:.2e}"  # keeps digits where 4 decimals would print 0.0000
    return f"{b:.4f}" if b < 0.1 else f"{b:.3f}" if b < 10 else f"{b:.2f}"


def fmt_ratio(r):
    return "-" if r is None else f"{r:.2f}"


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def busy_warning(meta):
    """A line when the machine was already busy before the run: other load turns polling ranks'
    waits into scheduler ticks (multiples of ~4 ms at small sizes) for every library."""
    try:
        load = float(meta.get("load_before", "").split()[0])
        cpus = int(meta.get("online_cpus", "0"))
    except (ValueError, IndexError):
        return ""
    if cpus <= 0 or load <= max(0.5, 0.25 * cpus):
        return ""
    return (f"WARNING: load average {load:.2f} on {cpus} CPUs before the run: other work competed "
            f"with the ranks; small-size times may be scheduler ticks (~4 ms). Repeat on a quiet "
            f"machine before trusting the targets.")


class Cell:
    """One library at one size: a measurement, or a status ('fail', 'n/a', '-')."""

    def __init__(self, time_us=None, bw=None, status=None, wrong=0):
        self.time_us, self.bw, self.status, self.wrong = time_us, bw, status, wrong

    def t(self):
        return self.status if self.status else fmt_time(self.time_us)

    def b(self):
        return self.status if self.status else fmt_bw(self.bw)


def render(header, rows, left=0):
    """Text table (the first `left` columns left-aligned, the rest right-aligned) and Markdown
    table lines."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    text = ["  ".join(str(c).ljust(w) if k < left else str(c).rjust(w)
                      for k, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in [header] + rows]
    md = ["| " + " | ".join(str(c) for c in header) + " |",
          "|" + "|".join(":---" if k < left else "---:" for k in range(len(header))) + "|"]
    md += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return text, md


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--meta", required=True)
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--memcpy", required=True)
    ap.add_argument("--out", default="/tmp/loom-peers.md")
    ap.add_argument("--membound", help="memcpy_bw's log with every core copying at once: the "
                    "machine's streaming bandwidth, from which each collective's memory bound")
    ap.add_argument("--mode", default="", help="how the sizes ran, for the titles (sweep: one "
                    "call from the smallest to the largest size, as nccl-tests users run it; "
                    "alone: each large size in a call of its own, cache-warm)")
    ap.add_argument("--ratio-target", type=float,
                    default=float(os.environ.get("LOOM_PEERS_RATIO_TARGET", "1.0")),
                    help="scales the issue's ratio targets (T1 2x Open MPI, T2 5x Gloo, T3/T4 1x); "
                         "default 1.0")
    ap.add_argument("--memcpy-target", type=float,
                    default=float(os.environ.get("LOOM_PEERS_MEMCPY_TARGET", "0.5")),
                    help="the 16 MiB target passes when Loom's busbw / memcpy bandwidth is >= "
                         "this for every collective and rank count (default 0.5)")
    args = ap.parse_args()

    meta = {}
    if os.path.exists(args.meta):
        with open(args.meta, errors="replace") as f:
            for line in f:
                if "=" in line:
                    k, v = line.rstrip("\n").split("=", 1)
                    meta[k] = v
    memcpy = read_memcpy(args.memcpy)
    memcpy_gbs = number(memcpy.get("best_gbs"))
    membound = read_memcpy(args.membound, "traffic_gbs")
    traffic_gbs = number(membound.get("traffic_gbs"))

    # data[(coll, n)][impl][size] = row; expect[(coll, n)][impl][size] = (rc, unsupported, log)
    data, expect, iters_of = {}, {}, {}
    failures = []
    seen_impls = []
    if os.path.exists(args.manifest):
        with open(args.manifest, errors="replace") as f:
            for line in f:
                p = line.rstrip("\n").split("\t")
                if len(p) < 11:
                    continue
                impl, coll, np_, lo, hi, fac, iters, _warm, rc, logf = p[:10]
                try:
                    n, lo, hi, fac, rc = int(np_), int(lo), int(hi), int(fac), int(rc)
                except ValueError:
                    continue
                if impl not in seen_impls:
                    seen_impls.append(impl)
                rows, unsup = (parse_loom(logf) if impl.startswith("loom") else
                               parse_result_lines(logf))
                if rc != 0:
                    why = "timeout" if rc in (124, 137) else f"exit {rc}"
                    failures.append(f"{impl} {coll} np={n} sizes {human(lo)}..{human(hi)} "
                                    f"({why}): {logf}")
                # Rounds (run_peers.sh -N): each size's best time; a wrong value in any round
                # stays counted.
                have = data.setdefault((coll, n), {}).setdefault(impl, {})
                for s, r in rows.items():
                    old = have.get(s)
                    if old is None:
                        have[s] = r
                        continue
                    best = dict(r if r["time_us"] < old["time_us"] else old)
                    best["wrong"] = old["wrong"] + r["wrong"]
                    have[s] = best
                ex = expect.setdefault((coll, n), {}).setdefault(impl, {})
                for req in geometric(lo, hi, fac):
                    s = row_size(coll, n, req)
                    ex[s] = (rc, unsup, logf)
                    iters_of[(coll, n, s)] = iters
                for s in rows:
                    iters_of[(coll, n, s)] = iters

    if not seen_impls:
        failures.append(f"no benchmark run in {args.manifest}")
    peers_meta = meta.get("peers", "").split()
    impls = [i for i in ALL_IMPLS if i in peers_meta or i in seen_impls]
    others = [i for i in impls if i != "loom"]
    has_loom = "loom" in impls
    skipped = [s.strip() for s in meta.get("skipped", "").split(";") if s.strip()]

    def cell(coll, n, impl, s):
        r = data.get((coll, n), {}).get(impl, {}).get(s)
        if r is not None:
            return Cell(r["time_us"], busbw(coll, n, s, r["time_us"]), wrong=r["wrong"])
        ex = expect.get((coll, n), {}).get(impl, {}).get(s)
        if ex is None:
            return Cell(status="-")
        rc, unsup, logf = ex
        if unsup:
            return Cell(status="n/a")
        if rc == 0:
            failures.append(f"{impl} {coll} np={n}: no result for size {human(s)}: {logf}")
        return Cell(status="fail")

    def ratio(lc, pc, s):
        """Loom busbw / peer busbw = peer time / Loom time (same bytes, same factor)."""
        if s <= 0 or lc.time_us is None or pc.time_us is None or lc.time_us <= 0:
            return None
        return pc.time_us / lc.time_us

    # cells[(coll, n)][size][impl] = Cell
    cells = {}
    keys = sorted(set(data) | set(expect),
                  key=lambda k: (k[1], COLL_ORDER.index(k[0]) if k[0] in COLL_ORDER else 9, k[0]))
    for key in keys:
        coll, n = key
        sizes = set()
        for impl in impls:
            sizes |= set(data.get(key, {}).get(impl, {}))
            sizes |= set(expect.get(key, {}).get(impl, {}))
        cells[key] = {s: {i: cell(coll, n, i, s) for i in impls} for s in sorted(sizes)}

    text, md, csv_rows, summary = [], [], [], []
    total_wrong = 0
    ratio_note = ("L/x = Loom busbw / x busbw = x time / Loom time; > 1: Loom faster"
                  if has_loom and others else "")
    for key in keys:
        coll, n = key
        header = ["size", "iters"]
        for i in impls:
            header += [f"{LABEL[i]} us", f"{LABEL[i]} GB/s"]
        if has_loom:
            header += [f"L/{LABEL[i]}" for i in others]
        bound = bound_busbw(coll, n, traffic_gbs)
        if bound:
            header += [f"{LABEL[i]}/mem" for i in impls]
        header.append("wrong")
        rows = []
        small = {i: [] for i in others}
        large = {i: [] for i in others}
        near = {i: [] for i in impls}
        peak = {i: None for i in impls}
        for s, cs in cells[key].items():
            row = [human(s), iters_of.get((coll, n, s), "-")]
            for i in impls:
                row += [cs[i].t(), cs[i].b()]
                if cs[i].bw is not None:
                    peak[i] = max(peak[i] or 0.0, cs[i].bw)
            rat = {}
            if has_loom:
                for i in others:
                    rat[i] = ratio(cs["loom"], cs[i], s)
                    row.append(fmt_ratio(rat[i]))
                    if 0 < s <= 64 * KIB:
                        small[i].append(rat[i])
                    if s >= MIB:
                        large[i].append(rat[i])
            frac = {}
            if bound:
                for i in impls:
                    frac[i] = cs[i].bw / bound if cs[i].bw is not None else None
                    row.append(cs[i].status if cs[i].status else fmt_ratio(frac[i]))
                    if s >= MIB and frac[i] is not None:
                        near[i].append(frac[i])
            bad = {i: cs[i].wrong for i in impls if cs[i].wrong}
            total_wrong += sum(bad.values())
            if all(cs[i].time_us is None for i in impls):
                row.append("-")
            else:
                row.append(" ".join(f"{LABEL[i]}:{w}" for i, w in bad.items()) if bad else "0")
            rows.append(row)
            rec = {"collective": coll, "nranks": n, "bytes": s,
                   "iters": iters_of.get((coll, n, s))}
            for i in impls:
                c = cs[i]
                rec[f"{i}_time_us"] = c.time_us if c.status is None else c.status
                rec[f"{i}_busbw"] = c.bw if c.status is None else c.status
                rec[f"{i}_wrong"] = c.wrong
            for i in rat:
                rec[f"ratio_loom_{i}"] = rat[i]
            if bound:
                rec["mem_bound_busbw"] = bound
                for i in frac:
                    rec[f"{i}_of_mem_bound"] = frac[i]
            if args.mode:
                rec["mode"] = args.mode
            csv_rows.append(rec)
        t, m = render(header, rows)
        title = (f"{coll}  np={n}{'  [' + args.mode + ']' if args.mode else ''}  (float32 sum; "
                 f"time us, busbw GB/s" +
                 (f"; x/mem = busbw / memory bound {bound:.2f} GB/s" if bound else ""))
        text += ["", f"== {title}{'; ' + ratio_note if ratio_note else ''})"] + t
        md += ["", f"### {coll}, {n} ranks", ""] + m
        srow = [coll, n]
        if has_loom:
            for i in others:
                srow += [fmt_ratio(geomean(small[i])), fmt_ratio(geomean(large[i]))]
        srow += [fmt_bw(peak[i]) for i in impls]
        if traffic_gbs:
            srow += [fmt_bw(bound)] + [fmt_ratio(geomean(near[i])) for i in impls]
        summary.append(srow)

    sum_header = ["collective", "np"]
    if has_loom:
        for i in others:
            sum_header += [f"L/{LABEL[i]} <=64K", f"L/{LABEL[i]} >=1M"]
    sum_header += [f"{LABEL[i]} peak" for i in impls]
    if traffic_gbs:
        sum_header += ["mem bound"] + [f"{LABEL[i]}/mem >=1M" for i in impls]
    st, sm = render(sum_header, summary, left=1) if summary else ([], [])
    text += ["", "== Summary (geometric mean of the ratios over the sizes <= 64 KiB and >= 1 MiB; "
             "peak busbw GB/s)"] + st
    md += ["", "### Summary", "", "Geometric mean of the L/x ratios over the sizes <= 64 KiB and "
           ">= 1 MiB; peak busbw in GB/s.", ""] + sm

    # ---- targets ------------------------------------------------------------------------------
    rt, mt = args.ratio_target, args.memcpy_target
    ttext = ["", f"== Targets (ratio = Loom busbw / peer busbw = peer time / Loom time; PASS: "
                 f"min ratio >= {rt:.2f}; INCOMPLETE: a size without both numbers)"]
    tmd = ["", "## Targets", "",
           f"Ratio = Loom busbw / peer busbw = peer time / Loom time (> 1: Loom faster). PASS when "
           f"the min ratio over the sizes is >= {rt:.2f}; INCOMPLETE when a size lacks a number.",
           ""]
    tsum, tcsv = [], []
    big = 1 << 62

    def verdict(vals, thr):
        got = [(v, s) for s, v in vals if v is not None]
        if not vals:
            return None, None, "n/a (no data)"
        if not got:
            return None, None, "INCOMPLETE (no size with both numbers)"
        mn, at = min(got)
        if mn < thr:
            return mn, at, "FAIL"
        if len(got) < len(vals):
            return mn, at, "INCOMPLETE"
        return mn, at, "PASS"

    def ratio_target(name, coll, n, peer, lo, hi, latency, thr, lead="loom"):
        key = (coll, n)
        if lead not in impls or peer not in impls or key not in cells:
            why = ("not run" if lead not in impls or peer not in impls
                   else f"{coll} np={n} not run")
            tsum.append([name, "-", "-", "-", f"n/a ({why})"])
            return
        sizes = [s for s in cells[key] if s > 0 and lo <= s <= hi]
        vals, rows = [], []
        for s in sizes:
            lc, pc = cells[key][s][lead], cells[key][s][peer]
            r = ratio(lc, pc, s)
            vals.append((s, r))
            if latency:
                rows.append([human(s), lc.t(), pc.t(), fmt_ratio(r)])
            else:
                rows.append([human(s), lc.b(), pc.b(), fmt_ratio(r)])
            tcsv.append({"target": name, "collective": coll, "nranks": n, "bytes": s,
                         "peer": peer, "loom": lc.time_us if latency else lc.bw,
                         "peer_value": pc.time_us if latency else pc.bw, "ratio": r})
        mn, at, word = verdict(vals, thr)
        word += f" (needs >= {thr:g})"
        if sizes and hi < big and (sizes[-1] < hi or sizes[0] >= 2 * lo):
            word += f" (partial: {human(lo)}..{human(hi)} not covered by this run)"
        unit = "us" if latency else "GB/s"
        ll = LABEL[lead]
        hdr = ["size", f"{ll} {unit}", f"{LABEL[peer]} {unit}",
               f"{LABEL[peer]} us / {ll} us" if latency else f"{ll} / {LABEL[peer]}"]
        t, m = render(hdr, rows) if rows else ([], [])
        rng = f"{human(sizes[0])}..{human(sizes[-1])}" if sizes else "no sizes"
        line = (f"min ratio {fmt_ratio(mn)}" + (f" at {human(at)}" if at is not None else "") +
                f": {word}")
        ttext.extend(["", f"{name}  [{rng}, {len(sizes)} sizes]"] + t + [line])
        tmd.extend(["", f"**{name}** ({rng}, {len(sizes)} sizes)", ""] + m + ["", line])
        tsum.append([name, rng, fmt_ratio(mn), human(at) if at is not None else "-", word])

    # The targets: 2x Open MPI and 5x Gloo at 2 ranks from 1 MiB; no slower than Open MPI
    # at 8 B..1 KiB (2 ranks) and at every size (4 ranks). --ratio-target scales none of them.
    ratio_target("T1 all_reduce 2 ranks busbw, Loom vs Open MPI shm, 1 MiB..64 MiB",
                 "all_reduce", 2, "ompi-shm", MIB, 64 * MIB, False, 2.0 * rt)
    ratio_target("T2 all_reduce 2 ranks busbw, Loom vs Gloo, 1 MiB..64 MiB",
                 "all_reduce", 2, "gloo", MIB, 64 * MIB, False, 5.0 * rt)
    ratio_target("T3 all_reduce 2 ranks latency, Loom vs Open MPI shm, 8 B..1 KiB",
                 "all_reduce", 2, "ompi-shm", 8, KIB, True, 1.0 * rt)
    ratio_target("T4 all_reduce 4 ranks busbw, Loom vs Open MPI shm, every size",
                 "all_reduce", 4, "ompi-shm", 1, big, False, 1.0 * rt)
    # The same with Loom's buffers from loomMemAlloc (one pass over mapped buffers).
    if "loom-mem" in impls:
        ratio_target("T1m all_reduce 2 ranks busbw, Loom-mem vs Open MPI shm, 1 MiB..64 MiB",
                     "all_reduce", 2, "ompi-shm", MIB, 64 * MIB, False, 2.0 * rt, "loom-mem")
        ratio_target("T2m all_reduce 2 ranks busbw, Loom-mem vs Gloo, 1 MiB..64 MiB",
                     "all_reduce", 2, "gloo", MIB, 64 * MIB, False, 5.0 * rt, "loom-mem")
        ratio_target("T4m all_reduce 4 ranks busbw, Loom-mem vs Open MPI shm, every size",
                     "all_reduce", 4, "ompi-shm", 1, big, False, 1.0 * rt, "loom-mem")

    # T5: busbw at 16 MiB / memcpy, every collective and rank count.
    name5 = "T5 busbw at 16 MiB / single-core memcpy bandwidth, every collective"
    rows5, vals5 = [], []
    for key in keys:
        coll, n = key
        s16 = row_size(coll, n, 16 * MIB)
        cs = cells[key].get(s16)
        if cs is None:
            continue
        row = [coll, n]
        for i in impls:
            c = cs[i]
            frac = c.bw / memcpy_gbs if c.bw is not None and memcpy_gbs else None
            row.append(c.status if c.status else fmt_ratio(frac))
            tcsv.append({"target": name5, "collective": coll, "nranks": n, "bytes": s16,
                         "peer": i, "loom": None, "peer_value": c.bw, "ratio": frac})
            if i == "loom":
                vals5.append((f"{coll} np={n}", frac))
        rows5.append(row)
    if not has_loom or not rows5 or not memcpy_gbs:
        why = ("memcpy bandwidth missing" if not memcpy_gbs else
               "Loom not run" if not has_loom else "16 MiB not measured")
        tsum.append([name5, "-", "-", "-", f"n/a ({why})"])
    else:
        mn, at, word = verdict(vals5, mt)
        hdr = ["collective", "np"] + [LABEL[i] for i in impls]
        t, m = render(hdr, rows5, left=1)
        line = (f"min Loom fraction {fmt_ratio(mn)}" + (f" ({at})" if at else "") +
                f": {word} (PASS: Loom busbw >= {mt:.2f} x memcpy {memcpy_gbs:.2f} GB/s)")
        ttext.extend(["", f"{name5}  [memcpy {memcpy_gbs:.2f} GB/s; cells = busbw / memcpy]"] +
                     t + [line])
        tmd.extend(["", f"**{name5}** (memcpy {memcpy_gbs:.2f} GB/s; cells = busbw / memcpy)", ""]
                   + m + ["", line])
        tsum.append([name5, f"{len(rows5)} rows", fmt_ratio(mn), at or "-",
                     f"{word} (threshold {mt:.2f})"])

    t, m = render(["target", "sizes", "min ratio", "at", "result"], tsum, left=1)
    ttext += ["", "Targets summary"] + t
    tmd += ["", "### Targets summary", ""] + m

    # T6: the memory target: all_reduce at 2 ranks, 1 MiB to 64 MiB, Loom's busbw at least
    # 0.8 of the memory bound (what the cores' streaming bandwidth allows).
    name6 = "T6 all_reduce 2 ranks busbw / memory bound, 1 MiB..64 MiB"
    key6 = ("all_reduce", 2)
    bound6 = bound_busbw("all_reduce", 2, traffic_gbs)
    if not has_loom or key6 not in cells or not bound6:
        why = ("memory bound not measured" if not bound6 else
               "Loom not run" if not has_loom else "all_reduce np=2 not run")
        tsum.append([name6, "-", "-", "-", f"n/a ({why})"])
    else:
        vals6, rows6 = [], []
        for sz, cs in cells[key6].items():
            if MIB <= sz <= 64 * MIB:
                c = cs["loom"]
                frac = c.bw / bound6 if c.bw is not None else None
                vals6.append((sz, frac))
                rows6.append([human(sz), c.b(), fmt_bw(bound6), fmt_ratio(frac)])
                tcsv.append({"target": name6, "collective": "all_reduce", "nranks": 2,
                             "bytes": sz, "peer": "memory", "loom": c.bw,
                             "peer_value": bound6, "ratio": frac})
        mn, at, word = verdict(vals6, 0.8 * rt)
        t, m = render(["size", "Loom GB/s", "bound GB/s", "Loom / bound"], rows6)
        line = (f"min fraction {fmt_ratio(mn)}" + (f" at {human(at)}" if at is not None else "") +
                f": {word} (needs >= {0.8 * rt:g})")
        ttext.extend(["", f"{name6}  [bound {bound6:.2f} GB/s]"] + t + [line])
        tmd.extend(["", f"**{name6}** (bound {bound6:.2f} GB/s)", ""] + m + ["", line])
        tsum.append([name6, f"{len(rows6)} sizes", fmt_ratio(mn),
                     human(at) if at is not None else "-", word])

    # ---- header and output --------------------------------------------------------------------
    mc = memcpy.get("best_gbs", "?")
    libs = []
    if has_loom:
        libs.append(f"Loom {meta.get('loom_git', '?')} ({meta.get('loom_perf', '?')})")
    if "ompi" in meta:
        libs.append(meta["ompi"])
    if "mpich" in meta:
        tr = meta.get("mpich_transport", "")
        libs.append(meta["mpich"] + (f"; {tr}" if tr else ""))
    if "gloo" in meta:
        libs.append(meta["gloo"] + " (libgloo-dev), TCP on 127.0.0.1")
    head = [
        "Loom peer benchmark: " + ", ".join(LABEL[i] for i in impls),
        f"machine: {meta.get('cpu', '?')}; {meta.get('online_cpus', '?')} CPUs online "
        f"({meta.get('sockets', '?')} socket(s) x {meta.get('cores_per_socket', '?')} core(s) x "
        f"{meta.get('threads_per_core', '?')} thread(s)); {meta.get('mem', '?')}; "
        f"kernel {meta.get('kernel', '?')}; {meta.get('date', '?')}",
        f"single-core memcpy (64 MiB, best of {memcpy.get('reps', '?')}): {mc} GB/s "
        f"(mean {memcpy.get('mean_gbs', '?')})",
        (f"memory bound ({bound_note(membound)}): {membound.get('threads', '?')} cores "
         f"copying at once move "
         f"{traffic_gbs:.2f} GB/s (reads plus writes; the better of memcpy, "
         f"{membound.get('memcpy_gbs', '?')} GB/s copied, and non-temporal stores, "
         f"{membound.get('stream_gbs', '?')}); a collective's bound is that over the "
         f"bytes it must read and write (AllReduce 2n x size), times its bus factor: "
         f"all_reduce at 2 ranks {bound_busbw('all_reduce', 2, traffic_gbs):.2f} GB/s busbw"
         if traffic_gbs else "memory bound: not measured"),
        "sizes ran " + ({"sweep": "in one sweep from the smallest to the largest (nccl-tests' "
                                  "way: buffers of the largest size, each iteration at the next "
                                  "offset, so large sizes are not cache-warm)",
                        "alone": "each size above the large threshold in a call of its own "
                                 "(one buffer of that size, cache-warm where it fits)"}
                       .get(args.mode, args.mode or "as the schedule says")),
        f"load average before: {meta.get('load_before', '?')}; after: "
        f"{meta.get('load_after', '?')}; elapsed {meta.get('elapsed_s', '?')} s",
        "libraries: " + "; ".join(libs),
        f"sizes {meta.get('sizes', '?')}; {meta.get('schedule', '?')}"
        + (f"; each implementation's best of {meta['rounds']} rounds (taking turns) per size"
           if meta.get("rounds", "1") != "1" else ""),
        "; ".join(DESC[i] for i in impls),
    ]
    if skipped:
        head.append("skipped: " + ", ".join(skipped))
    busy = busy_warning(meta)
    if busy:
        head.append(busy)
        ttext.insert(1, busy)
        tmd.insert(3, "**" + busy + "**\n")
    out = "\n".join(head + text + ttext)
    if failures:
        out += "\n\nFAILED RUNS:\n" + "\n".join("  " + f for f in failures)
    out += f"\n\nwrong values (Loom out-of-place + in-place, and the peers' checks): {total_wrong}\n"
    print(out)

    mdtext = ["# " + head[0], ""] + ["- " + h for h in head[1:]]
    if ratio_note:
        mdtext.append("- " + ratio_note)
    mdtext += md + tmd
    if failures:
        mdtext += ["", "## Failed runs", ""] + ["- " + f for f in failures]
    mdtext += ["", f"Wrong values: {total_wrong}", ""]
    with open(args.out, "w") as f:
        f.write("\n".join(mdtext))
    base = os.path.splitext(args.out)[0]
    for path, rows in ((base + ".csv", csv_rows), (base + ".targets.csv", tcsv)):
        fields = []
        for r in rows:
            fields += [k for k in r if k not in fields]
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields or ["none"])
            w.writeheader()
            w.writerows(rows)
    print(f"wrote {args.out}, {base}.csv and {base}.targets.csv", file=sys.stderr)
    return 1 if failures or total_wrong else 0


if __name__ == "__main__":
    sys.exit(main())
