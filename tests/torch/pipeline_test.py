"""A pipeline over "loom" send/recv (pipeline parallelism): stage r of a 4-layer MLP lives on rank
r (of --nprocs, at least 2; the layers are split evenly). Four microbatches go forward (each stage
receives its input from the previous rank with irecv, sends its output to the next with isend)
and backward (the gradients of the activations travel the other way). Every stage's parameter
gradients must equal those of the whole model run in one process on the same data (same
operations in the same order: bit for bit equal).

    python3 tests/torch/pipeline_test.py --nprocs N
"""

import torch
import torch.distributed as dist

from common import expect, init, launch

LAYERS, WIDTH, MICRO, BATCH = 4, 24, 4, 6


def full_model():
    torch.manual_seed(77)
    return torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh())
                                for _ in range(LAYERS)])


def main(rank, n, port):
    init(rank, n, port)
    expect(n >= 2 and LAYERS % n == 0, f"{n} ranks cannot split {LAYERS} layers")
    per = LAYERS // n
    layers = full_model()
    mine = torch.nn.Sequential(*layers[rank * per:(rank + 1) * per])
    gen = torch.Generator().manual_seed(3)
    xs = [torch.randn(BATCH, WIDTH, generator=gen) for _ in range(MICRO)]
    targets = [torch.randn(BATCH, WIDTH, generator=gen) for _ in range(MICRO)]
    inputs, outputs, losses = [], [], []
    for m in range(MICRO):  # forward
        if rank == 0:
            x = xs[m]
        else:
            x = torch.empty(BATCH, WIDTH)
            dist.irecv(x, src=rank - 1).wait()
            x.requires_grad_(True)
        y = mine(x)
        inputs.append(x)
        outputs.append(y)
        if rank < n - 1:
            dist.isend(y.detach().contiguous(), dst=rank + 1).wait()
        else:
            losses.append(torch.nn.functional.mse_loss(y, targets[m]) / MICRO)
    for m in range(MICRO):  # backward
        if rank == n - 1:
            losses[m].backward()
        else:
            g = torch.empty(BATCH, WIDTH)
            dist.recv(g, src=rank + 1)
            outputs[m].backward(g)
        if rank > 0:
            dist.send(inputs[m].grad.contiguous(), dst=rank - 1)
    # The reference: the whole model in this process.
    ref = full_model()
    total = sum(torch.nn.functional.mse_loss(torch.nn.Sequential(*ref)(xs[m]), targets[m]) / MICRO
                for m in range(MICRO))
    total.backward()
    for i, (p, q) in enumerate(zip(mine.parameters(),
                                   torch.nn.Sequential(*ref[rank * per:(rank + 1) * per])
                                   .parameters())):
        expect(torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-7),
               f"stage {rank} parameter {i}: gradient differs by "
               f"{(p.grad - q.grad).abs().max().item()}")
    dist.destroy_process_group()
    if rank == 0:
        print(f"pipeline_test: {n} stages, {MICRO} microbatches: every gradient matches")


if __name__ == "__main__":
    launch(main)
