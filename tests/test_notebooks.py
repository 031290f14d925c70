"""The book's chapters: parameters hidden the way Quarto hides them, every chapter executes in the smoke
profile with the profile injected as `quarto render -P` injects it, without warning text and without
changing a tracked file; the Quarto render runs from a scratch copy; the HTML draws in headless
Chromium with figures that fit the column (what `quarto render` would publish, checked without Quarto).
"""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest
import yaml
from _reading import checking_share, prose_words
from conftest import changed, tracked_changes  # noqa: E402, I001 (tests/ is on sys.path)

from smolfsdp.book.chapters import (
    PARAMETERS_OPTIONS,
    RENDER_STATE,
    chapters,
    inject_parameters,
    render_book,
)
from smolfsdp.book.figures.plotting import PLOTLYJS
from smolfsdp.paths import repo_root

pytestmark = pytest.mark.notebooks
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WARNING_TEXT = re.compile(r"\b\w*Warning\b")  # FutureWarning, UserWarning, "WARNING | ..." is not text


def test_book_lists_the_chapters():
    names = [p.name for p in chapters()]
    assert names and names[0] == "00_memory.ipynb"
    # the appendix (`book: appendices:` in _quarto.yml) comes after the last chapter: executed, rendered, checked
    assert names[-2:] == ["08_seed_claims.ipynb", "appendix_checks.ipynb"]
    for p in chapters():
        assert p.is_file()


def test_parameters_cell_and_injected_cell_are_hidden():
    """Quarto copies the parameters cell's tags to the injected cell always, its `#|` options only when
    they hold a `label`: both cells must leave the book (`remove-cell`), neither may print a warning."""
    for p in chapters():
        nb = nbformat.read(p, as_version=4)
        params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(params) == 1, f"{p.name}: one cell tagged 'parameters'"
        cell = params[0]
        assert cell.source.splitlines()[: len(PARAMETERS_OPTIONS)] == list(PARAMETERS_OPTIONS), p.name
        assert "remove-cell" in cell.metadata["tags"], p.name
        assert 'PROFILE = "smoke"' in cell.source, p.name
        inject_parameters(nb, PROFILE="full")
        injected = nb.cells[nb.cells.index(cell) + 1]
        # what Quarto's nb_parameterize writes (papermill's translator, options minus the label)
        assert injected.source == '#| echo: false\n# Injected Parameters\nPROFILE = "full"\n', p.name
        assert injected.metadata["tags"] == ["injected-parameters", "remove-cell"], p.name
        inject_parameters(nb, PROFILE="smoke")  # a second injection replaces the first
        tagged = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
        assert len(tagged) == 1 and tagged[0].source.endswith('PROFILE = "smoke"\n')
        assert nb.metadata.papermill["parameters"] == {"PROFILE": "smoke"}


def test_chapters_execute(executed):
    notebooks, _, _ = executed
    for name, nb in notebooks.items():
        errors = [
            o
            for c in nb.cells
            if c.cell_type == "code"
            for o in c.get("outputs", [])
            if o.get("output_type") == "error"
        ]
        assert not errors, name
        assert nb.cells[0].source.startswith("# ") and "{#sec-" in nb.cells[0].source.splitlines()[0]
        warned = [
            o["text"]
            for c in nb.cells
            if c.cell_type == "code"
            for o in c.get("outputs", [])
            if o.get("output_type") == "stream" and WARNING_TEXT.search(o.get("text", ""))
        ]
        assert not warned, (
            name,
            "library warnings reach the book; filter them where they are emitted",
            warned,
        )


def test_executed_chapter_00_reads_under_2500_words_and_07_runs_no_check(executed):
    """Issue 41 on the executed pages: chapter 00's prose, its Markdown cells and the sentences its code printed,
    stays under 2,500 words (5,258 before the appendix took the calibration); chapter 07 has no section that runs
    the project's checks of its own numbers (they are in the appendix)."""
    notebooks, _, _ = executed
    if "00_memory" not in notebooks or "07_scaling" not in notebooks:
        pytest.skip("SMOLFSDP_CHAPTERS left chapter 00 or 07 out")
    words = prose_words(notebooks["00_memory"])
    assert prose_words(notebooks["00_memory"], outputs=False) < words < 2_500
    assert checking_share(notebooks["07_scaling"]) == (0.0, [])
    assert checking_share(notebooks["00_memory"]) == (0.0, [])


def test_executing_chapters_changes_no_tracked_file(executed):
    _, _, (before, after) = executed
    if before is None:
        pytest.skip("not a git checkout")
    assert not changed(before, after), (
        f"executing the chapters changed tracked files: {changed(before, after)}"
    )


def test_committed_notebooks_have_no_outputs():
    for p in chapters():
        nb = nbformat.read(p, as_version=4)
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), (
            f"{p.name}: strip outputs"
        )
        assert any("parameters" in c.metadata.get("tags", []) for c in nb.cells), p.name


FAKE_QUARTO = """\
#!{python}
# Does to its project what a real `quarto render` was measured to do: runs the pre-render script
# (stopping on its failure), writes each executed chapter back over its source, adds /.quarto/ to
# .gitignore, freezes results in _freeze/ and writes the site to _book/.
import json, subprocess, sys
from pathlib import Path
import nbformat, yaml
from smolfsdp.book.chapters import inject_parameters

args = sys.argv[1:]
profile = args[args.index("--profile") + 1]
param = args[args.index("-P") + 1]
cfg = yaml.safe_load(Path("_quarto.yml").read_text())
if subprocess.run([sys.executable, cfg["project"]["pre-render"]]).returncode:
    sys.exit(1)
for chapter in cfg["book"]["chapters"] + cfg["book"].get("appendices", []):
    if chapter.endswith(".ipynb"):
        nb = nbformat.read(chapter, as_version=4)
        inject_parameters(nb, PROFILE=param.split(":")[1])
        nb.cells[-1].setdefault("outputs", []).append(nbformat.v4.new_output("stream", text="ran"))
        nbformat.write(nb, chapter)
        frozen = Path("_freeze") / chapter
        frozen.mkdir(parents=True, exist_ok=True)
        (frozen / "execute-results.json").write_text(json.dumps({{"profile": param}}))
with open(".gitignore", "a") as f:
    f.write("/.quarto/\\n")
Path("_book").mkdir(exist_ok=True)
Path("_book/index.html").write_text(f"<title>{{profile}} {{param}}</title>")
"""


def test_render_works_in_a_scratch_copy_per_profile(tmp_path, monkeypatch):
    """`make render` never writes a tracked file, and smoke and full results never share a freezer."""
    quarto = tmp_path / "bin" / "quarto"
    quarto.parent.mkdir()
    quarto.write_text(FAKE_QUARTO.format(python=sys.executable))
    quarto.chmod(0o755)
    monkeypatch.setenv("PYTHONPATH", str(repo_root() / "src"))
    before = tracked_changes()
    scratch, out = tmp_path / "_render", tmp_path / "_book"

    site = render_book("smoke", quarto=str(quarto), scratch_root=scratch, out_root=out)
    assert (site / "index.html").read_text() == "<title>smoke PROFILE:smoke</title>"
    assert site == out / "smoke"
    first = nbformat.read(scratch / "smoke" / "notebooks" / "00_memory.ipynb", as_version=4)
    assert first.cells[-1].outputs, "the fake wrote the executed notebook back (in the scratch copy)"
    # what _quarto.yml names beside the chapters: the plotly.js filter with the file it serves, the theme
    assert "scripts/quarto_plotly.lua" in yaml.safe_load((repo_root() / "_quarto.yml").read_text())["filters"]
    for rel in ("scripts/quarto_plotly.lua", "theme.scss"):
        assert (scratch / "smoke" / rel).read_bytes() == (repo_root() / rel).read_bytes()
    assert "* plotly.js v" in (scratch / "smoke" / "scripts" / PLOTLYJS).read_text()[:100]
    assert json.loads((scratch / "smoke" / RENDER_STATE).read_text())["profile"] == "smoke"
    assert not changed(before, tracked_changes()), "rendering changed tracked files"
    assert not (repo_root() / ".quarto").exists() and not (repo_root() / "_freeze").exists()

    # a second render keeps Quarto's written-back copy (freeze stays valid) and adds no second cell
    render_book("smoke", quarto=str(quarto), scratch_root=scratch, out_root=out)
    again = nbformat.read(scratch / "smoke" / "notebooks" / "00_memory.ipynb", as_version=4)
    assert sum("injected-parameters" in c.metadata.get("tags", []) for c in again.cells) == 1
    assert len(again.cells[-1].outputs) == 2  # re-rendered in place, not re-copied

    render_book("full", quarto=str(quarto), scratch_root=scratch, out_root=out)
    assert (out / "full" / "index.html").read_text() == "<title>full PROFILE:full</title>"
    frozen = {
        p: (scratch / p / "_freeze/notebooks/00_memory.ipynb/execute-results.json") for p in ("smoke", "full")
    }
    assert {p: json.loads(f.read_text())["profile"] for p, f in frozen.items()} == {
        "smoke": "PROFILE:smoke", "full": "PROFILE:full",
    }  # fmt: skip
    assert not changed(before, tracked_changes())


def test_quarto_refuses_to_render_in_the_repository():
    """The pre-render guard stops a plain `quarto render` at the repository root, saying what to run."""
    guard = subprocess.run(
        [sys.executable, "scripts/quarto_guard.py"], cwd=repo_root(), capture_output=True, text=True
    )
    assert guard.returncode == 1
    assert "make render" in guard.stderr and "PROFILE=full" in guard.stderr


def test_render_without_quarto_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="make book"):
        render_book("smoke", quarto=str(tmp_path / "no-quarto"), scratch_root=tmp_path)
    with pytest.raises(ValueError, match="smoke, full"):
        render_book("medium", quarto=sys.executable, scratch_root=tmp_path)


def _render_script():
    spec = importlib.util.spec_from_file_location(
        "render_book_script", repo_root() / "scripts" / "render_book.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_full_profile_refuses_in_one_line_before_any_chapter_without_gpus(tmp_path):
    """`make render PROFILE=full` on a CPU-only machine: one line, exit 2, before Quarto is even looked for."""
    had_render = (repo_root() / "_render" / "full").exists()
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(repo_root() / "src")}
    out = subprocess.run(
        [sys.executable, "scripts/render_book.py", "--profile", "full", "--quarto", str(tmp_path / "no-quarto")],
        cwd=repo_root(), env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("error: PROFILE=full needs 2 CUDA GPUs and this machine has 0")
    assert "make render" in out.stderr and "Quarto" not in out.stderr
    assert had_render or not (repo_root() / "_render" / "full").exists()


def test_render_clears_frozen_results_when_what_chapters_read_changes(tmp_path):
    """`freeze: auto` watches only a chapter's source: the render script stamps the package, the committed
    results and ../shared/, and clears the profile's _freeze/ when any of them changed."""
    rb = _render_script()
    root, shared = tmp_path / "repo", tmp_path / "shared" / "traces"
    (root / "src" / "smolfsdp").mkdir(parents=True)
    (root / "src" / "smolfsdp" / "m.py").write_text("x = 1\n")
    (root / "data" / "results").mkdir(parents=True)
    shared.mkdir(parents=True)
    (shared / "t.json.gz").write_bytes(b"trace")
    project = tmp_path / "_render" / "smoke"
    (project / "_freeze" / "ch").mkdir(parents=True)
    with_trace = rb.inputs_stamp(root)
    assert rb.stale_inputs(project, with_trace) == ["package", "results", "shared"]  # never stamped
    assert not (project / "_freeze").exists()
    (project / rb.STAMP).write_text(json.dumps(with_trace))
    (project / "_freeze" / "ch").mkdir(parents=True)
    assert rb.stale_inputs(project, rb.inputs_stamp(root)) == [] and (project / "_freeze").exists()
    (shared / "t.json.gz").unlink()  # a render without the trace, then with it: the page must change
    assert (
        rb.stale_inputs(project, rb.inputs_stamp(root)) == ["shared"] and not (project / "_freeze").exists()
    )
    (project / "_freeze").mkdir()
    (root / "src" / "smolfsdp" / "m.py").write_text("x = 2\n")
    assert "package" in rb.stale_inputs(project, rb.inputs_stamp(root))


# Each figure drew, fits its output block and the page (no horizontal scrollbar), and its title is
# clear of the modebar. Run at a text-column-like width: the book's column is ~800 px.
FIGURE_CHECK = textwrap.dedent("""
    () => Array.from(document.querySelectorAll('.plotly-graph-div')).map(gd => {
      const box = gd.closest('.jp-OutputArea-output') || gd.parentElement;
      const g = gd.getBoundingClientRect(), b = box.getBoundingClientRect();
      const t = gd.querySelector('.gtitle'), m = gd.querySelector('.modebar');
      const tr = t && t.getBoundingClientRect(), mr = m && m.getBoundingClientRect();
      const overlap = !!(tr && mr && mr.width && tr.left < mr.right && mr.left < tr.right
                         && tr.top < mr.bottom && mr.top < tr.bottom);
      const hit = (p, q) => p.left < q.right - 1 && q.left < p.right - 1 && p.top < q.bottom - 1 && q.top < p.bottom - 1;
      // a legend over an axis's tick labels or a title (Figure 3.4's legend covered its turned strategy names)
      const labels = Array.from(gd.querySelectorAll('g[class$="tick"] text, text[class$="title"]'))
        .map(e => [e.textContent, e.getBoundingClientRect()]).filter(([, r]) => r.width > 0);
      const covered = Array.from(gd.querySelectorAll('.legend')).map(l => l.getBoundingClientRect())
        .flatMap(lr => labels.filter(([, r]) => hit(lr, r)).map(([text]) => text));
      return {traces: (gd.data || []).length, drawn: gd.querySelectorAll('.main-svg').length,
              width: g.width, left: g.left - b.left, right: b.right - g.right, overlap: overlap,
              title_inside: !tr || (tr.left >= g.left - 1 && tr.right <= g.right + 1), legend_covers: covered};
    })
""")


# Every table cell at each width: its content fits it (scrollWidth <= clientWidth) and no word is broken across
# lines (each run of letters between spaces, hyphens and slashes lies on one line: one distinct top per word).
TABLE_CHECK = textwrap.dedent("""
    () => {
      const bad = [];
      for (const cell of document.querySelectorAll('table td, table th')) {
        if (cell.scrollWidth > cell.clientWidth + 1) bad.push(['overflows its cell', cell.innerText.slice(0, 40)]);
        const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
        for (let node = walker.nextNode(); node; node = walker.nextNode()) {
          for (const m of node.data.matchAll(/[^\\s\\-\u2010-\u2014\\/]+/g)) {
            const r = document.createRange();
            r.setStart(node, m.index);
            r.setEnd(node, m.index + m[0].length);
            const tops = new Set(Array.from(r.getClientRects()).filter(x => x.width > 0).map(x => Math.round(x.top)));
            if (tops.size > 1) bad.push(['word broken', m[0]]);
          }
        }
      }
      return bad.slice(0, 10);
    }
""")
WIDTHS = (820, 1300)  # the book's text column at a laptop's width, and a wide screen
# what a page must never print: this machine's folders (temporary, home, the checkout, the venv's python)
MACHINE_PATH = re.compile(
    r"(?<![\w.:/~])/(?:tmp|work|root|home|Users|private/var|var/folders|opt/hostedtoolcache)/"
)


def machine_paths(text: str) -> list[str]:
    """Absolute paths of this machine in ``text``: the patterns of :data:`MACHINE_PATH`, the checkout, the
    interpreter's folder and the temporary folder, each with a little context."""
    import tempfile

    found = [text[max(0, m.start() - 30) : m.end() + 30] for m in MACHINE_PATH.finditer(text)]
    for here in (str(repo_root()), str(Path(sys.executable).parent), tempfile.gettempdir()):
        found += [text[max(0, i - 30) : i + len(here) + 30] for i in _find_all(text, here)]
    return found


def _find_all(text: str, needle: str):
    i = text.find(needle)
    while i >= 0:
        yield i
        i = text.find(needle, i + 1)


def visible_text(html: str) -> str:
    """An nbconvert page's text without its scripts and styles (plotly.js and its figure data are code)."""
    html = re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.S | re.I)
    return re.sub(r"<[^>]+>", " ", html)


def _figure_cells(nb) -> list:
    """The cells with a ``fig-cap`` option: Quarto prints that caption under whatever the cell displays."""
    return [c for c in nb.cells if c.cell_type == "code" and re.search(r"^#\| fig-cap:", c.source, re.M)]


def test_every_caption_has_a_figure_or_a_sentence_above_it(executed):
    """No orphan caption: a figure cell shows its figure (the book's plotly output) or, when its input is absent
    (e.g. no ../shared/traces), a sentence saying so; never nothing, which leaves the caption bare."""
    notebooks, _, _ = executed
    for name, nb in notebooks.items():
        for cell in _figure_cells(nb):
            shown = [o.get("data", {}) for o in cell.get("outputs", []) if "data" in o]
            figure = any('class="plotly-graph-div"' in d.get("text/html", "") for d in shown)
            sentence = any(d.get("text/markdown", "").strip() for d in shown)
            assert figure or sentence, (name, cell.source.splitlines()[0], "caption without a figure")


def test_pages_are_light_and_load_plotlyjs_once(executed):
    """Every page is under 1 MB of HTML; a page with figures loads plotly.js once, from the file written beside
    it (the Quarto site: from site_libs/), and carries no copy inline; no script from another host but the
    ones nbconvert's template loads once (before: MathJax once per figure, from plotly's HTML)."""
    rb = _render_script()
    _, html_dir, _ = executed
    pages = sorted(html_dir.glob("*.html"))
    assert pages
    for html in pages:
        text = html.read_text()
        assert html.stat().st_size < rb.PAGE_LIMIT_BYTES, (html.name, html.stat().st_size)
        assert "* plotly.js v" not in text, (html.name, "plotly.js inline")
        outside = re.findall(r'<script\b[^>]*\bsrc="((?:https?:)?//[^"]+)"', text)
        assert len(outside) == len(set(outside)) and set(outside) <= _nbconvert_outside(), (
            html.name,
            outside,
        )
        if 'class="plotly-graph-div"' in text:
            assert text.count(f'<script src="{PLOTLYJS}"') == 1, html.name
    if any('class="plotly-graph-div"' in p.read_text() for p in pages):
        assert "* plotly.js v" in (html_dir / PLOTLYJS).read_text()[:100]


def test_pages_print_no_machine_path(executed):
    """No executed chapter shows an absolute path of the machine that built it (a runner's checkout, the
    venv's python, a temporary folder): the published site is read elsewhere. Runs without Chromium."""
    _, html_dir, _ = executed
    for html in sorted(html_dir.glob("*.html")):
        assert not machine_paths(visible_text(html.read_text())), (
            html.name,
            machine_paths(visible_text(html.read_text())),
        )


#: a progress line on a page (issue 41): a tqdm bar, a heartbeat, a rank's log line, a launch or import note
PROGRESS_LINE = re.compile(
    r"\d+%\||\d it/s|\d s/it|still running, \d|^\[rank\d\]|\[dry run\]|importing .*\(seconds\)|starting \d CPU rank",
    re.M,
)


def test_pages_show_no_progress_lines(executed):
    """Progress is seen while a cell runs, never kept (``smolfsdp.launch.progress.live_say``): no executed
    chapter's outputs, and no page's visible text, hold a progress bar, a heartbeat or a rank's log line."""
    notebooks, html_dir, _ = executed
    for name, nb in notebooks.items():
        for cell in nb.cells:
            for o in cell.get("outputs", []):
                texts = [o.get("text", "")] + [v for v in o.get("data", {}).values() if isinstance(v, str)]
                hits = [m for t in texts for m in PROGRESS_LINE.findall(t)]
                assert not hits, (name, hits, cell.source[:80])
    bars = re.compile(r"\d+%\||\d it/s|still running, \d|^\[rank\d\]", re.M)  # the notes' text is code there
    for html in sorted(html_dir.glob("*.html")):
        assert not bars.findall(visible_text(html.read_text())), html.name


def test_html_in_chromium(executed):
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("CI must check the chapters in Chromium, but no chromium binary is installed")
        pytest.skip("no chromium on this machine (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    notebooks, html_dir, _ = executed
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        for html in sorted(html_dir.glob("*.html")):
            page = browser.new_page(viewport={"width": WIDTHS[0], "height": 900})
            errors, outside, local = [], [], []
            page.on("pageerror", lambda e, errs=errors: errs.append(str(e)))
            page.route("**/*", _offline(outside, local))
            page.goto(html.as_uri(), wait_until="load")
            nb = notebooks[html.stem]
            # figure cells that drew something (a section may be skipped, e.g. without ../shared/traces)
            expected = sum(
                "#| label: fig-" in c.source
                and any("plotly" in str(o.get("data", {}).get("text/html", "")) for o in c.get("outputs", []))
                for c in nb.cells
                if c.cell_type == "code"
            )
            if expected:  # plotly draws after parsing 4.8 MB of plotly.js: slow on a loaded 2-core box
                page.wait_for_function(
                    f"document.querySelectorAll('.plotly-graph-div .main-svg').length >= {expected}",
                    timeout=180_000,
                )
            for width in WIDTHS:  # the same page at each width: no reload, plotly.js is parsed once
                page.set_viewport_size({"width": width, "height": 900})
                if expected:
                    page.wait_for_timeout(500)  # let the ResizeObserver settle each figure to its block
                figures = page.evaluate(FIGURE_CHECK)
                assert len(figures) >= expected, (html.name, width, expected, figures)
                for f in figures:
                    assert f["traces"] >= 1 and f["drawn"] >= 1, (html.name, width, f)
                    assert f["left"] >= -1 and f["right"] >= -1, (
                        html.name,
                        width,
                        "figure wider than its block",
                        f,
                    )
                    assert f["width"] > 300, (html.name, width, "figure collapsed", f)
                    assert not f["overlap"], (html.name, width, "title under the modebar", f)
                    assert f["title_inside"], (html.name, width, "title cut at the figure's edge", f)
                    assert not f["legend_covers"], (html.name, width, "legend over axis labels", f)
                scroll = page.evaluate(
                    "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
                )
                assert scroll[0] <= scroll[1] + 1, (html.name, width, "horizontal scrollbar", scroll)
                assert page.evaluate(TABLE_CHECK) == [], (html.name, width, "table cells")
            text = page.inner_text("body")
            assert 'PROFILE = "' not in text, (html.name, "the parameters cell is shown")
            assert not machine_paths(text), (html.name, "machine path on the page", machine_paths(text))
            assert errors == [], (html.name, errors)
            # drawn with every other host blocked, asking them for nothing but nbconvert's own page scripts
            assert set(outside) <= _nbconvert_outside(), (html.name, "outside requests", sorted(set(outside)))
            assert [u.rsplit("/", 1)[-1] for u in local].count(PLOTLYJS) == (1 if expected else 0), html.name
            page.close()
        browser.close()


def _nbconvert_outside() -> set[str]:
    """What nbconvert's own page template loads from a CDN (require.js, MathJax for Markdown math): not the
    book's, and nothing on the book's pages needs it (the Chromium check blocks it)."""
    from nbconvert import HTMLExporter

    exporter = HTMLExporter()
    return {exporter.require_js_url, exporter.mathjax_url}


def _offline(outside: list, local: list):
    """A route handler that serves the page's own files and refuses every request to another host, recording
    each URL in ``local`` or ``outside``."""

    def handle(route):
        url = route.request.url
        if url.startswith(("file:", "data:", "blob:")):
            local.append(url)
            route.continue_()
        else:
            outside.append(url)
            route.abort()

    return handle


# What Quarto writes into the head of a page with any text/html output (src/core/jupyter/widgets.ts,
# includesForJupyterWidgetDependencies): jsDelivr since Quarto 1.8, cdnjs before (quarto-cli PR 7076).
QUARTO_WIDGET_TAGS = {
    "1.8": (
        '<script src="https://cdn.jsdelivr.net/npm/requirejs@2.3.6/require.min.js" integrity="sha384-c9c+LnTbwQ3'
        "aujuU7ULEPVvgLs+Fn6fJUvIGTsuu1ZcCf11fiEubah0ttpca4ntM sha384-6V1/AdqZRWk1KAlWbKBlGhN7VG4iE/yAZcO6NZPMF8od"
        '0vukrvr0tg4qY6NSrItx" crossorigin="anonymous"></script>\n'
        '<script src="https://cdn.jsdelivr.net/npm/jquery@3.5.1/dist/jquery.min.js" integrity="sha384-ZvpUoO/+PpL'
        'XR1lu4jmpXWu80pZlYUAfxl5NsBMWOEPSjUn/6Z/hRTt8+pR6L4N2" crossorigin="anonymous" data-relocate-top="true">'
        "</script>\n"
        "<script type=\"application/javascript\">define('jquery', [],function() {return window.jQuery;})</script>\n"
    ),
    "1.7": (
        '<script src="https://cdnjs.cloudflare.com/ajax/libs/require.js/2.3.6/require.min.js" integrity="sha512-'
        'c3Nl8+7g4LMSTdrm621y7kf9v3SDPnhxLNhcjFJbKECVnmZHTdo+IRO05sNLTH/D3vA6u1X32ehoLC7WFVdheg==" crossorigin="'
        'anonymous"></script>\n'
        '<script src="https://cdnjs.cloudflare.com/ajax/libs/jquery/3.5.1/jquery.min.js" integrity="sha512-bLT0Qm9'
        'VnAYZDflyKcBaQ2gg0hSYNQrJ8RilYldYQ1FxQYoCLtUjuuRuZo+fjqhx/qtq/1itJ0C2ejDxltZVFg==" crossorigin="anonymous" '
        'data-relocate-top="true"></script>\n'
        "<script type=\"application/javascript\">define('jquery', [],function() {return window.jQuery;})</script>\n"
    ),
}
FIGURE_DIV = '<div id="f1" class="plotly-graph-div"></div><script>Plotly.newPlot("f1", [], {})</script>'


def _page(head: str, body: str) -> str:
    return f"<html><head>\n<meta charset='utf-8'>\n{head}</head><body>{body}</body></html>\n"


def test_finish_site_drops_quartos_unused_cdn_scripts_and_checks_the_site(tmp_path):
    """After Quarto: require.js, jQuery and define('jquery') leave every page; a page with figures loads the site's
    one plotly.js once; no page over 1 MB; nothing from another host (scripts/render_book.py: finish_site)."""
    rb = _render_script()
    site = tmp_path / "site"
    lib = site / "site_libs" / "quarto-contrib" / "plotly-4.1.1"
    lib.mkdir(parents=True)
    (lib / PLOTLYJS).write_text("/**\n* plotly.js v4.1.1\n*/")
    (site / "notebooks").mkdir()
    plotly = '<script src="../site_libs/quarto-contrib/plotly-4.1.1/plotly.min.js"></script>\n'
    (site / "index.html").write_text(_page(QUARTO_WIDGET_TAGS["1.8"], "<table><tr><td>1</td></tr></table>"))
    (site / "notebooks" / "ch.html").write_text(_page(QUARTO_WIDGET_TAGS["1.7"] + plotly, FIGURE_DIV))
    assert rb.finish_site(site) == []
    index, chapter = (site / "index.html").read_text(), (site / "notebooks" / "ch.html").read_text()
    assert index == _page("", "<table><tr><td>1</td></tr></table>")
    assert chapter == _page(plotly, FIGURE_DIV)  # the site's plotly.js stays, once
    assert rb.finish_site(site) == []  # a second pass changes nothing

    (site / "notebooks" / "big.html").write_text(_page("", FIGURE_DIV + "x" * rb.PAGE_LIMIT_BYTES))
    (site / "notebooks" / "inline.html").write_text(
        _page(plotly, "<script>/**\n* plotly.js v4.1.1\n*/</script>")
    )
    (site / "notebooks" / "twice.html").write_text(_page(plotly + plotly, FIGURE_DIV))
    (site / "notebooks" / "cdn.html").write_text(_page('<script src="https://cdn.plot.ly/plotly-3.0.1.min.js">'
                                                       "</script>\n", FIGURE_DIV))  # fmt: skip
    (site / "notebooks" / PLOTLYJS).write_text("a second copy")
    (site / "site_libs" / "theme.css").write_text(
        '@import url("https://fonts.googleapis.com/css2?family=X");'
    )
    problems = "\n".join(rb.finish_site(site))
    assert "notebooks/big.html: 1,000,1" in problems and "loads plotly.js 0 times" in problems
    assert "notebooks/inline.html: plotly.js inline" in problems
    assert "notebooks/twice.html: has figures and loads plotly.js 2 times" in problems
    assert "notebooks/cdn.html: from another host" in problems and "plotly.js 2 times in the site" in problems
    assert "site_libs/theme.css: imports a stylesheet from another host" in problems
    assert "index.html" not in problems and "notebooks/ch.html" not in problems


# Runs scripts/quarto_plotly.lua in pandoc with the two Quarto functions it calls stubbed as Quarto defines
# them (src/resources/pandoc/datadir/init.lua: quarto.doc.add_html_dependency, quarto.utils.resolve_path
# relative to the filter), and prints the dependencies it added. Quarto itself is checked by the book workflow.
QUARTO_STUB = """
local here = pandoc.path.directory(PANDOC_SCRIPT_FILE)
local deps = {}
quarto = {
  doc = {
    is_format = function(f) return f == "html" end,
    add_html_dependency = function(d) table.insert(deps, d) end,
  },
  utils = { resolve_path = function(p) return pandoc.path.join({ here, p }) end },
}
local filters = dofile(pandoc.path.join({ here, "quarto_plotly.lua" }))
table.insert(filters, { Pandoc = function(doc)
  local out = {}
  for _, d in ipairs(deps) do table.insert(out, d.name .. "-" .. d.version .. ":" .. table.concat(d.scripts, ",")) end
  return pandoc.Pandoc({ pandoc.Plain({ pandoc.Str(#deps .. " " .. table.concat(out, " ")) }) })
end })
return filters
"""
QUARTO_FIGURE_MD = """
::: {#fig-a .cell}
::: {.cell-output .cell-output-display}
```{=html}
<div id="a" class="plotly-graph-div" style="height:100%"></div><script>Plotly.newPlot("a", [], {})</script>
```
:::
Caption a.
:::

::: {.cell-output .cell-output-display}
```{=html}
<div id="b" class="plotly-graph-div"></div><script>Plotly.newPlot("b", [], {})</script>
```
:::
"""


@pytest.mark.skipif(shutil.which("pandoc") is None, reason="no pandoc here (apt-get install pandoc)")
def test_quarto_filter_adds_plotlyjs_once_to_pages_with_figures(tmp_path):
    shutil.copy(repo_root() / "scripts" / "quarto_plotly.lua", tmp_path)
    (tmp_path / "stub.lua").write_text(QUARTO_STUB)

    def run(markdown: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["pandoc", "--from", "markdown", "--to", "plain", "--lua-filter", str(tmp_path / "stub.lua")],
            input=markdown, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    missing = run(QUARTO_FIGURE_MD)  # the file `make render` writes beside the filter is not there
    assert missing.returncode != 0 and "plotly.min.js is missing" in missing.stderr
    assert "make render" in missing.stderr
    (tmp_path / PLOTLYJS).write_text("/**\n* plotly.js v9.8.7\n* Copyright 2012-2026, Plotly, Inc.\n*/\n")
    two_figures = run(QUARTO_FIGURE_MD)
    assert two_figures.stdout.strip() == "1 plotly-9.8.7:plotly.min.js", two_figures.stderr
    assert run("Prose and a table.\n\n| a |\n|---|\n| 1 |\n").stdout.strip() == "0"
