"""Reading DCP checkpoints safely and verifying them: an allow-list unpickler, checksums, needed files.

Two things torch.distributed.checkpoint (DCP, torch 2.13) leaves to its caller:

* **Its metadata is a pickle.** ``FileSystemReader.read_metadata`` runs ``pickle.load`` on
  ``.metadata``, and ``DefaultLoadPlanner.load_bytes`` runs ``torch.load(weights_only=False)`` on
  every non-tensor entry (the optimizer's ``param_groups``): a planted checkpoint runs code the
  moment it is read. :func:`read_dcp_metadata` unpickles ``.metadata`` with an unpickler that admits
  only the classes DCP metadata is made of (:data:`ALLOWED_GLOBALS`, listed from real checkpoints of
  both engines); :class:`SafeLoadPlanner` reads the non-tensor entries with ``weights_only=True``.
  :func:`dcp_load` uses both: every DCP load of ours goes through it.
* **Nothing says a checkpoint is intact.** At save, :func:`hash_files` records each file's size and
  SHA-256 in the ``COMPLETE`` marker (JSON); :func:`find_problem` checks them, and that every shard
  ``.metadata`` points to exists and is long enough, before a resume or a convert.

SHA-256 rather than CRC32 (2x faster here) or BLAKE2b (slower here): ``sha256sum`` checks the same
digests by hand, and OpenSSL's SHA-NI code runs ~0.8 GB/s per core on this project's machines; at save
the ranks hash their share of the files in parallel.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import pickle
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from smolfsdp.errors import ConfigError

MARKER = "COMPLETE"
MARKER_FORMAT = 1
HASH = "sha256"
log = logging.getLogger(__name__)

_DCP_METADATA = "torch.distributed.checkpoint.metadata"
#: (module, name) pairs a DCP ``.metadata`` pickle may name, found by unpickling the metadata of real
#: checkpoints (native FSDP1, native FSDP2 + LoRA, TRL) and recording each ``find_class`` call. Each is a
#: plain data class or a constructor of one; none runs anything but building that value.
ALLOWED_GLOBALS = frozenset(
    {(_DCP_METADATA, n) for n in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorStorageMetadata", "BytesStorageMetadata",
        "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING",
    )}
    | {
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),  # how torch.layout pickles (torch's weights-only list has it)
        ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"),  # StorageMeta.checkpoint_id
        ("pathlib", "PurePosixPath"), ("pathlib", "PureWindowsPath"),
        ("collections", "OrderedDict"),
    }
)  # fmt: skip


class UnsafeCheckpointError(ConfigError):
    """A checkpoint file asks the unpickler for something DCP never writes; nothing of it was run."""


class CheckpointCorruptError(ConfigError):
    """A checkpoint's files differ from what was written at save (missing, short, other bytes)."""


class _MetadataUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` restricted to :data:`ALLOWED_GLOBALS` and torch dtypes (the Python docs'
    "Restricting Globals" recipe): every global a pickle names, and so every callable it can call, goes
    through ``find_class``."""

    def __init__(self, file, path: Path):
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS or (
            module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        ):
            return super().find_class(module, name)
        raise UnsafeCheckpointError(
            f"{self.path} asks to load {module}.{name}, which DCP checkpoint metadata never holds: the file was "
            "not written by torch.distributed.checkpoint, or was altered to run code when read. It was refused "
            "before anything in it ran; do not load this checkpoint (and do not unpickle it by other means)."
        )


def read_dcp_metadata(path: str | Path) -> Metadata:
    """Unpickle ``<path>/.metadata`` through the allow-list and check its shape.

    Raises:
        UnsafeCheckpointError: a global outside :data:`ALLOWED_GLOBALS`, or a shard path that leaves the
            checkpoint folder.
        CheckpointCorruptError: unreadable, truncated, or not DCP ``Metadata``.
    """
    file = Path(path) / ".metadata"
    try:
        with file.open("rb") as f:
            meta = _MetadataUnpickler(f, file).load()
    except UnsafeCheckpointError:
        raise
    except Exception as err:  # truncated or garbled bytes fail in many ways (EOFError, UnpicklingError, ...)
        raise CheckpointCorruptError(
            f"{file} is not readable DCP metadata ({type(err).__name__}: {err})."
        ) from err
    storage = getattr(meta, "storage_data", None)
    if not isinstance(meta, Metadata) or not isinstance(storage, dict):
        raise CheckpointCorruptError(
            f"{file} holds a {type(meta).__name__}, not DCP Metadata with storage_data."
        )
    for info in storage.values():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
            raise UnsafeCheckpointError(
                f"{file} points a shard at {name!r}, outside the checkpoint folder; DCP writes plain file names. "
                "Refused: do not load this checkpoint."
            )
    return meta


class SafeFileSystemReader(dcp.FileSystemReader):
    """``FileSystemReader`` whose ``read_metadata`` unpickles through :func:`read_dcp_metadata`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        # per-rank metadata is written only without rank coordination, which smolfsdp never uses
        if kwargs.get("rank") is not None:
            raise UnsafeCheckpointError(f"{self.path}: per-rank DCP metadata is not read by smolfsdp.")
        meta = read_dcp_metadata(self.path)
        if getattr(meta, "storage_meta", None) is None:  # as FileSystemReader.read_metadata does
            meta.storage_meta = StorageMeta()
        meta.storage_meta.load_id = self.load_id
        return meta


class SafeLoadPlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` whose non-tensor entries must pass ``torch.load(weights_only=True)``.

    torch 2.13's ``load_bytes`` unpickles them with ``weights_only=False``. Here the same bytes are first
    read by torch's weights-only unpickler (floats, tuples, strings: what ``param_groups`` holds); only
    when that succeeds does the parent read them, so what it unpickles holds nothing else.
    """

    def __init__(self, path: str | Path, **kwargs: Any):
        super().__init__(**kwargs)
        self.path = Path(path)

    def load_bytes(self, read_item, value) -> None:
        try:
            torch.load(value, weights_only=True)
        except pickle.UnpicklingError as err:
            raise UnsafeCheckpointError(
                f"{self.path}: the entry {read_item.dest_index.fqn!r} is not plain data ({err}). Refused before "
                "it ran; do not load this checkpoint."
            ) from err
        value.seek(0)
        super().load_bytes(read_item, value)


def dcp_load(state: dict[str, Any], path: str | Path) -> None:
    """``dcp.load(state, checkpoint_id=path)`` through the allow-list reader and the weights-only planner.

    Collective when a process group is initialised; one process reads every shard otherwise.

    Raises:
        UnsafeCheckpointError: from :func:`read_dcp_metadata` or :class:`SafeLoadPlanner` (DCP gathers each
            rank's exception into a ``CheckpointException``; ours is taken out of it so the message reads).
    """
    read_dcp_metadata(path)  # raise the clear error here, before DCP wraps it
    try:
        dcp.load(
            state,
            checkpoint_id=str(path),
            storage_reader=SafeFileSystemReader(str(path)),
            planner=SafeLoadPlanner(path),
        )
    except dcp.CheckpointException as err:
        ours = [exc for exc, _ in err.failures.values() if isinstance(exc, ConfigError)]
        if ours:
            raise ours[0] from err
        raise


# ------------------------------------------------------------------------------- checksums
def hash_file(file: Path) -> dict[str, Any]:
    """``{"bytes": size, "sha256": hex digest}`` of one file."""
    with file.open("rb") as f:
        digest = hashlib.file_digest(f, HASH).hexdigest()
    return {"bytes": file.stat().st_size, HASH: digest}


def hash_files(folder: Path, names: list[str], threads: int = 4) -> dict[str, dict[str, Any]]:
    """:func:`hash_file` of each name in ``folder`` (threads: hashlib releases the GIL while hashing)."""
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(names)))) as pool:
        return dict(zip(names, pool.map(lambda n: hash_file(folder / n), names), strict=True))


def write_marker(folder: Path, files: dict[str, dict[str, Any]], parent: str | None = None) -> None:
    """The ``COMPLETE`` marker (JSON, last, rank 0): sizes, digests, ``parent``, ``saved_at`` (:func:`current_lineage`)."""
    body = {"format": MARKER_FORMAT, "algorithm": HASH, "parent": parent, "saved_at": time.time()}
    body["files"] = dict(sorted(files.items()))
    (folder / MARKER).write_text(json.dumps(body, indent=1) + "\n")


def _lineage_fields(folder: Path) -> tuple[float, str | None, bool]:
    """(saved_at, parent, knows_parent) of ``folder``'s marker; (0, None, False) for an older or unreadable one."""
    try:
        body = json.loads((folder / MARKER).read_text())
        return float(body.get("saved_at", 0.0)), body.get("parent"), "parent" in body
    except (OSError, ValueError, TypeError, AttributeError):
        return 0.0, None, False


def read_marker(folder: Path) -> dict[str, dict[str, Any]] | None:
    """The files recorded in ``folder``'s marker; None for a marker written before checksums ("ok").

    Raises CheckpointCorruptError when the marker is neither.
    """
    text = (folder / MARKER).read_text()
    if text.strip() == "ok":
        return None
    try:
        body = json.loads(text)
        files = body["files"]
        assert body["algorithm"] == HASH and isinstance(files, dict)
        for name, rec in files.items():  # plain names in this folder, a size and a digest each
            assert Path(name).name == name and name not in (".", "..")
            assert isinstance(rec["bytes"], int) and isinstance(rec[HASH], str)
    except (ValueError, KeyError, TypeError, AssertionError) as err:
        raise CheckpointCorruptError(f"{folder / MARKER} is damaged (not the JSON smolfsdp writes).") from err
    return files


def find_problem(path: str | Path, *, hashes: bool = True) -> str | None:
    """What is wrong with checkpoint ``path``, naming the file; None when it verifies.

    Checks, cheapest first: every file the marker lists exists with its recorded size; with ``hashes``,
    each file's SHA-256 (all bytes are read); ``.metadata`` unpickles through the allow-list; every shard
    it points to exists and holds the bytes it points into. A marker without checksums (written before
    they were recorded) gets only the last two checks.

    Raises UnsafeCheckpointError (from :func:`read_dcp_metadata` or :func:`check_rng_files`): an unsafe
    checkpoint is refused outright, never offered as a problem to route around.
    """
    path = Path(path)
    try:
        files = read_marker(path)
    except CheckpointCorruptError as err:
        return str(err)
    for name, rec in (files or {}).items():
        f = path / name
        if not f.is_file():
            return f"{f} is missing (the {MARKER} marker lists it, {rec['bytes']:,} bytes)"
        if f.stat().st_size != rec["bytes"]:
            return f"{f} has {f.stat().st_size:,} bytes; {rec['bytes']:,} were written at save"
    if files and hashes:
        names = list(files)
        for name, got in hash_files(path, names).items():
            if got[HASH] != files[name][HASH]:
                return (
                    f"{path / name} does not match the {HASH} recorded at save: its bytes changed since "
                    "(a flipped bit, a torn copy, an edit)"
                )
    check_rng_files(path)
    if not (path / ".metadata").is_file():
        return f"{path / '.metadata'} is missing"
    try:
        meta = read_dcp_metadata(path)
    except CheckpointCorruptError as err:
        return str(err)
    ends: dict[str, int] = {}
    for info in meta.storage_data.values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(ends.items()):
        f = path / name
        if not f.is_file():
            return f"{f} is missing (its .metadata stores tensors in it)"
        if f.stat().st_size < end:
            return f"{f} has {f.stat().st_size:,} bytes; its .metadata reads up to byte {end:,}"
    return None


RNG_FILES = ("rng_rank*.pt", "rng_state*.pth")  # the native loop's and the Trainer's (``_save_rng_state``)


def check_rng_files(path: Path) -> None:
    """Raise UnsafeCheckpointError naming an RNG file of ``path`` a resume would not load as plain data."""
    for file in sorted(f for pattern in RNG_FILES for f in path.glob(pattern)):
        allow = contextlib.nullcontext()
        if file.name.startswith(
            "rng_state"
        ):  # the Trainer's hold numpy state: its own allow-list, as it loads them
            from transformers.trainer_pt_utils import (
                safe_globals,
            )  # deferred: transformers, TRL checkpoints only

            allow = safe_globals()
        try:
            with allow:
                torch.load(file, weights_only=True, map_location="cpu")
        except Exception as err:  # UnpicklingError, RuntimeError, EOFError...: all mean "not RNG state"
            raise UnsafeCheckpointError(
                f"{file} is not plain RNG state ({type(err).__name__}: {str(err).splitlines()[0][:160]}); it was "
                "refused before anything in it ran. Do not resume from this checkpoint."
            ) from err


# ------------------------------------------------------------------------------- which checkpoints are good
def is_complete(path: str | Path) -> bool:
    return (Path(path) / MARKER).is_file()


def _step(path: Path) -> int:
    return int(path.name.split("-")[1])


def complete_checkpoints(folder: str | Path) -> list[Path]:
    """The ``step-N`` folders of ``folder`` (a run's ``checkpoints/``) that hold the marker, newest first."""
    done = [p for p in Path(folder).glob("step-*") if p.name[5:].isdigit() and p.is_dir() and is_complete(p)]
    return sorted(done, key=_step, reverse=True)


def current_lineage(folder: str | Path, head: Path | None = None) -> list[Path]:
    """The complete checkpoints of the current lineage in ``folder``, newest first: the head (``head``, or the
    highest step not saved before a lower one) and the checkpoints it continues (each marker's ``parent``; an
    older marker continues every lower step). A branch the run left is outside it (README, Checkpoints)."""
    done = complete_checkpoints(folder)
    if not done:
        return []
    if head is None:  # the highest step, unless a lower one was saved after it (then it is a left branch)
        saved = {p: _lineage_fields(p)[0] for p in done}  # after a resume from 4: a new 6 saved after 8
        last = max(done, key=lambda p: (saved[p], _step(p)))
        head = next(p for p in done if not (saved[p] and _step(p) > _step(last)))
    chain, by_name = [head], {p.name: p for p in done}
    while True:
        _, parent, knows = _lineage_fields(chain[-1])
        if not knows:  # an older marker: every lower step
            return chain + [p for p in done if _step(p) < _step(chain[-1])]
        nxt = by_name.get(parent or "")
        if nxt is None or nxt in chain or _step(nxt) >= _step(chain[-1]):
            return chain
        chain.append(nxt)


def newest_good_checkpoint(
    folder: str | Path, *, hashes: bool = True, skip: tuple[Path, ...] = ()
) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest complete checkpoint of the current lineage (:func:`current_lineage`) in ``folder``
    (``runs/<name>/checkpoints``) that verifies, and the newer ones that did not, each with its problem (see
    :func:`find_problem`; ``hashes=False`` checks sizes only). ``skip``: checkpoints not to consider."""
    bad = []
    for path in current_lineage(folder):
        if path in skip:
            continue
        try:
            problem = find_problem(path, hashes=hashes)
        except ConfigError as err:  # an unsafe one is not good either
            problem = str(err)
        if problem is None:
            return path, bad
        bad.append((path, problem))
    return None, bad


def verify_checkpoint(path: str | Path, *, hashes: bool = True, action: str = "resume") -> None:
    """Raise CheckpointCorruptError naming the bad file of checkpoint ``path`` and offering the newest other
    checkpoint of its folder that verifies (``action``: ``"resume"`` or ``"convert"``, for the command shown).

    ``hashes=True`` reads every byte (SHA-256; ~1 s per GB and core); ``False`` checks presence and sizes.
    A checkpoint saved before checksums were recorded is accepted with a warning (only the files its
    ``.metadata`` names are checked, for presence and length). Raises UnsafeCheckpointError for a
    ``.metadata`` outside the allow-list.
    """
    path = Path(path)
    problem = find_problem(path, hashes=hashes)
    if problem is None:
        if hashes and read_marker(path) is None:
            log.warning(
                "%s was saved before smolfsdp recorded checksums (its %s marker says only 'ok'): its shards were "
                "checked to exist and be long enough, not their bytes.", path, MARKER,
            )  # fmt: skip
        return
    good, _ = newest_good_checkpoint(path.parent, hashes=hashes, skip=(path,))
    if good is None:
        offer = f"No other checkpoint in {path.parent} verifies" + (
            "; the run must start over (--overwrite true)." if action == "resume" else "."
        )
    elif action == "resume":
        offer = f"The newest checkpoint that verifies is {good}: resume from it with --resume_from {good}."
    else:
        offer = f"The newest checkpoint that verifies is {good}: convert it instead (smolfsdp convert {good} OUT)."
    raise CheckpointCorruptError(
        f"{path} fails verification: {problem}. Loading it would give wrong weights, optimizer state or "
        "settings, or fail part-way. " + offer
    )
