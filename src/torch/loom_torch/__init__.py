"""Loom as a torch.distributed backend.

    import loom_torch                      # registers the backend "loom"
    torch.distributed.init_process_group("loom")               # every tensor through Loom
    torch.distributed.init_process_group("cpu:loom,cuda:nccl")   # per device

The rendezvous is PyTorch's (torchrun, mp.spawn, init_method="tcp://..."): rank 0 publishes
Loom's unique id through the process group's Store.
"""

import torch  # noqa: F401  (loads libtorch before the extension)
import torch.distributed as dist

from . import _C

__all__ = ["BACKEND", "loom_version"]

BACKEND = "loom"


def loom_version():
    """libloom's LOOM_VERSION_CODE (major * 10000 + minor * 100 + patch)."""
    return _C.loom_version()


def _create_backend(store, rank, world_size, timeout):
    return _C.create_backend(store, rank, world_size, timeout)


if BACKEND not in dist.Backend.backend_list:
    dist.Backend.register_backend(BACKEND, _create_backend, devices=["cpu", "cuda"])
