"""Sharded checkpoints with torch.distributed.checkpoint (DCP): atomic save, resume.

Each rank writes its own shards of the model and optimizer state (no gather to rank 0). A save
goes to ``step-N.tmp/``; only after every rank finished and rank 0 wrote the ``COMPLETE`` marker is
it renamed to ``step-N/``. A directory without the marker is never resumed from, so a save that
fails part-way leaves the previous checkpoint as the latest one.

    smolfsdp train --lora --save_steps 2 --stop_at_step 2      # "killed" after step 2
    smolfsdp train --lora --resume_from latest                 # continues at step 3
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from smolfsdp.config import ConfigError

MARKER = "COMPLETE"


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(
    run_dir: str | Path, step: int, model, optimizer, scheduler, trainer_state: dict[str, Any], rank: int
) -> Path:
    """Collective: every rank calls it. Returns ``<run_dir>/checkpoints/step-<step>``."""
    final = checkpoint_dir(run_dir) / f"step-{step:06d}"
    tmp = final.with_name(final.name + ".tmp")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
    dcp.save(state, checkpoint_id=str(tmp))
    # RNG streams differ per rank (dropout); each rank keeps its own.
    torch.save(
        {
            "cpu": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        },
        tmp / f"rng_rank{rank}.pt",
    )
    dist.barrier()
    if rank == 0:
        (tmp / "trainer_state.json").write_text(
            json.dumps({**trainer_state, "step": step, "scheduler": scheduler.state_dict()})
        )
        (tmp / MARKER).write_text("ok\n")
        if final.exists():
            shutil.rmtree(final)
        tmp.replace(final)
    dist.barrier()
    return final


def is_complete(path: str | Path) -> bool:
    return (Path(path) / MARKER).is_file()


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run, or None."""
    done = [p for p in checkpoint_dir(run_dir).glob("step-*") if p.is_dir() and is_complete(p)]
    return max(done, key=lambda p: int(p.name.split("-")[1]), default=None)


def resolve_resume(resume_from: str, run_dir: str | Path) -> Path:
    """``"latest"`` or a path -> a complete checkpoint directory; ConfigError otherwise."""
    path = latest_checkpoint(run_dir) if resume_from == "latest" else Path(resume_from)
    if path is None:
        raise ConfigError(f"resume_from=latest but {checkpoint_dir(run_dir)} holds no complete checkpoint.")
    if not path.is_dir() or not is_complete(path):
        raise ConfigError(
            f"{path} is not a complete smolfsdp checkpoint (no {MARKER} marker); "
            "it may be a save that was interrupted."
        )
    return path


def load_checkpoint(path: str | Path, model, optimizer, scheduler) -> dict[str, Any]:
    """Collective: load model + optimizer shards and the scheduler; return the trainer state.

    Call :func:`restore_rng` once everything that draws random numbers while setting up (a
    DataLoader iterator draws its base seed) has run, right before the next training step.
    """
    path = Path(path)
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
    dcp.load(state, checkpoint_id=str(path))
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optim"])
    trainer_state = json.loads((path / "trainer_state.json").read_text())
    scheduler.load_state_dict(trainer_state.pop("scheduler"))
    return trainer_state


def restore_rng(path: str | Path, rank: int) -> None:
    """Put back this rank's RNG streams as they were when the checkpoint was written."""
    rng = torch.load(Path(path) / f"rng_rank{rank}.pt", weights_only=True)
    torch.set_rng_state(rng["cpu"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
