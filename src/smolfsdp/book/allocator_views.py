"""The caching-allocator replay in the book: published reserved memory beside the estimate and the replay.

Appendix "How the estimates are checked" (``notebooks/appendix_checks.ipynb``), section "The caching
allocator, replayed". The rows come from
``data/results/published/check.json`` (``scripts/published_check.py``: the estimator's ``memory`` rows and the
``dry_run`` rows of ``smolfsdp.audit.dryrun.published_replay``); the ablation replays one dry run's allocation order with each
mechanism of ``smolfsdp.audit.allocator_replay.replay`` taken away in turn; the replay grid
(``data/results/dryrun/replay_grid.json``) is what the estimate's default-pool factor is fitted to. Traced and
replayed on a CPU, not measured on a GPU: every view says so.
"""

from __future__ import annotations

import json

import pandas as pd
import plotly.graph_objects as go

from smolfsdp.audit.allocator_replay import replay
from smolfsdp.audit.published_rows import CHECK_PATH
from smolfsdp.book.figures import palette
from smolfsdp.estimate.reserved import CUBLAS_WORKSPACE_BYTES, REPLAY_GRID
from smolfsdp.paths import repo_root

GIB = 2**30
#: The ablation's settings: each takes one mechanism away from the full replay (label, replay keyword arguments).
ABLATION = (
    ("full replay (3 steps, lazy AdamW state, a pool per stream, record_stream)", {}),
    ("AdamW's state made before the first step", {"lazy_optimizer_state": False}),
    ("FSDP1's record_stream frees at once", {"record_stream": False}),
    ("one pool for every stream", {"streams": False}),
)


def load_check() -> dict:
    """The committed ``check.json`` (``provenance``, ``memory``, ``mfu``, ``dry_run``)."""
    return json.loads((repo_root() / CHECK_PATH).read_text())


def reserved_table(check: dict) -> pd.DataFrame:
    """One row per dry-run row (seven columns): the dry run's tensor peak; published active GiB and the replay's
    error %; published reserved GiB, the replay's figure and error %, and the estimator's error %."""
    estimated = {
        r["id"]: r["error_pct"] for r in check["memory"] if r.get("modelled") and r["what"] == "reserved"
    }
    out = []
    for r in check["dry_run"]:
        act, res = r.get("active", {}), r["reserved"]
        out.append({"row": r["id"].split("/", 1)[1], "tensors GiB": r["dry_run_peak_gib"],
                    "active GiB": act.get("published_gib"), "replay active %": act.get("error_pct"),
                    "reserved GiB": res["published_gib"], "replay GiB": res["ours_gib"],
                    "replay %": res["error_pct"], "estimate %": estimated.get(r["id"])})  # fmt: skip
    return pd.DataFrame(out).set_index("row")


def published_ratios_text() -> str:
    """The published runs' reserved memory over their allocated (or active) bytes, per source, in words: what one
    factor on the tensor peak would have to cover (data/results/published/rows.json)."""
    from smolfsdp.audit.published_rows import load_rows  # deferred: measure loads torch

    by_source: dict[str, list[float]] = {}
    for r in load_rows()["rows"]:
        m = r["measured"]
        base = m.get("allocated_gib", m.get("active_gib"))
        if "reserved_gib" in m and base:
            by_source.setdefault(r["id"].split("/")[0], []).append(m["reserved_gib"] / base)
    return "; ".join(
        f"{src}: {min(v):.2f} to {max(v):.2f} x ({len(v)} runs)" for src, v in sorted(by_source.items())
    )


def reading(check: dict) -> str:
    """The table in words: how many rows each method meets the bar on, and the largest error of each."""
    rows = check["dry_run"]
    rep = [r["reserved"]["error_pct"] for r in rows]
    estimated = {
        r["id"]: r["error_pct"] for r in check["memory"] if r.get("modelled") and r["what"] == "reserved"
    }
    fac = [estimated[r["id"]] for r in rows if r["id"] in estimated]
    act = [r["active"]["error_pct"] for r in rows if "active" in r]
    return (
        f"On these {len(rows)} runs the estimate's reserved figure (no trace) is within 10 % on "
        f"{sum(abs(e) <= 10 for e in fac)} of {len(fac)} (worst {max(fac, key=abs):+.1f} %); the replayed allocator "
        f"on {sum(abs(e) <= 10 for e in rep)} of {len(rep)} (worst {max(rep, key=abs):+.1f} %), and the active bytes "
        f"it holds on {sum(abs(e) <= 5 for e in act)} of {len(act)} within 5 % (worst {max(act, key=abs):+.1f} %). "
        "Traced and replayed on a CPU (fake tensors, no GPU), against the runs' published numbers."
    )


def ablation(events: list, tensor_peak: int, **fixed) -> pd.DataFrame:
    """Peak reserved GiB of one dry run's allocation order with each mechanism of :data:`ABLATION` taken away,
    beside the full replay (``fixed``: replay arguments every line shares, e.g. ``rs_input_on_rs_stream``)."""
    out = []
    for label, kwargs in ABLATION:
        r = replay(events, **{**fixed, **kwargs})
        reserved = r["peak_reserved"] + CUBLAS_WORKSPACE_BYTES
        out.append({"replay": label, "reserved GiB": round(reserved / GIB, 2),
                    "x tensors": round(reserved / tensor_peak, 3),
                    "active GiB": round(r["peak_active"] / GIB, 2)})  # fmt: skip
    return pd.DataFrame(out).set_index("replay")


def ablation_reading(table: pd.DataFrame) -> str:
    """The ablation in words: what the full replay reserves above the tensors, and how much of that goes when
    each mechanism is taken away."""
    full = table.iloc[0]
    above = full["reserved GiB"] * (1 - 1 / full["x tensors"])
    parts = [f"{label}: {row['reserved GiB'] - full['reserved GiB']:+.2f} GiB"
             for label, row in table.iloc[1:].iterrows()]  # fmt: skip
    return (
        f"The full replay reserves {full['reserved GiB']:.2f} GiB, {above:.2f} GiB above the tensors "
        f"(x {full['x tensors']:.2f}). Taking one mechanism away at a time: " + "; ".join(parts) + "."
    )


def plot_reserved(check: dict) -> go.Figure:
    """Bars per dry-run row: the dry run's tensor peak, the estimate's and the replay's reserved figure, and the
    published reserved memory (GiB)."""
    estimated = {r["id"]: r for r in check["memory"] if r.get("modelled") and r["what"] == "reserved"}
    rows = check["dry_run"]
    names = [r["id"].split("/", 1)[1] for r in rows]
    series = [
        ("dry-run tensors", [r["dry_run_peak_gib"] for r in rows], palette.PHASE["forward"]),
        (
            "estimate, no trace (smolfsdp memory)",
            [estimated[r["id"]]["estimate_gib"] for r in rows],
            palette.SOURCE["estimated"],
        ),
        ("allocator replay", [r["reserved"]["ours_gib"] for r in rows], palette.PHASE["optimizer"]),
        ("published reserved", [r["reserved"]["published_gib"] for r in rows], palette.SOURCE["measured"]),
    ]
    fig = go.Figure([go.Bar(name=n, x=names, y=y, marker_color=c) for n, y, c in series])
    fig.update_layout(barmode="group", yaxis_title="GiB per GPU", legend_orientation="h",
                      title="Reserved memory: published, estimated and the replayed allocator (no GPU)")  # fmt: skip
    return fig


def replay_grid_table() -> pd.DataFrame:
    """The 16 book setups of ``data/results/dryrun/replay_grid.json``: the dry run's tensor peak, the replayed
    reserved memory, today's estimate (``smolfsdp.estimate.reserved.reserved_parts``) and its error % (GiB)."""
    from smolfsdp.audit.dryrun.compare import estimate_for  # deferred: torch, transformers
    from smolfsdp.config import load_config  # deferred: the chapter's other views need no config
    from smolfsdp.estimate.adamw_step import traced_adamw  # deferred with load_config

    grid = json.loads((repo_root() / REPLAY_GRID).read_text())
    out = []
    for r in grid["rows"]:
        o = r["overrides"]
        cfg = load_config(repo_root() / r["recipe"], **o)
        est = estimate_for(cfg, o["nproc"], r["loss_path"], traced_adamw(r))  # the loss and AdamW step traced
        replayed = r["replay_reserved_bytes"]
        out.append({"setup": f"FSDP{o['fsdp_version']} {'LoRA' if o['lora'] else 'full'} AC "
                             f"{'on' if o['activation_checkpointing'] else 'off'} x{o['nproc']}",
                    "tensors GiB": round(r["tensor_peak_bytes"] / GIB, 2), "replay GiB": round(replayed / GIB, 2),
                    "estimate GiB": round(est.reserved_bytes / GIB, 2),
                    "error %": round(100 * (est.reserved_bytes / replayed - 1), 1) + 0.0})  # + 0.0: no "-0.0"  # fmt: skip
    return pd.DataFrame(out).set_index("setup")
