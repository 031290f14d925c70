"""The "does it fit?" figure: every state is an ``estimate_memory`` result, its verdict is the one verdict
(``smolfsdp.estimate.hardware.fit_verdict``) for every (state, card) pair it offers, the script decides with the
same rule and prints the same line (run in node where node is installed, and in Chromium where that is), and in
Chromium changing the dropdowns changes the bars to the combined setting's estimate (not only the last
dropdown's)."""

import itertools
import json
import shutil
import subprocess

import pytest

from smolfsdp.book.figures import fit_explorer as fx
from smolfsdp.book.figures import palette
from smolfsdp.book.figures.fit_explorer import (
    BASE,
    NEED_LABEL,
    PEAK_LABEL,
    fit_states,
    plot_fit_explorer,
    state_fit,
    state_key,
)
from smolfsdp.book.fit_views import fit_words
from smolfsdp.estimate.hardware import (
    GPUS,
    fit_of_bytes,
    fit_table,
    fit_verdict,
    format_fit,
    get_gpu,
    verdict,
)
from smolfsdp.estimate.memory import estimate_memory
from smolfsdp.estimate.recipes import GIB

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
NODE = shutil.which("node")
#: the issue-41 example: three places gave three answers for it
EXAMPLE = {"strategy": "SHARD_GRAD_OP", "activation_checkpointing": True, "world_size": 2, "seq_len": 4096}


@pytest.fixture(scope="module")
def explorer(tmp_path_factory):
    states = fit_states()
    fig = plot_fit_explorer(states)
    out = tmp_path_factory.mktemp("fig")
    return states, fig, fx.save_explorer(fig, "fit_explorer", out)[0]


def setting_estimate(**setting):
    """``estimate_memory`` of an explorer setting, computed here (not read from the figure)."""
    s = {**BASE, **setting}
    model = fx.MODELS[s["model"]]() if s["model"] in fx.MODELS else s["model"]
    kw = {k: v for k, v in s.items() if k not in ("model", "gpu")}
    return estimate_memory(model, recipe="hf-fsdp-bf16", fsdp_version=2, **kw)


def expected_bars(fig, **setting):
    est = setting_estimate(**setting)
    comps = {**est.components(), PEAK_LABEL: est.peak_bytes, NEED_LABEL: est.device_need_bytes}
    keys = {v: k for k, v in fx.COMPONENT_LABELS.items()}
    return [round(comps[keys.get(x, x)] / GIB, 3) for x in fig.data[0].x], est


def test_every_combination_is_computed_and_the_base_is_drawn(explorer):
    states, fig, _ = explorer
    n = 1
    for c in fx.CONTROLS:
        n *= 1 if c.key == "gpu" else len(c.values)
    assert len(states) == n == 1152  # 2 models x 1/2/4/8 GPUs x 3 strategies x 3 sequences x 2 x 2 x 2 x 2
    assert {c.key: c.values for c in fx.CONTROLS}["world_size"] == (1, 2, 4, 8)
    bars, est = expected_bars(fig)
    assert list(fig.data[0].y) == bars and list(fig.data[0].x)[-2:] == [PEAK_LABEL, NEED_LABEL]
    fit = fit_verdict(est, GPUS[BASE["gpu"]])
    assert fig.layout.annotations[0].text == fit.line == format_fit(fit)
    assert list(fig.data[0].marker.color)[-2:] == [palette.VERDICT[fit.word]] * 2
    assert fig.layout.shapes[0].y0 == GPUS[BASE["gpu"]].memory_bytes / GIB
    assert (
        states[state_key({**BASE, "lora": True})]["peak"]
        == estimate_memory("smollm3-3b", world_size=2, seq_len=4096, lora=True).peak_bytes
    )


def test_every_state_and_card_gives_the_verdict_of_the_estimate(explorer):
    """Issue 41 (64 of the explorer's pairs disagreed with ``verdict()``): for every (setting, card) pair the
    figure offers, the bytes it embeds for its script are the estimate's, and the verdict and line they give
    are ``fit_verdict``'s on the estimate computed here."""
    states, fig, _ = explorer
    meta = fig.layout.meta["fit_explorer"]
    controls = [c for c in fx.CONTROLS if c.key != "gpu"]
    cards = [g for g, _ in meta["gpus"]]
    assert cards == list(fx.CONTROLS[1].values) and all(b == GPUS[g].memory_bytes for g, b in meta["gpus"])
    words = set()
    for combo in itertools.product(*(c.values for c in controls)):
        setting = dict(zip((c.key for c in controls), combo, strict=True))
        est, key = setting_estimate(**setting), state_key({**BASE, **setting})
        assert meta["states"][key][-2:] == [est.peak_bytes, est.device_need_bytes], setting
        for g in cards:
            want = fit_verdict(est, GPUS[g])
            got = state_fit(states[key], g)
            assert (got.word, got.line) == (want.word, want.line) == (verdict(est, GPUS[g]), want.line), (
                setting
            )
            words.add(want.word)
    assert words == {"fits", "tight", "does not fit"}  # the figure shows all three


def test_each_button_falls_back_to_its_one_setting(explorer):
    _, fig, _ = explorer
    menu = next(m for m in fig.layout.updatemenus if m.buttons[0].label.startswith("GPUs:"))
    assert [b.label for b in menu.buttons] == ["GPUs: 1", "GPUs: 2", "GPUs: 4", "GPUs: 8"]
    button = next(b for b in menu.buttons if b.label == "GPUs: 4")
    bars, est = expected_bars(fig, world_size=4)
    assert button.args[0]["y"][0] == bars
    assert button.args[1]["annotations[0].text"] == fit_verdict(est, GPUS[BASE["gpu"]]).line


def test_the_issue_41_example_reads_the_same_in_the_figure_and_the_table(explorer):
    """SHARD_GRAD_OP x 2, 4,096 tokens, activation checkpointing, A100 40GB: the explorer, ``fit_table`` and
    chapter 00's table give one word with the same need and tensor peak (the CLI and recommend: test_hardware)."""
    states, _, _ = explorer
    est = setting_estimate(**EXAMPLE)
    want = fit_verdict(est, GPUS["A100 40GB"])
    fig = plot_fit_explorer(states, {**EXAMPLE, "gpu": "A100 40GB"})
    assert fig.layout.annotations[0].text == want.line
    row = fit_table({"SGO": est}, [GPUS["A100 40GB"]]).iloc[0]
    assert (row.verdict, row.line, row.need_gib, row.peak_gib) == (
        want.word,
        want.line,
        want.need_gib,
        want.peak_gib,
    )
    page = fit_words({"SHARD_GRAD_OP x2": est})
    assert page.loc["A100 40GB (37.3 GiB)", "SHARD_GRAD_OP x2"] == want.word
    assert page.iloc[0, 0] == f"{want.need_gib:.1f} ({want.peak_gib:.1f})"


def _node(js: str):
    """Run ``js`` in node (from stdin: the pairs are too long for an argument) and read its JSON line."""
    done = subprocess.run([NODE, "-"], input=js, capture_output=True, text=True, check=True, timeout=120)
    return json.loads(done.stdout)


def test_the_script_decides_and_prints_as_hardware_does(explorer):
    """``VERDICT_JS`` (what the page runs) in node on every (state, card) pair the figure embeds and on cards a
    reader types in: the same word and the same line as ``hardware.fit_of_bytes`` / ``format_fit``, and a typed
    card's bytes as ``get_gpu(None, gib)`` computes them (``--gpu-memory-gib``)."""
    if NODE is None:
        pytest.skip("no node on this machine: the script's rule is checked in Chromium instead")
    _, fig, _ = explorer
    meta = fig.layout.meta["fit_explorer"]
    typed = [0.25, 1, 10.05, 22.35, 23.7, 24, 37.25, 39.5, 40, 47.9, 80, 141, 192.5]
    caps = [b for _, b in meta["gpus"]] + [get_gpu(None, g).memory_bytes for g in typed]
    pairs = [(s[-1], s[-2], c) for s in meta["states"].values() for c in caps]
    pairs += [(2**28, 2**28, 3 * 2**28), (37 * 2**28, 5 * 2**28, 37 * 2**28 - 1)]  # exact ties of one decimal
    got = _node(
        fx.VERDICT_JS
        + f"var p = {json.dumps(pairs)}, g = {json.dumps(typed)};"
        + "console.log(JSON.stringify({lines: p.map(function (x) { return fitLine(x[0], x[1], x[2]); }),"
        + "cards: g.map(cardBytes)}));"
    )
    assert got["cards"] == [get_gpu(None, g).memory_bytes for g in typed]
    want = [format_fit(fit_of_bytes(need, peak, cap)) for need, peak, cap in pairs]
    bad = [(p, g, w) for p, g, w in zip(pairs, got["lines"], want, strict=True) if g != w]
    assert bad == [] and len(want) == len(meta["states"]) * len(caps) + 2


# A stand-in page for COMPOSE_SCRIPT in node: the figure's div with its layout.meta, the DOM calls the script
# makes, and Plotly.update recorded. ``steps`` are run in order: ["card", "30"] types into the card box,
# ["menu", i, active] clicks item ``active`` of layout.updatemenus[i].
STUB = """
var handlers = {}, made = [], updates = [];
function element(tag) {
  var e = {tag: tag, style: {}, children: [], value: '', appendChild: function (c) { this.children.push(c); },
           addEventListener: function (name, f) { handlers[tag + ':' + name] = f; }};
  made.push(e);
  return e;
}
var gd = {layout: {meta: META}, on: function (name, f) { handlers['gd:' + name] = f; },
          parentNode: {insertBefore: function () {}}};
var document = {getElementById: function () { return gd; }, createElement: element};
var Plotly = {update: function (g, data, layout) { updates.push([data, layout]); }};
var setTimeout = function (f) { f(); };
"""


def test_the_script_reads_the_menus_and_the_typed_card_in_node(explorer):
    """The whole page script in node with a stand-in page: a click on the GPUs menu, then a typed card, then the
    box emptied, each redraws with ``fit_verdict``'s line on the combined setting and the card in use."""
    if NODE is None:
        pytest.skip("no node on this machine: the Chromium test checks the script")
    _, fig, _ = explorer
    meta = fig.layout.meta
    menus = meta["fit_explorer"]["menus"]
    steps = [["menu", menus.index("world_size"), 3], ["card", "30"], ["card", ""]]
    run = (
        STUB.replace("META", json.dumps(meta))
        + fx.COMPOSE_SCRIPT.replace("{plot_id}", "fig")
        + f"var steps = {json.dumps(steps)};"
        + """steps.forEach(function (s) {
  if (s[0] === 'menu') { handlers['gd:plotly_buttonclicked']({menu: {_index: s[1]}, active: s[2]}); }
  else { made.filter(function (e) { return e.tag === 'input'; })[0].value = s[1]; handlers['input:input'](); }
});
console.log(JSON.stringify(updates.map(function (u) { return [u[0].y[0], u[1]['annotations[0].text'],
  u[0]['marker.color'][0].slice(-1)[0], u[1]['shapes[0].y0']]; })));"""
    )
    got = _node(run)
    bars, est = expected_bars(fig, world_size=8)
    card = get_gpu(None, 30)
    base_card = GPUS[BASE["gpu"]]
    want = [
        [
            bars,
            fit_verdict(est, base_card).line,
            palette.VERDICT[verdict(est, base_card)],
            base_card.memory_bytes / GIB,
        ],
        [bars, fit_verdict(est, card).line, palette.VERDICT[verdict(est, card)], card.memory_bytes / GIB],
        [
            bars,
            fit_verdict(est, base_card).line,
            palette.VERDICT[verdict(est, base_card)],
            base_card.memory_bytes / GIB,
        ],
    ]
    assert got == want


def test_only_the_verdict_script_compares_bytes_with_a_card():
    """The script's one fit decision is ``fitWord`` (VERDICT_JS); the rest of it only reads and draws."""
    rest = fx.COMPOSE_SCRIPT.replace(fx.VERDICT_JS, "")
    assert fx.VERDICT_JS in fx.COMPOSE_SCRIPT
    assert not any(op in rest for op in ("<=", ">=", "'fits'", "'tight'", "does not fit"))


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
        text = f"{gd}.layout.annotations[0].text"
        assert page.evaluate(text) == fit_verdict(est, GPUS["A100 40GB"]).line
        choose(page, "GPU: A100 40GB", "GPU: A10G")  # the GPU moves the line and the verdict only
        assert page.evaluate(f"{gd}.data[0].y") == bars
        assert page.evaluate(f"{gd}.layout.shapes[0].y0") == GPUS["A10G"].memory_bytes / GIB
        assert page.evaluate(text) == fit_verdict(est, GPUS["A10G"]).line
        # the reader's own card: a GiB value between the tensor peak and the need reads "tight", the same line
        # as hardware for a --gpu-memory-gib card; emptied, the box gives the GPU menu's card back
        gib = round((est.peak_bytes + est.device_need_bytes) / 2 / GIB, 1)
        card = get_gpu(None, gib)
        want = fit_of_bytes(est.device_need_bytes, est.peak_bytes, card.memory_bytes)
        assert want.word == "tight"
        page.fill(".fit-explorer-card input", str(gib))
        page.wait_for_timeout(500)
        assert page.evaluate(text) == want.line == fit_verdict(est, card).line
        colours = page.evaluate(f"{gd}.data[0].marker.color")
        assert colours[-2:] == [palette.VERDICT["tight"]] * 2
        assert page.evaluate(f"{gd}.layout.shapes[0].y0") == card.memory_bytes / GIB
        page.fill(".fit-explorer-card input", "")
        page.wait_for_timeout(500)
        assert page.evaluate(text) == fit_verdict(est, GPUS["A10G"]).line
        assert errors == []
        browser.close()


# Every dropdown's header inside the figure, above the plot, clear of the title, the verdict and each other.
MENUS_CHECK = """
() => {
  const gd = document.querySelector('.plotly-graph-div');
  const hit = (p, q) => p.left < q.right - 1 && q.left < p.right - 1 && p.top < q.bottom - 1 && q.top < p.bottom - 1;
  const g = gd.getBoundingClientRect(), plot = gd.querySelector('.nsewdrag').getBoundingClientRect();
  const texts = [gd.querySelector('.gtitle'), gd.querySelector('.annotation')].map(e => e.getBoundingClientRect());
  if (texts[1].left < g.left - 1 || texts[1].right > g.right + 1) bad.push(['verdict outside the figure']);
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
