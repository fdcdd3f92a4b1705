"""Shared by the loom_torch tests: launching ranks and comparing results.

Each test script runs its ranks with torch.multiprocessing (forked, or spawned), or under torchrun
when torchrun's RANK/WORLD_SIZE are set. Every rank makes the "loom" default process group and, beside
it, a gloo group over the same ranks: results are compared between the two in the same
processes, and against values computed from every rank's inputs.
"""

import argparse
import datetime
import os
import socket
import sys
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import loom_torch  # noqa: F401  (registers "loom")

TIMEOUT = datetime.timedelta(seconds=int(os.environ.get("LOOMTEST_TORCH_TIMEOUT", "60")))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init(rank, world_size, port, backend="loom"):
    """The default group on backend (tcp:// rendezvous, or torchrun's env://), and a gloo group."""
    if port is None:
        dist.init_process_group(backend, timeout=TIMEOUT)
    else:
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size, timeout=TIMEOUT)
    return dist.new_group(backend="gloo", timeout=TIMEOUT)


def _entry(rank, fn, world_size, port, args):
    try:
        fn(rank, world_size, port, *args)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # a failing rank must not wait for the others in destroy_process_group


def launch(fn, *args, start_method=None):
    """Runs fn(rank, world_size, port, *args) on --nprocs ranks, or on this process's rank under
    torchrun (port None: env:// rendezvous). The ranks are forked (torch.multiprocessing) unless
    start_method or LOOMTEST_TORCH_START says "spawn": a spawned rank imports torch again, about
    3 s of one core each (four ranks on a 2-core machine took 18 s instead of 7). This process
    must then be single-threaded and must not have initialized CUDA (a test that asks
    torch.cuda.is_available() first spawns)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--nprocs", type=int, default=2)
    opts, _ = parser.parse_known_args()
    if "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ):
        _entry(int(os.environ["RANK"]), fn, int(os.environ["WORLD_SIZE"]), None, args)
        return
    method = start_method or os.environ.get("LOOMTEST_TORCH_START", "fork")
    mp.start_processes(_entry, args=(fn, opts.nprocs, free_port(), args), nprocs=opts.nprocs,
                       join=True, start_method=method)


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def same(got, want, what, exact=True):
    """Equal tensors (bit for bit where exact, else within float tolerance)."""
    ok = torch.equal(got, want) if exact else torch.allclose(
        got.double() if not got.is_complex() else got, want.double() if not want.is_complex()
        else want, rtol=1e-3, atol=1e-3)
    if not ok:
        raise AssertionError(f"{what}: got {got.flatten()[:8].tolist()} ... expected "
                             f"{want.flatten()[:8].tolist()} ... ({got.dtype}, {tuple(got.shape)})")


def raises(fn, words, what):
    """fn() must raise an exception whose message has every word of words."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        msg = str(e)
        missing = [w for w in words if w not in msg]
        if missing:
            raise AssertionError(f"{what}: the error does not say {missing}: {msg}") from e
        return msg
    raise AssertionError(f"{what}: no exception")


def step_all(nets, opts, losses, x, y):
    """One training step of every model in nets (mse loss), each recording its loss."""
    for k, m in nets.items():
        opts[k].zero_grad()
        loss = torch.nn.functional.mse_loss(m(x), y)
        loss.backward()
        opts[k].step()
        losses[k].append(loss.item())


def compare_training(name, losses, params, exact, rtol, atol, shrink=0.5):
    """losses: {"loom": [...], "gloo": [...]} per step; params: (name, loom tensor, gloo tensor)
    triples. Equal bit for bit where exact, else losses within rtol relative and parameters within
    rtol relative plus atol absolute. The loom run must have learned (mean of its last 10 losses
    below shrink times its first 10). Returns those two means."""
    for i, (a, b) in enumerate(zip(losses["loom"], losses["gloo"])):
        ok = a == b if exact else abs(a - b) <= rtol * max(abs(b), 1e-12)
        expect(ok, f"{name}: step {i}: loss {a} on loom, {b} on gloo")
    for pname, p, q in params:
        ok = torch.equal(p, q) if exact else torch.allclose(p, q, rtol=rtol, atol=atol)
        expect(ok, f"{name}: parameter {pname}: largest difference {(p - q).abs().max().item()}")
    first, last = sum(losses["loom"][:10]) / 10, sum(losses["loom"][-10:]) / 10
    expect(last < shrink * first, f"{name}: the model did not learn: mean loss {first} -> {last}")
    return first, last


def done(rank, line):
    """The end of a test's ranks: the group goes, and rank 0 says what passed."""
    dist.destroy_process_group()
    if rank == 0:
        print(line, flush=True)
