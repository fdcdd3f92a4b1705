#!/usr/bin/env python3
"""Checks loom-sim's -J output: loom-perf's rows, each with its block and the algorithm that ran.

  check_sim_json.py FILE --blocks auto,nccl --sizes N --nranks R
"""
import argparse
import json
import sys


def main():
    p = argparse.ArgumentParser()
    p.add_argument("file")
    p.add_argument("--blocks", required=True)
    p.add_argument("--sizes", type=int, required=True)
    p.add_argument("--nranks", type=int, required=True)
    a = p.parse_args()
    with open(a.file) as f:
        j = json.load(f)
    errors = []
    if j.get("tool") != "loom-sim" or j.get("predicted") is not True:
        errors.append("not a loom-sim prediction: tool %r predicted %r" % (j.get("tool"), j.get("predicted")))
    if j.get("nranks") != a.nranks:
        errors.append("nranks %r, expected %d" % (j.get("nranks"), a.nranks))
    blocks = a.blocks.split(",")
    rows = j.get("results", [])
    if len(rows) != len(blocks) * a.sizes:
        errors.append("%d rows, expected %d blocks x %d sizes" % (len(rows), len(blocks), a.sizes))
    for b in blocks:
        mine = [r for r in rows if r.get("block") == b]
        if len(mine) != a.sizes:
            errors.append("block %s: %d rows, expected %d" % (b, len(mine), a.sizes))
        last = 0
        for r in mine:
            m = r.get("out_of_place")
            if m is None:
                continue
            if not isinstance(r.get("algorithm"), str) or not r["algorithm"]:
                errors.append("block %s size %s: no algorithm" % (b, r.get("size")))
            if not (m["time_us"] > 0 and m["busbw_gbps"] >= 0 and m["algbw_gbps"] >= 0):
                errors.append("block %s size %s: bad figures %r" % (b, r.get("size"), m))
            if r["size"] < last:
                errors.append("block %s: sizes not ascending" % b)
            last = r["size"]
        if all(r.get("out_of_place") is None for r in mine):
            errors.append("block %s: nothing predicted" % b)
    for e in errors:
        print("check_sim_json.py: " + e)
    print("check_sim_json.py: %d rows checked" % len(rows))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
