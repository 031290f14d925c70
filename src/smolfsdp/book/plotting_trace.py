"""Figures for the chapter "Reading the profiler": pure ``plot_*`` functions returning plotly Figures.

Inputs come from ``smolfsdp.traces.analysis`` (a loaded trace and its ``TraceReport``); nothing is
typed in. Save with ``plotting.save_figure``. Step times of separate CPU runs are not drawn as bars
side by side (they would read as a ranking that the noise does not support): see
``smolfsdp.book.profiling.bench_table`` and ``timing_sentence``.

    python -c "from smolfsdp.traces import analysis as ta; from smolfsdp.book import plotting_trace as pt; \\
        pt.plot_timeline(ta.load_trace('runs/bench/traces/rank0.json.gz')).show()"
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from smolfsdp.traces.intervals import merge_intervals

CATEGORY_COLORS = {
    "compute": "#2ca02c",
    "cpu_op": "#98df8a",
    "communication": "#d62728",
    "memory": "#9467bd",
    "fsdp": "#ff7f0e",
    "step": "#7f7f7f",
    "annotation": "#1f77b4",
    "runtime": "#bcbd22",
    "other": "#c7c7c7",
}
#: categories that mark a range of work rather than doing it: drawn in their own lane, never over kernels
RANGE_CATEGORIES = ("step", "annotation", "fsdp")
#: draw order of :func:`plot_gpu_timeline`: later traces are drawn on top, communication last
DRAW_ORDER = (
    "step",
    "annotation",
    "fsdp",
    "other",
    "runtime",
    "cpu_op",
    "memory",
    "compute",
    "communication",
)


def busy_intervals(df: pd.DataFrame) -> pd.DataFrame:
    """The events of a loaded trace merged, per (row, category), into busy intervals: overlapping or
    touching events become one interval, so the intervals' total length in a row is that row's busy time
    for the category (``smolfsdp.traces.intervals.union_length``), with no event dropped.

    Columns: ``row, device, category, lane`` (the row, or ``"<row> · ranges"`` for the categories of
    :data:`RANGE_CATEGORIES`, which then never cover the row's kernels), ``ts, end, dur`` (µs),
    ``events`` (events merged), ``name`` (the first event's name).
    """
    out = []
    for (row, cat), g in df.groupby(["row", "category"], observed=True, sort=False):
        g = g.sort_values("ts", kind="stable")
        s, e = merge_intervals(g["ts"], g["end"])
        first = np.searchsorted(g["ts"].to_numpy(float), s, side="left")  # each interval's first event
        counts = np.diff(np.append(first, len(g)))
        lane = f"{row} · ranges" if cat in RANGE_CATEGORIES else str(row)
        out.append(
            pd.DataFrame(
                {"row": str(row), "device": g["device"].iloc[0], "category": cat, "lane": lane, "ts": s,
                 "end": e, "dur": e - s, "events": counts, "name": g["name"].astype(str).to_numpy()[first]}
            )
        )  # fmt: skip
    return pd.concat(out, ignore_index=True)


def plot_gpu_timeline(df: pd.DataFrame, *, max_cpu_intervals: int = 3000) -> go.Figure:
    """Timeline of a GPU trace drawn as busy intervals (:func:`busy_intervals`): every CUDA stream's
    kernels, all of them, merged where they touch, so a stream's share of the picture is its busy share;
    ranges (annotations, steps) in their own lane under their row, so no range hides a kernel, and NCCL
    kernels drawn last. CPU threads keep their ``max_cpu_intervals`` longest busy intervals (the title says
    how many). x: ms from the first event; hover: first event's name, events merged, duration (µs).
    """
    iv = busy_intervals(df)
    gpu = iv["device"].eq("gpu")
    cpu = iv[~gpu]
    if len(cpu) > max_cpu_intervals:
        cpu = cpu.nlargest(max_cpu_intervals, "dur")
    shown = pd.concat([iv[gpu], cpu])
    lanes = []
    for row in df["row"].cat.categories if hasattr(df["row"], "cat") else df["row"].unique():
        lanes += [lane for lane in (str(row), f"{row} · ranges") if lane in set(shown["lane"])]
    t0 = df["ts"].min()
    fig = go.Figure()
    order = sorted(shown["category"].unique(), key=lambda c: DRAW_ORDER.index(c) if c in DRAW_ORDER else 0)
    for cat in order:
        g = shown[shown["category"] == cat]
        fig.add_trace(
            go.Bar(
                base=(g["ts"] - t0) / 1e3, x=g["dur"] / 1e3, y=g["lane"], orientation="h", name=cat,
                marker={"color": CATEGORY_COLORS.get(cat, "#c7c7c7"), "line": {"width": 0}},
                customdata=list(zip(g["name"].str.slice(0, 60), g["events"], g["dur"], strict=True)),
                hovertemplate="%{customdata[0]}<br>" + cat
                + ": %{customdata[1]} event(s), %{customdata[2]:.1f} µs<extra>%{y}</extra>",
            )
        )  # fmt: skip
    n_gpu, n_cpu = int(gpu.sum()), int((~gpu).sum())
    fig.update_layout(
        barmode="overlay",
        title=(
            f"Busy intervals: all {int(iv.loc[gpu, 'events'].sum()):,} GPU events ({n_gpu:,}); "
            f"CPU: {len(cpu):,} longest of {n_cpu:,}"
        ),
        xaxis_title="time (ms from the first event)",
        template="plotly_white",
        height=200 + 40 * len(lanes),
        legend={"orientation": "h", "y": -0.25},
        margin={"l": 220, "r": 20, "t": 60, "b": 60},
    )
    fig.update_yaxes(categoryorder="array", categoryarray=lanes, autorange="reversed")
    return fig


def plot_timeline(df: pd.DataFrame, *, max_events: int = 4000, min_dur_us: float = 0.0) -> go.Figure:
    """Perfetto-like timeline: one row per thread/stream, one bar per event, colour = category.

    x: ms from the first event. Hover shows name, category and duration (µs). To stay light in a
    page, keeps the ``max_events`` longest events (and those longer than ``min_dur_us``); the title
    says how many were drawn. Zoom with the plotly toolbar.
    """
    ev = df[df["dur"] > min_dur_us]
    ev = ev.nlargest(max_events, "dur") if len(ev) > max_events else ev
    t0 = df["ts"].min()
    fig = go.Figure()
    for cat, g in ev.groupby("category"):
        fig.add_trace(
            go.Bar(
                base=(g["ts"] - t0) / 1e3,
                x=g["dur"] / 1e3,
                y=g["row"],
                orientation="h",
                name=cat,
                marker={"color": CATEGORY_COLORS.get(cat, "#c7c7c7"), "line": {"width": 0}},
                customdata=list(zip(g["name"].str.slice(0, 90), g["dur"], strict=True)),
                hovertemplate="%{customdata[0]}<br>" + cat + ", %{customdata[1]:.1f} µs<extra>%{y}</extra>",
            )
        )
    fig.update_layout(
        barmode="overlay",
        title=f"Timeline: {len(ev):,} of {len(df):,} events (the longest), rows = threads and streams",
        xaxis_title="time (ms from the first event)",
        template="plotly_white",
        height=200 + 40 * ev["row"].nunique(),
        legend={"orientation": "h", "y": -0.25},
        margin={"l": 220, "r": 20, "t": 60, "b": 60},
    )
    fig.update_yaxes(autorange="reversed")
    return fig


def plot_overlap(steps: pd.DataFrame, title: str = "Communication per step") -> go.Figure:
    """Stacked bars per step: communication overlapped by compute vs exposed (ms), overlap % on hover."""
    fig = go.Figure()
    x = steps["step"].astype(str)
    for col, label, color in (
        ("overlap_us", "overlapped with compute", "#2ca02c"),
        ("exposed_comm_us", "exposed", "#d62728"),
    ):
        fig.add_trace(
            go.Bar(
                x=x,
                y=steps[col] / 1e3,
                name=label,
                marker_color=color,
                customdata=steps["overlap_pct"],
                hovertemplate="step %{x}<br>%{y:.2f} ms<br>overlap %{customdata:.1f} %<extra>"
                + label
                + "</extra>",
            )
        )
    fig.update_layout(
        barmode="stack",
        title=title,
        xaxis_title="profiler step",
        yaxis_title="communication time (ms)",
        template="plotly_white",
        legend={"orientation": "h", "y": -0.25},
    )
    return fig


def plot_gathers(gathers: pd.DataFrame) -> go.Figure:
    """Per-unit all-gather time (ms), forward and backward side by side, mean over steps (± min..max)."""
    g = gathers.groupby(["unit", "pass"])["dur_us"].agg(["mean", "min", "max", "count"]).reset_index()
    order = sorted(
        g["unit"].unique(), key=lambda u: (u != "root", int(u.split(".")[-1]) if u != "root" else -1)
    )
    fig = go.Figure()
    for pass_, color in (("forward", "#1f77b4"), ("backward", "#ff7f0e")):
        s = g[g["pass"] == pass_].set_index("unit").reindex(order)
        fig.add_trace(
            go.Bar(
                x=order,
                y=s["mean"] / 1e3,
                name=pass_,
                marker_color=color,
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": (s["max"] - s["mean"]) / 1e3,
                    "arrayminus": (s["mean"] - s["min"]) / 1e3,
                },
                customdata=s["count"],
                hovertemplate="%{x}<br>mean %{y:.2f} ms over %{customdata} gathers<extra>"
                + pass_
                + "</extra>",
            )
        )
    source = ", ".join(sorted(gathers["source"].unique()))
    fig.update_layout(
        barmode="group",
        title=f"All-gather per FSDP unit (found by: {source})",
        yaxis_title="all-gather time (ms)",
        template="plotly_white",
        legend={"orientation": "h", "y": -0.25},
    )
    return fig
