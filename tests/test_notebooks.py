"""Every chapter executes in the smoke profile; its HTML renders in headless Chromium with live
plotly figures and no script errors (what `quarto render` would publish, checked without Quarto)."""

import os
import shutil

import pytest

from smolfsdp.book import chapters, execute_chapter

pytestmark = pytest.mark.notebooks
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    html_dir = tmp_path_factory.mktemp("html")
    return {nb.stem: execute_chapter(nb, "smoke", html_dir) for nb in chapters()}, html_dir


def test_book_lists_the_chapters():
    names = [p.name for p in chapters()]
    assert names and names[0] == "00_memory.ipynb"
    for p in chapters():
        assert p.is_file()


def test_chapters_execute(executed):
    notebooks, _ = executed
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


def test_committed_notebooks_have_no_outputs():
    import nbformat

    for p in chapters():
        nb = nbformat.read(p, as_version=4)
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), (
            f"{p.name}: strip outputs"
        )
        assert any("parameters" in c.metadata.get("tags", []) for c in nb.cells), p.name


def test_html_in_chromium(executed):
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("CI must check the chapters in Chromium, but no chromium binary is installed")
        pytest.skip("no chromium on this machine (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    notebooks, html_dir = executed
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
            page = browser.new_page()
            errors = []
            page.on("pageerror", lambda e, errs=errors: errs.append(str(e)))
            page.goto(html.as_uri(), wait_until="load")
            nb = notebooks[html.stem]
            # figure cells that drew something (a section may be skipped, e.g. without ../shared/traces)
            expected = sum(
                "#| label: fig-" in c.source
                and any("plotly" in str(o.get("data", {}).get("text/html", "")) for o in c.get("outputs", []))
                for c in nb.cells
                if c.cell_type == "code"
            )
            if expected:  # plotly draws after parsing ~5 MB of inline plotly.js: slow on a loaded 2-core box
                page.wait_for_function(
                    f"document.querySelectorAll('.plotly-graph-div .main-svg').length >= {expected}",
                    timeout=180_000,
                )
            n_figs = page.locator(".plotly-graph-div").count()
            traces = page.evaluate(
                "Array.from(document.querySelectorAll('.plotly-graph-div')).map(d => (d.data || []).length)"
            )
            assert n_figs >= expected and all(t >= 1 for t in traces), (html.name, expected, traces)
            assert errors == [], (html.name, errors)
            page.close()
        browser.close()
