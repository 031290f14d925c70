"""Figures for the book: pure ``plot_*`` functions that return plotly Figures, and ``save_figure``.

Every value drawn comes from a run folder (``smolfsdp.results``) or a package formula; nothing is
typed in. In a notebook kernel the renderer embeds plotly.js in the page (no CDN needed), so the
executed chapters work offline and in Quarto.
"""

from __future__ import annotations

import logging
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio

log = logging.getLogger(__name__)

# JupyterLab gets the plotly mimetype; HTML export (nbconvert, Quarto) gets inline plotly.js.
pio.renderers.default = "plotly_mimetype+notebook"

COLORS = {"train": "#1f77b4", "eval": "#d62728"}


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
    """Write ``figures/<name>.html`` and ``.json`` always, and ``.png`` when an exporter (kaleido) works."""
    from smolfsdp.data import repo_root

    out = Path(out_dir) if out_dir is not None else repo_root() / "figures"
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.html", out / f"{name}.json"]
    fig.write_html(paths[0], include_plotlyjs="cdn", full_html=True)
    fig.write_json(paths[1])
    try:
        fig.write_image(out / f"{name}.png")
        paths.append(out / f"{name}.png")
    except Exception as err:  # no kaleido / no Chrome for it: html and json are the figure of record
        log.info("png for %s not written (%s)", name, type(err).__name__)
    return paths


LANE_COLORS = {
    "annotation": "#7f7f7f",
    "all-gather": "#2ca02c",
    "reduce-scatter": "#ff7f0e",
    "all-reduce": "#9467bd",
    "broadcast": "#8c564b",
    "other": "#bcbd22",
}


def plot_fsdp_timeline(events: list[dict], title: str = "One training step on rank 0") -> go.Figure:
    """A Perfetto-like timeline of one step: a lane per kind (FSDP annotations, each collective).

    ``events``: dicts with ``name``, ``kind``, ``start_us``, ``dur_us`` (from ``smolfsdp.mechanics``).
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
