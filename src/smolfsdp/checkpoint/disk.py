"""Disk space for checkpoints: the estimate checked before a run, and the message of a save that hits ENOSPC.

``smolfsdp.launch.runner.preflight`` compares :func:`estimate_checkpoint_bytes` (times the checkpoints a run will
hold at once) with :func:`free_bytes`; ``smolfsdp.checkpoint.dcp.atomic_save`` turns an ENOSPC during a save
into :class:`DiskFullError` (:func:`explain_disk_full`). The chapter on gotchas shows both.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import torch.distributed.checkpoint as dcp

from smolfsdp.checkpoint.verify import newest_good_checkpoint
from smolfsdp.errors import ConfigError

ADAM_STATES = 2  # exp_avg and exp_avg_sq, each the size of its parameter (torch.optim.AdamW)


class DiskSpaceError(ConfigError):
    """The output directory's filesystem has less free space than the run will write."""


class DiskFullError(OSError):
    """A save ran out of disk space (ENOSPC); the message names the disk, the bytes and the last good save."""


def estimate_checkpoint_bytes(model, optimizer_trainable_params=None) -> int:
    """Bytes one sharded checkpoint of ``model`` takes on disk, all ranks together.

    Model state (every state-dict name, so tied weights count twice: DCP writes ``lm_head.weight``
    and ``embed_tokens.weight`` both) + AdamW state (two tensors per trainable parameter, in the
    parameter's dtype) + 5% for DCP's per-tensor serialisation and metadata (measured on the tiny
    model's checkpoints, where it is largest relative to the data). Works on the meta device.
    ``optimizer_trainable_params`` defaults to the parameters with ``requires_grad``.
    """
    model_bytes = sum(p.numel() * p.element_size() for _, p in model.named_parameters(remove_duplicate=False))
    trainable = optimizer_trainable_params
    if trainable is None:
        trainable = [p for p in model.parameters() if p.requires_grad]
    optim_bytes = sum(
        ADAM_STATES * p.numel() * p.element_size() for p in {id(p): p for p in trainable}.values()
    )
    return int((model_bytes + optim_bytes) * 1.05)


def free_bytes(path: str | Path) -> int:
    """Free bytes on the filesystem that holds ``path`` (symlinks followed; or its nearest existing parent)."""
    return shutil.disk_usage(_nearest_existing(path)).free


def check_disk_space(output_dir: str | Path, needed_bytes: int) -> None:
    """Raise DiskSpaceError (before training) when ``output_dir``'s filesystem cannot take ``needed_bytes``."""
    free = free_bytes(output_dir)
    if needed_bytes > free:
        raise DiskSpaceError(
            f"The run will write about {needed_bytes:,} bytes of checkpoints and models to {output_dir}, but its "
            f"filesystem has {free:,} bytes free. Free space, choose another output_dir, save less often "
            "(save_steps), keep fewer checkpoints (save_total_limit) or use LoRA (smaller optimizer state)."
        )


def check_disk_space_each(needs: list[tuple[Path, int]]) -> None:
    """:func:`check_disk_space` per filesystem: ``needs`` pairs a path (a run's ``checkpoints/``, its
    ``final_model/``) with the bytes written there; paths are followed through symlinks to the filesystem
    that really holds them (a ``checkpoints/`` linked to a small disk is checked on that disk), and the
    bytes of paths on one filesystem are added up."""
    by_device: dict[int, list] = {}
    for path, needed in needs:
        if needed > 0:
            device = os.stat(_nearest_existing(path)).st_dev
            by_device.setdefault(device, [path, 0])[1] += needed
    for path, needed in by_device.values():
        check_disk_space(path, needed)


def _nearest_existing(path: str | Path) -> Path:
    """``path`` with symlinks followed, or its nearest existing parent (a folder a run will create)."""
    p = Path(path).resolve()
    while not p.exists():
        p = p.parent
    return p


def disk_full_cause(err: BaseException) -> OSError | None:
    """The ENOSPC OSError behind ``err``: itself, its cause/context chain, or a rank's failure inside
    DCP's ``CheckpointException`` (which gathers every rank's exception of a failed save)."""
    seen: list[BaseException] = [err]
    while seen:
        e = seen.pop()
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return e
        seen += [x for x in (e.__cause__, e.__context__) if x is not None]
        if isinstance(e, dcp.CheckpointException):
            seen += [exc for exc, _ in e.failures.values()]
    return None


#: Below this many free bytes a failed save is read as a full disk even when the error does not say ENOSPC.
FULL_DISK_SLACK = 1 << 20


def full_disk_after_failure(run_dir: str | Path, tmp: Path, err: BaseException) -> OSError | None:
    """The full disk behind a failed save, when the error hides it: torch's zip writer reports a short
    write as ``RuntimeError: ... unexpected pos 704 vs 598`` (no errno). The filesystem of ``tmp`` is
    full when it has less free than the last good checkpoint takes (or :data:`FULL_DISK_SLACK`). Returns
    an ENOSPC ``OSError`` describing it, or None (another failure: re-raised as it was)."""
    found = disk_full_cause(err)
    if found is not None:
        return found
    good, _ = newest_good_checkpoint(Path(run_dir) / "checkpoints", hashes=False)
    needed = max(_folder_bytes(good) if good is not None else 0, FULL_DISK_SLACK)
    if free_bytes(tmp) >= needed:
        return None
    said = " ".join(str(err).split())[:200]
    return OSError(
        errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}; the save failed with {type(err).__name__}: {said}"
    )


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file()) if path.is_dir() else 0


def _mount_point(path: Path) -> Path:
    p = Path(path).resolve()
    while not p.exists() or not os.path.ismount(p):
        p = p.parent
    return p


def explain_disk_full(run_dir: str | Path, step: int, tmp: Path, err: OSError) -> str:
    """The message of a save that hit ENOSPC: the disk, the bytes needed and free, the last good checkpoint."""
    good, _ = newest_good_checkpoint(Path(run_dir) / "checkpoints", hashes=False)
    written = _folder_bytes(tmp)
    need = (
        f"about {_folder_bytes(good):,} bytes (the size of {good.name})"
        if good is not None
        else f"more than the {written:,} bytes it had written"
    )
    last = (
        f"The last good checkpoint is {good}; once there is room, resume from it (--resume)"
        if good is not None
        else "No checkpoint of this run is complete"
    )
    return (
        f"saving checkpoint step {step} ran out of disk space ({err}) on the filesystem mounted at "
        f"{_mount_point(tmp)}: the checkpoint needs {need}, and {free_bytes(tmp):,} bytes are free with the "
        f"partial save {tmp} ({written:,} bytes) still there. {last}; the partial save can be deleted. Free "
        "space, choose another output_dir, keep fewer checkpoints (save_total_limit) or save less often (save_steps)."
    )
