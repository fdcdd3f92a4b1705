#!/usr/bin/env python3
"""Draws bus bandwidth (or algorithm bandwidth, or time) against message size from loom-perf's and
loom-sim's JSON files (-J) and from bench/peers' CSV report, as PNG and SVG.

  plot_results.py [options] FILE...

A loom-perf file is one line (its out-of-place columns; --in-place for the others); a loom-sim
file is one line per algorithm it predicted (--algo all), or one line when it predicted one. A
CSV from bench/peers/report.py is one line per implementation (its <impl>_busbw columns), for
the collective and rank count chosen with --collective and --nranks (default: its first), with
its memory bound when it has one. A
file may be named LABEL=PATH to set its legend. --bound GBPS=LABEL draws a horizontal line (the
machine's memory bound, a link's rate).

Writes OUT.png and OUT.svg (-o OUT, default "results"). Exit status: 0, 2 for bad usage or an
unreadable file (a message names it).
"""
import argparse
import csv
import json
import math
import os
import sys

METRICS = {
    "busbw": ("busbw_gbps", "bus bandwidth (GB/s)"),
    "algbw": ("algbw_gbps", "algorithm bandwidth (GB/s)"),
    "time": ("time_us", "time (us)"),
}


def die(msg):
    print(f"plot_results: {msg}", file=sys.stderr)
    sys.exit(2)


def human(size):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift}{unit}"
    return str(size)


def json_lines(path, label, args):
    """[(label, [(size, value)])] of a loom-perf or loom-sim file."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        die(f"{path}: cannot read it as JSON: {e}")
    rows = doc.get("results")
    if not isinstance(rows, list):
        die(f"{path}: no \"results\" list (not a loom-perf or loom-sim -J file)")
    key = METRICS[args.metric][0]
    place = "in_place" if args.in_place else "out_of_place"
    tool = doc.get("tool", "loom-perf")
    machine = doc.get("machine")
    if isinstance(machine, dict):
        machine = "{} x{}".format(machine.get("name", "?"), machine.get("nodes", "?"))
    base = label or "{} {} {} ranks{}".format(tool, doc.get("collective", "?"),
                                              doc.get("nranks", "?"),
                                              f" ({machine})" if machine else "")
    groups = {}
    for r in rows:
        cols = r.get(place)
        if not isinstance(cols, dict) or cols.get(key) is None:
            continue
        algo = r.get("algorithm", "")
        groups.setdefault(algo, []).append((int(r["size"]), float(cols[key])))
    if not groups:
        die(f"{path}: no {place} {key} values")
    if len(groups) == 1:
        return [(base, sorted(next(iter(groups.values()))))]
    return [(f"{base} {a}", sorted(p)) for a, p in groups.items()]


def csv_lines(path, label, args):
    """[(label, [(size, busbw)])] of a bench/peers report CSV, one line per implementation."""
    if args.metric != "busbw":
        die(f"{path}: the peers' CSV has bus bandwidth only (--metric busbw)")
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        die(f"{path}: {e}")
    if not rows or "collective" not in rows[0]:
        die(f"{path}: not a bench/peers report CSV (no collective column)")
    coll = args.collective or rows[0]["collective"]
    nranks = str(args.nranks or rows[0]["nranks"])
    rows = [r for r in rows if r["collective"] == coll and r["nranks"] == nranks]
    if not rows:
        die(f"{path}: no rows for {coll} at {nranks} ranks")
    lines = []
    try:
        bound = float(rows[0].get("mem_bound_busbw") or "")
        args.csv_bounds.append((bound, "memory bound"))
    except ValueError:
        pass
    for col in rows[0]:
        if not col.endswith("_busbw") or col == "mem_bound_busbw":
            continue
        impl = col[: -len("_busbw")]
        pts = []
        for r in rows:
            try:
                pts.append((int(r["bytes"]), float(r[col])))
            except (TypeError, ValueError):
                pass  # a failed or missing cell
        if pts:
            name = f"{label} {impl}" if label else impl
            lines.append((name, sorted(pts)))
    if not lines:
        die(f"{path}: no busbw values for {coll} at {nranks} ranks")
    args.auto_title = args.auto_title or f"{coll}, {nranks} ranks"
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", metavar="[LABEL=]FILE")
    ap.add_argument("-o", "--out", default="results", help="output path without extension")
    ap.add_argument("--metric", choices=sorted(METRICS), default="busbw")
    ap.add_argument("--in-place", action="store_true", help="loom-perf's in-place columns")
    ap.add_argument("--collective", help="CSV: the collective to draw")
    ap.add_argument("--nranks", type=int, help="CSV: the rank count to draw")
    ap.add_argument("--title")
    ap.add_argument("--bound", action="append", default=[], metavar="GBPS=LABEL")
    ap.add_argument("--formats", default="png,svg")
    args = ap.parse_args()
    args.auto_title = None
    args.csv_bounds = []

    lines = []
    for spec in args.files:
        label, path = (spec.split("=", 1) if "=" in spec and not os.path.exists(spec)
                       else (None, spec))
        if not os.path.exists(path):
            die(f"{path}: no such file")
        reader = csv_lines if path.endswith(".csv") else json_lines
        lines += reader(path, label, args)
    bounds = list(args.csv_bounds)
    for b in args.bound:
        value, _, name = b.partition("=")
        try:
            bounds.append((float(value), name or f"{value} GB/s"))
        except ValueError:
            die(f"--bound {b}: not GBPS=LABEL")
    formats = [f for f in args.formats.split(",") if f]
    for f in formats:
        if f not in ("png", "svg", "pdf"):
            die(f"--formats: unknown format '{f}' (png, svg, pdf)")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        die("matplotlib is missing (python3 -m pip install matplotlib; tools/install_deps.sh "
            "installs it)")

    fig, ax = plt.subplots(figsize=(8, 5))
    sizes = sorted({s for _, pts in lines for s, _ in pts})
    for name, pts in lines:
        ax.plot([s for s, _ in pts], [v for _, v in pts], marker="o", markersize=3, label=name)
    for value, name in bounds:
        ax.axhline(value, linestyle="--", color="grey", linewidth=1)
        ax.annotate(name, (sizes[-1], value), textcoords="offset points", xytext=(-2, 3),
                    fontsize=8, color="grey", ha="right")
    ax.set_xscale("log", base=2)
    if args.metric == "time":
        ax.set_yscale("log")
    ticks = [s for i, s in enumerate(sizes) if i % max(1, math.ceil(len(sizes) / 12)) == 0]
    ax.set_xticks(ticks)
    ax.set_xticklabels([human(s) for s in ticks], rotation=45)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel(METRICS[args.metric][1])
    ax.set_title(args.title or args.auto_title or "")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    written = []
    for f in formats:
        path = f"{args.out}.{f}"
        try:
            fig.savefig(path)
        except OSError as e:
            die(f"{path}: cannot write it: {e}")
        written.append(path)
    print("plot_results: wrote " + ", ".join(written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
