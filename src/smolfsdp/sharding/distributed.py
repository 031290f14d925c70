"""Process-group set-up and rank-0 logging for runs started by torchrun or accelerate launch.

Every training entry point calls :func:`init_distributed` first and :func:`teardown` last. On CPU
the backend is gloo, on CUDA it is NCCL (with gloo beside it for CPU tensors when offloading). Notebooks never call these: they start runs through
``smolfsdp.launch.torchrun`` (a subprocess).

A collective that never completes (a rank stopped, skipped it, or hangs) fails after the process
group's timeout (``collective_timeout_s``) instead of hanging forever. gloo's own error says only
"Timed out waiting 600000ms for recv operation to complete"; :func:`name_collective_errors`
re-raises it as a :class:`CollectiveError` naming the rank and the collective, read from torch's
flight recorder (the ring buffer of each rank's recent collectives, ``TORCH_FR_BUFFER_SIZE``). On
NCCL the watchdog already logs ``[Rank R] Watchdog caught collective operation timeout:
WorkNCCL(SeqNum=..., OpType=ALLREDUCE, ...)`` and aborts the process.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace_json

from smolfsdp.errors import ConfigError


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


def choose_backend(device_type: str, cpu_offload: bool = False) -> str:
    """The process-group backend for a device type: ``"gloo"`` on CPU, ``"nccl"`` on CUDA, and
    ``"cuda:nccl,cpu:gloo"`` on CUDA with CPU offload.

    Why the pair: with offload the parameter shards and their gradients live on the host, and
    gradient clipping all-reduces the norm of those CPU shards (FSDP2: offloaded ``DTensor`` shards;
    FSDP1: ``clip_grad_norm_``); NCCL cannot reduce CPU tensors, gloo can. accelerate 1.15 makes the
    same choice for FSDP offload (``PartialState.__init__``, accelerate/state.py).

    Raises ConfigError for a device type other than ``cpu`` or ``cuda``.
    """
    if device_type == "cpu":
        return "gloo"
    if device_type == "cuda":
        return "cuda:nccl,cpu:gloo" if cpu_offload else "nccl"
    raise ConfigError(f"device type {device_type!r}: smolfsdp runs on 'cpu' (gloo) or 'cuda' (NCCL).")


def check_offload_support(fsdp_version: int, cpu_offload: bool, cuda_available: bool | None = None) -> None:
    """Refuse, before any process starts, an offload that cannot run on this machine.

    FSDP1's ``CPUOffload(offload_params=True)`` copies each unit to the accelerator for compute; on a
    CPU-only machine torch 2.13 fails after launch ("Cannot access accelerator device when none is
    available"). FSDP2's ``CPUOffloadPolicy(pin_memory=False)`` runs on CPU.

    Raises ConfigError for ``cpu_offload`` with ``fsdp_version`` 1 and no CUDA.
    """
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    if cpu_offload and int(fsdp_version) == 1 and not cuda_available:
        raise ConfigError(
            "cpu_offload with fsdp_version 1 needs a GPU: FSDP1's CPUOffload moves each unit to the "
            "accelerator for compute, and torch stops with 'Cannot access accelerator device when none is "
            "available' on this CPU-only machine. Use fsdp_version: 2 (CPUOffloadPolicy runs on CPU), or "
            "drop cpu_offload."
        )


def init_distributed(timeout_s: float = 600.0, cpu_offload: bool = False) -> DistInfo:
    """Join (or create, for a single process) the default process group.

    Returns a DistInfo with this rank's device: ``cuda:LOCAL_RANK`` when CUDA is available, else CPU.
    ``timeout_s`` bounds every collective of the default group (torch's default is 600 s for NCCL,
    1800 s for gloo); the flight recorder is switched on so a timeout can name its collective.
    ``cpu_offload``: on CUDA the group gets gloo for CPU tensors too (:func:`choose_backend`). A group
    that already exists is joined as it is.
    """
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    if not is_launched():  # a plain `python` process: a group of one
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = choose_backend(device.type, cpu_offload)
    if not dist.is_initialized():
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), **kwargs)
    else:
        backend = dist.get_backend()  # joined as it was created (e.g. by the CLI, before train())
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, device, backend)


class CollectiveError(RuntimeError):
    """A collective failed (timed out, or a peer vanished); the message names the rank and the collective."""


def last_collective() -> dict | None:
    """This rank's most recent collective from torch's flight recorder: ``profiling_name`` (e.g.
    ``gloo:all_reduce``), ``collective_seq_id``, ``input_sizes``, ``timeout_ms``, ``process_group``.
    None when the recorder is off (``TORCH_FR_BUFFER_SIZE`` unset or 0) or empty."""
    try:
        entries = json.loads(_dump_fr_trace_json(True, True)).get("entries", [])
    except (ImportError, RuntimeError, ValueError):
        return None
    return max(entries, key=lambda e: e.get("record_id", 0), default=None)


_COMM_FAILURE = ("timed out", "timeout", "connection reset", "connection closed", "watchdog", "nccl error")


@contextmanager
def name_collective_errors() -> Iterator[None]:
    """Re-raise a timed-out or broken collective as :class:`CollectiveError` naming rank and collective.

    Other exceptions pass through unchanged. Use around the body of a launched process::

        with name_collective_errors():
            train(cfg)
    """
    try:
        yield
    except Exception as err:
        text = str(err).lower()
        if not dist.is_initialized() or not (
            isinstance(err, dist.DistError) or any(k in text for k in _COMM_FAILURE)
        ):
            raise
        rank, world = dist.get_rank(), dist.get_world_size()
        last = last_collective()
        if last is None:
            what = "a collective (the flight recorder is off: set TORCH_FR_BUFFER_SIZE to name it)"
        else:
            op = last.get("profiling_name", "?").split(":")[-1]
            sizes = last.get("input_sizes") or []
            what = (
                f"collective {op} (#{last.get('collective_seq_id')} on process group "
                f"{(last.get('process_group') or ['?'])[-1]}, input sizes {sizes}, "
                f"timeout {last.get('timeout_ms', 0) / 1000:g} s)"
            )
        verb = "timed out" if "time" in text else "failed"
        raise CollectiveError(
            f"rank {rank} of {world}: {what} {verb}: {str(err).splitlines()[0]}. Another rank never joined it: "
            "look for a rank that died, skipped the collective or is stuck (its own error or py-spy dump)."
        ) from err


#: The slowest write the wait for rank 0's export allows (a network disk), and the time beside it.
SLOWEST_WRITE_BYTES_PER_S = 50e6
WRITE_WAIT_SLACK_S = 600.0


def write_wait_timeout_s(nbytes: int) -> float:
    """Seconds the other ranks wait for rank 0 to write ``nbytes``: :data:`WRITE_WAIT_SLACK_S` plus
    the write at :data:`SLOWEST_WRITE_BYTES_PER_S` (SmolLM3-3B in fp32, 12.3 GB: 846 s)."""
    return WRITE_WAIT_SLACK_S + nbytes / SLOWEST_WRITE_BYTES_PER_S


def parameter_bytes(model: torch.nn.Module, device: torch.device) -> int:
    """Bytes of ``model``'s parameters over all ranks (each rank's shards summed; a collective).

    FSDP2 ``DTensor`` parameters count their local shard, FSDP1 its flat shard; replicated (DDP) parameters
    count once per rank, which only lengthens a wait sized from it.
    """
    from torch.distributed.tensor import DTensor  # deferred: only the export sizes a wait with it

    local = sum(
        (p.to_local() if isinstance(p, DTensor) else p).numel() * p.element_size() for p in model.parameters()
    )
    total = torch.tensor([local], dtype=torch.int64, device=device)
    dist.all_reduce(total)
    return int(total.item())


@contextmanager
def rank0_writes(nbytes: int) -> Iterator[None]:
    """A block in which rank 0 writes ``nbytes`` (the final model) while the other ranks wait at its end.

    Why: a plain ``dist.barrier()`` there is bounded by the default group's timeout (600 s), and
    rank 0 writing SmolLM3-3B's 12 GB in fp32 to a slow disk can take longer: the waiting ranks
    would fail a run that was fine. The wait is a barrier of a gloo group (CPU and GPU runs alike)
    whose timeout is :func:`write_wait_timeout_s`. A world of one waits for nothing.
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        yield
        return
    timeout = timedelta(seconds=write_wait_timeout_s(nbytes))
    group = dist.new_group(backend="gloo", timeout=timeout)  # every rank, before rank 0 starts writing
    try:
        yield
        dist.barrier(group=group)
    finally:
        dist.destroy_process_group(group)


def teardown() -> None:
    """Synchronise and destroy the process group, so gloo does not abort at interpreter exit."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup_logging(rank: int) -> None:
    """smolfsdp's INFO on rank 0, WARNING elsewhere and from every other library, the rank in every line.

    Third-party INFO (accelerate's "The used dataset had no length" on every eval batch, ...) is
    not for a learner; their warnings still print (the known harmless ones are in ``smolfsdp.quiet``).
    """
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stdout,
        force=True,
        format=f"[rank{rank}] %(asctime)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    logging.getLogger("smolfsdp").setLevel(logging.INFO if rank == 0 else logging.WARNING)


def print0(*args, **kwargs) -> None:
    """print on rank 0 only (nanoGPT's print0)."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(*args, **kwargs, flush=True)


def all_gather_object(obj):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
