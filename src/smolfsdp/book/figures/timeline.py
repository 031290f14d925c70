"""Figures for the chapter "Reading the profiler": pure ``plot_*`` functions returning plotly Figures.

Inputs come from ``smolfsdp.traces.analysis`` (a loaded trace and its ``TraceReport``); nothing is
typed in. Save with ``plotting.save_figure``. Step times of separate CPU runs are not drawn as bars
side by side (they would read as a ranking that the noise does not support): see
``smolfsdp.book.profiling.bench_table`` and ``timing_sentence``.

    python -c "from smolfsdp.traces import analysis as ta; from smolfsdp.book.figures import trace as pt; \\
        pt.plot_timeline(ta.load_trace('runs/bench/traces/rank0.json.gz')).show()"
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from smolfsdp.book.figures import palette
from smolfsdp.traces.intervals import merge_intervals

CATEGORY_COLORS = palette.TRACE_CATEGORY
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
                marker={"color": CATEGORY_COLORS.get(cat, CATEGORY_COLORS["other"]), "line": {"width": 0}},
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


def busy_per_bin(starts, ends, edges) -> np.ndarray:
    """Busy time inside each bin ``[edges[i], edges[i+1])`` of disjoint, sorted intervals (as
    :func:`busy_intervals` gives them): the cumulative busy time at each edge, interpolated exactly
    (it grows inside an interval and is flat between), differenced. Sums to the intervals' total length."""
    s, e = np.asarray(starts, float), np.asarray(ends, float)
    keep = e > s
    s, e = s[keep], e[keep]
    if not len(s):
        return np.zeros(len(edges) - 1)
    before = np.concatenate([[0.0], np.cumsum(e - s)[:-1]])
    xp = np.column_stack([s, e]).ravel()
    fp = np.column_stack([before, before + (e - s)]).ravel()
    return np.diff(np.interp(edges, xp, fp))


def plot_gpu_timeline(df: pd.DataFrame, *, bins: int = 500) -> go.Figure:
    """Timeline of a GPU trace in which each row's share of the picture is its busy share: every row (CUDA
    stream or CPU thread) is a strip, and in each of ``bins`` time bins a bar fills the strip's height in
    proportion to the time the row was busy there (:func:`busy_intervals`, every event counted, none
    dropped), stacked by category. Thousands of kernels of a few µs each would otherwise draw as a solid
    block (a bar is at least one pixel wide) or vanish when cut to the longest. Ranges (annotations, steps)
    are drawn as they are in their own lane under their row, so no range covers a kernel, and every NCCL
    kernel also gets a marker on its stream, drawn last. x: ms from the first event; hover: busy share.
    """
    iv = busy_intervals(df)
    rows = df["row"].cat.categories if hasattr(df["row"], "cat") else df["row"].unique()
    lanes = [lane for row in rows for lane in (str(row), f"{row} · ranges") if lane in set(iv["lane"])]
    y = {lane: i for i, lane in enumerate(lanes)}
    t0, t1 = float(df["ts"].min()), float(df["end"].max())
    edges = np.linspace(t0, t1, bins + 1)
    width = edges[1] - edges[0]
    filled = {lane: np.zeros(bins) for lane in lanes}
    fig = go.Figure()
    order = sorted(iv["category"].unique(), key=lambda c: DRAW_ORDER.index(c) if c in DRAW_ORDER else 0)
    for cat in order:
        g = iv[iv["category"] == cat]
        color = CATEGORY_COLORS.get(cat, CATEGORY_COLORS["other"])
        if cat in RANGE_CATEGORIES:
            fig.add_trace(go.Bar(
                base=(g["ts"] - t0) / 1e3, x=g["dur"] / 1e3, y=g["lane"].map(y) + 0.4, width=0.8, orientation="h",
                name=cat, marker={"color": color, "line": {"width": 0}}, customdata=g["name"].str.slice(0, 60),
                hovertemplate="%{customdata}<br>" + cat + "<extra></extra>",
            ))  # fmt: skip
            continue
        x, h, base, share, names = [], [], [], [], []
        for lane, d in g.groupby("lane", sort=False):
            frac = busy_per_bin(d["ts"], d["end"], edges) / width
            on = frac > 0
            x.append((edges[:-1][on] + width / 2 - t0) / 1e3)
            h.append(0.8 * frac[on])
            base.append(y[lane] + filled[lane][on])
            filled[lane][on] += 0.8 * frac[on]
            share.append(frac[on])
            names += [lane] * int(on.sum())
        fig.add_trace(go.Bar(
            x=np.concatenate(x), y=np.concatenate(h), base=np.concatenate(base), width=width / 1e3, name=cat,
            marker={"color": color, "line": {"width": 0}}, customdata=list(zip(names, np.concatenate(share), strict=True)),
            hovertemplate="%{customdata[0]}<br>" + cat + ": %{customdata[1]:.0%} of this bin busy<extra></extra>",
        ))  # fmt: skip
    nccl = df[df["device"].eq("gpu") & df["category"].eq("communication")]
    if len(nccl):
        fig.add_trace(go.Scatter(
            x=(nccl["ts"] - t0) / 1e3, y=nccl["row"].astype(str).map(y) - 0.08, mode="markers", name="each NCCL kernel",
            marker={"symbol": "triangle-down", "size": 7, "color": CATEGORY_COLORS["communication"]},
            customdata=list(zip(nccl["name"].astype(str).str.slice(0, 60), nccl["dur"], strict=True)),
            hovertemplate="%{customdata[0]}<br>%{customdata[1]:.1f} µs<extra></extra>",
        ))  # fmt: skip
    fig.update_layout(
        barmode="overlay",
        title=f"Busy share per row, {len(df):,} events in {bins} bins of {width / 1e3:.2f} ms",
        xaxis_title="time (ms from the first event)",
        template="plotly_white",
        height=200 + 40 * len(lanes),
        legend={"orientation": "h", "y": -0.25},
        margin={"l": 220, "r": 20, "t": 60, "b": 60},
        bargap=0,
    )
    ticks = {"tickvals": [i + 0.4 for i in range(len(lanes))], "ticktext": lanes, "range": [len(lanes), -0.2]}
    fig.update_yaxes(showgrid=False, zeroline=False, **ticks)
    return fig


def plot_overlap(steps: pd.DataFrame, title: str = "Communication per step") -> go.Figure:
    """Stacked bars per step: communication overlapped by compute vs exposed (ms), overlap % on hover."""
    fig = go.Figure()
    x = steps["step"].astype(str)
    for col, label, color in (
        ("overlap_us", "overlapped with compute", palette.OVERLAP["overlapped with compute"]),
        ("exposed_comm_us", "exposed", palette.OVERLAP["exposed"]),
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
    for pass_, color in (("forward", palette.PHASE["forward"]), ("backward", palette.PHASE["backward"])):
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
