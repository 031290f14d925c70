"""Process-group set-up and rank-0 logging for runs started by torchrun or accelerate launch.

Every training entry point calls :func:`init_distributed` first and :func:`teardown` last. On CPU
the backend is gloo, on CUDA it is NCCL. Notebooks never call these: they start runs through
``smolfsdp.launch`` (a subprocess).

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
import sys
from collections.abc import Iterator
from contextlib import contextmanager
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
    ``timeout_s`` bounds every collective of the default group (torch's default is 600 s for NCCL,
    1800 s for gloo); the flight recorder is switched on so a timeout can name its collective.
    """
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
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


class CollectiveError(RuntimeError):
    """A collective failed (timed out, or a peer vanished); the message names the rank and the collective."""


def last_collective() -> dict | None:
    """This rank's most recent collective from torch's flight recorder: ``profiling_name`` (e.g.
    ``gloo:all_reduce``), ``collective_seq_id``, ``input_sizes``, ``timeout_ms``, ``process_group``.
    None when the recorder is off (``TORCH_FR_BUFFER_SIZE`` unset or 0) or empty."""
    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json

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
