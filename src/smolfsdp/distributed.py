"""Process-group set-up and rank-0 logging for runs started by torchrun or accelerate launch.

Every training entry point calls :func:`init_distributed` first and :func:`teardown` last. On CPU
the backend is gloo, on CUDA it is NCCL. Notebooks never call these: they start runs through
``smolfsdp.launch`` (a subprocess).
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def is_launched() -> bool:
    """True inside a process started by torchrun / accelerate launch (RANK and WORLD_SIZE are set)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_distributed(timeout_s: float = 600.0) -> DistInfo:
    """Join (or create, for a single process) the default process group.

    Returns a DistInfo with this rank's device: ``cuda:LOCAL_RANK`` when CUDA is available, else CPU.
    """
    if not is_launched():  # a plain `python` process: a group of one
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        device, backend = torch.device("cuda", local_rank), "nccl"
        torch.cuda.set_device(device)
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), **kwargs)
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, device, backend)


def teardown() -> None:
    """Synchronise and destroy the process group, so gloo does not abort at interpreter exit."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup_logging(rank: int) -> None:
    """INFO on rank 0, WARNING elsewhere, with the rank in every line."""
    level = logging.INFO if rank == 0 else logging.WARNING
    logging.basicConfig(
        level=level,
        stream=sys.stdout,
        force=True,
        format=f"[rank{rank}] %(asctime)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("datasets", "httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def print0(*args, **kwargs) -> None:
    """print on rank 0 only (nanoGPT's print0)."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(*args, **kwargs, flush=True)


def all_gather_object(obj):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
