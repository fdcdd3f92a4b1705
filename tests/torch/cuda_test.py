"""loom_torch on CUDA tensors (needs a GPU: tools/gpu_check.sh runs it; here it skips and says so).

Every rank uses GPU rank % device_count (all ranks share GPU 0 on a one-GPU machine). Checked:
- every operation of ops_test.py on CUDA tensors, against values computed on the CPU from every
  rank's inputs (the same inputs as ops_test.py's), and all_reduce against gloo's on CPU copies;
- stream semantics: an operation made after a long kernel (torch.cuda._sleep) on the caller's
  stream waits for it; async_op=True returns before the GPU is done and is_completed() says so;
  wait() does not block the host, and work on the caller's stream after wait() sees the result;
  operations made on a side stream (torch.cuda.stream) follow that stream; the Future's value on
  the GPU after then();
- coalesced operations, a subgroup (new_group), "cpu:gloo,cuda:loom" as one group's backends;
- CUDA graphs: an all_reduce (blocking), an async all_reduce waited on and an all_gather_into_tensor
  captured by torch.cuda.graph, replayed three times with new inputs written before each;
- DistributedDataParallel on the GPU for 100 steps: the replicas stay bit for bit equal across
  ranks and the loss falls;
- bad input: tensors of two devices in one operation, a CUDA tensor and a CPU tensor.

    python3 tests/torch/cuda_test.py --nprocs N
"""

import argparse
import sys
import time

import torch
import torch.distributed as dist

from common import done, expect, init, launch, raises, same
from ops_test import DTYPES, OPS, data, reduce_all


def dev(rank):
    return torch.device("cuda", rank % torch.cuda.device_count())


def check_all_reduce(rank, n, gloo, d):
    checked = 0
    for dtype in DTYPES:
        for name, op in OPS.items():
            for count in (1, 1000, (1 << 20) + 3):
                inputs = [data(r, count, dtype, salt=count, product=name == "PRODUCT")
                          for r in range(n)]
                t = inputs[rank].to(d)
                dist.all_reduce(t, op=op)
                same(t.cpu(), reduce_all(inputs, name, dtype), f"cuda all_reduce {name} {dtype} "
                     f"x{count}")
                checked += 1
    x = data(rank, 4096, torch.float32, salt=3)
    g = x.clone()
    dist.all_reduce(g, group=gloo)
    y = x.to(d)
    dist.all_reduce(y)
    same(y.cpu(), g, "cuda all_reduce against gloo on the CPU")
    for dtype in (torch.float32, torch.bfloat16):
        inputs = [data(r, 999, dtype, salt=5) for r in range(n)]
        t = inputs[rank].to(d)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        same(t.cpu(), (reduce_all(inputs, "SUM", torch.float64) / n).to(dtype),
             f"cuda all_reduce AVG {dtype}", exact=False)
    inputs = [data(r, 100, torch.float32, salt=6) for r in range(n)]
    t = inputs[rank].to(d)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
    same(t.cpu(), reduce_all(inputs, "SUM", torch.float32) * 0.5, "cuda all_reduce PREMUL_SUM")
    return checked


def check_streams(rank, n, gloo, d):
    # Ordered after the caller's stream: the value is written after a long kernel.
    x = torch.zeros(1 << 20, device=d)
    torch.cuda._sleep(200_000_000)
    x.fill_(float(rank + 1))
    dist.all_reduce(x)
    same(x.cpu(), torch.full((1 << 20,), float(n * (n + 1) // 2)), "all_reduce after a kernel")
    # async_op: made and waited for without blocking the host while the GPU sleeps (about 1 s).
    y = torch.full((1 << 16,), float(rank), device=d)
    torch.cuda._sleep(2_000_000_000)
    t0 = time.monotonic()
    work = dist.all_reduce(y, async_op=True)
    work.wait()
    host = time.monotonic() - t0
    pending = not work.is_completed()
    z = y * 2  # on the caller's stream, after wait(): sees the result
    torch.cuda.synchronize(d)
    expect(work.is_completed(), "is_completed() after the GPU finished")
    total = float(n * (n - 1) // 2)
    same(z.cpu(), torch.full((1 << 16,), 2 * total), "work after wait() on the caller's stream")
    # The future: then() runs after the value is ready; its value is read on the caller's stream.
    w = torch.full((300,), float(rank), device=d)
    fut = dist.all_reduce(w, async_op=True).get_future().then(lambda f: f.value()[0] + 1)
    same(fut.wait().cpu(), torch.full((300,), total + 1), "the future's value")
    # Made on a side stream: ordered after that stream's work.
    s = torch.cuda.Stream(device=d)
    with torch.cuda.stream(s):
        v = torch.zeros(4096, device=d)
        torch.cuda._sleep(100_000_000)
        v.fill_(float(rank + 10))
        work = dist.all_reduce(v, async_op=True)
        work.wait()
        v2 = v + 0
    torch.cuda.current_stream(d).wait_stream(s)
    same(v2.cpu(), torch.full((4096,), float(sum(r + 10 for r in range(n)))), "on a side stream")
    return host, pending


def check_others(rank, n, gloo, d):
    for root in range(n):
        t = data(rank, 513, torch.bfloat16, salt=root).to(d)
        dist.broadcast(t, src=root)
        same(t.cpu(), data(root, 513, torch.bfloat16, salt=root), f"cuda broadcast from {root}")
        inputs = [data(r, 333, torch.float32, salt=20 + root) for r in range(n)]
        t = inputs[rank].to(d)
        dist.reduce(t, dst=root, op=dist.ReduceOp.MAX)
        if rank == root:
            same(t.cpu(), reduce_all(inputs, "MAX", torch.float32), f"cuda reduce to {root}")
        mine = data(rank, 77, torch.int32, salt=30 + root).to(d)
        outs = ([torch.empty(77, dtype=torch.int32, device=d) for _ in range(n)]
                if rank == root else None)
        dist.gather(mine, gather_list=outs, dst=root)
        if rank == root:
            for r in range(n):
                same(outs[r].cpu(), data(r, 77, torch.int32, salt=30 + root), f"cuda gather {r}")
        got = torch.empty(55, dtype=torch.float64, device=d)
        parts = ([data(r, 55, torch.float64, salt=40 + root).to(d) for r in range(n)]
                 if rank == root else None)
        dist.scatter(got, scatter_list=parts, src=root)
        same(got.cpu(), data(rank, 55, torch.float64, salt=40 + root), f"cuda scatter {root}")
    want = [data(r, 1001, torch.float16, salt=50) for r in range(n)]
    outs = [torch.empty(1001, dtype=torch.float16, device=d) for _ in range(n)]
    dist.all_gather(outs, want[rank].to(d))
    for r in range(n):
        same(outs[r].cpu(), want[r], f"cuda all_gather part {r}")
    flat = torch.empty(1001 * n, dtype=torch.float16, device=d)
    dist.all_gather_into_tensor(flat, want[rank].to(d))
    same(flat.cpu(), torch.cat(want), "cuda all_gather_into_tensor")
    ins = [data(rank, 40, torch.float32, salt=60 + j) for j in range(n)]
    out = torch.empty(40, device=d)
    dist.reduce_scatter(out, [i.to(d) for i in ins])
    expect_rs = reduce_all([data(r, 40, torch.float32, salt=60 + rank) for r in range(n)], "SUM",
                           torch.float32)
    same(out.cpu(), expect_rs, "cuda reduce_scatter")
    out2 = torch.empty(40, device=d)
    dist.reduce_scatter_tensor(out2, torch.cat(ins).to(d))
    same(out2.cpu(), expect_rs, "cuda reduce_scatter_tensor")
    inp = (torch.arange(6 * n, dtype=torch.float32) + 100 * rank).to(d)
    o = torch.empty(6 * n, device=d)
    dist.all_to_all_single(o, inp)
    same(o.cpu(), torch.cat([torch.arange(6 * rank, 6 * rank + 6, dtype=torch.float32) + 100 * r
                             for r in range(n)]), "cuda all_to_all_single")
    send = [rank + k + 1 for k in range(n)]
    recv = [r + rank + 1 for r in range(n)]
    rows = torch.cat([torch.full((s, 3), float(10 * rank + k)) for k, s in enumerate(send)]).to(d)
    got = torch.empty(sum(recv), 3, device=d)
    dist.all_to_all_single(got, rows, output_split_sizes=recv, input_split_sizes=send)
    same(got.cpu(), torch.cat([torch.full((s, 3), float(10 * r + rank)) for r, s in
                               enumerate(recv)]), "cuda all_to_all_single with split sizes")
    if n > 1:
        nxt, prv = (rank + 1) % n, (rank - 1) % n
        s = torch.full((1 << 17,), float(rank), device=d)
        r = torch.empty(1 << 17, device=d)
        for q in dist.batch_isend_irecv([dist.P2POp(dist.isend, s, nxt),
                                         dist.P2POp(dist.irecv, r, prv)]):
            q.wait()
        same(r.cpu(), torch.full((1 << 17,), float(prv)), "cuda batch_isend_irecv ring")
    a, b = torch.full((10,), float(rank), device=d), torch.full((7,), 2.0 * rank, device=d)
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    s = n * (n - 1) // 2
    same(a.cpu(), torch.full((10,), float(s)), "cuda coalesced a")
    same(b.cpu(), torch.full((7,), 2.0 * s), "cuda coalesced b")
    dist.barrier()
    if n >= 2:
        evens = list(range(0, n, 2))
        sub = dist.new_group(ranks=evens, backend="loom")
        if rank in evens:
            t = torch.full((8,), float(rank), device=d)
            dist.all_reduce(t, group=sub)
            same(t.cpu(), torch.full((8,), float(sum(evens))), "cuda all_reduce on new_group")
    # Per-device backends in one group: CPU tensors through gloo, CUDA ones through loom.
    mixed = dist.new_group(backend="cpu:gloo,cuda:loom")
    c, g = torch.full((5,), float(rank)), torch.full((5,), float(rank), device=d)
    dist.all_reduce(c, group=mixed)
    dist.all_reduce(g, group=mixed)
    same(c, torch.full((5,), float(s)), "cpu:gloo part")
    same(g.cpu(), torch.full((5,), float(s)), "cuda:loom part")


def check_ddp(rank, n, gloo, d):
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(1234)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                              torch.nn.Linear(64, 4)).to(d)
    model = DDP(net, device_ids=[d.index], bucket_cap_mb=0.01)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(99 + rank)
    w_true = torch.randn(32, 4, generator=torch.Generator().manual_seed(7)).to(d)
    losses = []
    for _ in range(100):
        x = torch.randn(16, 32, generator=gen).to(d)
        y = x @ w_true
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    flat = torch.cat([p.detach().flatten() for p in model.module.parameters()])
    root = flat.clone()
    dist.broadcast(root, src=0)
    expect(torch.equal(flat, root), "cuda DDP: the replicas differ across ranks")
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    expect(last < 0.5 * first, f"cuda DDP did not learn: {first} -> {last}")
    return first, last


def check_graph(rank, n, gloo, d):
    x = torch.zeros(1 << 16, device=d)
    y = torch.zeros(7, dtype=torch.float64, device=d)
    mine = torch.zeros(5, device=d)
    everyone = torch.zeros(5 * n, device=d)
    dist.all_reduce(x)  # eager first, as users warm up before a capture
    torch.cuda.synchronize(d)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(x)
        dist.all_reduce(y, op=dist.ReduceOp.MAX, async_op=True).wait()
        dist.all_gather_into_tensor(everyone, mine)
    torch.cuda.synchronize(d)
    for k in range(1, 4):
        x.fill_(float(rank + k))
        y.fill_(float(rank * k))
        mine.fill_(float(rank * 10 + k))
        graph.replay()
        torch.cuda.synchronize(d)
        same(x.cpu(), torch.full((1 << 16,), float(sum(r + k for r in range(n)))),
             f"graph replay {k}: all_reduce")
        same(y.cpu(), torch.full((7,), float((n - 1) * k), dtype=torch.float64),
             f"graph replay {k}: async all_reduce (MAX)")
        same(everyone.cpu(), torch.cat([torch.full((5,), float(r * 10 + k)) for r in range(n)]),
             f"graph replay {k}: all_gather_into_tensor")
    del graph


def check_bad_input(rank, n, gloo, d):
    raises(lambda: dist.all_gather_into_tensor(torch.empty(3 * n, device=d), torch.zeros(3)),
           ["loom", "cpu"], "a CUDA output and a CPU input")
    if torch.cuda.device_count() > 1:
        other = torch.device("cuda", (d.index + 1) % torch.cuda.device_count())
        raises(lambda: dist.all_reduce(torch.zeros(3, device=other)), ["loom", "runs on"],
               "a tensor on another GPU than the group's")
    t = torch.ones(3, device=d)
    dist.all_reduce(t)
    same(t.cpu(), torch.full((3,), float(n)), "cuda all_reduce after refused calls")


def main(rank, n, port):
    d = dev(rank)
    torch.cuda.set_device(d)
    gloo = init(rank, n, port)
    checked = check_all_reduce(rank, n, gloo, d)
    host, pending = check_streams(rank, n, gloo, d)
    check_others(rank, n, gloo, d)
    first, last = check_ddp(rank, n, gloo, d)
    check_graph(rank, n, gloo, d)
    check_bad_input(rank, n, gloo, d)
    # Reported, not asserted as a time: wait() returned while the GPU still slept (about 1 s).
    done(rank, f"cuda_test: {n} ranks on {torch.cuda.get_device_name(d)} passed: {checked} "
               f"all_reduce cases; async all_reduce made and waited in {host * 1e3:.1f} ms of host "
               f"time, GPU still busy after wait(): {pending}; DDP loss {first:.4f} -> {last:.4f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--nprocs", type=int, default=2)
    if not torch.cuda.is_available():
        print("SKIP: cuda_test needs a CUDA GPU and a PyTorch built with CUDA "
              f"(torch {torch.__version__}: torch.cuda.is_available() is False)")
        sys.exit(77)
    # Spawned: torch.cuda.is_available() has initialized CUDA in this process, which a forked
    # rank could not use.
    launch(main, start_method="spawn")
