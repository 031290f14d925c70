"""The "does it fit?" figure: every state is an ``estimate_memory`` result, and in Chromium changing the
dropdowns changes the bars to the combined setting's estimate (not only the last dropdown's)."""

import shutil

import pytest

from smolfsdp.book.figures import fit_explorer as fx
from smolfsdp.book.figures.fit_explorer import (
    BASE,
    PEAK_LABEL,
    fit_states,
    plot_fit_explorer,
    state_key,
    verdict,
)
from smolfsdp.estimate.hardware import GPUS
from smolfsdp.estimate.memory import estimate_memory
from smolfsdp.estimate.recipes import GIB

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def explorer(tmp_path_factory):
    states = fit_states()
    fig = plot_fit_explorer(states)
    out = tmp_path_factory.mktemp("fig")
    return states, fig, fx.save_explorer(fig, "fit_explorer", out)[0]


def expected_bars(fig, **setting):
    est = estimate_memory(
        "smollm3-3b",
        recipe="hf-fsdp-bf16",
        **{k: v for k, v in {**BASE, **setting}.items() if k not in ("model", "gpu")},
    )
    comps = est.components()
    labels = list(fig.data[0].x)
    keys = {
        v: k
        for k, v in __import__("smolfsdp.book.figures.fit_explorer", fromlist=["x"]).COMPONENT_LABELS.items()
    }
    return [round((est.peak_bytes if x == PEAK_LABEL else comps[keys[x]]) / GIB, 3) for x in labels], est


def test_every_combination_is_computed_and_the_base_is_drawn(explorer):
    states, fig, _ = explorer
    n = 1
    for c in fx.CONTROLS:
        n *= 1 if c.key == "gpu" else len(c.values)
    assert len(states) == n == 864
    bars, est = expected_bars(fig)
    assert list(fig.data[0].y) == bars
    assert fig.layout.annotations[0].text == verdict(est.peak_bytes, BASE["gpu"])
    assert fig.layout.shapes[0].y0 == GPUS[BASE["gpu"]].memory_bytes / GIB
    assert (
        states[state_key({**BASE, "lora": True})]["peak"]
        == estimate_memory("smollm3-3b", world_size=2, seq_len=4096, lora=True).peak_bytes
    )


def test_each_button_falls_back_to_its_one_setting(explorer):
    _, fig, _ = explorer
    menu = next(m for m in fig.layout.updatemenus if m.buttons[0].label.startswith("GPUs:"))
    button = next(b for b in menu.buttons if b.label == "GPUs: 8")
    assert button.args[0]["y"][0] == expected_bars(fig, world_size=8)[0]


PICK = "Array.from(document.querySelectorAll('.updatemenu-dropdown-button')).map(e => e.textContent.trim())"


def choose(page, current, new):
    """Click a dropdown's header, then one of its items: what a reader does."""
    page.locator(".updatemenu-header", has_text=current).click()
    page.wait_for_function("document.querySelectorAll('.updatemenu-dropdown-button').length > 0")
    page.locator(".updatemenu-dropdown-button").nth(page.evaluate(PICK).index(new)).click()
    page.wait_for_timeout(500)


def test_dropdowns_change_the_bars_in_chromium(explorer):
    if CHROMIUM is None:
        pytest.skip("no chromium on this machine (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    _, fig, html = explorer
    gd = "document.querySelector('.plotly-graph-div')"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 820, "height": 900})
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(html.as_uri(), timeout=180_000)
        page.wait_for_function(f"{gd} && {gd}.querySelector('.main-svg')", timeout=180_000)
        assert page.evaluate(f"{gd}.data[0].y") == list(fig.data[0].y)
        choose(page, "GPUs: 2", "GPUs: 8")
        assert page.evaluate(f"{gd}.data[0].y") == expected_bars(fig, world_size=8)[0]
        choose(page, "LoRA: off", "LoRA: on")  # combined with 8 GPUs, not LoRA on the 2-GPU base
        bars, est = expected_bars(fig, world_size=8, lora=True)
        assert page.evaluate(f"{gd}.data[0].y") == bars
        assert page.evaluate(f"{gd}.layout.annotations[0].text") == verdict(est.peak_bytes, "A100 40GB")
        choose(page, "GPU: A100 40GB", "GPU: A10G")  # the GPU moves the line and the verdict only
        assert page.evaluate(f"{gd}.data[0].y") == bars
        assert page.evaluate(f"{gd}.layout.shapes[0].y0") == GPUS["A10G"].memory_bytes / GIB
        assert page.evaluate(f"{gd}.layout.annotations[0].text") == verdict(est.peak_bytes, "A10G")
        assert errors == []
        browser.close()


# Every dropdown's header inside the figure, above the plot, clear of the title, the verdict and each other.
MENUS_CHECK = """
() => {
  const gd = document.querySelector('.plotly-graph-div');
  const hit = (p, q) => p.left < q.right - 1 && q.left < p.right - 1 && p.top < q.bottom - 1 && q.top < p.bottom - 1;
  const g = gd.getBoundingClientRect(), plot = gd.querySelector('.nsewdrag').getBoundingClientRect();
  const texts = [gd.querySelector('.gtitle'), gd.querySelector('.annotation')].map(e => e.getBoundingClientRect());
  const heads = Array.from(gd.querySelectorAll('.updatemenu-header')).map(h => h.getBoundingClientRect());
  const bad = [];
  heads.forEach((a, i) => {
    if (a.left < g.left - 1 || a.right > g.right + 1) bad.push(['outside the figure', i]);
    if (a.bottom > plot.top + 1) bad.push(['over the plot', i]);
    texts.forEach((t, k) => { if (hit(a, t)) bad.push(['over the title or verdict', i, k]); });
    heads.forEach((b, j) => { if (j > i && hit(a, b)) bad.push(['over another dropdown', i, j]); });
  });
  return {width: g.width, menus: heads.length, bad: bad};
}
"""


def test_dropdowns_stay_apart_at_the_books_widths(explorer):
    """560 px: narrower than the book's column at an 820 px window (Quarto's docked layout keeps a margin
    column there); 820 and 1,300 px: the widths the site is checked at."""
    if CHROMIUM is None:
        pytest.skip("no chromium on this machine (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    _, _, html = explorer
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 560, "height": 900})
        page.goto(html.as_uri(), timeout=180_000)
        page.wait_for_function("document.querySelector('.plotly-graph-div .main-svg')", timeout=180_000)
        for width in (560, 820, 1300):
            page.set_viewport_size({"width": width, "height": 900})
            page.wait_for_timeout(700)  # plotly's responsive resize
            got = page.evaluate(MENUS_CHECK)
            assert got["menus"] == len(fx.CONTROLS) and got["bad"] == [], (width, got)
            assert got["width"] > width - 40, (width, got)  # the figure followed the window
        browser.close()
