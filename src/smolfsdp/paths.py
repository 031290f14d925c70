"""Where the repository's files are (bundled data, tokenizer, run recipes) and how written files get their modes.

Bottom layer: imports only :mod:`smolfsdp.errors`, so the data loader, the model builder and the
results writer reach the same paths without importing each other.

    python -c "from smolfsdp.paths import recipe; print(recipe('smoke'))"
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from smolfsdp.errors import ConfigError, did_you_mean


def repo_root() -> Path:
    """The repository root (this package is installed in editable mode from ``src/``)."""
    return Path(__file__).resolve().parents[2]


def bundled_data_path() -> Path:
    """The bundled medical Q&A sample (``dataset: bundled``), a JSON-lines file."""
    return repo_root() / "data" / "medical_qa" / "medical_qa_sample.jsonl"


def bundled_tokenizer_path() -> Path:
    """The bundled byte-level BPE tokenizer folder the ``tiny`` model uses."""
    return repo_root() / "data" / "tokenizer"


def chapter_runs(chapter: str) -> Path:
    """``runs/book/<chapter>/``, emptied and created: the folder a chapter's runs, drills and probes write to
    (never the system's temporary folder, where each render used to leave them behind).

    Emptied first so a re-render starts clean (a drill's earlier checkpoints would otherwise refuse or
    feed its new runs); nothing outside this one folder is touched.

    Raises:
        ConfigError: ``chapter`` is not one plain folder name (``07_scaling``).
    """
    if not chapter or chapter in (".", "..") or Path(chapter).name != chapter:
        raise ConfigError(f"chapter={chapter!r} must be one plain folder name, such as '07_scaling'.")
    folder = repo_root() / "runs" / "book" / chapter
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def recipe(name: str) -> Path:
    """Path of the named run recipe ``configs/runs/<name>.yaml`` in this repository.

    Raises:
        ConfigError: no such recipe, naming the known ones and the nearest.
    """
    path = repo_root() / "configs" / "runs" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise ConfigError(f"No run recipe {name!r}; known: {known}.{did_you_mean(name, known)}")
    return path


def umask_modes(folder: str | Path) -> None:
    """Give every file in ``folder`` (recursively) the mode the process umask gives a new file (0644
    under umask 022).

    Why: safetensors 0.8 writes ``*.safetensors`` through a temporary file created 0600 and renamed
    into place, so ``model.safetensors`` would be readable only by its owner while the config and
    tokenizer next to it are 0644 (a model folder shared or served by another user fails to load).
    """
    mask = os.umask(0)  # the only portable way to read the umask: set it, then put it back at once
    os.umask(mask)
    for path in Path(folder).rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(0o666 & ~mask)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (signal 0; a process of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def shown_path(path: str | Path) -> str:
    """``path`` inside the repository as a repository path (``data/models/llama2_7b``), anything else as given:
    for output a reader sees, which should not carry this machine's folders."""
    try:
        return str(Path(path).resolve().relative_to(repo_root()))
    except (ValueError, OSError):
        return str(path)
