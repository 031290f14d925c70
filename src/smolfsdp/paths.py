"""Where the repository's files are (bundled data, tokenizer, run recipes) and how written files get their modes.

Bottom layer: imports only :mod:`smolfsdp.errors`, so the data loader, the model builder and the
results writer reach the same paths without importing each other.

    python -c "from smolfsdp.paths import recipe; print(recipe('smoke'))"
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
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
    """Give ``folder``, every folder in it and every file in it (recursively) the mode the process umask
    gives a new one (0755 and 0644 under umask 022).

    Why: safetensors 0.8 writes ``*.safetensors`` through a temporary file created 0600 and renamed
    into place, so ``model.safetensors`` would be readable only by its owner while the config and
    tokenizer next to it are 0644; and a folder made by ``tempfile.mkdtemp`` (``smolfsdp convert``'s,
    moved into place when complete) is 0700. Either way a model folder shared or served by another user
    fails to load.
    """
    mask = os.umask(0)  # the only portable way to read the umask: set it, then put it back at once
    os.umask(mask)
    for path in (Path(folder), *Path(folder).rglob("*")):
        if path.is_symlink():
            continue
        if path.is_dir():
            path.chmod(0o777 & ~mask)
        elif path.is_file():
            path.chmod(0o666 & ~mask)


def check_writable_folder(out: str | Path, what: str) -> None:
    """Raise ConfigError unless a folder can be written where ``out`` is (or would be created): probed by
    creating and removing a file in the nearest existing folder among ``out`` and its parents
    (``os.access`` says yes to root even on a read-only mount). ``what`` names ``out`` in the message
    (``"OUT /tmp/x"``)."""
    base = Path(out).expanduser().absolute()
    while not base.exists() and base != base.parent:
        base = base.parent
    try:
        with tempfile.TemporaryFile(dir=base):
            pass
    except OSError as err:
        raise ConfigError(
            f"{what} is not writable ({err.strerror} in {str(base)!r}); nothing was read or written: choose an "
            "output folder you can write to."
        ) from err


#: A Hugging Face hub id, ``owner/name``: one slash, letters, digits, ``-``, ``_`` and ``.`` (the hub's rule).
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def looks_like_path(name: str) -> bool:
    """True for a ``--model`` meant as a folder: it starts with ``.``, ``/`` or ``~``, or holds a path separator
    and is not one ``owner/name`` hub id (``../models/x``, ``data/models/llama2_7b``; not ``HuggingFaceTB/SmolLM3-3B``)."""
    name = str(name)
    if name.startswith((".", "/", "~")):
        return True
    return any(sep in name for sep in {"/", "\\", os.sep}) and not HUB_ID.fullmatch(name)


def check_model_folder(model: str, what: str = "model") -> None:
    """Raise ConfigError when ``model`` looks like a folder (:func:`looks_like_path`) and is none, before it is
    taken for a hub id (looked up offline, with advice to download it). ``what`` names it (``"--model"``)."""
    folder = Path(str(model)).expanduser()
    if looks_like_path(model) and not folder.is_dir():
        why = "a file, not a folder" if folder.exists() else "no such folder"
        raise ConfigError(
            f"{what} {model}: {why} ({folder.resolve()}); give a folder with the model's config.json, or a hub "
            "id owner/name."
        )


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
