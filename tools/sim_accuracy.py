#!/usr/bin/env python3
"""loom-sim against published nccl-tests results: predicted busbw beside each published point.

  tools/sim_accuracy.py [--sim build/tools/sim/loom-sim] [--csv docs/sim/published_nccl_tests.csv]
                        [--min-bytes 64M] [--markdown docs/sim_accuracy.md]

Each published row (system, GPUs and NICs per node, nodes, collective, size, busbw, the algorithm
NCCL ran) is predicted by loom-sim on the matching built-in machine with the row's NICs: NCCL's
default choice where the row ran NCCL's default, the forced algorithm where it forced one
(NCCL_ALGO=Ring, NVLS disabled, CollNet with IB SHARP). Prints the table and a summary (and writes
it as markdown with --markdown); exits 0 whatever the errors are: this is a report.
"""
import argparse
import collections
import csv
import json
import os
import subprocess
import sys
import tempfile


def machine_of(system):
    if "B200" in system:
        return "dgx-b200"
    if "H200" in system:
        return "dgx-h200"
    return "dgx-h100"


def block_of(row):
    """loom-sim's block for what the row ran, and extra options."""
    a = row["algorithm"].lower()
    sharp = row["sharp"].lower()
    extra = []
    if "ib sharp" in sharp and not sharp.startswith("no"):
        extra = ["--sharp", "on"]
    if "collnet" in a and "collnet_enable=0" not in a:
        return ("nccl:collnet_chain" if "chain" in a else "nccl:collnet_direct"), ["--sharp", "on"]
    if "default" in a or "then" in a:
        return "nccl", extra  # NCCL chose (the row may say what it chose)
    if "nvls_enable=0" in a or a.startswith("ring"):
        return "nccl:ring", extra
    if a.startswith("nvlstree"):
        return "nccl:nvls_tree", extra
    if a.startswith("nvls"):
        return "nccl:nvls", extra
    if a.startswith("tree"):
        return "nccl:tree", extra
    return "nccl", extra


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text[-1].upper() in units:
        return int(text[:-1]) * units[text[-1].upper()]
    return int(text)


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = argparse.ArgumentParser()
    p.add_argument("--sim", default=os.path.join(root, "build/tools/sim/loom-sim"))
    p.add_argument("--csv", default=os.path.join(root, "docs/sim/published_nccl_tests.csv"))
    p.add_argument("--min-bytes", default="64M")
    p.add_argument("--markdown")
    a = p.parse_args()
    if not os.access(a.sim, os.X_OK):
        print("sim_accuracy: %s is not built" % a.sim)
        return 2
    min_bytes = parse_size(a.min_bytes)
    rows = [r for r in csv.DictReader(open(a.csv)) if int(r["size_bytes"]) >= min_bytes]
    # One loom-sim run per (machine, GPUs, NICs, nodes, collective, block).
    groups = collections.defaultdict(list)
    for r in rows:
        block, extra = block_of(r)
        key = (machine_of(r["system"]), r["gpus_per_node"], r["nics_per_node"], r["nic_gbps"],
               int(r["nodes"]), r["collective"], block, tuple(extra))
        groups[key].append(r)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for key, members in sorted(groups.items()):
            machine, gpus, nics, gbps, nodes, coll, block, extra = key
            sizes = sorted({int(m["size_bytes"]) for m in members})
            out = os.path.join(tmp, "sim.json")
            cmd = [a.sim, coll, "--topo", machine, "--nodes", str(nodes), "--algo", block,
                   "-b", str(sizes[0]), "-e", str(sizes[-1]), "-f", "2", "-J", out] + list(extra)
            if gpus:
                cmd += ["--gpus", gpus]
            if nics:
                cmd += ["--nics", nics]
            if gbps:
                cmd += ["--nic-gbps", gbps]
            if nodes > 2048:
                cmd += ["--tiers", "3"]
            run = subprocess.run(cmd, capture_output=True, text=True)
            if run.returncode != 0:
                print("sim_accuracy: %s failed: %s" % (" ".join(cmd), run.stderr.strip()))
                continue
            predicted = {r["size"]: r for r in json.load(open(out))["results"]}
            for m in members:
                pr = predicted.get(int(m["size_bytes"]))
                if pr is None or pr["out_of_place"] is None:
                    continue
                pub = float(m["busbw_gbps"])
                pred = pr["out_of_place"]["busbw_gbps"]
                results.append((m, machine, block, pr["algorithm"], pub, pred, (pred - pub) / pub))
    lines = ["| system | nodes x GPUs | NICs | collective | size | NCCL ran (published) | "
             "predicted | published busbw | predicted busbw | error | source |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for m, machine, block, ran, pub, pred, err in results:
        nics = "%sx%s G" % (m["nics_per_node"], m["nic_gbps"]) if m["nics_per_node"] else "-"
        lines.append("| %s | %s x %s | %s | %s | %s | %s | %s (%s) | %.1f | %.1f | %+.1f%% | [link](%s) |" % (
            m["system"], m["nodes"], m["gpus_per_node"] or "8", nics, m["collective"],
            m["size_bytes"], m["algorithm"], ran, block, pub, pred, 100 * err, m["source_url"]))
    errs = [abs(r[6]) for r in results]
    within = sum(1 for e in errs if e <= 0.15)
    errs.sort()
    median = errs[len(errs) // 2] if errs else 0
    summary = ("sim_accuracy: %d published points >= %s: %d within 15%%, median |error| %.1f%%, "
               "worst %.1f%%" % (len(errs), a.min_bytes, within, 100 * median,
                                  100 * (errs[-1] if errs else 0)))
    print("\n".join(lines))
    print(summary)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write("<!-- Generated by tools/sim_accuracy.py from docs/sim/published_nccl_tests.csv; "
                    "do not edit. -->\n")
            f.write(summary.replace("sim_accuracy: ", "**Summary:** ") + "\n\n")
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
