"""loom_torch's CUDA path on Loom's emulated GPU (no GPU needed): PyTorch's CUDA device guard is
replaced by one over libloom-fakecuda.so (emulated_gpu.cc), the library LOOM_CUDA_LIB gives Loom,
so CUDA tensors, streams and events are the emulated device's and Loom runs its device path on
them (CUDA IPC between the ranks' processes, streams, its kernels' host build). Checked:
- all_reduce (dtypes, SUM/PRODUCT/MIN/MAX/AVG), broadcast, reduce, all_gather_into_tensor,
  reduce_scatter_tensor, all_to_all_single, send/recv, batch_isend_irecv, coalesced all_reduce
  and allreduce_coalesced on CUDA tensors, against values computed from every rank's inputs;
- stream order, without timing: a gate (a stream memory wait on host memory) holds the caller's
  stream; the input is written on that stream after the gate; all_reduce(async_op=True) and
  wait() return while the gate is closed (the host is not blocked) and is_completed() is False;
  a copy made on the caller's stream after wait() reads the result once the gate opens (wait()
  made the stream wait); the same from a second stream made current; the Future's value;
- CUDA graphs (torch.cuda.graph's way, on the emulated driver: a capture of the current stream in
  GLOBAL mode): a blocking all_reduce, an async all_reduce waited on in the capture and an
  allreduce_coalesced, captured once, nothing run at capture, then three launches with new inputs
  written before each: every launch reduces that launch's inputs;
- bad input: tensors of two devices in one operation;
- destroy_process_group with an operation still waiting on the stream: it completes first;
- (--mode dead) a rank that dies while the other's stream waits: the stream is released, and the
  failure is raised by wait() or the next operation;
- (--mode abort) an abort while the stream waits on an operation a peer never joins: the stream
  is released and wait() raises.

    LOOM_CUDA_LIB=build/tests/device/fake_cuda/libloom-fakecuda.so \\
        python3 tests/torch/emulated_gpu_test.py --nprocs N [--mode ops|abort|dead]
"""

import argparse
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

from common import expect, init, launch, raises, same
from ops_test import data, reduce_all

try:
    import loom_emulated_gpu as egpu
except ImportError as e:
    print(f"SKIP: loom_emulated_gpu is not built ({e})")
    sys.exit(77)

OPS = {"SUM": dist.ReduceOp.SUM, "PRODUCT": dist.ReduceOp.PRODUCT, "MIN": dist.ReduceOp.MIN,
       "MAX": dist.ReduceOp.MAX}


def cuda(t):
    return egpu.to_device(t)


def check_ops(rank, n):
    checked = 0
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
                  torch.int64, torch.uint8, torch.int8):
        for name, op in OPS.items():
            for count in (1, 1000, (1 << 17) + 3):
                inputs = [data(r, count, dtype, salt=count, product=name == "PRODUCT")
                          for r in range(n)]
                t = cuda(inputs[rank])
                dist.all_reduce(t, op=op)
                same(egpu.to_cpu(t), reduce_all(inputs, name, dtype),
                     f"all_reduce {name} {dtype} x{count}")
                checked += 1
    inputs = [data(r, 999, torch.float32, salt=5) for r in range(n)]
    t = cuda(inputs[rank])
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    same(egpu.to_cpu(t), reduce_all(inputs, "SUM", torch.float64).float() / n, "all_reduce AVG",
         exact=False)
    for root in range(n):
        t = cuda(data(rank, 513, torch.bfloat16, salt=root))
        dist.broadcast(t, src=root)
        same(egpu.to_cpu(t), data(root, 513, torch.bfloat16, salt=root), f"broadcast from {root}")
        inputs = [data(r, 333, torch.float32, salt=20 + root) for r in range(n)]
        t = cuda(inputs[rank])
        dist.reduce(t, dst=root, op=dist.ReduceOp.MAX)
        if rank == root:
            same(egpu.to_cpu(t), reduce_all(inputs, "MAX", torch.float32), f"reduce to {root}")
    want = [data(r, 1001, torch.float16, salt=50) for r in range(n)]
    flat = cuda(torch.zeros(1001 * n, dtype=torch.float16))
    dist.all_gather_into_tensor(flat, cuda(want[rank]))
    same(egpu.to_cpu(flat), torch.cat(want), "all_gather_into_tensor")
    big = [data(r, 40 * n, torch.int32, salt=60) for r in range(n)]
    out = cuda(torch.zeros(40, dtype=torch.int32))
    dist.reduce_scatter_tensor(out, cuda(big[rank]), op=dist.ReduceOp.MIN)
    same(egpu.to_cpu(out), reduce_all(big, "MIN", torch.int32)[40 * rank:40 * rank + 40],
         "reduce_scatter_tensor MIN")
    inp = cuda(torch.arange(6 * n, dtype=torch.float32) + 100 * rank)
    o = cuda(torch.zeros(6 * n))
    dist.all_to_all_single(o, inp)
    same(egpu.to_cpu(o), torch.cat([torch.arange(6 * rank, 6 * rank + 6, dtype=torch.float32) +
                                    100 * r for r in range(n)]), "all_to_all_single")
    a, b = cuda(torch.full((10,), float(rank))), cuda(torch.full((7,), 2.0 * rank))
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    s = n * (n - 1) // 2
    same(egpu.to_cpu(a), torch.full((10,), float(s)), "coalesced all_reduce a")
    same(egpu.to_cpu(b), torch.full((7,), 2.0 * s), "coalesced all_reduce b")
    xs = [cuda(torch.full((5,), float(rank))), cuda(torch.full((9,), float(rank + 1)))]
    dist.distributed_c10d._get_default_group().allreduce_coalesced(xs).wait()
    same(egpu.to_cpu(xs[1]), torch.full((9,), float(s + n)), "allreduce_coalesced")
    if n > 1:
        nxt, prv = (rank + 1) % n, (rank - 1) % n
        src, dst = cuda(torch.full((1 << 16,), float(rank))), cuda(torch.zeros(1 << 16))
        for q in dist.batch_isend_irecv([dist.P2POp(dist.isend, src, nxt),
                                         dist.P2POp(dist.irecv, dst, prv)]):
            q.wait()
        same(egpu.to_cpu(dst), torch.full((1 << 16,), float(prv)), "batch_isend_irecv ring")
        if rank == 0:
            dist.send(cuda(torch.arange(10, dtype=torch.int64)), dst=n - 1)
        elif rank == n - 1:
            got = cuda(torch.zeros(10, dtype=torch.int64))
            dist.recv(got, src=0)
            same(egpu.to_cpu(got), torch.arange(10, dtype=torch.int64), "recv from rank 0")
    dist.barrier()
    return checked


def check_stream_order(rank, n, new_stream):
    if new_stream:
        egpu.use_new_stream()
    count = 1 << 18
    x = cuda(torch.zeros(count))
    gate = egpu.gate()  # the caller's stream waits here until gate.open()
    egpu.write(x, torch.full((count,), float(rank + 1)))  # after the gate
    work = dist.all_reduce(x, async_op=True)
    fut = work.get_future()
    work.wait()  # the host is not blocked: the gate is still closed
    pending = not work.is_completed()
    gate.open()
    got = egpu.to_cpu(x)  # on the caller's stream, after wait(): the result
    want = torch.full((count,), float(n * (n + 1) // 2))
    same(got, want, f"all_reduce after a gate{' on a new stream' if new_stream else ''}")
    egpu.synchronize()
    expect(work.is_completed(), "is_completed() once the stream passed the operation")
    expect(pending, "is_completed() was True while the caller's stream was still gated")
    value = fut.wait()[0]
    same(egpu.to_cpu(value), want, "the Future's value")
    if new_stream:
        egpu.use_default_stream()
    return pending


def check_graph(rank, n):
    count = 1 << 12
    x = cuda(torch.zeros(count))
    y = cuda(torch.zeros(7, dtype=torch.float64))
    zs = [cuda(torch.zeros(5)), cuda(torch.zeros(3, dtype=torch.int32))]
    egpu.synchronize()
    egpu.begin_capture()
    dist.all_reduce(x)
    work = dist.all_reduce(y, op=dist.ReduceOp.MAX, async_op=True)
    work.wait()  # the caller's stream joins the backend's again, inside the capture
    dist.distributed_c10d._get_default_group().allreduce_coalesced(zs).wait()
    graph = egpu.end_capture()
    same(egpu.to_cpu(x), torch.zeros(count), "the captured all_reduce ran at capture")
    for k in range(1, 4):
        egpu.write(x, torch.full((count,), float(rank + k)))
        egpu.write(y, torch.full((7,), float(rank * k), dtype=torch.float64))
        egpu.write(zs[0], torch.full((5,), float(k)))
        egpu.write(zs[1], torch.full((3,), rank + k, dtype=torch.int32))
        egpu.launch_graph(graph)
        same(egpu.to_cpu(x), torch.full((count,), float(sum(r + k for r in range(n)))),
             f"captured all_reduce, launch {k}")
        same(egpu.to_cpu(y), torch.full((7,), float((n - 1) * k), dtype=torch.float64),
             f"captured async all_reduce (MAX), launch {k}")
        same(egpu.to_cpu(zs[0]), torch.full((5,), float(n * k)), f"captured coalesced, launch {k}")
        same(egpu.to_cpu(zs[1]), torch.full((3,), sum(r + k for r in range(n)), dtype=torch.int32),
             f"captured coalesced int32, launch {k}")
    egpu.synchronize()
    egpu.destroy_graph(graph)
    t = cuda(torch.ones(3))
    dist.all_reduce(t)
    same(egpu.to_cpu(t), torch.full((3,), float(n)), "an eager all_reduce after the graph")


def check_bad_input(rank, n):
    raises(lambda: dist.all_gather_into_tensor(cuda(torch.zeros(3 * n)), torch.zeros(3)),
           ["loom", "cpu", "cuda:0"], "a CUDA output and a CPU input")
    t = cuda(torch.ones(3))
    dist.all_reduce(t)
    same(egpu.to_cpu(t), torch.full((3,), float(n)), "all_reduce after a refused call")


def destroy_with_pending(rank, n):
    """destroy_process_group with an all_reduce still waiting on the stream (behind a gate opened
    0.5 s later): the group's shutdown lets it finish, then destroys the communicator."""
    count = 1 << 14
    x = cuda(torch.zeros(count))
    gate = egpu.gate()
    egpu.write(x, torch.full((count,), float(rank + 1)))
    dist.all_reduce(x, async_op=True)
    threading.Timer(0.5, gate.open).start()
    dist.destroy_process_group()
    same(egpu.to_cpu(x), torch.full((count,), float(n * (n + 1) // 2)),
         "an all_reduce pending on the stream at destroy_process_group")


def check_dead_peer(rank, n):
    t = cuda(torch.ones(16))
    dist.all_reduce(t)  # everything works first
    if rank == 1:
        os._exit(0)  # without a word, while rank 0's stream will wait for it
    x = cuda(torch.ones(1 << 12))
    failed = None
    try:
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        egpu.synchronize()  # released by Loom when the peer is found dead
        dist.all_reduce(cuda(torch.ones(4)))  # the failure is the communicator's
    except Exception as e:  # noqa: BLE001
        failed = str(e)
    expect(failed is not None, "no exception after the peer died")
    expect("loom" in failed, f"the exception is not Loom's: {failed}")
    print(f"emulated_gpu_test: dead peer: {failed.splitlines()[0][:200]}", flush=True)
    os._exit(0)


def abort_in_flight(rank, n):
    """Rank 0 aborts its group while its stream waits on an all_reduce that rank 1 never joins:
    the stream is released, and wait() raises."""
    t = cuda(torch.ones(16))
    dist.all_reduce(t)  # everything works first
    if rank == 1:
        time.sleep(2)
        os._exit(0)
    x = cuda(torch.ones(1 << 12))
    work = dist.all_reduce(x, async_op=True)
    time.sleep(0.3)
    expect(not work.is_completed(), "the all_reduce completed on the GPU without rank 1")
    start = time.monotonic()
    dist.distributed_c10d._abort_process_group()
    egpu.synchronize()  # the stream was let go
    msg = raises(work.wait, ["loom"], "wait() after the abort")
    expect(time.monotonic() - start < 20, "releasing the stream took over 20 s")
    print(f"emulated_gpu_test abort: the stream was released; wait() raised: {msg[:160]}",
          flush=True)
    os._exit(0)


def main(rank, n, port, mode="ops"):
    egpu.install(os.environ["LOOM_CUDA_LIB"])
    # torch.distributed's Python side asks the CUDA runtime (absent here) for the capability of
    # a broadcast's device: the emulated GPU's is 9.0.
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    gloo = init(rank, n, port)
    if mode == "abort":
        abort_in_flight(rank, n)
    if mode == "dead":
        check_dead_peer(rank, n)
    checked = check_ops(rank, n)
    check_stream_order(rank, n, False)
    check_stream_order(rank, n, True)
    check_graph(rank, n)
    check_bad_input(rank, n)
    dist.barrier(group=gloo)
    if rank == 0:
        print(f"emulated_gpu_test: {n} ranks passed ({checked} all_reduce cases on CUDA tensors, "
              "stream order on the default and a new stream, a captured graph launched 3 times)",
              flush=True)
    destroy_with_pending(rank, n)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--mode", choices=["ops", "abort", "dead"], default="ops")
    mode = parser.parse_known_args()[0].mode
    if not os.environ.get("LOOM_CUDA_LIB"):
        print("SKIP: LOOM_CUDA_LIB must name the emulated GPU (libloom-fakecuda.so)")
        sys.exit(77)
    launch(main, mode)
