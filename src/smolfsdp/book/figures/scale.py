"""Figures of the chapter "Scaling out": pure ``plot_*`` functions returning plotly Figures.

Every point is a row of ``smolfsdp.estimate.scaling.scaling_table`` (the communication model and
``smolfsdp.estimate.memory``); the table's assumptions go into the title. Save with
``smolfsdp.book.figures.plotting.save_figure``.

    python -c "from smolfsdp.measure import scaling; from smolfsdp.book.figures import scale as p; p.plot_scaling(scaling.scaling_table()).show()"
"""

from __future__ import annotations

import math
import textwrap

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from smolfsdp.book.figures import palette, plotting  # noqa: F401  (plotting sets the notebook renderer)

STRATEGY_COLORS = palette.STRATEGY
STRATEGY_LABELS = {
    "NO_SHARD": "DDP (NO_SHARD)",
    "SHARD_GRAD_OP": "ZeRO-2 (SHARD_GRAD_OP)",
    "FULL_SHARD": "ZeRO-3 (FULL_SHARD)",
    "HYBRID_SHARD": "HSDP (HYBRID_SHARD)",
}


def _subplots(models, title: str, y_title: str, df):
    fig = make_subplots(rows=1, cols=len(models), subplot_titles=list(models), shared_yaxes=True)
    note = _wrap(df.attrs.get("assumptions", ""))
    lines = note.count("<br>") + 1
    fig.update_layout(
        title={"text": f"{title}<br><sup>{note}</sup>", "y": 0.98, "yanchor": "top"}, template="plotly_white",
        legend={"orientation": "h", "y": -0.2}, margin={"l": 60, "r": 20, "t": 50 + 22 * lines, "b": 80},
    )  # fmt: skip
    fig.update_xaxes(type="log", title_text="GPUs", dtick=0.30103)  # ticks at powers of two
    fig.update_yaxes(title_text=y_title, col=1)
    return fig


def _wrap(text: str, width: int = 95) -> str:
    """Break the assumptions line at ``"; "`` (and a part still too long at spaces) so the subtitle fits the
    figure's width."""
    out, line = [], ""
    for part in text.split("; "):
        if line and len(line) + len(part) + 2 > width:
            out.append(line)
            line = part
        else:
            line = f"{line}; {part}" if line else part
    lines = [*out, line] if line else out
    # a single part longer than ``width`` (the recipe's own description) is wrapped at spaces
    return "<br>".join(piece for ln in lines for piece in (textwrap.wrap(ln, width) or [ln]))


#: the marker of each fit verdict (``smolfsdp.estimate.hardware.verdict``, the ``verdict`` column)
VERDICT_SYMBOLS = {"fits": "circle", "tight": "diamond-open", "does not fit": "x"}


def _lines(fig, df, y: str, fmt: str, dash_unfit: bool = True) -> None:
    for col, model in enumerate(df["model"].unique(), start=1):
        for s, color in STRATEGY_COLORS.items():
            d = df[(df["model"] == model) & (df["strategy"] == s)].sort_values("n_gpus")
            if d.empty:
                continue
            symbols = [VERDICT_SYMBOLS[v] for v in d["verdict"]] if dash_unfit else "circle"
            fig.add_trace(
                go.Scatter(
                    x=d["n_gpus"], y=d[y], mode="lines+markers", name=STRATEGY_LABELS[s],
                    line={"color": color}, marker={"symbol": symbols, "size": 8}, legendgroup=s,
                    showlegend=col == 1, customdata=d["verdict"],
                    hovertemplate="%{x} GPUs<br>" + fmt + "<br>%{customdata}<extra>" + s + "</extra>",
                ),
                row=1, col=col,
            )  # fmt: skip


def plot_memory_vs_gpus(df, title: str = "Memory per GPU") -> go.Figure:
    """What each GPU must hold (GiB, ``need_gib``: the allocator's reserved memory + CUDA context + NCCL, the
    number the fit verdict is decided on) against GPU count, one line per strategy, one panel per model, the
    GPU's memory as a dotted line; markers by the verdict (:data:`VERDICT_SYMBOLS`: a circle fits, an open
    diamond is tight, an x does not fit)."""
    models = list(df["model"].unique())
    fig = _subplots(models, title, "GiB needed per GPU (reserved + context + NCCL)", df)
    _lines(fig, df, "need_gib", "%{y:.1f} GiB needed")
    # the GPU's memory as a dotted trace, not add_hline: on a log axis an hline's annotation is placed
    # in log10 units and stretches the autorange to 1e70
    cap = float(df["gpu_memory_gib"].iloc[0])
    x = sorted(df["n_gpus"].unique())
    for col in range(1, len(models) + 1):
        fig.add_trace(
            go.Scatter(
                x=x, y=[cap] * len(x), mode="lines", line={"dash": "dot", "color": "black"},
                name=f"GPU memory ({cap:.0f} GiB)", showlegend=col == 1, hoverinfo="name",
            ),
            row=1, col=col,
        )  # fmt: skip
    lo, hi = float(df["need_gib"].min()), max(float(df["need_gib"].max()), cap)
    fig.update_yaxes(
        type="log", range=[math.log10(lo / 1.5), math.log10(hi * 1.5)], **decade_ticks(lo / 1.5, hi * 1.5)
    )
    return fig


def plot_scaling(df, metric: str = "efficiency", title: str | None = None) -> go.Figure:
    """Weak-scaling ``efficiency`` (compute / projected step time), ``step_s`` or ``tokens_per_s_per_gpu``
    against GPU count (log axis), one line per strategy, one panel per model; markers by the fit verdict
    (:data:`VERDICT_SYMBOLS`: x does not fit, an open diamond is tight). Raises ValueError for another metric."""
    labels = {
        "efficiency": ("Scaling efficiency (weak scaling)", "compute / step time", "%{y:.0%}"),
        "step_s": ("Projected step time", "seconds per step", "%{y:.3f} s"),
        "tokens_per_s_per_gpu": ("Throughput per GPU", "tokens/s per GPU", "%{y:,.0f} tokens/s"),
    }
    if metric not in labels:
        raise ValueError(f"metric={metric!r}: use one of {list(labels)}")
    head, y_title, fmt = labels[metric]
    models = list(df["model"].unique())
    fig = _subplots(models, title or head, y_title, df)
    _lines(fig, df, metric, fmt)
    if metric == "efficiency":
        fig.update_yaxes(range=[0, 1.05], tickformat=".0%")
    elif metric == "step_s":  # the two models' step times differ ~20x: a log axis keeps both readable
        fig.update_yaxes(type="log", **decade_ticks(float(df[metric].min()), float(df[metric].max())))
    return fig


def decade_ticks(lo: float, hi: float) -> dict:
    """Log-axis tick settings that label decades only (1, 10, 100, ...; plotly's default also labels 2 and 5
    between them, which reads as "1000 5 2 100 5 2 10"): ``dtick=1`` when ``lo..hi`` spans two labelled
    decades at least, else the default ticks (a narrower range would show one label or none)."""
    if lo <= 0 or hi <= 0 or math.floor(math.log10(hi)) - math.ceil(math.log10(lo)) < 1:
        return {}
    return {"dtick": 1, "exponentformat": "none", "separatethousands": True}
