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
