"""Read PyTorch profiler (Kineto) Chrome traces by program: what ran where, and what overlapped.

Chapter "Reading the profiler" (``notebooks/05_profiling.ipynb``). Works on CPU-only traces (gloo:
collectives run on ``pt_gloo_runloop`` threads, compute on the Python thread) and GPU traces
(NCCL/RCCL kernels on one CUDA or HIP stream, compute kernels on others), as Kineto writes them for
CUDA and ROCm. Pure pandas/numpy; traces are read streaming (``smolfsdp.traces.load``).

    smolfsdp analyze-trace runs/bench/traces/rank0.json.gz [--json]

Modules: ``trace_load`` (reading, columns), ``trace_classify`` (what each event is),
``trace_intervals`` (union/intersection), ``trace_collectives`` (steps, NCCL kernels -> CPU code,
FSDP all-gathers, prefetch), ``sanity`` (what is left out and why: ``data_quality``); their public names
are importable from here.

Definitions (every time in microseconds, the trace's own unit):

* busy time of a row (a thread or a stream): length of the union of its events' intervals;
  idle gaps: the step window minus that union.
* communication: GPU mode (the trace has kernels): NCCL kernels; CPU mode: ``c10d::``/``gloo:``/
  ``nccl:`` ops, ``record_param_comms`` and everything nested in them. Compute: GPU mode, the
  other kernels (memcpy/memset excluded, as HTA does); CPU mode, ``cpu_op`` events outside
  communication. ``overlap`` = |union(comm) ∩ union(compute)|; ``exposed`` = comm − overlap;
  ``overlap_pct`` = 100 · overlap / comm (HTA's ``get_comm_comp_overlap`` definition).
* steps: ``ProfilerStep#N`` ranges; GPU events belong to the step of the CPU call that launched
  them (``correlation``). A trace without them is analysed as one span, and ``notes`` says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from smolfsdp.traces.classify import (
    CATEGORIES,
    CPU_COMM_RE,
    FSDP_RE,
    KINDS,
    LAYER_RE,
    NCCL_RE,
    classify,
    parse_id,
)
from smolfsdp.traces.collectives import all_gathers, assign_steps, collective_kernels, prefetch
from smolfsdp.traces.intervals import intersection_length, merge_intervals, union_length
from smolfsdp.traces.load import TraceError, load_trace, read_trace
from smolfsdp.traces.sanity import attribute_steps, screen, step_notes

__all__ = [
    "CATEGORIES", "CPU_COMM_RE", "FSDP_RE", "KINDS", "LAYER_RE", "NCCL_RE", "TraceError", "TraceReport",
    "all_gathers", "analyze", "assign_steps", "classify", "collective_kernels", "comm_by_row", "complete_window",
    "intersection_length", "json_safe", "load_trace", "merge_intervals", "parse_id", "prefetch", "read_trace",
    "summarize_trace", "union_length",
]  # fmt: skip


@dataclass
class TraceReport:
    """What :func:`analyze` found. DataFrames in µs; ``notes`` explain any fallback taken."""

    mode: str  # "gpu" or "cpu"
    overall: dict[str, float]  # whole trace: comm/compute/overlap
    complete_steps: dict[str, float]  # every step but the last (HTA's default window), summed
    steps: pd.DataFrame  # one row per step
    rows: pd.DataFrame  # one row per (step, row)
    gathers: pd.DataFrame  # one row per all-gather of an FSDP unit
    prefetch: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    # what could not be trusted (smolfsdp.traces.sanity.screen): impossible times, device kinds not
    # analysed, same-stream overlap, and the steps left out of complete_steps as empty
    data_quality: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values: NaN and infinities (e.g. the overlap % of a step without
        communication) become None, so ``json.dumps(..., allow_nan=False)`` writes strict JSON."""
        return json_safe(
            {
                "mode": self.mode,
                "overall": self.overall,
                "complete_steps": self.complete_steps,
                "steps": self.steps.to_dict(orient="records"),
                "rows": self.rows.to_dict(orient="records"),
                "gathers": self.gathers.to_dict(orient="records"),
                "prefetch": self.prefetch,
                "notes": self.notes,
                "data_quality": self.data_quality,
            }
        )


def json_safe(obj: Any) -> Any:
    """``obj`` with numpy scalars as Python ones and NaN/±inf floats as None (strict JSON has no NaN)."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _comm_compute(ev: pd.DataFrame, mode: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    if mode == "gpu":
        g = ev[ev["device"].eq("gpu")]
        return g[g["category"].eq("communication")], g[g["category"].eq("compute")]
    c = ev[ev["device"].eq("cpu")]
    comm = c[c["category"].eq("communication")]
    return comm, c[c["category"].eq("cpu_op") & ~c["in_comm"]]


def _overlap(comm: pd.DataFrame, comp: pd.DataFrame) -> dict[str, float]:
    return _overlap_arrays(
        (comm["ts"].to_numpy(), comm["end"].to_numpy()), (comp["ts"].to_numpy(), comp["end"].to_numpy())
    )


def _overlap_arrays(
    comm: tuple[np.ndarray, np.ndarray], comp: tuple[np.ndarray, np.ndarray]
) -> dict[str, float]:
    """comm/compute/overlap/exposed µs and overlap % (HTA's definition) of two interval sets."""
    comm_us = union_length(*comm)
    over = intersection_length(comm, comp)
    return {
        "compute_us": union_length(*comp),
        "comm_us": comm_us,
        "overlap_us": over,
        "exposed_comm_us": comm_us - over,
        "overlap_pct": 100 * over / comm_us if comm_us else float("nan"),
    }


def analyze(df: pd.DataFrame, *, boundary_frac: float = 0.1) -> TraceReport:
    """Per-step and per-row busy/idle/communication/overlap figures, per-layer all-gathers, prefetch.

    ``boundary_frac``: the first and last fraction of each step window whose communication is
    reported as the step-boundary bursts. Raises ValueError for an empty frame.
    """
    if df.empty:
        raise ValueError("analyze: the trace has no events")
    # the mode from every event: a GPU trace whose kernels all have impossible times stays a GPU trace
    mode = "gpu" if (df["device"].eq("gpu") & df["category"].eq("compute")).any() else "cpu"
    df, found = screen(df)
    if df.empty:
        raise ValueError(f"analyze: no event of the trace can be analysed ({'; '.join(found['notes'])})")
    df, windows, notes = assign_steps(df)
    # the whole trace's figures leave out the kernels launched before recording, as every step's do
    overall = _overlap(*_comm_compute(df[~df["before_recording"]], mode))
    impossible = found.pop("impossible_frame")
    excluded = attribute_steps(impossible, df, windows)
    step_found, step_found_notes = step_notes(windows, impossible, excluded.attrs.get("unplaced", 0))
    found.update(step_found)
    notes += step_found_notes
    step_rows, row_rows = [], []
    a = _Arrays(df, mode)
    for w in windows.itertuples(index=False):
        in_step = a.step == w.step
        sel = in_step & a.comm
        comm = (a.ts[sel], a.end[sel])
        sel = in_step & a.comp
        rec = {
            "step": w.step,
            "start_us": w.start_us,
            "dur_us": w.dur_us,
            **_overlap_arrays(comm, (a.ts[sel], a.end[sel])),
            "excluded_events": int(excluded.get(w.step, 0)),  # impossible times, left out of the sums
        }
        rec.update(_bursts(*comm, w.start_us, w.end_us, boundary_frac))
        for phase, code in a.phases.items():
            rec[f"{phase}_us"] = float(a.dur[in_step & (a.name == code)].sum())
        step_rows.append(rec)
        row_rows += _row_figures(a, in_step & a.timed, w)
    gathers = all_gathers(df)
    steps = pd.DataFrame(step_rows)
    window, empty = complete_window(steps)
    found["empty_steps"] = empty
    if empty and len(empty) == len(steps):
        notes.append("no step recorded compute or communication that could be analysed")
    elif empty:
        notes.append(
            f"step{'s' if len(empty) > 1 else ''} {', '.join(map(str, empty))} recorded no compute and no "
            "communication while other steps did: left out of the complete-steps figures"
        )
    return TraceReport(
        mode=mode,
        overall=overall,
        complete_steps=_sum_steps(window),
        steps=steps,
        rows=pd.DataFrame(row_rows),
        gathers=gathers,
        prefetch=prefetch(df, gathers),
        notes=found.pop("notes") + notes + gathers.attrs.get("notes", []),
        data_quality=found,
    )


def complete_window(steps: pd.DataFrame) -> tuple[pd.DataFrame, list[int]]:
    """(the steps HTA's window keeps, the empty steps left out): every step but the trace's last (it may
    be cut short), and never an empty one (no compute and no communication, while another step has
    some) in place of a real one. With a single real step, that step."""
    work = (steps["comm_us"] + steps["compute_us"]) > 0
    empty = [int(s) for s in steps["step"][~work]]
    real = steps[work] if work.any() else steps
    last_is_real = real["step"].iloc[-1] == steps["step"].iloc[-1]
    return (real.iloc[:-1] if len(real) > 1 and last_is_real else real), empty


class _Arrays:
    """The numpy columns the per-step loop reads (pandas indexing per step and row cost more than
    the arithmetic on traces of 100k+ events)."""

    def __init__(self, df: pd.DataFrame, mode: str):
        category = df["category"]
        self.ts, self.end, self.dur = df["ts"].to_numpy(), df["end"].to_numpy(), df["dur"].to_numpy()
        self.step = df["step"].to_numpy()
        gpu = df["device"].eq("gpu").to_numpy()
        self.is_comm = category.eq("communication").to_numpy()
        work = "compute" if mode == "gpu" else "cpu_op"
        self.is_work = category.eq(work).to_numpy()
        if mode == "gpu":
            self.comm, self.comp = gpu & self.is_comm, gpu & self.is_work
        else:
            self.comm, self.comp = ~gpu & self.is_comm, ~gpu & self.is_work & ~df["in_comm"].to_numpy()
        self.timed = ~category.isin(["step", "annotation", "fsdp"]).to_numpy()
        self.rows, self.row_names = df["row"].cat.codes.to_numpy(), list(df["row"].cat.categories)
        self.gpu = gpu
        self.name = df["name"].cat.codes.to_numpy()
        names = {n: i for i, n in enumerate(df["name"].cat.categories)}
        self.phases = {p: names.get(p, -2) for p in ("forward_backward", "clip", "optimizer")}


def _row_figures(a: _Arrays, sel: np.ndarray, w) -> list[dict[str, Any]]:
    """Busy/idle, gaps, communication and compute time of each row (thread or stream) in one step."""
    out = []
    for row in np.unique(a.rows[sel]):
        r = sel & (a.rows == row)
        s, e = merge_intervals(a.ts[r], a.end[r])
        busy = float((e - s).sum())
        gaps = np.concatenate([[s[0] - w.start_us], s[1:] - e[:-1], [w.end_us - e[-1]]])
        gaps = gaps[gaps > 0]
        out.append(
            {
                "step": w.step,
                "row": a.row_names[row],
                "device": "gpu" if a.gpu[r][0] else "cpu",
                "busy_us": busy,
                "idle_us": float(max(w.dur_us - busy, 0.0)),
                "busy_pct": 100 * busy / w.dur_us if w.dur_us else float("nan"),
                "gaps": int(len(gaps)),
                "longest_gap_us": float(gaps.max()) if len(gaps) else 0.0,
                "comm_us": union_length(a.ts[r & a.is_comm], a.end[r & a.is_comm]),
                "compute_us": union_length(a.ts[r & a.is_work], a.end[r & a.is_work]),
            }
        )
    return out


def _sum_steps(steps: pd.DataFrame) -> dict[str, float]:
    """Overlap over several steps: sums of their comm and overlap times (steps do not overlap)."""
    comm, over = float(steps["comm_us"].sum()), float(steps["overlap_us"].sum())
    return {
        "steps": [int(s) for s in steps["step"]],
        "compute_us": float(steps["compute_us"].sum()),
        "comm_us": comm,
        "overlap_us": over,
        "exposed_comm_us": comm - over,
        "overlap_pct": 100 * over / comm if comm else float("nan"),
    }


def _pick(g: pd.DataFrame, category: str) -> tuple[np.ndarray, np.ndarray]:
    sel = g[g["category"].eq(category)]
    return sel["ts"].to_numpy(), sel["end"].to_numpy()


def _bursts(ts: np.ndarray, end: np.ndarray, start: float, stop: float, frac: float) -> dict[str, float]:
    """Communication in the first and last ``frac`` of a step window: µs (union) and collectives."""
    span = (stop - start) * frac
    out = {}
    for label, lo, hi in (("head", start, start + span), ("tail", stop - span, stop)):
        out[f"comm_{label}_us"] = union_length(np.clip(ts, lo, hi), np.clip(end, lo, hi))
        out[f"collectives_{label}"] = int(((ts < hi) & (end > lo)).sum())
    return out


def comm_by_row(df: pd.DataFrame) -> pd.DataFrame:
    """Communication and compute time (µs, interval union) per row over the whole trace."""
    out = []
    for row, g in df.groupby("row"):
        out.append(
            {
                "row": row,
                "device": g["device"].iloc[0],
                "comm_us": union_length(*_pick(g, "communication")),
                "compute_us": union_length(*_pick(g, "compute")),
                "cpu_op_us": union_length(*_pick(g, "cpu_op")),
                "events": len(g),
            }
        )
    return pd.DataFrame(out).sort_values("row").reset_index(drop=True)


def summarize_trace(path: str | Path, *, progress: bool = False) -> dict[str, Any]:
    """``load_trace`` + ``analyze`` as a JSON-ready dict (what ``smolfsdp analyze-trace --json`` prints):
    strict JSON values only (NaN -> None), so ``json.dumps(out, allow_nan=False)`` succeeds."""
    df = load_trace(path, progress=progress)
    report = analyze(df)
    return {
        "path": str(path),
        "events": len(df),
        **report.to_dict(),
        "by_row": json_safe(comm_by_row(screen(df)[0]).to_dict(orient="records")),  # the analysed events
    }
