"""Figures of the chapter "Where the memory goes": pure ``plot_*`` functions returning plotly Figures.

Every bar is a ``smolfsdp.estimate.memory`` estimate or a measured byte count; save with
``smolfsdp.book.figures.plotting.save_figure``.

    python -c "from smolfsdp.book.figures.memory_bars import *; from smolfsdp.estimate.memory import estimate_memory as e; plot_memory_breakdown({'1 GPU': e()}).show()"
"""

from __future__ import annotations

import plotly.graph_objects as go

from smolfsdp.book.figures import palette, plotting  # noqa: F401  (plotting sets the notebook renderer)

GIB = 2**30
COMPONENT_COLORS = palette.COMPONENT  # one colour per meaning, in every chapter


def plot_memory_breakdown(
    estimates: dict, gpu_lines: dict[str, int] | None = None, title: str = ""
) -> go.Figure:
    """Stacked bars: one bar per labelled ``MemoryEstimate``, one segment per device component (GiB), and a
    black mark at each estimate's device peak (``peak_bytes``: the fullest moment of a step, below the stack,
    which adds every component as if all were alive at once).

    ``gpu_lines``: optional ``{name: bytes}`` drawn as horizontal lines (GPU memory).
    """
    labels = list(estimates)
    fig = go.Figure()
    for comp, color in COMPONENT_COLORS.items():
        values = [estimates[k].components()[comp] / GIB for k in labels]
        if not any(values):
            continue
        fig.add_trace(
            go.Bar(
                x=labels, y=values, name=comp, marker_color=color,
                hovertemplate="%{x}<br>" + comp + ": %{y:.2f} GiB<extra></extra>",
            )
        )  # fmt: skip
    fig.add_trace(
        go.Scatter(
            x=labels, y=[estimates[k].peak_bytes / GIB for k in labels], name="device peak (fullest moment)",
            mode="markers", marker={"symbol": "line-ew", "size": 36, "line": {"width": 4, "color": "black"}},
            hovertemplate="%{x}<br>device peak: %{y:.2f} GiB<extra></extra>",
        )
    )  # fmt: skip
    for name, nbytes in (gpu_lines or {}).items():
        fig.add_hline(y=nbytes / GIB, line_dash="dot", annotation_text=name, annotation_position="top left")
    fig.update_layout(
        barmode="stack", title=title, yaxis_title="GiB per GPU (device)", template="plotly_white",
        legend={"orientation": "h", "y": -0.25}, margin={"l": 60, "r": 20, "t": 60, "b": 80},
    )  # fmt: skip
    return fig


def plot_estimate_vs_measured(df, title: str = "") -> go.Figure:
    """Grouped bars of measured vs estimated static bytes (KiB) per case and rank, from
    ``memory_measure.compare_with_estimate``."""
    x = [f"{c} r{r}" for c, r in zip(df["case"], df["rank"], strict=True)]
    fig = go.Figure()
    for col, name, color in (
        ("measured_static", "measured", palette.SOURCE["measured"]),
        ("estimated_static", "estimated", palette.SOURCE["estimated"]),
    ):
        fig.add_trace(
            go.Bar(
                x=x, y=df[col] / 1024, name=name, marker_color=color,
                hovertemplate="%{x}<br>" + name + ": %{y:,.1f} KiB<extra></extra>",
            )
        )  # fmt: skip
    fig.update_layout(
        barmode="group", title=title, yaxis_title="KiB per rank (params + grads + AdamW m, v)",
        template="plotly_white", legend={"orientation": "h", "y": -0.45}, margin={"b": 140},
    )  # fmt: skip
    return fig
