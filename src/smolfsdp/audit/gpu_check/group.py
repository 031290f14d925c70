"""The check's process group of one: gloo, not NCCL (issue 34: NCCL is the riskiest first contact).

At world size 1 FSDP2 moves no bytes between ranks, yet its hooks and ``clip_grad_norm_`` still call the
group; gloo serves them on the host. On CUDA a tiny FSDP2 step is tried first under gloo; only if that
raises (a torch whose gloo lacks a collective on CUDA tensors) is the group remade with NCCL, and the
reason is returned, so the report says which backend ran and why.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from smolfsdp.sharding.fsdp2 import build_mesh


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init(backend: str, device: torch.device) -> None:
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
    os.environ["MASTER_PORT"] = str(_free_port())
    kwargs = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, timeout=timedelta(seconds=300), **kwargs)


def single_process_group(device: torch.device, probe=None) -> tuple[str, str | None]:
    """Create the default group of one on ``device``; returns (backend, why it is not gloo or None).

    ``probe(device)``: what must work under gloo (default: a tiny FSDP2 step, :func:`tiny_step`).
    """
    if device.type == "cuda":
        torch.cuda.set_device(device)
    _init("gloo", device)
    if device.type != "cuda":
        return "gloo", None
    try:
        (probe or tiny_step)(device)
        return "gloo", None
    except Exception as err:  # noqa: BLE001  (any failure of gloo on CUDA tensors: NCCL then, said)
        why = f"gloo failed a tiny FSDP2 step on {device} ({type(err).__name__}: {str(err)[:200]}); NCCL used"
    dist.destroy_process_group()
    _init("nccl", device)
    return "nccl", why


def tiny_step(device: torch.device) -> None:
    """A 4x4 linear layer, FSDP2-sharded on a mesh of one, one step as the check takes them."""
    lin = torch.nn.Linear(4, 4, device=device)
    fully_shard(lin, mesh=build_mesh(device.type, 1))
    opt = torch.optim.AdamW(lin.parameters(), fused=True)
    lin(torch.ones(2, 4, device=device)).sum().backward()
    torch.nn.utils.clip_grad_norm_(lin.parameters(), 1.0)
    opt.step()
    torch.cuda.synchronize(device)
