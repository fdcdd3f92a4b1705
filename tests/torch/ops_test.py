"""Every torch.distributed operation on the "loom" backend, against gloo in the same processes and
against values computed from every rank's inputs: all_reduce (every dtype and ReduceOp, async
with a future, coalesced), broadcast, reduce, all_gather (list, into a tensor, coalesced),
reduce_scatter (list, tensor, coalesced), all_to_all_single (equal and uneven splits),
all_to_all, gather, scatter, send/recv, batch_isend_irecv, barrier, all_gather_object, new_group;
and the errors of bad input (non-contiguous tensors, unsupported ops, a wrong rank).

    python3 tests/torch/ops_test.py --nprocs N        (forked ranks; LOOMTEST_TORCH_START=spawn)
    torchrun --nproc-per-node N tests/torch/ops_test.py
"""

import torch
import torch.distributed as dist

import loom_torch

from common import expect, init, launch, raises, same

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int32, torch.int64, torch.bool]
OPS = {"SUM": dist.ReduceOp.SUM, "PRODUCT": dist.ReduceOp.PRODUCT, "MIN": dist.ReduceOp.MIN,
       "MAX": dist.ReduceOp.MAX}


def data(rank, count, dtype, salt=0, product=False):
    """Rank rank's input: small integers, so that any summation order gives the same floats."""
    g = torch.Generator().manual_seed(1000 + 17 * rank + salt)
    if dtype == torch.bool:
        return torch.randint(0, 2, (count,), generator=g).bool()
    if dtype.is_complex:
        re = torch.randint(-4, 5, (count,), generator=g).float()
        im = torch.randint(-4, 5, (count,), generator=g).float()
        return torch.complex(re, im).to(dtype)
    lo, hi = (1, 3) if product else ((0, 9) if dtype == torch.uint8 else (-4, 5))
    return torch.randint(lo, hi, (count,), generator=g).to(dtype)


def reduce_all(inputs, name, dtype):
    if dtype == torch.bool:
        s = torch.stack(inputs)
        return (s.any(0) if name in ("SUM", "MAX") else s.all(0))
    wide = torch.stack([t.to(torch.complex128 if dtype.is_complex else
                             (torch.float64 if dtype.is_floating_point else torch.int64))
                        for t in inputs])
    out = {"SUM": lambda: wide.sum(0), "PRODUCT": lambda: wide.prod(0),
           "MIN": lambda: wide.amin(0), "MAX": lambda: wide.amax(0)}[name]()
    return out.to(dtype)


class Counter:
    gloo = 0


def vs_gloo(gloo, fn, loom_out, what):
    """Runs fn(group=gloo) and compares its result with loom's; gloo may not support it."""
    try:
        out = fn(gloo)
    except RuntimeError as e:
        if "support" in str(e) or "Invalid" in str(e) or "not implemented" in str(e).lower():
            return
        raise
    same(loom_out, out, f"{what}: loom vs gloo")
    Counter.gloo += 1


def check_all_reduce(rank, n, gloo):
    for dtype in DTYPES:
        for name, op in OPS.items():
            for count in (1, 1000) if dtype != torch.float32 else (1, 1000, (1 << 18) + 3):
                prod = name == "PRODUCT"
                inputs = [data(r, count, dtype, salt=count, product=prod) for r in range(n)]
                t = inputs[rank].clone()
                dist.all_reduce(t, op=op)
                what = f"all_reduce {name} {dtype} x{count}"
                same(t, reduce_all(inputs, name, dtype), what)

                def on_gloo(g, op=op, x=inputs[rank]):
                    y = x.clone()
                    dist.all_reduce(y, op=op, group=g)
                    return y
                vs_gloo(gloo, on_gloo, t, what)
    # AVG (gloo has none): the sum divided by the number of ranks.
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        inputs = [data(r, 999, dtype, salt=5) for r in range(n)]
        t = inputs[rank].clone()
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        same(t, (reduce_all(inputs, "SUM", torch.float64) / n).to(dtype), f"all_reduce AVG {dtype}",
             exact=False)
    # PREMUL_SUM: each input multiplied by the factor, then summed.
    inputs = [data(r, 100, torch.float32, salt=6) for r in range(n)]
    t = inputs[rank].clone()
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
    same(t, reduce_all(inputs, "SUM", torch.float32) * 0.5, "all_reduce PREMUL_SUM 0.5")
    big = torch.cat([data(rank, 4, torch.float32, salt=70 + j) for j in range(n)])
    keep, out = big.clone(), torch.empty(4)
    dist.reduce_scatter_tensor(out, big, op=dist._make_nccl_premul_sum(2.0))
    same(big, keep, "reduce_scatter_tensor PREMUL_SUM leaves its input as it was")
    same(out, reduce_all([data(r, 4, torch.float32, salt=70 + rank) for r in range(n)], "SUM",
                         torch.float32) * 2, "reduce_scatter_tensor PREMUL_SUM 2.0")
    # Complex sums travel as pairs of reals.
    inputs = [data(r, 300, torch.complex64, salt=7) for r in range(n)]
    t = inputs[rank].clone()
    dist.all_reduce(t)
    same(t, reduce_all(inputs, "SUM", torch.complex64), "all_reduce SUM complex64")
    raises(lambda: dist.all_reduce(inputs[rank].clone(), op=dist.ReduceOp.MAX), ["complex"],
           "all_reduce MAX of complex64")
    # Multi-dimensional and empty tensors.
    t = torch.full((3, 4, 5), float(rank + 1))
    dist.all_reduce(t)
    same(t, torch.full((3, 4, 5), float(n * (n + 1) // 2)), "all_reduce of a 3-d tensor")
    e = torch.empty(0)
    dist.all_reduce(e)


def check_async(rank, n, gloo):
    x = torch.full((4096,), float(rank))
    work = dist.all_reduce(x, async_op=True)
    fut = work.get_future().then(lambda f: f.value()[0] * 2)
    work.wait()
    expect(work.is_completed(), "all_reduce async: completed after wait()")
    total = float(n * (n - 1) // 2)
    same(x, torch.full((4096,), total), "all_reduce async")
    same(fut.wait(), torch.full((4096,), 2 * total), "all_reduce async: the future's value")
    # Several in flight, waited in reverse order.
    ts = [torch.full((100 + i,), float(rank + i)) for i in range(8)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for w in reversed(works):
        w.wait()
    for i, t in enumerate(ts):
        same(t, torch.full((100 + i,), float(n * (n - 1) // 2 + n * i)), f"async #{i}")
    # After wait(), the Future is done too (its value readable at once), as gloo's is.
    late = 0
    for i in range(300):
        w = dist.all_reduce(torch.full((256,), float(i)), async_op=True)
        w.wait()
        late += 0 if w.get_future().done() else 1
    expect(late == 0, f"the future was not done after wait() in {late} of 300 all_reduces")


def check_coalesced(rank, n, gloo):
    a, b = torch.full((10,), float(rank)), torch.full((7,), float(2 * rank), dtype=torch.float64)
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    s = n * (n - 1) // 2
    same(a, torch.full((10,), float(s)), "coalesced all_reduce a")
    same(b, torch.full((7,), float(2 * s), dtype=torch.float64), "coalesced all_reduce b")
    pg = dist.distributed_c10d._get_default_group()
    xs = [torch.full((5,), float(rank)), torch.full((9,), float(rank + 1))]
    pg.allreduce_coalesced(xs).wait()
    same(xs[0], torch.full((5,), float(s)), "allreduce_coalesced 0")
    same(xs[1], torch.full((9,), float(s + n)), "allreduce_coalesced 1")
    # all_gather_into_tensor and reduce_scatter_tensor, coalesced.
    ins = [data(rank, 6, torch.float32, salt=i) for i in range(2)]
    outs = [torch.empty(6 * n) for _ in range(2)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    cm.wait()
    for k in range(2):
        same(outs[k], torch.cat([data(r, 6, torch.float32, salt=k) for r in range(n)]),
             f"coalesced all_gather_into_tensor {k}")
    big = [data(rank, 4 * n, torch.float32, salt=10 + i) for i in range(2)]
    red = [torch.empty(4) for _ in range(2)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, i in zip(red, big):
            dist.reduce_scatter_tensor(o, i)
    cm.wait()
    for k in range(2):
        full = reduce_all([data(r, 4 * n, torch.float32, salt=10 + k) for r in range(n)], "SUM",
                          torch.float32)
        same(red[k], full[4 * rank:4 * rank + 4], f"coalesced reduce_scatter_tensor {k}")


def check_rooted(rank, n, gloo):
    for root in range(n):
        for dtype in (torch.float32, torch.int64, torch.bfloat16):
            t = data(rank, 513, dtype, salt=root)
            dist.broadcast(t, src=root)
            same(t, data(root, 513, dtype, salt=root), f"broadcast {dtype} from {root}")
        inputs = [data(r, 333, torch.float32, salt=20 + root) for r in range(n)]
        t = inputs[rank].clone()
        dist.reduce(t, dst=root, op=dist.ReduceOp.MAX)
        if rank == root:
            same(t, reduce_all(inputs, "MAX", torch.float32), f"reduce MAX to {root}")

        # gather and scatter
        mine = data(rank, 77, torch.int32, salt=30 + root)
        outs = [torch.empty(77, dtype=torch.int32) for _ in range(n)] if rank == root else None
        dist.gather(mine, gather_list=outs, dst=root)
        if rank == root:
            for r in range(n):
                same(outs[r], data(r, 77, torch.int32, salt=30 + root), f"gather {r} at {root}")
        got = torch.empty(55, dtype=torch.float64)
        parts = ([data(r, 55, torch.float64, salt=40 + root) for r in range(n)]
                 if rank == root else None)
        dist.scatter(got, scatter_list=parts, src=root)
        same(got, data(rank, 55, torch.float64, salt=40 + root), f"scatter from {root}")



def check_gathers(rank, n, gloo):
    for dtype in (torch.float32, torch.float16, torch.uint8, torch.bool):
        mine = data(rank, 1001, dtype, salt=50)
        want = [data(r, 1001, dtype, salt=50) for r in range(n)]
        outs = [torch.empty(1001, dtype=dtype) for _ in range(n)]
        dist.all_gather(outs, mine)
        for r in range(n):
            same(outs[r], want[r], f"all_gather {dtype} part {r}")
        flat = torch.empty(1001 * n, dtype=dtype)
        dist.all_gather_into_tensor(flat, mine)
        same(flat, torch.cat(want), f"all_gather_into_tensor {dtype}")
        if dtype != torch.bool:
            def on_gloo(g, mine=mine, dtype=dtype):
                o = torch.empty(1001 * n, dtype=dtype)
                dist.all_gather_into_tensor(o, mine, group=g)
                return o
            vs_gloo(gloo, on_gloo, flat, f"all_gather_into_tensor {dtype}")
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": rank, "name": f"r{rank}"})
    expect(objs == [{"rank": r, "name": f"r{r}"} for r in range(n)], f"all_gather_object: {objs}")
    # reduce_scatter: list and tensor forms
    for dtype in (torch.float32, torch.int32):
        ins = [data(rank, 40, dtype, salt=60 + j) for j in range(n)]
        out = torch.empty(40, dtype=dtype)
        dist.reduce_scatter(out, ins)
        same(out, reduce_all([data(r, 40, dtype, salt=60 + rank) for r in range(n)], "SUM", dtype),
             f"reduce_scatter {dtype}")
        big = torch.cat(ins)
        out2 = torch.empty(40, dtype=dtype)
        dist.reduce_scatter_tensor(out2, big, op=dist.ReduceOp.MIN)
        same(out2, reduce_all([data(r, 40, dtype, salt=60 + rank) for r in range(n)], "MIN", dtype),
             f"reduce_scatter_tensor MIN {dtype}")

        def on_gloo(g, big=big, dtype=dtype):
            o = torch.empty(40, dtype=dtype)
            dist.reduce_scatter_tensor(o, big, op=dist.ReduceOp.MIN, group=g)
            return o
        vs_gloo(gloo, on_gloo, out2, f"reduce_scatter_tensor {dtype}")


def check_all_to_all(rank, n, gloo):
    # Equal slices.
    inp = torch.arange(6 * n, dtype=torch.float32) + 100 * rank
    out = torch.empty(6 * n)
    dist.all_to_all_single(out, inp)
    want = torch.cat([torch.arange(6 * rank, 6 * rank + 6, dtype=torch.float32) + 100 * r
                      for r in range(n)])
    same(out, want, "all_to_all_single")
    g_out = torch.empty(6 * n)
    dist.all_to_all_single(g_out, inp, group=gloo)
    same(out, g_out, "all_to_all_single: loom vs gloo")
    # Uneven slices (MoE): rank r sends (r + k + 1) rows of 3 to rank k.
    send = [rank + k + 1 for k in range(n)]
    recv = [r + rank + 1 for r in range(n)]
    rows = torch.cat([torch.full((s, 3), float(10 * rank + k)) for k, s in enumerate(send)])
    got = torch.empty(sum(recv), 3)
    dist.all_to_all_single(got, rows, output_split_sizes=recv, input_split_sizes=send)
    want = torch.cat([torch.full((s, 3), float(10 * r + rank)) for r, s in enumerate(recv)])
    same(got, want, "all_to_all_single with split sizes")
    # all_to_all of lists, of unequal sizes.
    ins = [torch.full((k + 2,), rank * 10 + k, dtype=torch.int64) for k in range(n)]
    outs = [torch.empty(rank + 2, dtype=torch.int64) for _ in range(n)]
    dist.all_to_all(outs, ins)
    for r in range(n):
        same(outs[r], torch.full((rank + 2,), r * 10 + rank, dtype=torch.int64), f"all_to_all {r}")


def check_p2p(rank, n, gloo):
    if n == 1:
        return
    # A ring through batch_isend_irecv (both directions at once: no deadlock).
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    for count in (5, 1 << 17):
        s = torch.full((count,), float(rank))
        r = torch.empty(count)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, s, nxt),
                                       dist.P2POp(dist.irecv, r, prv)])
        for q in reqs:
            q.wait()
        same(r, torch.full((count,), float(prv)), f"batch_isend_irecv ring x{count}")
    # Blocking send/recv between rank 0 and the last rank.
    last = n - 1
    if rank == 0:
        dist.send(torch.arange(10, dtype=torch.int32), dst=last)
        back = torch.empty(3, dtype=torch.float64)
        dist.recv(back, src=last)
        same(back, torch.tensor([1.5, 2.5, 3.5], dtype=torch.float64), "recv from the last rank")
    elif rank == last:
        got = torch.empty(10, dtype=torch.int32)
        dist.recv(got, src=0)
        same(got, torch.arange(10, dtype=torch.int32), "recv from rank 0")
        dist.send(torch.tensor([1.5, 2.5, 3.5], dtype=torch.float64), dst=0)


def check_groups(rank, n, gloo):
    dist.barrier()
    if n < 2:
        return
    # A subgroup of the even ranks, made by new_group (its own Loom communicator).
    evens = list(range(0, n, 2))
    sub = dist.new_group(ranks=evens, backend="loom")
    if rank in evens:
        t = torch.full((8,), float(rank))
        dist.all_reduce(t, group=sub)
        same(t, torch.full((8,), float(sum(evens))), "all_reduce on new_group(evens)")
        dist.barrier(group=sub)


def check_direct(rank, n, gloo):
    # The benchmark's reference: Loom's own call on the group's communicator, after the operations
    # queued before it (an async all_reduce still queued or running), with the same values.
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    x = torch.full((1 << 16,), float(rank))
    work = dist.all_reduce(x, async_op=True)
    y = torch.arange(1000, dtype=torch.float32) + rank
    loom_torch._C.direct_all_reduce(backend, y)
    expect(work.is_completed(), "direct_all_reduce ran after the queued all_reduce")
    same(x, torch.full((1 << 16,), float(n * (n - 1) // 2)), "all_reduce before direct_all_reduce")
    same(y, torch.arange(1000, dtype=torch.float32) * n + n * (n - 1) // 2, "direct_all_reduce")
    raises(lambda: loom_torch._C.direct_all_reduce(gloo._get_backend(torch.device("cpu")), y),
           ["not a loom backend"], "direct_all_reduce on gloo's backend")


def check_profiler(rank, n, gloo):
    # Under torch.profiler an operation is a range named for it, blocking or not (outside a
    # profiler the backend opens none: it costs an allocation per call). At 2 ranks only (ops.np2
    # and the torchrun run): the rank count changes nothing here, and the profiler's first use
    # costs each process about 2 s of one core (PyTorch's own start-up).
    if n != 2:
        return
    t = torch.ones(64)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        dist.all_reduce(t)
        dist.broadcast(t, src=0, async_op=True).wait()
    names = {e.name for e in prof.events()}
    for title in ("loom:all_reduce", "loom:broadcast"):
        expect(title in names, f"{title} not among the profiler's events: {sorted(names)[:20]}")
    same(t, torch.full((64,), float(n)), "all_reduce under the profiler")


def check_bad_input(rank, n, gloo):
    nc = torch.zeros(4, 4).t()
    raises(lambda: dist.all_reduce(nc), ["contiguous"], "non-contiguous all_reduce")
    raises(lambda: dist.all_reduce(torch.zeros(3), op=dist.ReduceOp.BAND), ["not supported"],
           "BAND")
    raises(lambda: dist.broadcast(torch.zeros(3), src=n + 5), ["rank"], "a root out of range")
    raises(lambda: dist.all_reduce(torch.zeros(2, dtype=torch.bool), op=dist.ReduceOp.AVG),
           ["AVG", "bool"], "AVG of bool")
    o = torch.empty(5)
    raises(lambda: dist.all_gather_into_tensor(o, torch.zeros(3)), ["all_gather"],
           "all_gather_into_tensor of the wrong size")
    # Still usable after refused calls.
    t = torch.ones(3)
    dist.all_reduce(t)
    same(t, torch.full((3,), float(n)), "all_reduce after refused calls")


def main(rank, n, port):
    gloo = init(rank, n, port)
    expect(dist.get_backend() == "loom", f"backend {dist.get_backend()}")
    for check in (check_all_reduce, check_async, check_coalesced, check_rooted, check_gathers,
                  check_all_to_all, check_p2p, check_groups, check_direct, check_profiler,
                  check_bad_input):
        check(rank, n, gloo)
        dist.barrier(group=gloo)
    expect(Counter.gloo > 20, f"only {Counter.gloo} results were compared with gloo's")
    dist.destroy_process_group()
    if rank == 0:
        print(f"ops_test: {n} ranks passed ({Counter.gloo} results compared with gloo)")


if __name__ == "__main__":
    launch(main)
