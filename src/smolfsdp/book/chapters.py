"""The book's chapters (Jupyter notebooks): execute them in a profile, and render the book with Quarto.

Quarto renders the book where it is installed (the GitHub workflow, readers): :func:`render_book`,
``make render [PROFILE=full]``, from a scratch copy per profile (see the comment above it for why).
Where Quarto is not (CI here), :func:`execute_chapter` runs the same notebooks with nbclient,
injecting the profile the way ``quarto render -P PROFILE:smoke`` does (:func:`inject_parameters`,
through papermill), and writes plain nbconvert HTML for the browser checks. That HTML checks that the
chapters run and their figures draw; it is not the book (no cross-references, captions, titles or
navigation, which only Quarto makes).

    python scripts/execute_notebooks.py --profile smoke --html-dir _book_html
    python scripts/execute_notebooks.py --chapter 05_profiling --chapter notebooks/07_scaling.ipynb
    python scripts/render_book.py --profile smoke     # needs Quarto; site in _book/smoke/
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import yaml
from tqdm import tqdm

from smolfsdp.book.profiles import PROFILES, check_profile  # noqa: F401 (PROFILES: re-exported)
from smolfsdp.errors import ConfigError, did_you_mean
from smolfsdp.launch.progress import QUARTO_DISPLAY
from smolfsdp.paths import repo_root


def _book_entries(root: Path) -> list[str]:
    """Every chapter file listed in ``<root>/_quarto.yml`` (parts flattened), in book order: the chapters,
    then the appendices (``book: appendices:``, after the chapters in Quarto's navigation too)."""
    book = yaml.safe_load((root / "_quarto.yml").read_text())["book"]
    items = []
    for entry in [*book["chapters"], *book.get("appendices", [])]:
        items += entry["chapters"] if isinstance(entry, dict) else [entry]
    return items


def chapters() -> list[Path]:
    """The notebooks listed in ``_quarto.yml``, chapters then appendices, in book order."""
    return [repo_root() / c for c in _book_entries(repo_root()) if str(c).endswith(".ipynb")]


def select_chapters(names=None) -> list[Path]:
    """The chapters named in ``names``, in book order; all of :func:`chapters` when ``names`` is empty.

    A name is a notebook stem (``05_profiling``), a file name (``05_profiling.ipynb``) or a path to the
    notebook (relative to the current directory or the repository root). Repeats count once. Raises
    ConfigError for a name that is no chapter of ``_quarto.yml``, with the nearest stems.
    """
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
            raise ConfigError(
                f"--chapter {name!r} is no chapter of _quarto.yml"
                + did_you_mean(path.stem, by_stem, 3, form=" (did you mean {}?)")
                + f"; give a stem or path of one of: {', '.join(by_stem)}."
            )
        picked.add(hit)
    return [nb for nb in book if nb in picked]


# Quarto's own parameter injection (quarto-cli src/resources/jupyter/notebook.py, nb_parameterize),
# mirrored so that a chapter that breaks under `quarto render -P` breaks here too: the code comes from
# papermill's translator (Quarto refuses -P without papermill), the new cell follows the cell tagged
# `parameters`, carries that cell's other tags and its `#|` options minus `label`. Quarto copies the
# options only when they parse *and* hold a `label` (it deletes the key unguarded; without one it
# prints "Invalid YAML option format" and drops them all), which is why our parameters cells carry
# both a label and the `remove-cell` tag: the tag reaches the injected cell in every case.
PARAMETERS_OPTIONS = ("#| label: parameters", "#| echo: false")
PARAMETERS_TAGS = ("parameters", "remove-cell")


def _option_lines(source: str) -> list[str]:
    """The leading ``#|`` option lines of a cell, without the ``#| `` prefix (Quarto's rule)."""
    out = []
    for line in source.splitlines():
        m = re.match(r"^#\s*\| ?", line)
        if not m:
            break
        out.append(re.sub(r":\s+$", ":", line[m.end() :]))
    return out


def inject_parameters(nb, **params) -> None:
    """Insert the cell ``quarto render -P NAME:value`` injects, after the cell tagged ``parameters``.

    Replaces an earlier injected cell (tag ``injected-parameters``), as Quarto and papermill do, and
    records the parameters in ``nb.metadata.papermill``. Raises ValueError when no cell is tagged
    ``parameters`` (Quarto would silently ignore -P: a chapter must declare what it takes).
    """
    from papermill.translators import translate_parameters  # deferred: dev extra, book tooling only

    idx = next(
        (i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])), None
    )
    if idx is None:
        raise ValueError("the notebook has no cell tagged 'parameters'")
    spec = nb.metadata.get("kernelspec", {})
    src = translate_parameters(
        spec.get("name", "python3"), spec.get("language", "python"), params, "Injected Parameters"
    )
    options = yaml.safe_load("\n".join(_option_lines(nb.cells[idx].source))) or {}
    if isinstance(options, dict) and "label" in options:
        del options["label"]
        src = "".join(f"#| {line}\n" for line in yaml.safe_dump(options).strip().splitlines()) + src
    cell = nbformat.v4.new_code_cell(src)
    cell.metadata["tags"] = ["injected-parameters"] + [
        t for t in nb.cells[idx].metadata["tags"] if t != "parameters"
    ]
    old = next(
        (i for i, c in enumerate(nb.cells) if "injected-parameters" in c.get("metadata", {}).get("tags", [])),
        None,
    )
    if old is not None:
        nb.cells[old] = cell
    else:
        nb.cells.insert(idx + 1, cell)
    nb.metadata.setdefault("papermill", {})["parameters"] = dict(params)


def _kernel_config(socket_dir: str):
    """nbclient configuration for a kernel that talks over IPC (Unix sockets in ``socket_dir``).

    ipykernel 7.4 warns "Kernel is running over TCP without encryption ..." at every kernel start when
    the transport is TCP (jupyter_client's default), once per chapter in ``make book``: the kernel and
    this process share the machine, so Unix-domain sockets, which the warning itself suggests, are the
    right transport here and the warning has no cause left. The socket files go to a temporary folder,
    never beside the notebook (the kernel's working directory).
    """
    from traitlets.config import Config  # deferred: dev extra (jupyter), book tooling only

    cfg = Config()
    cfg.KernelManager.transport = "ipc"
    cfg.KernelManager.ip = str(Path(socket_dir) / "kernel")
    return cfg


def _cell_title(cell, width: int = 48) -> str:
    """What a progress line shows for a code cell: its ``#| label``, else its first line of code."""
    options = _option_lines(cell.source)
    label = next((o.split(":", 1)[1].strip() for o in options if o.startswith("label:")), None)
    code = next((ln.strip() for ln in cell.source.splitlines() if ln.strip() and not ln.startswith("#|")), "")
    title = label or code
    return title if len(title) <= width else title[: width - 3] + "..."


def _attach_progress(client, nb, name: str) -> tqdm:
    """A tqdm bar over ``nb``'s code cells, named ``name`` and showing the running cell's number and
    title; advanced by nbclient's ``on_cell_execute`` / ``on_cell_executed`` hooks (the first runs
    before a cell is sent, the second once its reply is in; ``on_cell_complete`` fires at send)."""
    total = sum(1 for c in nb.cells if c.cell_type == "code" and c.source.strip())
    bar = tqdm(total=total, desc=name, unit="cell", dynamic_ncols=True)

    def started(cell, cell_index):
        bar.set_postfix_str(f"cell {cell_index + 1}/{len(nb.cells)}: {_cell_title(cell)}")

    def finished(cell, cell_index, execute_reply):
        bar.update(1)

    client.on_cell_execute = started
    client.on_cell_executed = finished
    return bar


#: Per-cell time limit of each profile, in seconds (None: no limit). The smoke profile's cells take
#: seconds to minutes on CPU, so a stuck cell fails within 15 minutes. The full profile's cells train
#: SmolLM3-3B for up to an epoch (chapter 01: about 25 minutes on 2 H100s, over an hour on 2 A100s,
#: estimated by smolfsdp.book.full_budget): no cut they cannot meet; the runs bound themselves.
CELL_TIMEOUT_S: dict[str, int | None] = {"smoke": 900, "full": None}
#: What each profile's kernels (and every rank they launch) see of the environment: the smoke profile's text
#: says CPU ranks (gloo), so a GPU box hides its GPUs from it; the full profile trains on the GPUs.
PROFILE_ENV: dict[str, dict[str, str]] = {"smoke": {"CUDA_VISIBLE_DEVICES": ""}, "full": {}}


def execute_chapter(
    path: str | Path,
    profile: str = "smoke",
    html_dir: str | Path | None = None,
    timeout: int | None = 0,
    progress: bool = False,
):
    """Execute one notebook (cwd = its folder) and optionally write ``<html_dir>/<stem>.html``.

    ``timeout``: seconds per cell; 0 (the default) takes the profile's :data:`CELL_TIMEOUT_S`, None
    means no limit.

    The notebook is read, parameterised (:func:`inject_parameters`) and executed in memory: the file
    on disk is never written. The kernel talks over IPC (:func:`_kernel_config`). ``progress`` shows a
    bar over the code cells on stderr, with the running cell's number and label or first line.
    Cells tagged ``remove-cell`` (the parameters and the injected cell) are
    left out of the HTML, as Quarto leaves them out of the book. A page with a figure loads
    ``plotly.min.js`` from ``html_dir`` (written there once: :func:`plotting.write_plotlyjs`), as the Quarto
    site loads it from its ``site_libs/``. Outputs Quarto leaves off a page (:func:`drop_undisplayed_outputs`:
    the emptied progress displays) are removed before the HTML is written. Returns the executed notebook.
    Raises ``nbclient.exceptions.CellExecutionError`` on the first failing cell, with its traceback.
    """
    from nbclient import NotebookClient  # deferred: dev extra, book tooling only

    path = Path(path)
    if timeout == 0:
        timeout = CELL_TIMEOUT_S[profile]
    nb = nbformat.read(path, as_version=4)
    inject_parameters(nb, PROFILE=check_profile(profile))
    with tempfile.TemporaryDirectory(prefix="smolfsdp-kernel-") as sockets:
        client = NotebookClient(
            nb,
            timeout=timeout,
            kernel_name="python3",
            resources={"metadata": {"path": str(path.parent)}},
            config=_kernel_config(sockets),
        )
        bar = _attach_progress(client, nb, path.stem) if progress else None
        try:
            client.execute(
                env={**os.environ, **PROFILE_ENV[profile]}
            )  # the kernel's (and its ranks') devices
        finally:
            if bar is not None:
                bar.close()
    drop_undisplayed_outputs(nb)
    if html_dir is not None:
        from nbconvert import HTMLExporter  # deferred: dev extra, book tooling only
        from traitlets.config import Config  # deferred: dev extra (nbconvert's), book tooling only

        cfg = Config()
        cfg.TagRemovePreprocessor.enabled = True
        cfg.TagRemovePreprocessor.remove_cell_tags = {"remove-cell"}
        out = Path(html_dir)
        out.mkdir(parents=True, exist_ok=True)
        body, _ = HTMLExporter(config=cfg).from_notebook_node(nb)
        (out / f"{path.stem}.html").write_text(with_plotlyjs(body, out))
    return nb


def drop_undisplayed_outputs(nb) -> int:
    """Remove, in place, every output Quarto would leave off the page (output metadata ``quarto_display``
    false: the emptied live progress displays of ``smolfsdp.launch.progress.LiveLines``), so the HTML and the
    executed notebooks written here show what a Quarto render shows. Returns how many were removed."""
    removed = 0
    for cell in nb.cells:
        kept = [o for o in cell.get("outputs", []) if o.get("metadata", {}).get(QUARTO_DISPLAY) is not False]
        removed += len(cell.get("outputs", [])) - len(kept)
        if "outputs" in cell:
            cell["outputs"] = kept
    return removed


def with_plotlyjs(page: str, folder: Path) -> str:
    """An nbconvert page whose figures get plotly.js: one ``<script src="plotly.min.js">`` in its head, the
    file written beside it. The book's figures carry no plotly.js of their own (``book.plotting``); a page
    without a figure is returned unchanged."""
    if 'class="plotly-graph-div"' not in page:
        return page
    from smolfsdp.book.figures.plotting import (  # deferred: plotly, for pages with figures
        PLOTLYJS,
        write_plotlyjs,
    )

    write_plotlyjs(folder)
    return page.replace("</head>", f'<script src="{PLOTLYJS}" charset="utf-8"></script>\n</head>', 1)


# ------------------------------------------------------------------------------------- quarto render
# Quarto writes every executed .ipynb chapter back over its source, and `freeze: auto` ignores -P (a
# full render re-uses frozen smoke results). So the book is never rendered in the repository itself:
# `make render PROFILE=...` copies the sources into a scratch project per profile, `_render/<profile>/`
# (git-ignored), renders there with `--profile <profile> -P PROFILE:<profile>`, and copies the site to
# `_book/<profile>/`. Each profile has its own scratch project, hence its own `_freeze/`: smoke and
# full results cannot mix. A source is copied again only when the committed file changed since the
# last copy, so the scratch notebook Quarto wrote back stays, as in an in-place project, and
# `freeze: auto` re-executes exactly the chapters whose committed source changed.
RENDER_STATE = ".smolfsdp-render.json"  # marks a scratch project; scripts/quarto_guard.py looks for it


QUARTO_FILES = ("scripts/quarto_guard.py", "scripts/quarto_plotly.lua", "theme.scss")  # named in _quarto.yml


def render_sources(root: Path | None = None) -> list[Path]:
    """Files a render needs, relative to the repository: Quarto configs, chapters, the guard, filter, theme."""
    root = root or repo_root()
    items = _book_entries(root)
    configs = sorted(p.name for p in root.glob("_quarto*.yml"))
    return [Path(p) for p in [*configs, *items, *QUARTO_FILES]]


def prepare_render_project(profile: str, scratch_root: Path | None = None) -> Path:
    """Create or refresh the scratch Quarto project of ``profile``; return its folder.

    ``scratch_root`` defaults to ``<repo>/_render``. Raises ValueError for an unknown profile.
    """
    if profile not in PROFILES:
        raise ValueError(f"profile {profile!r} is not one of {', '.join(PROFILES)}")
    root = repo_root()
    project = Path(scratch_root or root / "_render") / profile
    state_path = project / RENDER_STATE
    state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    if state.get("profile", profile) != profile:
        raise ValueError(f"{project} holds a {state['profile']!r} render; remove it or pick its profile")
    copied = state.get("sources", {})
    for rel in render_sources(root):
        digest = hashlib.sha256((root / rel).read_bytes()).hexdigest()
        dest = project / rel
        if copied.get(str(rel)) != digest or not dest.is_file():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / rel, dest)
            copied[str(rel)] = digest
    state_path.write_text(json.dumps({"profile": profile, "sources": copied}, indent=1))
    from smolfsdp.book.figures.plotting import write_plotlyjs  # deferred: plotly, for a render only

    write_plotlyjs(project / "scripts")  # beside quarto_plotly.lua, which makes it the site's one plotly.js
    return project


def _forget_sources(project: Path) -> None:
    """Make the next :func:`prepare_render_project` copy every chapter again (its copies were replaced)."""
    path = project / RENDER_STATE
    state = json.loads(path.read_text())
    state["sources"] = {k: v for k, v in state["sources"].items() if not k.endswith(".ipynb")}
    path.write_text(json.dumps(state, indent=1))


def render_book(
    profile: str,
    quarto: str = "quarto",
    scratch_root: Path | None = None,
    out_root: Path | None = None,
    executed: dict[str, nbformat.NotebookNode] | None = None,
) -> Path:
    """``quarto render`` the book in ``profile`` from its scratch project; return ``_book/<profile>``.

    Runs Quarto with this interpreter as ``QUARTO_PYTHON`` (and its folder first on ``PATH``), so the
    kernel, papermill and the pre-render guard are this environment's. ``executed`` (chapter stem ->
    notebook executed by :func:`execute_chapter` in ``profile``, parameters injected) renders those
    notebooks as they are, ``quarto render --no-execute`` (one execution: Quarto runs no cell; a chapter
    missing from ``executed`` renders without outputs). Raises FileNotFoundError when ``quarto`` is not
    installed, CalledProcessError when the render fails.
    """
    exe = shutil.which(quarto)
    if exe is None:
        raise FileNotFoundError(
            f"{quarto!r} is not on PATH: install Quarto (https://quarto.org/docs/get-started/) to render "
            "the book, or run `make book` to execute and check the chapters without it"
        )
    if executed is not None and scratch_root is None:  # apart from `make render`'s project and its _freeze/
        scratch_root = repo_root() / "_render" / "executed"
    project = prepare_render_project(profile, scratch_root)
    if executed is not None:
        for nb_path in chapters():  # over the scratch copies; the next plain render copies the sources again
            if nb_path.stem in executed:
                nbformat.write(executed[nb_path.stem], project / nb_path.relative_to(repo_root()))
        _forget_sources(project)
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "QUARTO_PYTHON": sys.executable, "PATH": bindir + os.pathsep + os.environ["PATH"]}
    env.update(PROFILE_ENV[profile])  # smoke: CPU ranks, as its text says, also on a GPU box
    cmd = [exe, "render", "--profile", profile]
    cmd += ["--no-execute"] if executed is not None else ["-P", f"PROFILE:{profile}"]
    subprocess.run(cmd, cwd=project, env=env, check=True)
    site = Path(out_root or repo_root() / "_book") / profile
    if site.exists():
        shutil.rmtree(site)
    shutil.copytree(project / "_book", site)
    return site
