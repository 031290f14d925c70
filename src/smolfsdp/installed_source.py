"""The file and line of an installed library's source that decides a behaviour, read without importing it.

The book cites the installed libraries where they decide something (a default, a refusal, a hook): the seeds'
audit (``smolfsdp.audit.seeds``) and the explained gotchas (``smolfsdp.gotchas.explained``) both call
:func:`installed_line`. When a pinned version moves and the text is gone, the citation raises, so the page
that states the behaviour fails to build instead of citing a line that no longer says it.

    python -c "from smolfsdp.installed_source import source_line as s; print(s('transformers.training_args', 'cpu_offload'))"
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def installed_line(path: str, needle: str) -> str:
    """``path:LINE``: the first line of the installed file ``path`` (``package/sub/file.py``) that holds ``needle``.

    The package is found with ``importlib.util.find_spec`` on its top-level name, so nothing is imported.
    Raises LookupError when the package or file is absent or the text is gone: another version is installed,
    and whatever cites it must be checked again."""
    top, _, rest = path.partition("/")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        raise LookupError(f"{top} is not installed")
    file = Path(spec.submodule_search_locations[0]) / rest
    if not file.is_file():
        raise LookupError(f"{path} is not in the installed {top}: another version; re-check what cites it")
    for number, line in enumerate(file.read_text().splitlines(), start=1):
        if needle in line:
            return f"{path}:{number}"
    raise LookupError(f"{needle!r} not found in {file}: the installed {top} changed; re-check what cites it")


def source_line(module: str, needle: str) -> str:
    """:func:`installed_line` for a dotted module name (``"transformers.training_args"``; a package means its
    ``__init__.py``): ``package/file.py:LINE``."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    base = Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None
    path = "/".join([top, *rest]) + ".py"
    if base is not None and not (base.parent / path).is_file():
        path = "/".join([top, *rest, "__init__.py"])
    return installed_line(path, needle)
