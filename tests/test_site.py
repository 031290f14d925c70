"""The book as readers get it: the chapters the suite executed once (tests/conftest.py: executed) rendered with
the real ``quarto render --no-execute`` (no second execution), then the site checked in headless Chromium at the
book's two widths, served over HTTP on 127.0.0.1 with every other host refused.

Quarto: ``.tools/quarto/bin/quarto`` (what .ci/run installs from ../shared/tools/quarto/) or ``quarto`` on PATH.
Without Quarto or Chromium the site tests skip, except under CI=1, where they fail.
"""

import functools
import http.server
import os
import re
import shutil
import threading

import pytest
from test_notebooks import CHROMIUM, TABLE_CHECK, _render_script, machine_paths  # noqa: I001 (tests/ on sys.path)

from smolfsdp.book.chapters import chapters, render_book
from smolfsdp.book.figures.plotting import PLOTLYJS
from smolfsdp.paths import repo_root

pytestmark = pytest.mark.notebooks
QUARTO_VERSION = "1.8.27"  # ../shared/tools/quarto, .github/workflows/book.yml
SITE_WIDTHS = (1300, 820)
NEGATIVE_ZERO = re.compile(r"(?<![\w.])[-\u2212]0(?:\.0+)?(?![\d.]*\d)")


def quarto_exe() -> str | None:
    local = repo_root() / ".tools" / "quarto" / "bin" / "quarto"
    return str(local) if local.is_file() else shutil.which("quarto")


def _need(what: str, found) -> None:
    if not found:
        if os.environ.get("CI"):
            pytest.fail(f"CI must check the Quarto site, but {what} is missing (.ci/run installs it)")
        pytest.skip(f"no {what} on this machine (.ci/run installs it)")


@pytest.fixture(scope="module")
def site(executed, tmp_path_factory):
    """The smoke site rendered by Quarto from the executed notebooks, after render_book.py's own pass
    (finish_site: the unused CDN tags dropped, its problems returned)."""
    _need("Quarto (bash ../shared/tools/quarto/install.sh .tools/quarto)", quarto_exe())
    notebooks, _, _ = executed
    tmp = tmp_path_factory.mktemp("quarto")
    out = render_book("smoke", quarto=quarto_exe(), scratch_root=tmp / "render", out_root=tmp / "book",
                      executed=notebooks)  # fmt: skip
    return out, _render_script().finish_site(out), notebooks


def test_quarto_renders_the_executed_chapters_without_running_them(site):
    """Each chapter page carries the outputs of the one execution (the figures' plotly divs, no parameters
    cell), and render_book.py's site check finds nothing: one plotly.js, no page over 1 MB, no other host."""
    out, problems, notebooks = site
    assert problems == []
    pages = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.html") if "site_libs" not in p.parts)
    assert pages == ["index.html"] + [f"notebooks/{nb.stem}.html" for nb in chapters()]
    for stem, nb in notebooks.items():
        html = (out / "notebooks" / f"{stem}.html").read_text()
        figures = sum('class="plotly-graph-div"' in str(o.get("data", {})) for c in nb.cells
                      for o in c.get("outputs", []))  # fmt: skip
        assert html.count('class="plotly-graph-div"') == figures, stem
        assert 'PROFILE = "' not in html, (stem, "the parameters cell reached the page")
        assert len(html.encode()) < _render_script().PAGE_LIMIT_BYTES, stem
    assert len(list(out.rglob(PLOTLYJS))) == 1


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def served(site):
    out, _, _ = site
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(out)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield out, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


# What a page shows wrong at the current width, one entry per problem (at most a few of each kind).
PAGE_CHECK = """
() => {
  const bad = [], main = document.querySelector('main') || document.body;
  const col = main.getBoundingClientRect();
  const doc = document.documentElement;
  if (doc.scrollWidth > doc.clientWidth + 1) bad.push(['sideways scroll', doc.scrollWidth, doc.clientWidth]);
  for (const t of main.querySelectorAll('table')) {
    const r = t.getBoundingClientRect(), box = t.parentElement;
    if (r.right > col.right + 1 || r.left < col.left - 1 || box.scrollWidth > box.clientWidth + 1)
      bad.push(['table wider than the column', Math.round(r.width), Math.round(col.width),
                t.innerText.slice(0, 40)]);
  }
  for (const pre of main.querySelectorAll('pre')) {
    if (pre.scrollWidth > pre.clientWidth + 1 || pre.getBoundingClientRect().right > col.right + 1)
      bad.push(['code wider than the column', pre.scrollWidth, pre.clientWidth, pre.innerText.slice(0, 60)]);
  }
  for (const fig of main.querySelectorAll('figure')) {
    const cap = fig.querySelector(':scope > figcaption');
    const body = cap && cap.previousElementSibling;
    if (!cap || !cap.innerText.trim()) { bad.push(['figure without a caption', fig.innerText.slice(0, 40)]); continue; }
    if (body && cap.getBoundingClientRect().top < body.getBoundingClientRect().bottom - 1)
      bad.push(['caption not under its figure', cap.innerText.slice(0, 40)]);
  }
  for (const gd of main.querySelectorAll('.plotly-graph-div'))
    if (!gd.querySelector('.main-svg') || !(gd.data || []).length) bad.push(['figure not drawn', gd.id]);
  return bad;
}
"""
NAV_LINKS = "Array.from(document.querySelectorAll('#quarto-sidebar a.sidebar-link')).map(a => a.href)"
EXPLORER = ("Array.from(document.querySelectorAll('.plotly-graph-div'))"
            ".find(g => g.layout && (g.layout.updatemenus || []).length)")  # fmt: skip


def _open(browser, url: str, base: str, width: int):
    """A page of the site at ``width`` with every request outside ``base`` refused; returns the page and the
    lists it fills: page errors, console errors, outside requests, requests for plotly.js."""
    page = browser.new_page(viewport={"width": width, "height": 900})
    log = {"errors": [], "console": [], "outside": [], "plotly": []}
    page.on("pageerror", lambda e: log["errors"].append(str(e)))
    page.on("console", lambda m: m.type == "error" and log["console"].append(m.text))

    def route(r):
        u = r.request.url
        if u.startswith(base) or u.startswith(("data:", "blob:")):
            if u.split("?")[0].endswith(PLOTLYJS):
                log["plotly"].append(u)
            r.continue_()
        else:
            log["outside"].append(u)
            r.abort()

    page.route("**/*", route)
    page.goto(url, wait_until="load", timeout=180_000)
    return page, log


def _check_page(page, rel: str, width: int, log: dict, nav_expected: set[str]) -> list:
    figures = page.evaluate("document.querySelectorAll('.plotly-graph-div').length")
    if figures:  # plotly draws after parsing 4.8 MB of plotly.js: slow on a loaded 2-core box
        page.wait_for_function(
            f"document.querySelectorAll('.plotly-graph-div .main-svg').length >= {figures}", timeout=180_000
        )
    page.wait_for_timeout(300)
    text = page.inner_text("main")
    bad = [[rel, width, *p] for p in page.evaluate(PAGE_CHECK)]
    bad += [[rel, width, "table cell", *p] for p in page.evaluate(TABLE_CHECK)]
    nav = {h.split("#")[0].rsplit("/", 1)[-1] or "index.html" for h in page.evaluate(NAV_LINKS)}
    if not nav_expected <= nav:
        bad.append([rel, width, "chapters missing from the navigation", sorted(nav_expected - nav)])
    checks = {
        "unresolved cross-reference": ["?@" + m for m in re.findall(r"\?@([\w-]+)", text)],
        "negative zero": [text[max(0, m.start() - 20) : m.end() + 5] for m in NEGATIVE_ZERO.finditer(text)],
        "machine path": machine_paths(text),
        "parameters cell": ['PROFILE = "'] if 'PROFILE = "' in text else [],
        "page error": log["errors"],
        "console error": log["console"],
        "outside request": log["outside"],
        "plotly.js loads": [] if len(log["plotly"]) == (1 if figures else 0) else log["plotly"],
    }
    return bad + [[rel, width, k, v[:3]] for k, v in checks.items() if v]


@pytest.fixture(scope="module")
def browser():
    _need("chromium (apt-get install chromium)", CHROMIUM)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu",
                               "--disable-background-networking", "--disable-component-update"])  # fmt: skip
        yield b
        b.close()


def test_site_in_chromium_at_both_widths(served, browser):
    """Every page at 1300 and 820 px: every chapter in the navigation, cross-references resolved, captions
    under drawn figures, tables and code inside the column with no word broken in a cell, no sideways
    scroll, no negative zero, no machine path or parameters cell, no page or console error, plotly.js
    requested once on a page with figures, nothing asked of another host."""
    out, base = served
    pages = ["index.html"] + [f"notebooks/{nb.stem}.html" for nb in chapters()]
    nav_expected = {p.rsplit("/", 1)[-1] for p in pages}
    bad = []
    for rel in pages:
        for width in SITE_WIDTHS:
            page, log = _open(browser, base + rel, base, width)
            bad += _check_page(page, rel, width, log, nav_expected)
            page.close()
    assert bad == [], "\n".join(map(str, bad))


def test_search_finds_a_chapter(served, browser):
    """Typing a word in the site's search box lists a hit from the chapter that has it (search.json, local)."""
    _, base = served
    page, log = _open(browser, base + "index.html", base, 1300)
    page.locator("#quarto-search .aa-DetachedSearchButton, #quarto-search button").first.click()
    page.locator("input.aa-Input").fill("reduce-scatter")
    page.wait_for_selector(".aa-Item", timeout=60_000)
    hits = page.eval_on_selector_all(".aa-Item a", "as => as.map(a => a.href)")
    assert any("notebooks/" in h for h in hits), hits
    assert log["outside"] == [] and log["errors"] == []
    page.close()


def test_fit_explorer_controls_change_its_figure(served, browser, executed):
    """Chapter 00's fit explorer on the Quarto page: choosing 8 GPUs in its dropdown redraws other bars."""
    notebooks, _, _ = executed
    if "00_memory" not in notebooks:
        pytest.skip("chapter 00 not executed (SMOLFSDP_CHAPTERS)")
    _, base = served
    page, log = _open(browser, base + "notebooks/00_memory.html", base, 820)
    page.wait_for_function(f"{EXPLORER} && {EXPLORER}.querySelector('.main-svg')", timeout=180_000)
    before = page.evaluate(f"{EXPLORER}.data[0].y")
    gd = page.locator(".plotly-graph-div", has=page.locator(".updatemenu-header")).first
    gd.locator(".updatemenu-header", has_text="GPUs: 2").click()
    gd.locator(".updatemenu-dropdown-button", has_text="GPUs: 8").click()
    page.wait_for_timeout(500)
    after = page.evaluate(f"{EXPLORER}.data[0].y")
    assert after != before and len(after) == len(before)
    assert log["errors"] == [] and log["outside"] == []
    page.close()


def test_site_check_catches_the_defects(browser, tmp_path):
    """The checks above on a page with each defect: a table wider than the column, a word broken in a cell,
    a code line wider than the column, a negative zero, an unresolved cross-reference."""
    page_html = (
        """<html><body><main style="width:400px"><table><tr><td style="word-break:break-all;width:40px">
    reduce-scatter HuggingFaceTB</td></tr></table><table style="width:900px"><tr><td>wide</td></tr></table>
    <pre>"""
        + "x" * 300
        + """</pre><p>-0.0 % and ?@sec-missing</p></main></body></html>"""
    )
    (tmp_path / "bad.html").write_text(page_html)
    page = browser.new_page(viewport={"width": 820, "height": 900})
    page.goto((tmp_path / "bad.html").as_uri())
    bad = _check_page(
        page, "bad.html", 820, {"errors": [], "console": [], "outside": [], "plotly": []}, set()
    )
    kinds = {b[2] for b in bad}
    assert {"table wider than the column", "code wider than the column", "table cell", "negative zero",
            "unresolved cross-reference"} <= kinds, bad  # fmt: skip
    assert any(b[3] == "word broken" for b in bad if b[2] == "table cell"), bad
    page.close()


def test_github_workflow_pins_the_quarto_ci_renders_with():
    """The GitHub workflow installs the Quarto that .ci/run installs and this suite renders with."""
    import yaml

    flow = yaml.safe_load((repo_root() / ".github" / "workflows" / "book.yml").read_text())
    steps = [s for s in flow["jobs"]["render"]["steps"] if "quarto-actions/setup" in s.get("uses", "")]
    assert len(steps) == 1 and str(steps[0]["with"]["version"]) == QUARTO_VERSION
    if quarto_exe():
        import subprocess

        out = subprocess.run([quarto_exe(), "--version"], capture_output=True, text=True, timeout=300)
        assert out.stdout.strip() == QUARTO_VERSION


RECORDING_QUARTO = """\
#!{python}
# Records its arguments and the chapter it was given, writes a one-page site (what render_book copies).
import json, sys
from pathlib import Path
import nbformat
nb = nbformat.read("notebooks/00_memory.ipynb", as_version=4)
Path("{log}").write_text(json.dumps({{"argv": sys.argv[1:], "outputs": nb.cells[-1].get("outputs", [])}}))
Path("_book").mkdir(exist_ok=True)
Path("_book/index.html").write_text("site")
"""


def test_render_of_executed_notebooks_runs_quarto_without_execution(tmp_path):
    """render_book(executed=...) hands Quarto the executed notebook in the scratch copy and asks it to execute
    nothing (--no-execute, no -P); render_book.py --executed refuses a folder missing a chapter or executed in
    another profile, in one line, before Quarto starts."""
    import json
    import subprocess
    import sys

    import nbformat

    log, quarto = tmp_path / "argv.json", tmp_path / "quarto"
    quarto.write_text(RECORDING_QUARTO.format(python=sys.executable, log=log))
    quarto.chmod(0o755)
    nb = nbformat.read(chapters()[0], as_version=4)
    nb.cells[-1]["outputs"] = [nbformat.v4.new_output("stream", text="from the one execution")]
    render_book("smoke", quarto=str(quarto), scratch_root=tmp_path / "r", out_root=tmp_path / "b",
                executed={"00_memory": nb})  # fmt: skip
    seen = json.loads(log.read_text())
    assert seen["argv"] == ["render", "--profile", "smoke", "--no-execute"]
    assert seen["outputs"][0]["text"] == "from the one execution"
    assert (tmp_path / "b" / "smoke" / "index.html").read_text() == "site"

    folder = tmp_path / "executed"
    folder.mkdir()
    script = [sys.executable, str(repo_root() / "scripts" / "render_book.py"), "--executed", str(folder)]
    missing = subprocess.run(script, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "00_memory.ipynb is missing" in missing.stderr
    assert "execute_notebooks.py --profile smoke --ipynb-dir" in missing.stderr
    for p in chapters():
        other = nbformat.read(p, as_version=4)
        other.metadata["papermill"] = {"parameters": {"PROFILE": "full"}}
        nbformat.write(other, folder / p.name)
    wrong = subprocess.run(script, capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2 and "executed in profile 'full', not 'smoke'" in wrong.stderr
