"""FSDP2 (fully_shard) on "loom" against gloo, in the same processes: the same MLP sharded over a
DeviceMesh of the loom default group and over one of a gloo group, trained for --steps steps on
the same per-rank batches (Adam). Parameters are all-gathered and gradients reduce-scattered by
each backend. The losses of every step and the final (gathered) parameters must agree: with 2
ranks, bit for bit (a sum or mean of two is the same in any order); with more, within 1e-4
relative (float32 sums in another order, see ddp_test.py). The loss must fall.

    python3 tests/torch/fsdp_test.py --nprocs 2 [--steps 100]
"""

import argparse

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from common import compare_training, done, init, launch, step_all


def model():
    torch.manual_seed(4321)
    return torch.nn.Sequential(torch.nn.Linear(16, 48), torch.nn.GELU(), torch.nn.Linear(48, 48),
                               torch.nn.GELU(), torch.nn.Linear(48, 2))


def main(rank, n, port):
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    steps = parser.parse_known_args()[0].steps
    gloo = init(rank, n, port)
    meshes = {"loom": DeviceMesh.from_group(dist.group.WORLD, "cpu"),
              "gloo": DeviceMesh.from_group(gloo, "cpu")}
    nets, opts, losses = {}, {}, {}
    for k, mesh in meshes.items():
        m = model()
        for layer in m:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(m, mesh=mesh)
        nets[k], opts[k], losses[k] = m, torch.optim.Adam(m.parameters(), lr=1e-3), []
    gen = torch.Generator().manual_seed(5 + rank)
    for _ in range(steps):
        x = torch.randn(8, 16, generator=gen)
        y = torch.stack([x[:, :8].sum(1), x[:, 8:].prod(1)], 1)
        step_all(nets, opts, losses, x, y)
    exact = n <= 2
    params = [(pn, p.full_tensor(), q.full_tensor())
              for (pn, p), (_, q) in zip(nets["loom"].named_parameters(),
                                         nets["gloo"].named_parameters())]
    first, last = compare_training("fsdp", losses, params, exact, 1e-4, 1e-6, shrink=1.0)
    done(rank, f"fsdp_test: {n} ranks, {steps} steps: mean loss {first:.4f} -> {last:.4f}, "
              f"{'bit for bit' if exact else 'within tolerance'} equal to gloo")


if __name__ == "__main__":
    launch(main)
