#!/usr/bin/env python3
"""Checks loom-topo --json output read from stdin: it parses, and has the expected counts.
usage: loom-topo ... --json | check_topo_json.py [--gpus N] [--nics N] [--ports N] [--host]"""
import argparse
import json
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--gpus", type=int)
ap.add_argument("--nics", type=int)
ap.add_argument("--ports", type=int)
ap.add_argument("--host", action="store_true", help="expect discovery's host facts")
args = ap.parse_args()
d = json.load(sys.stdin)
errors = []
if args.gpus is not None and len(d["gpus"]) != args.gpus:
    errors.append(f"{len(d['gpus'])} GPUs, expected {args.gpus}")
if args.nics is not None and len(d["nics"]) != args.nics:
    errors.append(f"{len(d['nics'])} NICs, expected {args.nics}")
ports = sum(len(n["ports"]) for n in d["nics"])
if args.ports is not None and ports != args.ports:
    errors.append(f"{ports} ports, expected {args.ports}")
if not d["cpus"]:
    errors.append("no CPU")
labels = d["matrix"]["labels"]
if len(labels) != len(d["gpus"]) + len(d["nics"]) + len(d["cpus"]):
    errors.append("matrix labels do not cover GPUs, NICs and CPUs")
for i, row in enumerate(d["matrix"]["paths"]):
    if len(row) != len(labels) or row[i] != "LOC":
        errors.append(f"matrix row {i} malformed")
for g in d["gpus"]:
    if d["nics"] and not g["nearestNics"]:
        errors.append(f"{g['label']} has no nearest NIC")
if args.host:
    h = d.get("host")
    if not h or h["numaNodes"] < 1 or h["cores"] < 1 or not h["sources"]:
        errors.append(f"host facts missing or empty: {h}")
for e in errors:
    print("check_topo_json:", e)
sys.exit(1 if errors else 0)
