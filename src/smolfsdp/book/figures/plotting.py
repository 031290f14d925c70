"""Figures for the book: pure ``plot_*`` functions that return plotly Figures, and ``save_figure``.

Every value drawn comes from a run folder (``smolfsdp.measure.results``) or a package formula; nothing is
typed in. In a notebook kernel the ``smolfsdp`` renderer (below) shows each figure as HTML sized to the
text column, without plotly.js: the page loads plotly.js once, from the site (:func:`write_plotlyjs`; Quarto:
``scripts/quarto_plotly.lua``, nbconvert: ``book.chapters.execute_chapter``), offline, no CDN.
"""

from __future__ import annotations

import logging
import re
import textwrap
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

from smolfsdp.book.figures import palette
from smolfsdp.paths import repo_root

log = logging.getLogger(__name__)

# The one place where the book changes how plotly displays figures, and why. Plotly's `notebook`
# renderer puts plotly.js (4.8 MB) inline in the first figure's cell of every notebook, so every chapter
# page carried its own copy (~5 MB a page), and each figure loaded MathJax from a CDN (HtmlRenderer's
# `include_mathjax="cdn"`). The book's renderer writes no plotly.js and no MathJax (unless a figure has
# TeX, :func:`needs_tex`): each page loads plotly.js once from the site, where the HTML is made
# (PLOTLYJS). Each figure is a div sized `width: 100%`, measured once, at 525 px high; in a rendered book
# the column settles after that measurement, so figures came out wider than the column, and a long title
# sat under the modebar. So each figure (1) drops any fixed width and autosizes, (2) gets its title hung
# below the modebar with a top margin that fits its lines and any subplot titles, (3) gets a horizontal
# legend in a band of its own under the title (below the plot it covered axis labels that plotly turns
# on their side in a narrow column, and axis titles: Figure 3.4 and six more), and (4) re-measures its
# output block whenever that block's width changes (a ResizeObserver, not only window resizes).
MODEBAR_PX = 36  # height the modebar takes at the top of a figure (25 px buttons + padding)
TITLE_LINE_PX = 22  # one line of title text at plotly's default 17 px font, sub/sup lines included
TITLE_CLIMB_PX = 16  # measured in Chromium: a 5-line title's block starts 15 px above its pad
SUBPLOT_TITLE_PX = 24  # a subplot title's line (plotly's 16 px annotation font)
TITLE_CHARS = 80  # a plain title line wraps beyond this: ~8.5 px a character fits a ~700 px column
DEFAULT_HEIGHT_PX = 525  # a figure's height when its layout sets none (the renderer's default_height)
# A horizontal legend's rows, measured in Chromium at plotly's 12 px font: 19 px a row; an entry is its
# symbol (40 px) and about 7 px a character; entries that do not fit one row are set in columns as wide as
# the widest entry. Rows are counted for a plot 520 px wide (the book's column at an 820 px window).
LEGEND_ROW_PX, LEGEND_ITEM_PX, LEGEND_CHAR_PX, LEGEND_WIDTH_PX = 20, 40, 7, 520
LEGEND_GAP_PX = 4  # under the title's lines counted at TITLE_LINE_PX from its pad (the text ends above: a
# one-line title's box ends 16 px above that, measured in Chromium), and 8 px more under the legend

_FIT_SCRIPT = """
var gd = document.getElementById('{plot_id}');
var box = gd.closest('.cell-output-display, .jp-OutputArea-output, .output_subarea') || gd.parentElement;
gd.style.maxWidth = '100%';
function fit() {
  var w = box.clientWidth;
  if (w > 0 && gd._fullLayout && Math.abs(gd._fullLayout.width - w) > 1) {
    gd.style.width = w + 'px';
    Plotly.Plots.resize(gd);
  }
}
fit();
if (window.ResizeObserver) { new ResizeObserver(fit).observe(box); }
"""


def fit_layout(layout: dict, legend: list[str] | None = None) -> dict:
    """Return ``layout`` (a figure's layout as a dict) made to fit a text column; the input is not changed.

    Drops ``width`` and sets ``autosize``. A title is wrapped (:func:`_wrap_title`) and hung from the
    top edge below the modebar (plotly anchors a multi-line title on its first line, so its block sits
    up to ``TITLE_CLIMB_PX`` higher than the pad says). ``legend``: the entries the figure's legend lists
    (:func:`legend_names`); a horizontal one is set in a band under the title (:func:`legend_rows` rows),
    at a fixed height (``DEFAULT_HEIGHT_PX`` unless the layout sets one). The top margin is raised to hold
    the modebar, every title line, the legend and any subplot titles. Pure: no plotly.js, no I/O.
    """
    out = {k: v for k, v in layout.items() if k != "width"}
    out["autosize"] = True
    title = out.get("title")
    title = {"text": title} if isinstance(title, str) else dict(title or {})
    text = _wrap_title(title.get("text") or "")
    lines = text.count("<br>") + 1 + bool((title.get("subtitle") or {}).get("text")) if text else 0
    h_legend = (out.get("legend") or {}).get("orientation") == "h" and out.get("showlegend") is not False
    rows = legend_rows(legend or []) if h_legend else 0
    if not (lines or rows):
        return out
    # make_subplots puts subplot titles as annotations standing on the plot area (paper y = 1)
    above = any(
        a.get("yref", "paper") == "paper" and a.get("y", 0) >= 1 for a in out.get("annotations") or []
    )
    pad_b = 8 + SUBPLOT_TITLE_PX * above
    pad_t = MODEBAR_PX + TITLE_CLIMB_PX
    if lines:
        pad = {**title.get("pad", {}), "t": pad_t}
        out["title"] = {**title, "text": text, "y": 1, "yref": "container", "yanchor": "top", "pad": pad}
    top = (pad_t + TITLE_LINE_PX * lines if lines else MODEBAR_PX) + LEGEND_GAP_PX  # the legend's top, px
    if rows:
        out["height"] = out.get("height") or DEFAULT_HEIGHT_PX
        out["legend"] = {**out["legend"], "yref": "container", "y": 1 - top / out["height"], "yanchor": "top",
                         "x": 0, "xanchor": "left"}  # fmt: skip
    margin = dict(out.get("margin") or {})
    need = top + LEGEND_ROW_PX * rows + 8 + pad_b if rows else pad_t + TITLE_LINE_PX * lines + pad_b
    margin["t"] = max(margin.get("t", 100), need)
    out["margin"] = margin
    return out


def legend_names(data: list[dict]) -> list[str]:
    """The entries a figure's legend lists, one per trace whose ``showlegend`` is not False (an unnamed
    trace is listed as plotly names it, ``trace N``); none when plotly shows no legend (one entry)."""
    names = [t.get("name") or f"trace {i}" for i, t in enumerate(data) if t.get("showlegend", True)]
    return names if len(names) > 1 or any(t.get("showlegend") for t in data) else []


def legend_rows(names: list[str], width: int = LEGEND_WIDTH_PX) -> int:
    """Rows a horizontal legend of ``names`` takes in a plot ``width`` px wide (0 for no entry)."""
    widths = [LEGEND_ITEM_PX + LEGEND_CHAR_PX * len(re.sub(r"<[^>]+>", "", n)) for n in names]
    if sum(widths) <= width:
        return min(1, len(widths))
    return -(-len(widths) // max(1, width // max(widths)))


def _wrap_title(text: str) -> str:
    """Break plain title lines longer than ``TITLE_CHARS`` at spaces (plotly never wraps a title).

    Lines with markup, or inside a ``<sup>``/``<sub>`` span (subtitles, wrapped by their plot
    function), are kept as they are.
    """
    lines, depth = [], 0
    for line in text.split("<br>"):
        plain = depth == 0 and "<" not in line and len(line) > TITLE_CHARS
        lines += textwrap.wrap(line, TITLE_CHARS) if plain else [line]
        depth += len(re.findall(r"<su[bp]>", line)) - len(re.findall(r"</su[bp]>", line))
    return "<br>".join(lines)


def fit_figure(fig_dict: dict) -> dict:
    """``fig_dict`` (a figure as a dict) with :func:`fit_layout` applied, its legend's entries counted."""
    layout = fit_layout(fig_dict.get("layout", {}), legend_names(fig_dict.get("data", [])))
    return {**fig_dict, "layout": layout}


def needs_tex(fig_dict: dict) -> bool:
    """Whether any string in the figure is TeX as plotly.js reads it (starts and ends with ``$``): only such
    a figure needs MathJax. Walks dicts and lists; numeric arrays are skipped."""
    stack = [fig_dict]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if len(item) > 1 and item[0] == "$" and item[-1] == "$":
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


class BookNotebookRenderer(pio.base_renderers.HtmlRenderer):
    """``text/html``: the figure fitted to the column (:func:`fit_layout`) as a div and a script that calls
    ``Plotly.newPlot``; no plotly.js (the page loads it once, PLOTLYJS), no output of its own on activation
    (plotly's notebook renderer displays plotly.js then), MathJax only for a figure with TeX."""

    def __init__(self, config=None, post_script=None):
        super().__init__(full_html=False, global_init=False, config=config, post_script=post_script)

    def to_mimebundle(self, fig_dict):
        fig_dict = fit_figure(fig_dict)
        scripts = self.post_script if isinstance(self.post_script, list) else [self.post_script]
        html = pio.to_html(
            fig_dict, config=self.config, auto_play=self.auto_play, include_plotlyjs=False,
            include_mathjax="cdn" if needs_tex(fig_dict) else False, post_script=[s for s in scripts if s],
            full_html=False, animation_opts=self.animation_opts, default_width="100%",
            default_height=DEFAULT_HEIGHT_PX,
            validate=False,
        )  # fmt: skip
        return {"text/html": html}


class BookMimetypeRenderer(pio.base_renderers.PlotlyRenderer):
    """The plotly mimetype (JupyterLab, VS Code draw it with their own plotly.js), fitted to the column."""

    def to_mimebundle(self, fig_dict):
        return super().to_mimebundle(fit_figure(fig_dict))


_CONFIG = {"responsive": True, "displaylogo": False}
pio.renderers["smolfsdp"] = BookNotebookRenderer(config=_CONFIG, post_script=_FIT_SCRIPT)
pio.renderers["smolfsdp_mimetype"] = BookMimetypeRenderer(config=_CONFIG)
# JupyterLab and VS Code show the plotly mimetype; HTML (Quarto, nbconvert) takes the text/html one.
pio.renderers.default = "smolfsdp_mimetype+smolfsdp"
PLOTLYJS = "plotly.min.js"  # the name plotly itself gives the file (write_html(include_plotlyjs="directory"))


def write_plotlyjs(folder: str | Path) -> Path:
    """Write the installed plotly's ``plotly.min.js`` into ``folder`` (unless the same bytes are there);
    return its path. The book's pages load it from there once: the nbconvert pages beside it, the Quarto site
    as an HTML dependency (``scripts/quarto_plotly.lua``), so it matches the figures' plotly.py."""
    path = Path(folder) / PLOTLYJS
    js = get_plotlyjs().encode()
    if not path.is_file() or path.read_bytes() != js:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(js)
    return path


COLORS = palette.LOSS


def plot_loss_curve(run, title: str | None = None) -> go.Figure:
    """Training loss per optimizer step and eval loss at each evaluation, from a ``results.Run``.

    x: optimizer step; y: mean token cross-entropy (nats) over assistant tokens of the global batch.
    """
    s = run.summary
    fig = go.Figure()
    train, ev = run.train, run.eval
    fig.add_trace(
        go.Scatter(
            x=train["step"],
            y=train["loss"],
            mode="lines",
            name="train loss",
            line={"color": COLORS["train"]},
            hovertemplate="step %{x}<br>train loss %{y:.3f}<extra></extra>",
        )
    )
    if len(ev):
        fig.add_trace(
            go.Scatter(
                x=ev["step"],
                y=ev["eval_loss"],
                mode="lines+markers",
                name="eval loss",
                line={"color": COLORS["eval"], "dash": "dot"},
                hovertemplate="step %{x}<br>eval loss %{y:.3f}<extra></extra>",
            )
        )
    strategy = s["effective"]["strategy"].upper()
    fig.update_layout(
        title=title
        or f"{s['name']}: {s['engine']} engine, ran {strategy} on {s['world_size']} x {s['device']}",
        xaxis_title="optimizer step",
        yaxis_title="loss (nats per assistant token)",
        template="plotly_white",
        hovermode="x unified",
        legend={"orientation": "h", "y": -0.2},
        margin={"l": 60, "r": 20, "t": 60, "b": 60},
    )
    return fig


def save_figure(fig: go.Figure, name: str, out_dir: str | Path | None = None) -> list[Path]:
    """Write ``figures/<name>.html`` and ``.json`` always, and ``.png`` when an exporter (kaleido) works.

    The HTML loads ``plotly.min.js`` from the same folder (written once, beside it): offline, no CDN.
    """

    out = Path(out_dir) if out_dir is not None else repo_root() / "figures"
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.html", out / f"{name}.json"]
    fig.write_html(paths[0], include_plotlyjs="directory", full_html=True)
    fig.write_json(paths[1])
    try:
        fig.write_image(out / f"{name}.png")
        paths.append(out / f"{name}.png")
    except Exception as err:  # no kaleido / no Chrome for it: html and json are the figure of record
        log.info("png for %s not written (%s)", name, type(err).__name__)
    return paths


LANE_COLORS = {
    "annotation": palette.TRACE_CATEGORY["annotation"],
    **{k: palette.COLLECTIVE[k] for k in ("all-gather", "reduce-scatter", "all-reduce", "broadcast")},
    "other": palette.COLLECTIVE["other collective"],
}


def plot_fsdp_timeline(events: list[dict], title: str = "One training step on rank 0") -> go.Figure:
    """A Perfetto-like timeline of one step: a lane per kind (FSDP annotations, each collective).

    ``events``: dicts with ``name``, ``kind``, ``start_us``, ``dur_us`` (from ``smolfsdp.probes.mechanics``).
    x is milliseconds since the first event; hover shows the name and duration.
    """
    fig = go.Figure()
    for kind, color in LANE_COLORS.items():
        rows = [e for e in events if e["kind"] == kind]
        if not rows:
            continue
        fig.add_trace(
            go.Bar(
                y=[kind] * len(rows),
                x=[max(e["dur_us"], 1) / 1e3 for e in rows],
                base=[e["start_us"] / 1e3 for e in rows],
                orientation="h",
                name=kind,
                marker_color=color,
                customdata=[[e["name"], e["dur_us"] / 1e3] for e in rows],
                hovertemplate="%{customdata[0]}<br>%{customdata[1]:.3f} ms<extra></extra>",
            )
        )
    fig.update_layout(
        title=title,
        barmode="overlay",
        template="plotly_white",
        xaxis_title="time (ms)",
        yaxis={"categoryorder": "array", "categoryarray": list(LANE_COLORS)[::-1]},
        height=360,
        margin={"l": 110, "r": 20, "t": 50, "b": 50},
    )
    return fig


def plot_grouped_bars(df, x: str, y: str, color: str, title: str, y_title: str) -> go.Figure:
    """Grouped bars from a long DataFrame (one bar per ``x`` and ``color``); values drawn as given."""
    fig = go.Figure()
    for key, part in df.groupby(color, sort=False):
        fig.add_trace(
            go.Bar(
                x=part[x],
                y=part[y],
                name=str(key),
                hovertemplate=f"{key}<br>%{{x}}: %{{y:,.0f}}<extra></extra>",
            )
        )
    fig.update_layout(
        title=title,
        barmode="group",
        template="plotly_white",
        yaxis_title=y_title,
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
    )
    return fig
