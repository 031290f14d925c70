"""Execute the book's chapters (Jupyter notebooks) in a profile and export them to HTML.

Quarto renders the book where it is installed (the GitHub workflow, readers). Where it is not (CI
here), this runs the same notebooks with nbclient, injecting the profile the way
``quarto render -P PROFILE:smoke`` does (a cell after the one tagged ``parameters``), and writes
HTML with nbconvert for the browser checks.

    python scripts/execute_notebooks.py --profile smoke --html-dir _book_html
    python scripts/execute_notebooks.py --chapter 05_profiling --chapter notebooks/07_scaling.ipynb
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import yaml

from smolfsdp.data import repo_root


def chapters() -> list[Path]:
    """The notebooks listed in ``_quarto.yml``, in book order."""
    book = yaml.safe_load((repo_root() / "_quarto.yml").read_text())["book"]
    items = []
    for entry in book["chapters"]:
        items += entry["chapters"] if isinstance(entry, dict) else [entry]
    return [repo_root() / c for c in items if str(c).endswith(".ipynb")]


def select_chapters(names=None) -> list[Path]:
    """The chapters named in ``names``, in book order; all of :func:`chapters` when ``names`` is empty.

    A name is a notebook stem (``05_profiling``), a file name (``05_profiling.ipynb``) or a path to the
    notebook (relative to the current directory or the repository root). Repeats count once. Raises
    ConfigError for a name that is no chapter of ``_quarto.yml``, with the nearest stems.
    """
    from smolfsdp.config import ConfigError, nearest

    book = chapters()
    if not names:
        return book
    by_stem = {nb.stem: nb for nb in book}
    by_path = {nb.resolve(): nb for nb in book}
    picked = set()
    for name in names:
        path = Path(name)
        hit = by_stem.get(path.stem) if path.name == str(name) else None
        hit = hit or by_path.get(path.resolve()) or by_path.get((repo_root() / path).resolve())
        if hit is None:
            hint = nearest(path.stem, by_stem, n=3)
            raise ConfigError(
                f"--chapter {name!r} is no chapter of _quarto.yml"
                + (f" (did you mean {' or '.join(map(repr, hint))}?)" if hint else "")
                + f"; give a stem or path of one of: {', '.join(by_stem)}."
            )
        picked.add(hit)
    return [nb for nb in book if nb in picked]


def inject_parameters(nb, **params) -> None:
    """Insert ``NAME = value`` lines after the cell tagged ``parameters`` (papermill/Quarto style)."""
    idx = next(
        (i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])), None
    )
    if idx is None:
        raise ValueError("the notebook has no cell tagged 'parameters'")
    src = "\n".join(f"{k} = {v!r}" for k, v in params.items())
    cell = nbformat.v4.new_code_cell(src)
    cell.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(idx + 1, cell)


def execute_chapter(
    path: str | Path, profile: str = "smoke", html_dir: str | Path | None = None, timeout: int = 900
):
    """Execute one notebook (cwd = its folder) and optionally write ``<html_dir>/<stem>.html``.

    Returns the executed notebook. Raises ``nbclient.exceptions.CellExecutionError`` on the first
    failing cell, with its traceback.
    """
    from nbclient import NotebookClient

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    inject_parameters(nb, PROFILE=profile)
    NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()
    if html_dir is not None:
        from nbconvert import HTMLExporter

        out = Path(html_dir)
        out.mkdir(parents=True, exist_ok=True)
        body, _ = HTMLExporter().from_notebook_node(nb)
        (out / f"{path.stem}.html").write_text(body)
    return nb
