"""DistributedDataParallel on "loom" against gloo, in the same processes: two copies of a small
MLP with the same initial parameters, one wrapped over the loom default group and one over a gloo
group, train for --steps steps on the same per-rank batches (SGD with momentum). The losses of
every step and the final parameters must agree.

Tolerance: the gradients are averaged by an all_reduce SUM; Loom and gloo may add the ranks'
gradients in different orders, and float addition is not associative, so results may differ by
rounding, and training with momentum amplifies such differences step after step (float32 at 4
ranks: 8e-5 relative by step 56). With 2 ranks a sum of two is the same in any order: the float32
runs must be bit for bit equal. With more ranks the model is float64, whose rounding is 2^29
times finer: losses and parameters within 1e-9 relative (parameters also 1e-9 absolute).

    python3 tests/torch/ddp_test.py --nprocs N [--steps 300]
"""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from common import compare_training, done, expect, init, launch, step_all


def model(dtype):
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                               torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(dtype)


def main(rank, n, port):
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    steps = parser.parse_known_args()[0].steps
    gloo = init(rank, n, port)
    exact = n <= 2
    dtype = torch.float32 if exact else torch.float64
    nets = {"loom": DDP(model(dtype), process_group=None, bucket_cap_mb=0.01),
            "gloo": DDP(model(dtype), process_group=gloo, bucket_cap_mb=0.01)}
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for k, m in nets.items()}
    losses = {k: [] for k in nets}
    gen = torch.Generator().manual_seed(99 + rank)
    w_true = torch.randn(32, 4, generator=torch.Generator().manual_seed(7)).to(dtype)
    for _ in range(steps):
        x = torch.randn(16, 32, generator=gen).to(dtype)
        y = x @ w_true + 0.01 * torch.randn(16, 4, generator=gen).to(dtype)
        step_all(nets, opts, losses, x, y)
    params = [(pn, p, q) for (pn, p), (_, q) in zip(nets["loom"].module.named_parameters(),
                                                    nets["gloo"].module.named_parameters())]
    first, last = compare_training("ddp", losses, params, exact, 1e-9, 1e-9)
    # The replicas agree across ranks (DDP kept them in sync).
    flat = torch.cat([p.detach().flatten() for p in nets["loom"].module.parameters()])
    root = flat.clone()
    dist.broadcast(root, src=0)
    expect(torch.equal(flat, root), "the loom replicas differ across ranks")
    done(rank, f"ddp_test: {n} ranks, {steps} steps: mean loss of 10 steps {first:.4f} -> "
              f"{last:.4f}, {dtype}, {'bit for bit' if exact else 'within 1e-9'} equal to gloo")


if __name__ == "__main__":
    launch(main)
