"""The full-size dry run in the book: the committed grid (``data/results/dryrun/grid.json``) as tables and a figure.

Chapter "Where the memory goes". ``scripts/dryrun_grid.py`` writes the file (provenance inside); each number
here is read from it or from ``smolfsdp.measure`` (the estimate), never typed. Traced on fake tensors, not
measured on a GPU: every view says so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from smolfsdp.paths import repo_root

GIB = 2**30
GRID = Path("data/results/dryrun/grid.json")
PHASE_COLOURS = {"forward": "#1f77b4", "backward": "#d62728", "clip": "#7f7f7f", "optimizer": "#2ca02c"}


def load_grid(path: str | Path | None = None) -> dict | None:
    """The committed grid (``{"provenance": ..., "runs": [...]}``), or None when the file is absent."""
    p = Path(path) if path else repo_root() / GRID
    return json.loads(p.read_text()) if p.is_file() else None


def _peak_row(run: dict) -> dict:
    return next(r for r in run["estimate_vs_dry_run"] if r["component"].startswith("peak"))


def grid_table(grid: dict) -> pd.DataFrame:
    """One row per setup: traced peak and its moment, the estimate's peak and moment, the error, static terms."""
    rows = []
    for run in grid["runs"]:
        peak = _peak_row(run)
        static = [r for r in run["estimate_vs_dry_run"] if not r["component"].startswith("peak")]
        rows.append({
            "setup": run["label"],
            "traced peak (GiB)": run["peak_bytes"] / GIB,
            "traced during": run["peak_moment"].get("phase", "?"),
            "estimated peak (GiB)": peak["estimate_gib"],
            "estimated moment": peak["component"].removeprefix("peak (").removesuffix(" moment)"),
            "error": f"{peak['error_pct']:+.1f} %",
            "static terms": "exact" if all(r["error_pct"] == 0 for r in static) else "differ",
        })  # fmt: skip
    return pd.DataFrame(rows)


def grid_reading(grid: dict) -> str:
    """A sentence counted from the grid: static terms exact in how many setups, the largest peak error."""
    table = grid_table(grid)
    errors = [(abs(_peak_row(r)["error_pct"]), r["label"]) for r in grid["runs"]]
    worst, where = max(errors)
    within = sum(e <= 3 for e, _ in errors)
    exact = (table["static terms"] == "exact").sum()
    return (
        f"Parameters, gradients and AdamW state equal the estimate to the byte in {exact} of {len(table)} setups. "
        f"The estimated peak, taken at the moment it happens, is within 3 % of the traced one in {within} of "
        f"{len(errors)}; the largest error is {worst:.1f} % ({where})."
    )


def provenance_line(grid: dict) -> str:
    p = grid["provenance"]
    return (f"Traced on fake tensors by `{p['command']}` on {p['date'][:10]} (commit {p['git_sha'][:7]}, torch "
            f"{p['torch']}, transformers {p['transformers']}, {p['machine']}): {p['what']}.")  # fmt: skip


def plot_step_memory(run: dict) -> go.Figure:
    """Rank 0's tensor bytes over one traced step: a point after each decoder layer's forward and backward."""
    series = pd.DataFrame(run["series"])
    fig = go.Figure()
    for phase, part in series.groupby("phase", sort=False):
        fig.add_trace(go.Scatter(
            x=part["i"], y=part["bytes"] / GIB, mode="markers", name=phase,
            marker={"color": PHASE_COLOURS.get(phase, "#444"), "size": 6},
            text=part["module"] + " " + part["event"], hovertemplate="%{text}: %{y:.2f} GiB<extra></extra>",
        ))  # fmt: skip
    fig.add_hline(y=run["peak_bytes"] / GIB, line_dash="dot", annotation_text="traced peak")
    fig.update_layout(
        title={"text": f"{run['label']}: tensor bytes on rank 0 over one step", "font": {"size": 14}},
        xaxis_title="event (after each layer's forward, then backward)", yaxis_title="GiB",
        margin={"t": 70}, legend={"orientation": "h", "y": -0.25},
    )  # fmt: skip
    return fig


def flops_table(grid: dict) -> pd.DataFrame:
    """Counted FLOPs per step against the MFU formula's model FLOPs (6N + 12·L·H·Q·T per token)."""
    rows = [{"setup": r["label"], "checkpointing": "on" if r["setup"]["activation_checkpointing"] else "off",
             "counted / formula": r["flops_counted"] / r["flops_formula"]} for r in grid["runs"]]  # fmt: skip
    return pd.DataFrame(rows)
