"""torch.distributed on "loom" against gloo, in one run (issue 17's benchmark):

  1. all_reduce (float32 SUM, in place, blocking as a training step calls it) from --min-bytes to
     --max-bytes on a loom and a gloo group of the same processes, alternating the two at each
     size for --rounds rounds: time per call (the slowest rank's median of --iters timed calls,
     the best round of each) and bus bandwidth (nccl-tests' definition: bytes / time x
     2(n-1)/n), and the ratios (the rounds keep a busy host's bursts from landing on one side only).
     With CPU tensors, a third side in the same rounds: Loom's own call (loomAllReduce through
     loom_torch._C.direct_all_reduce) on the same communicator and tensor, around PyTorch's
     dispatch and the backend: "loom_torch/Loom's call" is what the binding adds, like for like;
     and a fourth: the backend's own allreduce called straight (backend.allreduce([t]).wait(),
     around torch.distributed's Python and PyTorch's dispatcher, which every backend, gloo's too,
     runs under): "backend/Loom's call" is what loom_torch's own code adds;
  2. loom-perf's all_reduce at the same sizes and ranks, each size alone as the tensor above is
     reused (--loom-perf, run right after; its in-place time, the best of -N --rounds): what the
     binding adds to Loom's own time;
  3. one DistributedDataParallel step of an MLP of about --ddp-params parameters (float32, batch
     8), loom against gloo: the median step time of --ddp-steps steps.

--device cuda: the tensors (and the model) on the GPU rank % device_count, each timed call
followed by torch.cuda.synchronize() (enqueue to completion); gloo takes CUDA tensors too (through
the host), and loom-perf runs with --mem device. (NCCL is not the peer here: it refuses two ranks
on one GPU, which is what a one-GPU machine runs.)

    python3 bench/torch/torch_bench.py --nprocs 2,4 --loom-perf build/tools/perf/loom-perf

Needs loom_torch importable (PYTHONPATH=build/python, or pip-installed). Prints markdown tables;
--json FILE writes every figure.
"""

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import loom_torch  # noqa: F401


def parse_bytes(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def sizes(lo, hi, factor):
    out, b = [], lo
    while b <= hi:
        out.append(b)
        b *= factor
    return out


def timed(fn, iters):
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def worker(rank, n, port, args, queue):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dev = torch.device("cpu")
    if args.device == "cuda":
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    timeout = datetime.timedelta(seconds=300)
    dist.init_process_group("loom", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=n, timeout=timeout)
    groups = {"loom": dist.group.WORLD, "gloo": dist.new_group(backend="gloo", timeout=timeout)}
    # Loom's own call on the same communicator and tensor, around torch.distributed (CPU only):
    # what the binding adds, measured in the same processes.
    backend = dist.group.WORLD._get_backend(dev) if dev.type == "cpu" else None
    sides = ["loom", "gloo"] + (["backend", "direct"] if backend is not None else [])
    opts = dist.AllreduceOptions()
    if hasattr(opts, "asyncOp"):
        opts.asyncOp = False  # run on the calling thread, as dist.all_reduce's blocking call does
    rows = []
    for nbytes in sizes(args.min_bytes, args.max_bytes, args.factor):
        t = torch.ones(max(nbytes // 4, 1), device=dev)
        iters = max(5, min(args.iters, int(args.target_bytes // max(nbytes, 1))))
        row = {"bytes": t.numel() * 4, "iters": iters}
        for _ in range(args.rounds):
            for name in sides:
                if name == "direct":
                    def call():
                        loom_torch._C.direct_all_reduce(backend, t)
                elif name == "backend":
                    def call():
                        backend.allreduce([t], opts).wait()
                else:
                    def call(g=groups[name]):
                        dist.all_reduce(t, group=g)
                        sync()
                for _ in range(max(2, iters // 10)):
                    call()
                dist.barrier(group=groups["gloo"])
                # Every rank's median, the slowest counted (they differ by which rank waits).
                med = torch.tensor([timed(call, iters)], dtype=torch.float64)
                dist.all_reduce(med, op=dist.ReduceOp.MAX, group=groups["gloo"])
                row[name] = min(row.get(name, float("inf")), med.item())
        rows.append(row)
    ddp = {}
    if args.ddp_params > 0:
        from torch.nn.parallel import DistributedDataParallel as DDP
        width = 4096
        layers = max(1, round(args.ddp_params / (width * width + width)))
        torch.manual_seed(0)
        base = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).to(dev)
        params = sum(p.numel() for p in base.parameters())
        x = torch.randn(8, width, device=dev)
        for name, g in groups.items():
            model = DDP(base, process_group=g, device_ids=[dev.index] if dev.index is not None
                        else None)
            opt = torch.optim.SGD(model.parameters(), lr=1e-6)

            def step():
                opt.zero_grad()
                model(x).square().mean().backward()
                opt.step()
                sync()
            step()
            dist.barrier(group=groups["gloo"])
            ddp[name] = timed(step, args.ddp_steps)
            del model, opt
        ddp["params"] = params
    if rank == 0:
        queue.put({"nprocs": n, "allreduce": rows, "ddp": ddp})
    dist.destroy_process_group()


def loom_perf(path, n, args):
    """loom-perf all_reduce at each of the same sizes, each size alone (-b S -e S: one buffer,
    reused every iteration, as the benchmark above reuses its tensor): {bytes: in-place time in
    seconds} (torch.distributed.all_reduce is in place)."""
    times, cmd = {}, []
    for nbytes in sizes(args.min_bytes, args.max_bytes, args.factor):
        b = max(nbytes // 4, 1) * 4
        iters = max(5, min(args.iters, int(args.target_bytes // max(b, 1))))
        cmd = [path, "all_reduce", "-np", str(n), "-b", str(b), "-e", str(b), "-n", str(iters),
               "-w", str(max(2, iters // 10)), "-N", str(args.rounds)]
        if args.device == "cuda":
            cmd += ["--mem", "device"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        for line in out.stdout.splitlines():
            m = re.match(r"\s+(\d+)\s+\d+\s+\w+\s+\w+\s+-?\d+\s+[\d.]+\s+[\d.]+\s+[\d.]+"
                         r"\s+\S+\s+([\d.]+)", line)
            if m:  # the best of the -N rounds
                t = float(m.group(2)) * 1e-6
                times[int(m.group(1))] = min(times.get(int(m.group(1)), t), t)
    return times, " ".join(cmd[:4] + ["-b S -e S (each size alone)"] + cmd[8:])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nprocs", default="2,4")
    p.add_argument("--min-bytes", default="8")
    p.add_argument("--max-bytes", default="64M")
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds per size, the sides alternating; each side keeps its best")
    p.add_argument("--target-bytes", type=float, default=2e9, help="bytes timed per size at most")
    p.add_argument("--ddp-params", type=float, default=100e6)
    p.add_argument("--ddp-steps", type=int, default=3)
    p.add_argument("--loom-perf", default="")
    p.add_argument("--json", default="")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("torch_bench: --device cuda: torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    args.min_bytes, args.max_bytes = parse_bytes(args.min_bytes), parse_bytes(args.max_bytes)
    results = []
    ctx = mp.get_context("spawn")
    for n in (int(x) for x in args.nprocs.split(",")):
        queue = ctx.SimpleQueue()
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(worker, args=(n, port, args, queue), nprocs=n, join=True)
        r = queue.get()
        if args.loom_perf:
            r["loom_perf"], r["loom_perf_cmd"] = loom_perf(args.loom_perf, n, args)
        results.append(r)
    tensors = ("CUDA tensors on " + torch.cuda.get_device_name(0) if args.device == "cuda"
               else "CPU tensors")
    print(f"# torch {torch.__version__}, loom_torch (libloom {loom_torch.loom_version()}), "
          f"{os.cpu_count()} CPUs; all_reduce float32 SUM in place, the slowest rank's median of "
          f"{args.iters} timed calls (fewer above 10 MB), best of {args.rounds} rounds; "
          f"{tensors}")
    for r in results:
        n = r["nprocs"]
        f = 2 * (n - 1) / n
        print(f"\n## {n} ranks: all_reduce")
        head = "| bytes | loom us | gloo us | loom busbw GB/s | gloo busbw GB/s | gloo/loom time |"
        direct = "direct" in r["allreduce"][0]
        if direct:
            head += " backend us | Loom's call us | loom_torch/Loom's call | backend/Loom's call |"
        if "loom_perf" in r:
            head += " loom-perf in-place us | loom_torch/loom-perf |"
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        for row in r["allreduce"]:
            b, tl, tg = row["bytes"], row["loom"], row["gloo"]
            line = (f"| {b} | {tl * 1e6:.1f} | {tg * 1e6:.1f} | {b / tl * f / 1e9:.3f} | "
                    f"{b / tg * f / 1e9:.3f} | {tg / tl:.2f} |")
            if direct:
                td, tb = row["direct"], row["backend"]
                line += f" {tb * 1e6:.1f} | {td * 1e6:.1f} | {tl / td:.2f} | {tb / td:.2f} |"
            if "loom_perf" in r:
                lp = r["loom_perf"].get(b)
                line += f" {lp * 1e6:.1f} | {tl / lp:.2f} |" if lp else " - | - |"
            print(line)
        if r["ddp"]:
            d = r["ddp"]
            print(f"\nDDP step, {d['params'] / 1e6:.0f} M parameters: loom {d['loom'] * 1e3:.0f} ms, "
                  f"gloo {d['gloo'] * 1e3:.0f} ms, gloo/loom {d['gloo'] / d['loom']:.2f}")
        if "loom_perf_cmd" in r:
            print(f"\nloom-perf: {r['loom_perf_cmd']}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
