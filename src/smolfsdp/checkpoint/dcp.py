"""Sharded checkpoints with torch.distributed.checkpoint (DCP): atomic save, resume.

Each rank writes its own shards of the model and optimizer state (no gather to rank 0). A save
goes to ``step-N.tmp/``; only after every rank finished and rank 0 wrote the ``COMPLETE`` marker is
it renamed to ``step-N/``. A directory without the marker is never resumed from, so a save that
fails part-way leaves the previous checkpoint as the latest one. The marker records each file's size
and SHA-256; a resume or a convert checks them first, and reads DCP's pickled ``.metadata`` only
through an allow-list (``smolfsdp.checkpoint.verify``).

    smolfsdp train --lora --save_steps 2 --stop_at_step 2      # "killed" after step 2
    smolfsdp train --lora --resume_from latest                 # continues at step 3
"""

from __future__ import annotations

import errno
import json
import shutil
import sys
from collections.abc import Callable
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

# re-exported: callers import the checkpoint API from this module
from smolfsdp.checkpoint.convert import (  # noqa: F401
    ConvertPlan,
    check_matches_model,
    config_of,
    convert_checkpoint,
    plan_convert,
)
from smolfsdp.checkpoint.disk import (  # noqa: F401
    ADAM_STATES,
    DiskFullError,
    DiskSpaceError,
    check_disk_space,
    check_disk_space_each,
    disk_full_cause,
    estimate_checkpoint_bytes,
    explain_disk_full,
    free_bytes,
    full_disk_after_failure,
)
from smolfsdp.checkpoint.verify import (  # noqa: F401
    MARKER,
    CheckpointCorruptError,
    UnsafeCheckpointError,
    complete_checkpoints,
    current_lineage,
    dcp_load,
    find_problem,
    hash_files,
    is_complete,
    newest_good_checkpoint,
    read_dcp_metadata,
    verify_checkpoint,
    write_marker,
)
from smolfsdp.errors import ConfigError
from smolfsdp.secrets import redact
from smolfsdp.yaml_files import read_recipe


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


#: The checkpoint this process last resumed from (:func:`resolve_resume`) or saved (:func:`atomic_save`),
#: per checkpoints folder: the ``parent`` the next save records in its marker (its lineage).
_LAST: dict[Path, Path] = {}


_TOLD: set[Path] = set()  # left-branch checkpoints already named as kept (once per process)


def _lineage_key(run_dir: str | Path) -> Path:
    return checkpoint_dir(run_dir).resolve()


def atomic_save(
    run_dir: str | Path,
    step: int,
    rank: int,
    write: Callable[[Path], None],
    *,
    keep: int | None = None,
    config=None,
) -> Path:
    """Collective: write a checkpoint into ``step-N.tmp/``, mark it ``COMPLETE``, rename it ``step-N/``.

    ``write(tmp)`` runs on every rank and puts the state into ``tmp`` (a DCP save is itself a
    collective). Rank 0 then writes ``config.yaml`` (the settings that produced these tensors); the
    ranks hash the files (size + SHA-256, each rank a share), rank 0 writes them into the marker and
    renames. With ``keep``, only the newest ``keep`` complete checkpoints remain (the new one is
    complete before any old one is removed; only the newest ``keep`` of its lineage stay, see
    :func:`smolfsdp.checkpoint.verify.current_lineage`: the marker records the checkpoint this process
    resumed from or saved last as the new one's parent); a left branch's checkpoints of higher steps are
    kept, as HF Trainer keeps them, and named once on stderr). If ``write`` raises on any rank, no ``step-N/`` appears
    and the previous checkpoint stays the latest. Returns ``step-N/``.

    Raises:
        DiskFullError: the disk filled up during the save (ENOSPC on any rank); the message names the
            disk, the bytes needed and free, and the last good checkpoint.
    """
    final = checkpoint_dir(run_dir) / f"step-{step:06d}"
    tmp = final.with_name(final.name + ".tmp")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    try:
        write(tmp)
        if rank == 0 and config is not None:
            config.save(tmp / "config.yaml")
        dist.barrier()
        files = _hash_share(tmp, rank)
        if rank == 0:
            parent = _LAST.get(_lineage_key(run_dir))
            write_marker(tmp, files, parent=parent.name if parent is not None else None)
    except (OSError, RuntimeError, dcp.CheckpointException) as err:
        full = full_disk_after_failure(run_dir, tmp, err)  # ENOSPC, or a short write on a full disk
        if full is not None:
            raise DiskFullError(errno.ENOSPC, explain_disk_full(run_dir, step, tmp, full)) from err
        raise
    if rank == 0:
        if final.exists():
            shutil.rmtree(final)
        tmp.replace(final)
        if keep is not None:  # the new one and its lineage's newest, and a left branch's newer steps
            kept = current_lineage(checkpoint_dir(run_dir), head=final)
            for old in complete_checkpoints(checkpoint_dir(run_dir)):
                if old in kept[:keep]:
                    continue
                if old not in kept and int(old.name[5:]) > step:  # HF Trainer never prunes a higher step
                    if old not in _TOLD:
                        _TOLD.add(old)
                        print(
                            f"smolfsdp: kept {old} (saved by the run before this resume; keep-last-K prunes "
                            "only this run's line): this run replaces it when it saves that step, or delete it",
                            file=sys.stderr,
                        )
                    continue
                shutil.rmtree(old)
    _LAST[_lineage_key(run_dir)] = final
    dist.barrier()
    return final


def _hash_share(tmp: Path, rank: int) -> dict[str, dict[str, Any]]:
    """Collective: each rank hashes every world_size-th file of ``tmp`` (rank 0 lists them); all get all."""
    world = dist.get_world_size()
    names: list[Any] = [sorted(p.name for p in tmp.iterdir() if p.is_file())] if rank == 0 else [None]
    dist.broadcast_object_list(names, src=0)
    parts: list[Any] = [None] * world
    dist.all_gather_object(parts, hash_files(tmp, names[0][rank::world]))
    return {name: rec for part in parts for name, rec in part.items()}


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    model,
    optimizer,
    scheduler,
    trainer_state: dict[str, Any],
    rank: int,
    keep: int | None = None,
    config=None,
) -> Path:
    """Collective (native engine): model + optimizer shards, scheduler, data position, RNG per rank.

    Returns ``<run_dir>/checkpoints/step-<step>`` (see :func:`atomic_save`).
    """

    def write(tmp: Path) -> None:
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
        if rank == 0:
            (tmp / "trainer_state.json").write_text(
                json.dumps({**trainer_state, "step": step, "scheduler": scheduler.state_dict()})
            )

    return atomic_save(run_dir, step, rank, write, keep=keep, config=config)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run's current lineage (not verified: see
    :func:`newest_good_checkpoint`), or None."""
    done = current_lineage(checkpoint_dir(run_dir))
    return done[0] if done else None


def resolve_resume(resume_from: str, run_dir: str | Path, *, hashes: bool = False) -> Path:
    """``"latest"`` or a path -> a complete checkpoint directory that verifies; ConfigError otherwise.

    ``"latest"`` is the newest complete checkpoint; if it fails verification the error names the file and
    offers the newest one that passes (explicit: nothing is skipped silently). The pre-launch check
    (``launch.runner.preflight``) passes ``hashes=True``; the ranks check presence and sizes only (cheap).
    """
    path = latest_checkpoint(run_dir) if resume_from == "latest" else Path(resume_from)
    if path is None:
        raise ConfigError(f"resume_from=latest but {checkpoint_dir(run_dir)} holds no complete checkpoint.")
    if not path.exists():
        raise ConfigError(
            f"{path} does not exist; checkpoints live in runs/<name>/checkpoints/step-N/ "
            "(or give resume_from: latest)."
        )
    if not path.is_dir() or not is_complete(path):
        raise ConfigError(
            f"{path} is not a complete smolfsdp checkpoint (no {MARKER} marker); "
            "it may be a save that was interrupted."
        )
    verify_checkpoint(path, hashes=hashes, action="resume")
    _LAST[_lineage_key(run_dir)] = path  # the parent of this process's next save
    return path


def load_checkpoint(path: str | Path, model, optimizer, scheduler) -> dict[str, Any]:
    """Collective: load model + optimizer shards and the scheduler; return the trainer state.

    Call :func:`restore_rng` once everything that draws random numbers while setting up (a
    DataLoader iterator draws its base seed) has run, right before the next training step.
    """
    path = Path(path)
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
    dcp_load(state, path)
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


def check_engine(path: str | Path, engine: str) -> None:
    """Raise ConfigError when a checkpoint was written by the other engine.

    Both engines write the same DCP model and optimizer keys, but the rest differs: the native loop
    keeps its data position and scheduler in ``trainer_state.json`` and RNG in ``rng_rank<R>.pt``;
    the TRL engine keeps the Trainer's ``TrainerState``, ``scheduler.json`` and ``rng_state_<R>.pth``.
    """
    path = Path(path)
    written_by = "trl" if (path / "scheduler.json").is_file() else "native"
    if (path / "config.yaml").is_file():
        written_by = (read_recipe(path / "config.yaml") or {}).get("engine", written_by)
    if written_by != engine:
        raise ConfigError(
            f"{path} was written by the {written_by} engine, and this run uses engine: {engine}. Resume with "
            f"engine: {written_by}, or convert it (smolfsdp convert) and start a new run from the weights."
        )


#: Settings that define a run's trajectory: a resumed run must keep them, or it is another run
#: (the optimizer, scheduler and data position come from the checkpoint and assume them). How a run
#: is sharded, launched, logged, evaluated and saved may change (DCP reshards on load).
TRAJECTORY_FIELDS = (
    "model", "tokenizer", "dataset", "dataset_config", "dataset_split", "columns", "include_reasoning",
    "system_prompt", "max_length", "too_long", "eval_size", "max_rows", "engine", "nproc", "seed", "lora", "lora_r",
    "lora_alpha", "lora_dropout", "lora_target_modules", "num_train_epochs", "max_steps",
    "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate", "weight_decay",
    "warmup_ratio", "lr_scheduler_type", "max_grad_norm", "mixed_precision", "benchmark_steps",
    "benchmark_warmup_steps", "packing",
)  # fmt: skip


def check_resume_settings(path: str | Path, cfg) -> None:
    """Raise ConfigError when ``cfg`` would not continue the run that wrote checkpoint ``path``.

    Compares ``cfg`` with the checkpoint's own ``config.yaml`` on :data:`TRAJECTORY_FIELDS` (naming
    each difference, old -> new), and refuses a checkpoint already at the run's last step (the
    Trainer would train one step past ``max_steps``; nothing is left to resume). A checkpoint without
    ``config.yaml`` (written before it was saved there) is not compared.
    """
    path = Path(path)
    saved_file = path / "config.yaml"
    saved: dict = {}
    if saved_file.is_file():
        saved = read_recipe(saved_file) or {}  # bounded: a checkpoint's file is data from elsewhere
        now = redact(cfg.to_dict())  # the saved config is redacted: compare like with like
        diff = [
            f"{k} {saved.get(k)!r} -> {now.get(k)!r}"
            for k in TRAJECTORY_FIELDS
            if k in saved and saved[k] != now[k]
        ]
        if diff:
            raise ConfigError(
                f"{path} was written by a run with other settings: {'; '.join(diff)}. A resumed run continues "
                "that run (its optimizer, scheduler and data position come from the checkpoint), so these must "
                f"match; {saved_file} holds them. Resume with the same settings, or start a new run from the "
                f"weights (smolfsdp convert {path} OUT)."
            )
    step = int(path.name.split("-")[-1]) if path.name.split("-")[-1].isdigit() else None
    if step is not None and cfg.max_steps > 0 and step >= cfg.max_steps:
        missing = missing_final_model(cfg.run_dir, path)
        if missing and not saved.get("save_final_model", cfg.save_final_model):  # none was to be written
            raise ConfigError(
                f"{path} is at step {step} of max_steps={cfg.max_steps}: the run finished, and with "
                "save_final_model: false it wrote no final model; nothing is left to resume. Write the model "
                f"from that checkpoint: smolfsdp convert {path} OUT; to train longer, start a new run from it."
            )
        if missing:
            raise ConfigError(
                f"{path} is at step {step} of max_steps={cfg.max_steps}: nothing is left to train. {missing}"
            )
        raise ConfigError(
            f"{path} is at step {step} and the run has max_steps={cfg.max_steps}: it is finished, there is "
            f"nothing to resume. Its final model is in {Path(cfg.run_dir) / 'final_model'}; to train longer start a "
            f"new run from the weights (smolfsdp convert {path} OUT)."
        )


def missing_final_model(run_dir: str | Path, ckpt: str | Path) -> str | None:
    """For a run whose last checkpoint ``ckpt`` is at its last step: None when ``final_model/`` was written
    (it appears whole: ``smolfsdp.train.export`` moves a finished folder into place), else what exists
    and the command that writes the final model from ``ckpt`` (a kill during the final save)."""
    final = Path(run_dir) / "final_model"
    if final.is_dir() and any(final.rglob("*.safetensors")):
        return None
    partial = final.with_name("final_model.tmp")
    left = f"; {partial} holds the interrupted save and can be deleted" if partial.exists() else ""
    return (
        f"Every step ran and {ckpt} is complete, but the final model was not written (its save was "
        f"interrupted{left}). Write it from that checkpoint: smolfsdp convert {ckpt} {final} (a LoRA run's "
        "adapter comes out merged into the base model)."
    )
